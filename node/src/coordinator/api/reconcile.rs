//! `Reconcile`: tokens of a window handed back.

use leasehold_core::coordinator::Outcome;
use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::v1 as pb;
use tonic::Status;

use super::group::{unexpected, Caller, CoordinatorApi};

impl CoordinatorApi {
    /// `Reconcile` in this group.
    pub async fn reconcile(
        &self,
        caller: &Caller,
        request: pb::ReconcileRequest,
    ) -> Result<pb::ReconcileResponse, Status> {
        self.require_region(caller, &request.region)?;
        let command = convert::reconcile_command(request, caller.principal.clone())
            .map_err(|e| self.invalid(e))?;
        match self.write(command).await? {
            Outcome::Reconcile(outcome) => Ok(pb::ReconcileResponse::from(&outcome)),
            other => Err(unexpected(&other)),
        }
    }
}
