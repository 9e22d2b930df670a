//! The openraft type configuration of the coordinator and the aliases the
//! rest of the workspace names instead of spelling out openraft generics.
//!
//! A Raft log entry carries one [`Proposal`] (a leader-stamped batch of
//! commands) as a [`SharedProposal`]; applying it yields one
//! [`ProposalResult`].

use std::sync::Arc;

use leasehold_core::coordinator::{Proposal, ProposalResult};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

openraft::declare_raft_types!(
    /// Type configuration of the Leasehold coordinator's Raft group.
    pub TypeConfig:
        D = SharedProposal,
        R = ProposalResult,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = crate::runtime::CoordinatorRuntime,
);

/// A coordinator member's id.
pub type NodeId = u64;
/// A coordinator member's address record.
pub type Node = openraft::BasicNode;
/// A running Raft member of the coordinator group.
pub type Raft = openraft::Raft<TypeConfig>;
/// One Raft log entry.
pub type Entry = openraft::Entry<TypeConfig>;
/// The payload of one Raft log entry.
pub type EntryPayload = openraft::EntryPayload<TypeConfig>;
/// Position of a log entry: (leader term, leader id, index).
pub type LogId = openraft::LogId<NodeId>;
/// A persisted Raft vote.
pub type Vote = openraft::Vote<NodeId>;
/// A membership configuration.
pub type Membership = openraft::Membership<NodeId, Node>;
/// A membership configuration together with the log id that introduced it.
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
/// Metadata of a state-machine snapshot.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
/// A state-machine snapshot: metadata plus the encoded state.
pub type Snapshot = openraft::Snapshot<TypeConfig>;
/// The storage error openraft expects from storage callbacks.
pub type StorageError = openraft::StorageError<NodeId>;
/// Raft metrics of one member.
pub type RaftMetrics = openraft::RaftMetrics<NodeId, Node>;
/// Peer RPC: append entries (also the heartbeat).
pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
/// Peer RPC reply to [`AppendEntriesRequest`].
pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<NodeId>;
/// Peer RPC: request a vote.
pub type VoteRequest = openraft::raft::VoteRequest<NodeId>;
/// Peer RPC reply to [`VoteRequest`].
pub type VoteResponse = openraft::raft::VoteResponse<NodeId>;
/// Peer RPC: one chunk of a snapshot being installed.
pub type InstallSnapshotRequest = openraft::raft::InstallSnapshotRequest<TypeConfig>;
/// Peer RPC reply to [`InstallSnapshotRequest`].
pub type InstallSnapshotResponse = openraft::raft::InstallSnapshotResponse<NodeId>;
/// What `Raft::client_write` returns once the proposal is applied.
pub type ClientWriteResponse = openraft::raft::ClientWriteResponse<TypeConfig>;

/// The proposal of a log entry, shared rather than copied: openraft clones
/// an entry for each replication stream and for the state machine, and the
/// log keeps its newest entries in memory, so with a plain [`Proposal`] every
/// reader of the tail copied every command (a sixteenth of the leader's CPU
/// under load). Encoded exactly as the [`Proposal`] it holds, so logs,
/// snapshots and peer messages are unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedProposal(Arc<Proposal>);

impl std::ops::Deref for SharedProposal {
    type Target = Proposal;

    fn deref(&self) -> &Proposal {
        &self.0
    }
}

impl From<Proposal> for SharedProposal {
    fn from(proposal: Proposal) -> Self {
        Self(Arc::new(proposal))
    }
}

impl Serialize for SharedProposal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SharedProposal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Proposal::deserialize(deserializer).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use leasehold_core::coordinator::Command;
    use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
    use leasehold_core::principal::Principal;
    use proptest::prelude::*;

    use super::*;

    fn lease(key: &str, tokens: u64, seq: u64) -> Command {
        Command::Lease {
            key: Key::new(key).unwrap(),
            region: RegionId::new("eu").unwrap(),
            tokens,
            request_id: Some(RequestId {
                client: ClientId::new("c").unwrap(),
                seq,
            }),
            caller: Principal::Region(RegionId::new("eu").unwrap()),
        }
    }

    proptest! {
        /// A shared proposal is written and read exactly as the proposal it
        /// holds: logs, snapshots and peer messages of either read as the other.
        #[test]
        fn a_shared_proposal_encodes_as_its_proposal(
            stamp_ms in any::<u64>(),
            leases in prop::collection::vec(("[a-z]{1,12}", any::<u64>(), any::<u64>()), 0..8),
            ticks in 0usize..3,
        ) {
            let mut commands: Vec<Command> =
                leases.iter().map(|(key, tokens, seq)| lease(key, *tokens, *seq)).collect();
            commands.extend(std::iter::repeat_n(Command::Tick, ticks));
            let proposal = Proposal { stamp_ms, commands };
            let shared = SharedProposal::from(proposal.clone());
            let plain = postcard::to_allocvec(&proposal).unwrap();
            prop_assert_eq!(&postcard::to_allocvec(&shared).unwrap(), &plain);
            let read: SharedProposal = postcard::from_bytes(&plain).unwrap();
            prop_assert_eq!(&*read, &proposal);
        }
    }
}
