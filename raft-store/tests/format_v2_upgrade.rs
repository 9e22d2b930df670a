//! Data written in storage format 2 (before shadow mode) stays readable:
//! log entries and snapshots of format 2, written by the format-2 code
//! (`tests/fixtures/format_v2.hex`, from the history in
//! `support/format_v2.rs`), decode and upgrade to exactly what the current
//! code makes of the same history, through the codec, a reopened store and
//! an installed snapshot.

mod support;

use std::io::Cursor;
use std::ops::Bound;

use leasehold_core::coordinator::CoordinatorState;
use leasehold_raft_store::codec::{decode, encode};
use leasehold_raft_store::{
    open_with_engine, Entry, EntryPayload, Keyspace, PowerLossDisk, SnapshotEnvelope,
    StorageEngine, StoredMembership,
};
use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use support::format_v2::proposals;
use support::{entries, log_id, membership_entry};

const FIXTURES: &str = include_str!("fixtures/format_v2.hex");

/// The fixture record named `name`, as bytes.
fn fixture(name: &str) -> Vec<u8> {
    support::hex_fixture(FIXTURES, name)
}

/// The entries the fixtures hold, as the current code builds them.
fn expected_entries() -> Vec<(String, Entry)> {
    let mut all = vec![("entry-1".to_string(), membership_entry(1, 1))];
    for (i, proposal) in proposals().into_iter().enumerate() {
        let index = i as u64 + 2;
        all.push((
            format!("entry-{index}"),
            Entry {
                log_id: log_id(2, index),
                payload: EntryPayload::Normal(proposal.into()),
            },
        ));
    }
    all.push((
        "entry-9".to_string(),
        Entry {
            log_id: log_id(2, 9),
            payload: EntryPayload::Blank,
        },
    ));
    all
}

/// The state after the fixture history, applied by the current code.
/// [`expected_state`] as a snapshot of an older format reads: its cache
/// recorded no pool grant increments, so retries answer 0, and no answer's
/// slot.
fn expected_snapshot_state() -> CoordinatorState {
    let mut state = expected_state().with_answers_of_unknown_slot();
    state.zero_cached_increments();
    state
}

fn expected_state() -> CoordinatorState {
    let mut state = CoordinatorState::default();
    for proposal in proposals() {
        state.apply(&proposal);
    }
    state
}

#[test]
fn format_2_records_carry_version_2() {
    for (name, _) in expected_entries() {
        assert_eq!(fixture(&name)[0], 2, "{name}");
    }
    assert_eq!(fixture("snapshot")[0], 2);
}

#[test]
fn format_2_entries_decode_to_the_same_entries_with_policies_not_in_shadow() {
    for (name, expected) in expected_entries() {
        let decoded: Entry = decode(&fixture(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded, expected, "{name}");
        // Written back, an upgraded entry is of the current format.
        let rewritten = encode(&decoded).expect("encode");
        assert_eq!(
            u32::from(rewritten[0]),
            <Entry as leasehold_raft_store::codec::Persisted>::FORMAT_VERSION
        );
        assert_eq!(decode::<Entry>(&rewritten).expect("decode"), expected);
    }
}

#[test]
fn a_format_2_snapshot_decodes_to_the_state_the_current_code_reaches() {
    let envelope: SnapshotEnvelope = decode(&fixture("snapshot")).expect("decode");
    assert_eq!(envelope.last_applied, Some(log_id(2, 8)));
    assert_eq!(envelope.membership, StoredMembership::default());
    let expected = expected_snapshot_state();
    assert_eq!(envelope.state, expected);
    assert!(expected.policies().iter().all(|policy| !policy.shadow));
    assert_eq!(expected.shadow_tallies().count(), 0);
    // The upgraded state keeps working: a lease on a format-2 window.
    let mut upgraded = envelope.state;
    let mut current = expected;
    let lease = proposals().swap_remove(1);
    assert_eq!(upgraded.apply(&lease), current.apply(&lease));
    assert_eq!(upgraded, current);
}

#[tokio::test]
async fn a_store_holding_format_2_entries_opens_and_serves_them_upgraded() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    {
        let (mut log, _sm) = open_with_engine(disk.open_engine())?;
        log.blocking_append(entries(1, 9)).await?;
    }
    // Put the format-2 bytes where the current code wrote entries 1..=9.
    let engine = disk.open_engine();
    let keys: Vec<Vec<u8>> = engine
        .range(Keyspace::Log, (Bound::Unbounded, Bound::Unbounded))?
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(keys.len(), 9);
    for (key, (name, _)) in keys.iter().zip(expected_entries()) {
        engine.insert(Keyspace::Log, key, fixture(&name))?;
    }
    drop(engine);

    let (mut log, mut sm) = open_with_engine(disk.open_engine())?;
    let read = log.try_get_log_entries(1..=9).await?;
    let expected: Vec<Entry> = expected_entries().into_iter().map(|(_, e)| e).collect();
    // The fixture's entries carry their own log ids (term 2 after index 1).
    assert_eq!(read, expected);
    sm.apply(read).await?;
    assert_eq!(sm.read(|state| state.clone()), expected_state());
    Ok(())
}

#[tokio::test]
async fn a_format_2_snapshot_installs() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (_log, mut sm) = open_with_engine(disk.open_engine())?;
    let mut meta = sm.get_snapshot_builder().await.build_snapshot().await?.meta;
    meta.last_log_id = Some(log_id(2, 8));
    sm.install_snapshot(&meta, Box::new(Cursor::new(fixture("snapshot"))))
        .await?;
    assert_eq!(sm.read(|state| state.clone()), expected_snapshot_state());
    assert_eq!(sm.last_applied(), Some(log_id(2, 8)));
    // The snapshot it keeps from now on is of the current format.
    let rebuilt = sm.get_snapshot_builder().await.build_snapshot().await?;
    assert_eq!(
        u32::from(rebuilt.snapshot.get_ref()[0]),
        <SnapshotEnvelope as leasehold_raft_store::codec::Persisted>::FORMAT_VERSION
    );
    Ok(())
}
