//! Backup files and new clusters written from a state
//! (`leasehold_raft_store::backup`): a backup reads back to the state it
//! holds, and any damage to it is refused, never misread; a new cluster's
//! store opens as one voter at the state's position with the old ids
//! retired and its windows sealed; the refusals that keep an old member
//! out of a restored cluster; a survivor's whole log is applied.

mod support;

use std::collections::BTreeSet;

use leasehold_raft_store::backup::{
    backup_bytes, read_backup, survivor_state, write_new_cluster, BackupFileError, NewClusterError,
    StateOrigin, StateSummary,
};
use leasehold_raft_store::{open_data_dir, SnapshotEnvelope};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use proptest::prelude::*;
use support::{entries, log_id, membership_of};

/// A state after entries 1..=12 (voters 1, 2, 3), as a member holds it.
async fn state_after_entries() -> SnapshotEnvelope {
    let dir = tempfile::tempdir().unwrap();
    let (_log, mut state_machine) = open_data_dir(dir.path()).unwrap();
    state_machine.apply(entries(1, 12)).await.unwrap();
    state_machine.envelope()
}

#[tokio::test]
async fn a_backup_reads_back_to_the_state_it_holds() {
    let envelope = state_after_entries().await;
    let bytes = backup_bytes(&envelope).unwrap();
    assert_eq!(&bytes[..8], b"LHBACKUP");
    let read = read_backup(&bytes).unwrap();
    assert_eq!(read, envelope);
    let summary = StateSummary::of(&read);
    assert_eq!(summary.last_log_id, Some(log_id(1, 12)));
    assert_eq!(summary.voters, vec![1, 2, 3]);
    assert_eq!(summary.clock_ms, 12_000);
}

#[test]
fn what_is_not_a_backup_is_refused_by_name() {
    assert_eq!(read_backup(b""), Err(BackupFileError::NotABackup));
    assert_eq!(
        read_backup(b"LHBACKUX\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\0\0"),
        Err(BackupFileError::NotABackup)
    );
    assert_eq!(
        read_backup(b"LHBACKUP\0\0\0\x02\0\0\0\0\0\0\0\0\0\0\0\0"),
        Err(BackupFileError::UnknownFormat(2))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Flipped bytes, a cut or an extension are refused — never a panic,
    /// never a different state read as good.
    #[test]
    fn a_damaged_backup_is_refused_never_misread(
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        cut in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 1..8),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let envelope = runtime.block_on(state_after_entries());
        let good = backup_bytes(&envelope).unwrap();
        let mut flipped = good.clone();
        for (at, mask) in &flips {
            let i = at.index(flipped.len());
            flipped[i] ^= mask;
        }
        if flipped != good {
            prop_assert!(read_backup(&flipped).is_err());
        }
        let short = &good[..cut.index(good.len())];
        prop_assert!(read_backup(short).is_err());
        let mut long = good.clone();
        long.extend(&tail);
        prop_assert!(read_backup(&long).is_err());
    }
}

