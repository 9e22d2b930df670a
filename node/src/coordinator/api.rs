//! The public coordinator API (`leasehold.v1.Coordinator`): lease,
//! reconcile and pool grant go through group commit at the leader;
//! `GetWindow` is a linearizable read.
//!
//! Every handler validates its input first (`INVALID_ARGUMENT`, nothing
//! proposed), then checks leadership (`FAILED_PRECONDITION` with a leader
//! hint, or `UNAVAILABLE`), then proposes and maps the state machine's
//! outcome (`NOT_FOUND` without a policy, `FAILED_PRECONDITION` on a kind
//! mismatch).
//!
//! Lease, Reconcile and PoolGrant act for the request's region: only that
//! region's certificate may send them (`PERMISSION_DENIED` otherwise; see
//! [`crate::auth`]).

use std::sync::Arc;

use leasehold_core::coordinator::{Command, Outcome};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::coordinator_server::Coordinator;
use leasehold_proto::refusal::{refusal, Reason};
use tonic::{Request, Response, Status};

use super::context::NodeContext;
use super::convert;
use super::leader::command_error_status;
use super::metrics::Rejection;
use crate::auth::{authorize_region, caller, PeerInfo};
use crate::telemetry;

/// Serves `leasehold.v1.Coordinator` for one member.
#[derive(Clone)]
pub struct CoordinatorApi {
    node: Arc<NodeContext>,
}

impl CoordinatorApi {
    /// The API over a member's shared context.
    pub fn new(node: Arc<NodeContext>) -> Self {
        Self { node }
    }

    fn invalid(&self, status: Status) -> Status {
        self.node
            .metrics
            .record_rejection(Rejection::InvalidArgument);
        status
    }

    /// Refuses unless the caller may act for `region`.
    fn require_region<T>(&self, request: &Request<T>, region: &str) -> Result<(), Status> {
        authorize_region(&caller(request), region).map_err(|refusal| {
            let peer = request.extensions().get::<PeerInfo>();
            self.node.metrics.auth.refuse(peer, "Coordinator", refusal)
        })
    }

    async fn write(&self, command: Command) -> Result<Outcome, Status> {
        self.node.require_leader()?;
        let outcome = self.node.propose(command).await?;
        match outcome {
            Outcome::Rejected(error) => Err(command_error_status(&error)),
            outcome => Ok(outcome),
        }
    }
}

fn unexpected(outcome: &Outcome) -> Status {
    refusal(Reason::Internal, format!("unexpected outcome {outcome:?}"))
}

impl CoordinatorApi {
    async fn lease_call(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        self.require_region(&request, &request.get_ref().region)?;
        let caller = caller(&request);
        let request = request.into_inner();
        let tokens = request.tokens;
        let command = convert::lease_command(request, caller).map_err(|e| self.invalid(e))?;
        self.node.require_leader()?;
        self.node.metrics.record_lease_request(tokens);
        match self.write(command).await? {
            Outcome::Lease(grant) => Ok(Response::new(convert::lease_response(&grant))),
            other => Err(unexpected(&other)),
        }
    }

    async fn reconcile_call(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        self.require_region(&request, &request.get_ref().region)?;
        let caller = caller(&request);
        let command = convert::reconcile_command(request.into_inner(), caller)
            .map_err(|e| self.invalid(e))?;
        match self.write(command).await? {
            Outcome::Reconcile(outcome) => Ok(Response::new(convert::reconcile_response(&outcome))),
            other => Err(unexpected(&other)),
        }
    }

    async fn pool_grant_call(
        &self,
        request: Request<pb::PoolGrantRequest>,
    ) -> Result<Response<pb::PoolGrantResponse>, Status> {
        self.require_region(&request, &request.get_ref().region)?;
        let caller = caller(&request);
        let command = convert::pool_grant_command(request.into_inner(), caller)
            .map_err(|e| self.invalid(e))?;
        match self.write(command).await? {
            Outcome::PoolGrant(grant) => Ok(Response::new(convert::pool_grant_response(&grant))),
            other => Err(unexpected(&other)),
        }
    }

    async fn get_window_call(
        &self,
        request: Request<pb::GetWindowRequest>,
    ) -> Result<Response<pb::GetWindowResponse>, Status> {
        let key = convert::window_key(request.get_ref()).map_err(|e| self.invalid(e))?;
        self.node.linearizable_read().await?;
        let wall_now = self.node.clock.now_ms();
        let view = self
            .node
            .state
            .read(|state| state.window_view(&key, state.now_ms().max(wall_now)));
        match view {
            Ok(view) => Ok(Response::new(convert::window_response(&key, &view))),
            Err(error) => {
                self.node.metrics.record_rejection(Rejection::NoPolicy);
                Err(command_error_status(&error))
            }
        }
    }
}

/// Records a refusal (or a grant of nothing) on the current span.
fn traced<T>(
    result: Result<Response<T>, Status>,
    granted_nothing: impl Fn(&T) -> bool,
) -> Result<Response<T>, Status> {
    match &result {
        Err(status) => telemetry::record_refusal(status),
        Ok(response) if granted_nothing(response.get_ref()) => {
            telemetry::record_denial(telemetry::DENIED_WINDOW_EXHAUSTED)
        }
        Ok(_) => {}
    }
    result
}

#[tonic::async_trait]
impl Coordinator for CoordinatorApi {
    #[tracing::instrument(name = "coordinator.lease", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region, tokens = request.get_ref().tokens))]
    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        traced(self.lease_call(request).await, |r| r.granted == 0)
    }

    #[tracing::instrument(name = "coordinator.reconcile", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn reconcile(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        traced(self.reconcile_call(request).await, |_| false)
    }

    #[tracing::instrument(name = "coordinator.pool_grant", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn pool_grant(
        &self,
        request: Request<pb::PoolGrantRequest>,
    ) -> Result<Response<pb::PoolGrantResponse>, Status> {
        traced(self.pool_grant_call(request).await, |r| {
            r.granted_total == 0
        })
    }

    #[tracing::instrument(name = "coordinator.get_window", level = "debug", skip_all, fields(
        key = %request.get_ref().key))]
    async fn get_window(
        &self,
        request: Request<pb::GetWindowRequest>,
    ) -> Result<Response<pb::GetWindowResponse>, Status> {
        traced(self.get_window_call(request).await, |_| false)
    }
}
