//! The Raft stores of a member's groups on disk: shard 0's under the
//! member's data directory ([`open_stores`]), each shard past 0's under
//! `data_dir/shards/<id>` ([`on_disk`], the [`ShardStoreOpener`] of a real
//! member).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use leasehold_core::shard::ShardId;
use leasehold_raft_store::{LogStore, StateMachineStore};

use crate::config::NodeConfig;
use crate::error::NodeError;

/// The Raft log store and state machine of one member, as opened by
/// `leasehold_raft_store::open_data_dir` or `open_with_engine`.
pub type CoordinatorStores = (LogStore, StateMachineStore);

/// Opens (creating if needed) the Raft store of a shard past 0.
pub type ShardStoreOpener =
    Arc<dyn Fn(ShardId) -> Result<CoordinatorStores, NodeError> + Send + Sync>;

/// Opens the Raft store of `config.data_dir` (created if missing; a store
/// of an earlier build on sled is moved to segment files by a build with
/// the `migrate-sled` feature and refused, with that advice, otherwise).
pub fn open_stores(config: &NodeConfig) -> Result<CoordinatorStores, NodeError> {
    open_stores_in(&config.data_dir)
}

/// The directory of shard `shard`'s store under a member's data directory.
pub fn shard_dir(data_dir: &Path, shard: ShardId) -> PathBuf {
    data_dir.join("shards").join(shard.0.to_string())
}

/// Opens each shard's store on disk under `data_dir/shards/<id>`.
pub fn on_disk(data_dir: PathBuf) -> ShardStoreOpener {
    Arc::new(move |shard| open_stores_in(&shard_dir(&data_dir, shard)))
}

/// Opens the Raft store in `dir`, creating the directory if missing.
fn open_stores_in(dir: &Path) -> Result<CoordinatorStores, NodeError> {
    std::fs::create_dir_all(dir).map_err(|source| NodeError::DataDir {
        path: dir.to_path_buf(),
        source,
    })?;
    leasehold_raft_store::open_data_dir(dir).map_err(|e| NodeError::Storage {
        path: dir.to_path_buf(),
        message: e.to_string(),
    })
}
