//! The narrow storage seam under the Raft store: a few named keyspaces of
//! ordered byte keys, atomic write batches, and an explicit `flush`.
//!
//! Everything above this module (log store, state machine) speaks only
//! [`StorageEngine`]; swapping the on-disk engine touches this module alone.
//! Two engines implement it:
//! - [`SegmentEngine`]: append-only segment files (production, ADR 0012).
//! - `SledEngine` (feature `migrate-sled`): sled 0.34 on a directory, with
//!   background flushing off, so data is durable exactly when
//!   [`StorageEngine::flush`] returns; read to move earlier builds' stores.
//! - [`PowerLossEngine`]: in memory, over a [`PowerLossDisk`] that outlives a
//!   simulated process and can [`PowerLossDisk::crash`], discarding every
//!   write not yet flushed (models power loss in simulations).
//!
//! Contract every engine keeps (the laws the engine tests check):
//! - a batch is applied atomically and is visible to reads once
//!   [`StorageEngine::apply_batch`] returns;
//! - after [`StorageEngine::flush`] returns `Ok`, every write applied before
//!   the call survives a crash; writes after it may not;
//! - keys iterate in lexicographic byte order within a keyspace, and
//!   keyspaces never see each other's keys.

mod power_loss;
mod segment_engine;
#[cfg(feature = "migrate-sled")]
mod sled_engine;

use std::ops::Bound;

pub use power_loss::{PowerLossDisk, PowerLossEngine, PowerLossOptions};
pub use segment_engine::{SegmentEngine, SegmentOptions, SegmentStats};
#[cfg(feature = "migrate-sled")]
pub use sled_engine::SledEngine;

/// A named, separately ordered set of keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Keyspace {
    /// Raft log entries keyed by big-endian index.
    Log,
    /// Vote, committed log id, last purged log id.
    LogMeta,
    /// The latest state-machine snapshot.
    StateMachine,
}

impl Keyspace {
    /// Every keyspace, in a fixed order.
    pub const ALL: [Keyspace; 3] = [Keyspace::Log, Keyspace::LogMeta, Keyspace::StateMachine];
}

/// One write of a [`WriteBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    /// Insert or overwrite `key` with `value`.
    Insert {
        /// Target keyspace.
        keyspace: Keyspace,
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Remove `key` if present.
    Remove {
        /// Target keyspace.
        keyspace: Keyspace,
        /// The key.
        key: Vec<u8>,
    },
}

/// Writes applied together, all or none, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteBatch {
    ops: Vec<WriteOp>,
}

impl WriteBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds an insert.
    pub fn insert(&mut self, keyspace: Keyspace, key: impl Into<Vec<u8>>, value: Vec<u8>) {
        self.ops.push(WriteOp::Insert {
            keyspace,
            key: key.into(),
            value,
        });
    }
    /// Adds a removal.
    pub fn remove(&mut self, keyspace: Keyspace, key: impl Into<Vec<u8>>) {
        self.ops.push(WriteOp::Remove {
            keyspace,
            key: key.into(),
        });
    }
    /// The writes, in order.
    pub fn ops(&self) -> &[WriteOp] {
        &self.ops
    }
    /// Whether the batch holds no write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// An inclusive/exclusive/unbounded key range within one keyspace.
pub type KeyRange<'a> = (Bound<&'a [u8]>, Bound<&'a [u8]>);

/// A key with its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Failure of the storage engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The underlying engine failed.
    #[error("storage engine: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// This handle belongs to a process that has crashed (power-loss
    /// simulation); reopen the disk.
    #[error("storage handle is from before a simulated crash")]
    Crashed,
}

/// Ordered key-value storage with named keyspaces, atomic batches and an
/// explicit durability point. See the module docs for the laws.
pub trait StorageEngine: Send + Sync + 'static {
    /// The value of `key`, if any.
    fn get(&self, keyspace: Keyspace, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError>;

    /// All entries with keys in `range`, in ascending key order. An empty or
    /// inverted range yields nothing.
    fn range(&self, keyspace: Keyspace, range: KeyRange<'_>) -> Result<Vec<KeyValue>, EngineError>;

    /// The entry with the smallest key, if any.
    fn first(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError>;

    /// The entry with the largest key, if any.
    fn last(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError>;

    /// Applies every write of `batch` atomically.
    fn apply_batch(&self, batch: WriteBatch) -> Result<(), EngineError>;

    /// Makes every write applied so far durable; returns once it is.
    fn flush(&self) -> Result<(), EngineError>;

    /// Inserts one key (not yet durable; see [`StorageEngine::flush`]).
    fn insert(&self, keyspace: Keyspace, key: &[u8], value: Vec<u8>) -> Result<(), EngineError> {
        let mut batch = WriteBatch::new();
        batch.insert(keyspace, key, value);
        self.apply_batch(batch)
    }

    /// Removes one key (not yet durable; see [`StorageEngine::flush`]).
    fn remove(&self, keyspace: Keyspace, key: &[u8]) -> Result<(), EngineError> {
        let mut batch = WriteBatch::new();
        batch.remove(keyspace, key);
        self.apply_batch(batch)
    }
}

/// Whether `range` selects no key at all (start after end, or an empty
/// half-open interval); such ranges would make ordered-map lookups panic.
pub(crate) fn is_empty_range(range: &KeyRange<'_>) -> bool {
    match (range.0, range.1) {
        (Bound::Included(start), Bound::Included(end)) => start > end,
        (Bound::Included(start), Bound::Excluded(end))
        | (Bound::Excluded(start), Bound::Included(end))
        | (Bound::Excluded(start), Bound::Excluded(end)) => start >= end,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
