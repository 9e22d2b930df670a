//! The snapshot size and age a member exports: none before the first
//! snapshot, the stored size after building one, and the same size when a
//! restarted member loads it.

use leasehold_raft_store::{open_with_engine, PowerLossDisk};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;

#[tokio::test]
async fn snapshot_size_and_age_follow_the_stored_snapshot() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (_log, mut sm) = open_with_engine(disk.open_engine())?;
    let reader = sm.reader();
    assert_eq!(reader.snapshot().bytes(), 0);
    assert_eq!(reader.snapshot().age(), None);

    let built = sm.get_snapshot_builder().await.build_snapshot().await?;
    let bytes = reader.snapshot().bytes();
    assert!(
        bytes > built.snapshot.get_ref().len() as u64,
        "the stored record holds the snapshot's data and its metadata: {bytes}"
    );
    assert!(reader.snapshot().age().is_some());
    drop((sm, reader));

    let (_log, reopened) = open_with_engine(disk.open_engine())?;
    assert_eq!(
        reopened.reader().snapshot().bytes(),
        bytes,
        "a restarted member reports the snapshot it loaded"
    );
    Ok(())
}
