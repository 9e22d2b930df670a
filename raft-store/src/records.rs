//! What the store persists, the keys it persists it under, and the format
//! version of each record (see [`crate::codec`]).

use leasehold_core::coordinator::CoordinatorState;
use serde::{Deserialize, Serialize};

use crate::codec::Persisted;
use crate::types::{Entry, LogId, SnapshotMeta, StoredMembership, Vote};

/// [`Keyspace::LogMeta`](crate::Keyspace::LogMeta) key of the vote.
pub(crate) const VOTE_KEY: &[u8] = b"vote";
/// [`Keyspace::LogMeta`](crate::Keyspace::LogMeta) key of the committed log id.
pub(crate) const COMMITTED_KEY: &[u8] = b"committed";
/// [`Keyspace::LogMeta`](crate::Keyspace::LogMeta) key of the last purged log id.
pub(crate) const LAST_PURGED_KEY: &[u8] = b"last_purged";
/// [`Keyspace::StateMachine`](crate::Keyspace::StateMachine) key of the current snapshot.
pub(crate) const SNAPSHOT_KEY: &[u8] = b"snapshot";

/// [`Keyspace::Log`](crate::Keyspace::Log) key of the entry at `index`:
/// big-endian, so byte order is index order.
pub(crate) fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl Persisted for Entry {
    const KIND: &'static str = "raft log entry";
    const FORMAT_VERSION: u32 = 1;
}

impl Persisted for Vote {
    const KIND: &'static str = "raft vote";
    const FORMAT_VERSION: u32 = 1;
}

impl Persisted for LogId {
    const KIND: &'static str = "raft log id";
    const FORMAT_VERSION: u32 = 1;
}

/// The bytes of a state-machine snapshot: everything needed to rebuild the
/// state machine as of `last_applied`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEnvelope {
    /// The last log entry reflected in `state`.
    pub last_applied: Option<LogId>,
    /// The last membership applied at or before `last_applied`.
    pub membership: StoredMembership,
    /// The coordinator state.
    pub state: CoordinatorState,
}

impl Persisted for SnapshotEnvelope {
    const KIND: &'static str = "state-machine snapshot";
    const FORMAT_VERSION: u32 = 1;
}

/// The current snapshot as kept on disk: openraft's metadata plus the
/// encoded [`SnapshotEnvelope`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: Vec<u8>,
}

impl Persisted for StoredSnapshot {
    const KIND: &'static str = "stored snapshot";
    const FORMAT_VERSION: u32 = 1;
}
