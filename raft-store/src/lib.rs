//! openraft 0.9 (storage v2) log and state-machine storage for the Leasehold
//! coordinator.
//!
//! # Layout
//! - [`types`]: the openraft [`TypeConfig`] and aliases (`Raft`, `Entry`, ...).
//! - [`engine`]: the narrow storage seam ([`StorageEngine`]) with its
//!   engines: [`SegmentEngine`] (production: append-only segment files, one
//!   `fdatasync` per flush), `SledEngine` (feature `migrate-sled`: earlier
//!   builds' store, read to move it; a second implementation of the seam) and
//!   [`PowerLossEngine`] (simulated power loss for chaos tests).
//! - [`codec`]: versioned postcard encoding of every persisted value.
//! - [`log_store`]: [`LogStore`], the Raft log and vote.
//! - [`state_machine`]: [`StateMachineStore`], the coordinator state machine
//!   and its snapshots, with [`StateReader`] for reads.
//! - `records`: what is persisted under which key, with format versions.
//! - [`runtime`]: tokio for openraft, with election randomness a
//!   simulation can seed.
//! - [`backup`]: backup files of the state, and new clusters started from
//!   a backup or from a survivor of a lost quorum.
//!
//! # Use
//! ```no_run
//! # fn main() -> Result<(), leasehold_raft_store::StoreError> {
//! let (log_store, state_machine) = leasehold_raft_store::open_data_dir("/var/lib/leasehold")?;
//! let reader = state_machine.reader(); // keep for reads; move the stores into `Raft::new`
//! # Ok(()) }
//! ```
//!
//! # Log compaction
//! openraft decides when to snapshot and purge; set on the node's
//! `openraft::Config` (values the node should start from):
//! - `snapshot_policy: SnapshotPolicy::LogsSinceLast(5_000)` — a restart
//!   replays at most that many entries after the stored snapshot;
//! - `max_in_snapshot_log_to_keep: 1_000` — lets a briefly lagging follower
//!   catch up from the log instead of a full snapshot transfer;
//! - `purge_batch_size: 256` — bounds the size of one purge batch.
//!
//! Snapshots hold the whole coordinator state (postcard, versioned), so the
//! threshold trades restart replay time against snapshot write cost.
#![deny(missing_docs)]

pub mod backup;
pub mod codec;
pub mod engine;
mod error;
pub mod log_store;
mod recent_entries;
mod records;
pub mod runtime;
pub mod state_machine;
pub mod types;

use std::path::Path;
use std::sync::Arc;

pub use codec::CodecError;
#[cfg(feature = "migrate-sled")]
pub use engine::SledEngine;
pub use engine::{
    EngineError, Keyspace, PowerLossDisk, PowerLossEngine, PowerLossOptions, SegmentEngine,
    SegmentOptions, SegmentStats, StorageEngine, WriteBatch,
};
pub use error::StoreError;
pub use log_store::{FlushMode, LogStore};
pub use records::SnapshotEnvelope;
pub use runtime::{seed_election_rng, unseed_election_rng, CoordinatorRuntime};
pub use state_machine::{SnapshotStats, StateMachineStore, StateReader};
pub use types::*;

/// Opens (creating if needed) the Raft store in directory `path` on sled
/// (log appends flushed in the background).
#[cfg(feature = "migrate-sled")]
pub fn open_sled(path: impl AsRef<Path>) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with(SledEngine::open(path)?, FlushMode::Background)
}

/// Opens (creating if needed) the Raft store in directory `path` on the
/// append-only [`SegmentEngine`] (log appends flushed in the background).
pub fn open_segments(path: impl AsRef<Path>) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with(SegmentEngine::open(path)?, FlushMode::Background)
}

/// Subdirectory of a member's data directory holding its Raft store.
pub const STORE_DIR: &str = "store";
/// Subdirectory where earlier builds kept the Raft store on sled; moved to
/// [`STORE_DIR`] when found.
pub const SLED_STORE_DIR: &str = "raft";

