//! openraft 0.9 (storage v2) log and state-machine storage for the Leasehold
//! coordinator.
//!
//! # Layout
//! - [`types`]: the openraft [`TypeConfig`] and aliases (`Raft`, `Entry`, ...).
//! - [`engine`]: the narrow storage seam ([`StorageEngine`]) with its two
//!   engines, [`SledEngine`] (production) and [`PowerLossEngine`] (simulated
//!   power loss for chaos tests).
//! - [`codec`]: versioned postcard encoding of every persisted value.
#![deny(missing_docs)]

pub mod codec;
pub mod engine;
pub mod types;

pub use engine::{
    EngineError, Keyspace, PowerLossDisk, PowerLossEngine, PowerLossOptions, SledEngine,
    StorageEngine, WriteBatch,
};
pub use types::*;
