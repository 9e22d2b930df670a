//! The API of one group ([`CoordinatorApi`]) and what its RPCs share:
//! who sent a call ([`Caller`]), the region a call may act for, the
//! counted `INVALID_ARGUMENT` refusal and proposing a write. Each RPC's
//! methods are in a file of their own beside this one.

use std::sync::Arc;

use leasehold_core::coordinator::{Command, Outcome};
use leasehold_core::pool::desk::{GrantNotes, PoolDesk};
use leasehold_core::principal::Principal;
use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::convert::InvalidField;
use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::v1 as pb;
use tonic::{Request, Status};

use crate::auth::{authorize_region, PeerInfo};
use crate::coordinator::context::NodeContext;
use crate::coordinator::leader::command_error_status;
use crate::coordinator::metrics::Rejection;

/// Who sent a call, as its connection proved it.
pub struct Caller {
    /// The principal its certificate proves (anonymous in plaintext).
    pub principal: Principal,
    /// Its peer, for the refusals counted against it.
    pub peer: Option<PeerInfo>,
}

impl Caller {
    /// The sender of `request`.
    pub fn of<T>(request: &Request<T>) -> Self {
        Self {
            principal: crate::auth::caller(request),
            peer: request.extensions().get::<PeerInfo>().cloned(),
        }
    }
}

/// Answers `leasehold.v1.Coordinator` calls for one group of a member.
#[derive(Clone)]
pub struct CoordinatorApi {
    pub(super) node: Arc<NodeContext>,
    /// The leader's pool memory — demand reports, the regions of recent
    /// windows, capped asks — held while leading (see
    /// `leasehold_core::pool::desk`).
    pub(super) pool_desk: Arc<std::sync::Mutex<PoolDesk>>,
}

impl CoordinatorApi {
    /// The API over a group's shared context.
    pub fn new(node: Arc<NodeContext>) -> Self {
        Self {
            node,
            pool_desk: Arc::default(),
        }
    }

    /// The Raft handle of this API's group.
    pub fn raft(&self) -> leasehold_raft_store::Raft {
        self.node.raft.clone()
    }

    /// The group this API answers for.
    pub fn context(&self) -> &Arc<NodeContext> {
        &self.node
    }

    /// The `INVALID_ARGUMENT` refusal of `error`, counted.
    pub(super) fn invalid(&self, error: InvalidField) -> Status {
        self.node
            .metrics
            .record_rejection(Rejection::InvalidArgument);
        Status::from(error)
    }

    /// Refuses unless `caller` may act for `region`.
    pub(super) fn require_region(&self, caller: &Caller, region: &str) -> Result<(), Status> {
        self.require_region_in(caller, region, "Coordinator")
    }

    /// Refuses unless `caller` may act for `region`, the refusal counted
    /// against the caller's peer as one of `method`'s.
    pub(super) fn require_region_in(
        &self,
        caller: &Caller,
        region: &str,
        method: &'static str,
    ) -> Result<(), Status> {
        authorize_region(&caller.principal, region).map_err(|refusal| {
            self.node
                .metrics
                .auth
                .refuse(caller.peer.as_ref(), method, refusal)
        })
    }

    /// Proposes `command` at the group's leader; a rejection is its
    /// error status.
    pub(super) async fn write(&self, command: Command) -> Result<Outcome, Status> {
        self.node.require_leader()?;
        let outcome = self.node.propose(command).await?;
        match outcome {
            Outcome::Rejected(error) => Err(command_error_status(&error)),
            outcome => Ok(outcome),
        }
    }
}

/// `notes` in a pool grant's answer: the hints and the demand totals.
pub(super) fn add_notes(response: &mut pb::PoolGrantResponse, notes: GrantNotes) {
    if let Some(standing) = notes.standing {
        response.guarantee_total = standing.guarantee;
        response.ceiling_total = standing.ceiling;
    }
    if let Some(expected) = notes.expected {
        response.expected_guarantee_total = expected.guarantee;
        response.expected_ceiling_total = expected.ceiling;
    }
    response.reserved_unheld_total = notes.reserved_unheld;
    response.retired_kept_total = notes.retired_kept;
    response.late_released_before_total = notes.late_released_before;
    response.tenant_demands = convert::tenant_demands_to_wire(&notes.tenant_demands);
    response.settled_tenant_demands =
        convert::tenant_demands_to_wire(&notes.settled_tenant_demands);
}

/// The refusal of an outcome a call cannot have.
pub(super) fn unexpected(outcome: &Outcome) -> Status {
    refusal(Reason::Internal, format!("unexpected outcome {outcome:?}"))
}