/// Opens the Raft store of a member whose data directory is `data_dir`
/// (created if needed), on the [`SegmentEngine`] in [`STORE_DIR`].
///
/// A store that earlier builds kept on sled (in [`SLED_STORE_DIR`]) is, with
/// the `migrate-sled` feature, copied first, keyspace by keyspace, into a
/// new segment store that is flushed and renamed into place before the
/// sled directory is removed; a crash at any point leaves either the sled
/// store or the complete new one, and the next open finishes the job.
/// Without the feature it is refused ([`StoreError::SledStoreFound`]),
/// untouched.
pub fn open_data_dir(
    data_dir: impl AsRef<Path>,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    let data_dir = data_dir.as_ref();
    let (store, sled_store) = (data_dir.join(STORE_DIR), data_dir.join(SLED_STORE_DIR));
    let io = |error: std::io::Error| StoreError::from(EngineError::Backend(Box::new(error)));
    if !store.exists() && sled_store.exists() {
        move_sled_store(data_dir, &sled_store, &store)?;
    }
    if store.exists() && sled_store.exists() {
        // The move finished (the new store is complete once renamed).
        std::fs::remove_dir_all(&sled_store).map_err(io)?;
    }
    open_segments(&store)
}

/// Refuses an earlier build's sled store: this build cannot read it.
#[cfg(not(feature = "migrate-sled"))]
fn move_sled_store(_: &Path, sled_store: &Path, _: &Path) -> Result<(), StoreError> {
    Err(StoreError::SledStoreFound {
        path: sled_store.display().to_string(),
    })
}

/// Moves an earlier build's sled store to segment files (see
/// [`open_data_dir`]).
#[cfg(feature = "migrate-sled")]
fn move_sled_store(data_dir: &Path, sled_store: &Path, store: &Path) -> Result<(), StoreError> {
    let io = |error: std::io::Error| StoreError::from(EngineError::Backend(Box::new(error)));
    {
        let moving = data_dir.join(format!("{STORE_DIR}.moving"));
        if moving.exists() {
            std::fs::remove_dir_all(&moving).map_err(io)?;
        }
        copy_engine(
            &SledEngine::open(sled_store)?,
            &SegmentEngine::open(&moving)?,
        )?;
        std::fs::rename(&moving, store).map_err(io)?;
        std::fs::File::open(data_dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io)?;
        tracing::info!(from = %sled_store.display(), to = %store.display(), "moved the Raft store from sled to segment files");
    }
    Ok(())
}

/// Copies every key of every keyspace of `from` into `to` and flushes it.
#[cfg(feature = "migrate-sled")]
fn copy_engine(from: &dyn StorageEngine, to: &dyn StorageEngine) -> Result<(), StoreError> {
    use std::ops::Bound::Unbounded;
    for keyspace in Keyspace::ALL {
        let mut batch = WriteBatch::new();
        for (key, value) in from.range(keyspace, (Unbounded, Unbounded))? {
            batch.insert(keyspace, key, value);
        }
        to.apply_batch(batch)?;
    }
    to.flush()?;
    Ok(())
}

/// Opens the Raft store on any [`StorageEngine`] (e.g. a
/// [`PowerLossEngine`] from [`PowerLossDisk::open_engine`] in simulations).
/// Fails with a typed error if stored data has a format this build cannot
/// read.
///
/// Log appends are flushed inline ([`FlushMode::Inline`]): no thread, so a
/// simulation stays deterministic.
pub fn open_with_engine(
    engine: impl StorageEngine,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with(engine, FlushMode::Inline)
}

/// [`open_with_engine`] with the given [`FlushMode`].
pub fn open_with(
    engine: impl StorageEngine,
    flush_mode: FlushMode,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    let engine: Arc<dyn StorageEngine> = Arc::new(engine);
    let log_store = LogStore::open(engine.clone(), flush_mode)?;
    let state_machine = StateMachineStore::open(engine)?;
    Ok((log_store, state_machine))
}
