//! Snapshot install: it replaces state and stored snapshot, and is durable
//! when it returns.

mod support;

use leasehold_raft_store::{open_with_engine, PowerLossDisk, Snapshot, StateMachineStore};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;
use support::{entries, log_id, membership_of};

async fn snapshot_after(last_index: u64) -> anyhow::Result<Snapshot> {
    let (_log, mut sm) = open_with_engine(PowerLossDisk::new().open_engine())?;
    sm.apply(entries(1, last_index)).await?;
    Ok(sm.get_snapshot_builder().await.build_snapshot().await?)
}

async fn install(sm: &mut StateMachineStore, snapshot: Snapshot) -> anyhow::Result<()> {
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await?;
    Ok(())
}

#[tokio::test]
async fn an_installed_snapshot_replaces_a_newer_local_one_and_survives_power_loss(
) -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (_log, mut sm) = open_with_engine(disk.open_engine())?;
    sm.apply(entries(1, 8)).await?;
    sm.get_snapshot_builder().await.build_snapshot().await?;

    let leaders = snapshot_after(5).await?;
    let meta = leaders.meta.clone();
    install(&mut sm, leaders).await?;
    assert_eq!(sm.last_applied(), Some(log_id(1, 5)));
    let current = sm.get_current_snapshot().await?.expect("installed");
    assert_eq!(current.meta, meta);

    disk.crash();
    let (_log, mut sm) = open_with_engine(disk.open_engine())?;
    assert_eq!(sm.get_current_snapshot().await?.map(|s| s.meta), Some(meta));
    assert_eq!(sm.applied_state().await?.0, Some(log_id(1, 5)));
    Ok(())
}

#[tokio::test]
async fn installing_then_applying_matches_applying_everything() -> anyhow::Result<()> {
    let (_log, mut follower) = open_with_engine(PowerLossDisk::new().open_engine())?;
    install(&mut follower, snapshot_after(6).await?).await?;
    follower.apply(entries(7, 12)).await?;

    let (_log, mut reference) = open_with_engine(PowerLossDisk::new().open_engine())?;
    reference.apply(entries(1, 12)).await?;
    assert_eq!(
        follower.read(|state| state.clone()),
        reference.read(|state| state.clone())
    );
    assert_eq!(
        follower.applied_state().await?,
        reference.applied_state().await?
    );
    Ok(())
}

/// Member ids removed by committed membership changes are recorded in the
/// state machine, kept by its snapshots (built, installed, reopened) and
/// never forgotten when a later change leaves them out again.
#[tokio::test]
async fn retired_members_are_replicated_and_survive_snapshots_and_restarts() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (_log, mut sm) = open_with_engine(disk.open_engine())?;
    sm.apply(vec![
        membership_of(1, 1, &[1, 2, 3, 4]),
        membership_of(1, 2, &[1, 2, 3]),
        membership_of(1, 3, &[1, 2, 3, 5]),
    ])
    .await?;
    let reader = sm.reader();
    assert_eq!(reader.retired_members(), [4].into());
    assert!(reader.is_retired(4) && !reader.is_retired(5));

    let snapshot = sm.get_snapshot_builder().await.build_snapshot().await?;
    let (_log, mut follower) = open_with_engine(PowerLossDisk::new().open_engine())?;
    install(&mut follower, snapshot).await?;
    assert_eq!(follower.reader().retired_members(), [4].into());

    sm.apply(vec![membership_of(1, 4, &[1, 2, 5])]).await?;
    assert_eq!(reader.retired_members(), [3, 4].into());
    disk.crash();
    let (_log, reopened) = open_with_engine(disk.open_engine())?;
    assert_eq!(
        reopened.reader().retired_members(),
        [4].into(),
        "the snapshot holds what was retired when it was built; the log replays the rest"
    );
    Ok(())
}
