//! openraft 0.9 (storage v2) log and state-machine storage for the Leasehold
//! coordinator.
//!
//! # Layout
//! - [`types`]: the openraft [`TypeConfig`] and aliases (`Raft`, `Entry`, ...).
//! - [`engine`]: the narrow storage seam ([`StorageEngine`]) with its two
//!   engines, [`SledEngine`] (production) and [`PowerLossEngine`] (simulated
//!   power loss for chaos tests).
//! - [`codec`]: versioned postcard encoding of every persisted value.
//! - [`log_store`]: [`LogStore`], the Raft log and vote.
//! - [`state_machine`]: [`StateMachineStore`], the coordinator state machine
//!   and its snapshots, with [`StateReader`] for reads.
//! - `records`: what is persisted under which key, with format versions.
//! - [`runtime`]: tokio for openraft, with election randomness a
//!   simulation can seed.
//!
//! # Use
//! ```no_run
//! # fn main() -> Result<(), leasehold_raft_store::StoreError> {
//! let (log_store, state_machine) = leasehold_raft_store::open_sled("/var/lib/leasehold/raft")?;
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

pub mod codec;
pub mod engine;
mod error;
pub mod log_store;
mod records;
pub mod runtime;
pub mod state_machine;
pub mod types;

use std::path::Path;
use std::sync::Arc;

pub use codec::CodecError;
pub use engine::{
    EngineError, Keyspace, PowerLossDisk, PowerLossEngine, PowerLossOptions, SledEngine,
    StorageEngine, WriteBatch,
};
pub use error::StoreError;
pub use log_store::LogStore;
pub use records::SnapshotEnvelope;
pub use runtime::{seed_election_rng, unseed_election_rng, CoordinatorRuntime};
pub use state_machine::{SnapshotStats, StateMachineStore, StateReader};
pub use types::*;

/// Opens (creating if needed) the Raft store in directory `path` on sled.
pub fn open_sled(path: impl AsRef<Path>) -> Result<(LogStore, StateMachineStore), StoreError> {
    open_with_engine(SledEngine::open(path)?)
}

/// Opens the Raft store on any [`StorageEngine`] (e.g. a
/// [`PowerLossEngine`] from [`PowerLossDisk::open_engine`] in simulations).
/// Fails with a typed error if stored data has a format this build cannot
/// read.
pub fn open_with_engine(
    engine: impl StorageEngine,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    let engine: Arc<dyn StorageEngine> = Arc::new(engine);
    let log_store = LogStore::open(engine.clone())?;
    let state_machine = StateMachineStore::open(engine)?;
    Ok((log_store, state_machine))
}
