//! The openraft type configuration of the coordinator and the aliases the
//! rest of the workspace names instead of spelling out openraft generics.
//!
//! A Raft log entry carries one [`Proposal`] (a leader-stamped batch of
//! commands); applying it yields one [`ProposalResult`].

use leasehold_core::coordinator::{Proposal, ProposalResult};

openraft::declare_raft_types!(
    /// Type configuration of the Leasehold coordinator's Raft group.
    pub TypeConfig:
        D = Proposal,
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
