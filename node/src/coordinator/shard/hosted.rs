//! One shard past 0 hosted on this member: its group's context and the
//! tasks that run with it, and what a pass reads of its membership.

use std::sync::Arc;

use leasehold_raft_store::{NodeId, Raft};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::coordinator::context::NodeContext;

/// One hosted shard.
pub(super) struct Hosted {
    /// Its group's context.
    pub(super) context: Arc<NodeContext>,
    /// Since when its group has known no leader (as of the last pass).
    pub(super) leaderless_since: Option<tokio::time::Instant>,
    /// Turns true to stop its tasks.
    pub(super) stop: watch::Sender<bool>,
    /// Its batcher and clock ticks.
    pub(super) tasks: Vec<JoinHandle<()>>,
}

/// Whether `raft` belongs to a group yet (it has a membership: formed
/// here, or joined by its leader).
pub(super) fn in_any_group(raft: &Raft) -> bool {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .next()
        .is_some()
}

/// Whether `raft`'s group counts `member` (voter or learner).
pub(super) fn in_group(raft: &Raft, member: NodeId) -> bool {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .any(|(id, _)| *id == member)
}