#[tokio::test]
async fn a_restored_store_opens_as_one_voter_at_the_backups_position() {
    let envelope = state_after_entries().await;
    let dir = tempfile::tempdir().unwrap();
    let written = write_new_cluster(
        dir.path(),
        envelope.clone(),
        7,
        "node-7:7000",
        50_000,
        StateOrigin::Backup,
    )
    .unwrap();
    assert_eq!(written.last_log_id, log_id(1, 12));
    assert_eq!(written.retired, BTreeSet::from([1, 2, 3]));
    assert_eq!(written.restored_at_ms, 50_000);
    assert_eq!(written.previous_store, None);

    let (mut log, mut state_machine) = open_data_dir(dir.path()).unwrap();
    let (applied, membership) = state_machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 12)));
    assert_eq!(
        membership.membership().voter_ids().collect::<Vec<_>>(),
        vec![7]
    );
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 12)));
    assert_eq!(state.last_log_id, Some(log_id(1, 12)));
    assert!(log
        .read_vote()
        .await
        .unwrap()
        .is_some_and(|v| v.leader_id().voted_for() == Some(7)));
    let snapshot = state_machine
        .get_current_snapshot()
        .await
        .unwrap()
        .expect("stored");
    assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 12)));
    let reader = state_machine.reader();
    assert_eq!(reader.retired_members(), BTreeSet::from([1, 2, 3]));
    assert_eq!(reader.read(|s| s.restored_at_ms()), 50_000);
    assert_eq!(
        reader.read(|s| s.policies()),
        envelope.state.policies(),
        "the state itself is the backup's"
    );
    assert!(log.try_get_log_entries(1..13).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_restore_refuses_an_old_id_and_a_used_data_directory() {
    let envelope = state_after_entries().await;
    let dir = tempfile::tempdir().unwrap();
    for old in [1, 2, 3] {
        let refused = write_new_cluster(
            dir.path(),
            envelope.clone(),
            old,
            "a:1",
            1,
            StateOrigin::Backup,
        );
        assert!(
            matches!(refused, Err(NewClusterError::IdInUse(id)) if id == old),
            "{refused:?}"
        );
    }
    let mut retired = envelope.clone();
    retired.retired_members.insert(9);
    let refused = write_new_cluster(dir.path(), retired, 9, "a:1", 1, StateOrigin::Backup);
    assert!(
        matches!(refused, Err(NewClusterError::IdInUse(9))),
        "{refused:?}"
    );

    write_new_cluster(
        dir.path(),
        envelope.clone(),
        4,
        "a:1",
        1,
        StateOrigin::Backup,
    )
    .unwrap();
    let again = write_new_cluster(
        dir.path(),
        envelope.clone(),
        5,
        "a:1",
        1,
        StateOrigin::Backup,
    );
    assert!(
        matches!(again, Err(NewClusterError::StoreExists(_))),
        "{again:?}"
    );

    let empty = SnapshotEnvelope {
        last_applied: None,
        ..envelope
    };
    let other = tempfile::tempdir().unwrap();
    let refused = write_new_cluster(other.path(), empty, 4, "a:1", 1, StateOrigin::Backup);
    assert!(
        matches!(refused, Err(NewClusterError::EmptyState)),
        "{refused:?}"
    );
}

/// A survivor's log beyond its last snapshot — committed or not — is
/// applied; it keeps its id, and its previous store is kept aside.
#[tokio::test]
async fn a_survivor_applies_its_whole_log_and_keeps_its_id() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, mut state_machine) = open_data_dir(dir.path()).unwrap();
        log.blocking_append(entries(1, 20)).await.unwrap();
        state_machine.apply(entries(1, 8)).await.unwrap();
    }
    let state = survivor_state(dir.path()).await.unwrap();
    assert_eq!(state.last_applied, Some(log_id(1, 20)));
    assert_eq!(state.state.now_ms(), 20_000);

    let refused = write_new_cluster(
        dir.path(),
        state.clone(),
        4,
        "a:1",
        1,
        StateOrigin::Survivor,
    );
    assert!(
        matches!(refused, Err(NewClusterError::NotAMember(4))),
        "{refused:?}"
    );
    let written = write_new_cluster(
        dir.path(),
        state,
        2,
        "node-2:7000",
        30_000,
        StateOrigin::Survivor,
    )
    .unwrap();
    assert_eq!(written.retired, BTreeSet::from([1, 3]));
    let previous = written.previous_store.expect("kept aside");
    assert!(previous.exists());
    let (_log, mut state_machine) = open_data_dir(dir.path()).unwrap();
    let (applied, membership) = state_machine.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 20)));
    assert_eq!(
        membership.membership().voter_ids().collect::<Vec<_>>(),
        vec![2]
    );

    let nothing = tempfile::tempdir().unwrap();
    assert!(matches!(
        survivor_state(nothing.path()).await,
        Err(NewClusterError::NoStore(_))
    ));
}

/// A membership change in the survivor's unapplied log retires the ids it
/// removed as well.
#[tokio::test]
async fn a_survivor_retires_ids_its_log_removed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut log, _state_machine) = open_data_dir(dir.path()).unwrap();
        let mut log_entries = entries(1, 5);
        log_entries.push(membership_of(1, 6, &[1, 2]));
        log.blocking_append(log_entries).await.unwrap();
    }
    let state = survivor_state(dir.path()).await.unwrap();
    assert_eq!(state.retired_members, BTreeSet::from([3]));
    let written = write_new_cluster(
        dir.path(),
        state,
        1,
        "node-1:7000",
        1,
        StateOrigin::Survivor,
    )
    .unwrap();
    assert_eq!(written.retired, BTreeSet::from([2, 3]));
}
