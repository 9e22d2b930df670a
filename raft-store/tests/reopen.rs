//! Everything acknowledged survives closing and reopening a sled directory.

mod support;

use leasehold_raft_store::{open_sled, SnapshotEnvelope, Vote};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use support::{entries, log_id};

#[tokio::test]
async fn acknowledged_log_vote_and_snapshot_survive_reopening() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let vote = Vote::new_committed(1, 1);
    let state_at_8 = {
        let (mut log, mut sm) = open_sled(dir.path())?;
        log.save_vote(&vote).await?;
        log.blocking_append(entries(1, 10)).await?;
        log.save_committed(Some(log_id(1, 8))).await?;
        sm.apply(entries(1, 6)).await?;
        let snapshot = sm.get_snapshot_builder().await.build_snapshot().await?;
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 6)));
        sm.apply(entries(7, 8)).await?;
        log.purge(log_id(1, 3)).await?;
        sm.read(|state| state.clone())
    };

    let (mut log, mut sm) = open_sled(dir.path())?;
    assert_eq!(log.read_vote().await?, Some(vote));
    assert_eq!(log.read_committed().await?, Some(log_id(1, 8)));
    let log_state = log.get_log_state().await?;
    assert_eq!(log_state.last_purged_log_id, Some(log_id(1, 3)));
    assert_eq!(log_state.last_log_id, Some(log_id(1, 10)));
    assert_eq!(log.try_get_log_entries(0..=10).await?, entries(4, 10));

    let snapshot = sm.get_current_snapshot().await?.expect("a stored snapshot");
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 6)));
    let envelope: SnapshotEnvelope =
        leasehold_raft_store::codec::decode(snapshot.snapshot.get_ref())?;
    assert_eq!(envelope.last_applied, Some(log_id(1, 6)));

    // The state machine restarts from the snapshot, membership included...
    let (last_applied, membership) = sm.applied_state().await?;
    assert_eq!(last_applied, Some(log_id(1, 6)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 1)));
    assert_eq!(sm.reader().last_applied(), Some(log_id(1, 6)));
    // ...and replaying the committed entries after it restores the exact state.
    let replay = log.try_get_log_entries(7..=8).await?;
    sm.apply(replay).await?;
    assert_eq!(sm.read(|state| state.clone()), state_at_8);
    assert_eq!(sm.last_applied(), Some(log_id(1, 8)));
    Ok(())
}

#[tokio::test]
async fn truncation_is_durable() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut log, _sm) = open_sled(dir.path())?;
        log.blocking_append(entries(1, 9)).await?;
        log.truncate(log_id(1, 5)).await?;
    }
    let (mut log, _sm) = open_sled(dir.path())?;
    assert_eq!(log.get_log_state().await?.last_log_id, Some(log_id(1, 4)));
    assert_eq!(log.try_get_log_entries(0..100).await?, entries(1, 4));
    Ok(())
}
