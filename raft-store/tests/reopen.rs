//! Everything acknowledged survives closing and reopening a directory, on
//! both disk engines; a store of an earlier build on sled is moved to
//! segment files with everything in it (`migrate-sled`), or refused,
//! untouched, with the way to migrate it (the default build).

mod support;

use std::path::Path;

#[cfg(feature = "migrate-sled")]
use leasehold_raft_store::open_sled;
use leasehold_raft_store::{
    open_data_dir, open_segments, LogStore, SnapshotEnvelope, StateMachineStore, StoreError, Vote,
    SLED_STORE_DIR, STORE_DIR,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use support::{entries, log_id};

type Opener = fn(&Path) -> Result<(LogStore, StateMachineStore), StoreError>;

const ENGINES: &[(&str, Opener)] = &[
    ("segments", |p| open_segments(p)),
    #[cfg(feature = "migrate-sled")]
    ("sled", |p| open_sled(p)),
];

#[tokio::test]
async fn acknowledged_log_vote_and_snapshot_survive_reopening() -> anyhow::Result<()> {
    for &(name, open) in ENGINES {
        println!("engine: {name}");
        log_vote_and_snapshot_survive(open, open).await?;
    }
    Ok(())
}

/// Without `migrate-sled`, a data directory holding an earlier build's
/// sled store is refused — untouched, nothing created beside it — with the
/// way to migrate it.
#[cfg(not(feature = "migrate-sled"))]
#[test]
fn a_store_on_sled_is_refused_untouched_with_the_way_to_migrate() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sled_dir = dir.path().join(SLED_STORE_DIR);
    std::fs::create_dir(&sled_dir)?;
    std::fs::write(sled_dir.join("db"), b"an earlier build's data")?;
    let Err(refused) = open_data_dir(dir.path()) else {
        anyhow::bail!("a sled store was opened by a build that cannot read it");
    };
    assert!(
        matches!(refused, StoreError::SledStoreFound { .. }),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("--features migrate-sled"),
        "{refused}"
    );
    assert_eq!(
        std::fs::read(sled_dir.join("db"))?,
        b"an earlier build's data"
    );
    assert!(!dir.path().join(STORE_DIR).exists());
    Ok(())
}

/// A store on sled written by an earlier build is found in the data
/// directory and moved; everything in it is there after the move.
#[cfg(feature = "migrate-sled")]
#[tokio::test]
async fn a_store_on_sled_is_moved_to_segments_with_everything_in_it() -> anyhow::Result<()> {
    fn earlier_build(data_dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
        open_sled(data_dir.join(SLED_STORE_DIR))
    }
    fn this_build(data_dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
        let opened = open_data_dir(data_dir)?;
        assert!(data_dir.join(STORE_DIR).is_dir());
        assert!(
            !data_dir.join(SLED_STORE_DIR).exists(),
            "the sled store is removed once moved"
        );
        Ok(opened)
    }
    log_vote_and_snapshot_survive(earlier_build, this_build).await
}

/// A move cut short (the new store not yet renamed into place) is done
/// again from the sled store, which is still whole.
#[cfg(feature = "migrate-sled")]
#[tokio::test]
async fn a_move_cut_short_is_done_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let (mut log, _sm) = open_sled(dir.path().join(SLED_STORE_DIR))?;
        log.blocking_append(entries(1, 5)).await?;
    }
    let moving = dir.path().join(format!("{STORE_DIR}.moving"));
    {
        // Half a move: a partial copy that never got renamed.
        let (mut log, _sm) = open_segments(&moving)?;
        log.blocking_append(entries(1, 2)).await?;
    }
    let (mut log, _sm) = open_data_dir(dir.path())?;
    assert_eq!(log.try_get_log_entries(0..100).await?, entries(1, 5));
    assert!(!moving.exists());
    Ok(())
}

/// Writes log, vote, committed id and a snapshot through `write`, reopens
/// the same directory through `reopen`, and checks everything is there.
async fn log_vote_and_snapshot_survive(write: Opener, reopen: Opener) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let vote = Vote::new_committed(1, 1);
    let state_at_8 = {
        let (mut log, mut sm) = write(dir.path())?;
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

    let (mut log, mut sm) = reopen(dir.path())?;
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
    for (name, open) in ENGINES {
        println!("engine: {name}");
        let dir = tempfile::tempdir()?;
        {
            let (mut log, _sm) = open(dir.path())?;
            log.blocking_append(entries(1, 9)).await?;
            log.truncate(log_id(1, 5)).await?;
        }
        let (mut log, _sm) = open(dir.path())?;
        assert_eq!(log.get_log_state().await?.last_log_id, Some(log_id(1, 4)));
        assert_eq!(log.try_get_log_entries(0..100).await?, entries(1, 4));
    }
    Ok(())
}
