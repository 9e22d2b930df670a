//! `GetWindow`: a linearizable read of a key's window.

use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::v1 as pb;
use tonic::Status;

use super::group::CoordinatorApi;
use crate::coordinator::leader::command_error_status;
use crate::coordinator::metrics::Rejection;

impl CoordinatorApi {
    /// `GetWindow` in this group: a linearizable read of the key's window.
    pub async fn get_window(
        &self,
        request: &pb::GetWindowRequest,
    ) -> Result<pb::GetWindowResponse, Status> {
        let key = convert::window_key(request).map_err(|e| self.invalid(e))?;
        self.node.linearizable_read().await?;
        let wall_now = self.node.clock.now_ms();
        let view = self.node.state.read(|state| {
            if !state.owns(&key) {
                return None;
            }
            Some(state.window_view(&key, state.now_ms().max(wall_now)))
        });
        // The group does not hold the key's window (yet, or any more):
        // an empty view would read as nothing granted.
        let Some(view) = view else {
            return Err(refusal(
                Reason::SlotMoving,
                format!("the window of key \"{key}\" is changing shards; retry shortly"),
            ));
        };
        match view {
            Ok(view) => Ok(convert::window_response(&key, &view)),
            Err(error) => {
                self.node.metrics.record_rejection(Rejection::NoPolicy);
                Err(command_error_status(&error))
            }
        }
    }
}
