//! Stored data of a format version this build does not know is refused with
//! a typed error when the store opens, never a panic or a silent default.

mod support;

use std::io::Cursor;
use std::ops::Bound;

use leasehold_raft_store::{
    open_with_engine, CodecError, Keyspace, PowerLossDisk, StorageEngine, StoreError, Vote,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::RaftSnapshotBuilder;
use support::entries;

const FUTURE_VERSION: u8 = 99;

/// A disk holding a vote, log entries and a snapshot, all well formed.
async fn populated_disk() -> anyhow::Result<PowerLossDisk> {
    let disk = PowerLossDisk::new();
    let (mut log, mut sm) = open_with_engine(disk.open_engine())?;
    log.save_vote(&Vote::new(2, 1)).await?;
    log.blocking_append(entries(1, 3)).await?;
    sm.apply(entries(1, 3)).await?;
    sm.get_snapshot_builder().await.build_snapshot().await?;
    Ok(disk)
}

/// Rewrites the leading format version of every value in `keyspace`
/// (versions below 128 are a single varint byte).
fn stamp_future_version(engine: &dyn StorageEngine, keyspace: Keyspace) -> anyhow::Result<()> {
    for (key, mut value) in engine.range(keyspace, (Bound::Unbounded, Bound::Unbounded))? {
        anyhow::ensure!(
            matches!(value.first(), Some(1..=8)),
            "values start with a known format version"
        );
        value[0] = FUTURE_VERSION;
        engine.insert(keyspace, &key, value)?;
    }
    Ok(())
}

#[tokio::test]
async fn opening_data_of_an_unknown_version_fails_cleanly() -> anyhow::Result<()> {
    for keyspace in Keyspace::ALL {
        let disk = populated_disk().await?;
        stamp_future_version(&disk.open_engine(), keyspace)?;
        let error =
            open_with_engine(disk.open_engine()).expect_err("unknown version must be refused");
        assert!(
            matches!(
                error,
                StoreError::Codec(CodecError::UnknownVersion {
                    found: 99,
                    supported: 1..=8,
                    ..
                })
            ),
            "{keyspace:?}: {error}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn installing_a_snapshot_of_an_unknown_version_is_an_error() -> anyhow::Result<()> {
    let disk = populated_disk().await?;
    let (_log, mut sm) = open_with_engine(disk.open_engine())?;
    let snapshot = sm.get_current_snapshot().await?.expect("snapshot");
    let mut data = snapshot.snapshot.into_inner();
    data[0] = FUTURE_VERSION;
    let result = sm
        .install_snapshot(&snapshot.meta, Box::new(Cursor::new(data)))
        .await;
    assert!(result.is_err());
    assert_eq!(
        sm.last_applied(),
        snapshot.meta.last_log_id,
        "state untouched"
    );
    Ok(())
}
