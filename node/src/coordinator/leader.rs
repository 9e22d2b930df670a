//! Who leads, as this member sees it, and the gRPC errors that say so.
//!
//! A member that is not the leader answers writes and linearizable reads
//! with `FAILED_PRECONDITION`, naming the leader in the message and in the
//! metadata keys `leasehold-leader-id` / `leasehold-leader-addr` (ADR 0004).
//! With no leader known it answers `UNAVAILABLE` at once.

use leasehold_core::coordinator::CommandError;
use leasehold_proto::refusal::{refusal, refusal_with, Reason, KEY};
use leasehold_proto::LeaderHint;
use leasehold_raft_store::{NodeId, Raft, RaftMetrics};
use openraft::ServerState;
use tonic::Status;

use super::batcher::ProposeError;
use super::metrics::{NodeMetrics, Rejection};

/// The leader as one member currently sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderView {
    /// This member leads.
    Me,
    /// Another member leads; its address when the membership names it.
    Other {
        /// Its node id.
        id: NodeId,
        /// Its `host:port`.
        addr: Option<String>,
    },
    /// No leader is known (election under way, no quorum, or not initialised).
    Unknown {
        /// Whether this member has ever been part of a cluster.
        initialized: bool,
    },
}

impl LeaderView {
    /// Reads the view from Raft metrics.
    pub fn from_metrics(metrics: &RaftMetrics) -> Self {
        let initialized = metrics
            .membership_config
            .membership()
            .voter_ids()
            .next()
            .is_some();
        match metrics.current_leader {
            Some(id) if id == metrics.id && metrics.state == ServerState::Leader => LeaderView::Me,
            Some(id) if id != metrics.id => {
                let addr = metrics
                    .membership_config
                    .membership()
                    .get_node(&id)
                    .map(|node| node.addr.clone());
                LeaderView::Other { id, addr }
            }
            _ => LeaderView::Unknown { initialized },
        }
    }

    /// The current view of `raft`.
    pub fn of(raft: &Raft) -> Self {
        Self::from_metrics(&raft.metrics().borrow())
    }
}

/// The error for a request that needs the leader, given the leader this
/// member names (an empty hint: none is known).
pub fn not_leader_status(hint: &LeaderHint, initialized: bool) -> Status {
    match hint.leader_id {
        Some(id) => hint.not_leader(format!(
            "this member is not the leader; the leader is node {id} at {}",
            hint.leader_addr.as_deref().unwrap_or("an unknown address")
        )),
        None if !initialized => refusal(
            Reason::NotInitialized,
            "this member is not initialised and knows no leader; run `leasehold cluster init` or add it to a cluster",
        ),
        None => refusal(
            Reason::NoLeader,
            "no leader is known (election in progress or no quorum); retry shortly",
        ),
    }
}

/// Fails fast unless this member leads: the error carries the leader hint.
pub fn require_leader(raft: &Raft, metrics: &NodeMetrics) -> Result<(), Status> {
    match LeaderView::of(raft) {
        LeaderView::Me => Ok(()),
        LeaderView::Other { id, addr } => {
            metrics.record_rejection(Rejection::NotLeader);
            Err(not_leader_status(&LeaderHint::new(Some(id), addr), true))
        }
        LeaderView::Unknown { initialized } => {
            metrics.record_rejection(Rejection::Unavailable);
            Err(not_leader_status(&LeaderHint::default(), initialized))
        }
    }
}

/// The gRPC error for a failed proposal.
pub fn propose_error_status(error: ProposeError, metrics: &NodeMetrics) -> Status {
    match error {
        ProposeError::NotLeader { leader } => {
            metrics.record_rejection(Rejection::NotLeader);
            not_leader_status(&leader, true)
        }
        ProposeError::Timeout(ms) => {
            metrics.record_rejection(Rejection::Unavailable);
            refusal(
                Reason::NoQuorum,
                format!(
                    "the write was not committed within {ms} ms (no quorum?); retrying with the same request id is safe"
                ),
            )
        }
        ProposeError::Unavailable(why) => {
            metrics.record_rejection(Rejection::Unavailable);
            refusal(Reason::ShuttingDown, why)
        }
        ProposeError::Overloaded => {
            metrics.record_rejection(Rejection::Overloaded);
            refusal(
                Reason::Overloaded,
                "too many requests queued at the leader; retry with backoff",
            )
        }
    }
}

/// The gRPC error for a command the state machine refused.
pub fn command_error_status(error: &CommandError) -> Status {
    match error {
        CommandError::InvalidArgument(why) => refusal(Reason::InvalidField, why.clone()),
        CommandError::NoPolicy(key) => refusal_with(
            Reason::NoPolicy,
            format!("no policy matches key {key:?}; set one with `leasehold policy set`"),
            [(KEY, key.to_string())],
        ),
        CommandError::WrongKind(why) => refusal(Reason::WrongKeyKind, why.clone()),
        CommandError::RequestIdReused(why) => refusal(Reason::RequestIdReused, why.clone()),
        CommandError::SessionExpired(why) => refusal(Reason::SessionExpired, why.clone()),
        CommandError::SessionsExhausted(why) => refusal(Reason::SessionsExhausted, why.clone()),
        // The group's own refusal: the key's slot is moving to or from it,
        // or the member routed by a placement behind the group's (routing
        // by the placement refuses NOT_OWNER before anything is proposed).
        CommandError::NotOwner(why) => refusal(Reason::SlotMoving, why.clone()),
        CommandError::Placement(why) => refusal(Reason::PlacementRefused, why.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn hint_carries_id_and_address_in_metadata_and_message() {
        let hint = LeaderHint::new(Some(2), Some("127.0.0.1:7102".into()));
        let status = not_leader_status(&hint, true);
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(LeaderHint::from_metadata(status.metadata()), hint);
        assert_eq!(LeaderHint::from_error_info(&status), hint);
        assert!(status.message().contains("node 2 at 127.0.0.1:7102"));
        let id_only = not_leader_status(&LeaderHint::new(Some(2), None), true);
        assert!(id_only.message().contains("node 2 at an unknown address"));
    }

    #[test]
    fn no_leader_is_unavailable_and_says_whether_initialised() {
        let fresh = not_leader_status(&LeaderHint::default(), false);
        assert_eq!(fresh.code(), Code::Unavailable);
        assert!(fresh.message().contains("not initialised"));
        assert_eq!(
            not_leader_status(&LeaderHint::default(), true).code(),
            Code::Unavailable
        );
    }

    #[test]
    fn command_errors_map_to_their_codes() {
        assert_eq!(
            command_error_status(&CommandError::NoPolicy("k".into())).code(),
            Code::NotFound
        );
        assert_eq!(
            command_error_status(&CommandError::InvalidArgument("x".into())).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            command_error_status(&CommandError::WrongKind("x".into())).code(),
            Code::FailedPrecondition
        );
    }
}
