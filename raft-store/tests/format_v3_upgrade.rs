//! Data written in storage format 3 (before a `fair` key could hold its
//! next pool window beside its live one) stays readable: log entries and
//! snapshots of format 3, written by the format-3 code
//! (`tests/fixtures/format_v3.hex`, from the history in
//! `support/format_v3.rs`), decode and upgrade to exactly what the current
//! code makes of the same history, through the codec, a reopened store and
//! an installed snapshot; rewritten, they are of format 4.

mod support;

use std::io::Cursor;
use std::ops::Bound;

use leasehold_core::coordinator::{Command, CoordinatorState, Outcome, Proposal};
use leasehold_core::ids::{Key, RegionId};
use leasehold_core::principal::Principal;
use leasehold_raft_store::codec::{decode, encode};
use leasehold_raft_store::{
    open_with_engine, Entry, EntryPayload, Keyspace, PowerLossDisk, SnapshotEnvelope,
    StorageEngine, StoredMembership,
};
use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use support::format_v3::proposals;
use support::{entries, log_id, membership_entry};

const FIXTURES: &str = include_str!("fixtures/format_v3.hex");

/// The fixture record named `name`, as bytes.
fn fixture(name: &str) -> Vec<u8> {
    support::hex_fixture(FIXTURES, name)
}

/// Index of the last proposal entry of the fixtures (a blank follows it).
fn last_proposal_index() -> u64 {
    proposals().len() as u64 + 1
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
    let blank = last_proposal_index() + 1;
    all.push((
        format!("entry-{blank}"),
        Entry {
            log_id: log_id(2, blank),
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
fn format_3_records_carry_version_3() {
    for (name, _) in expected_entries() {
        assert_eq!(fixture(&name)[0], 3, "{name}");
    }
    assert_eq!(fixture("snapshot")[0], 3);
}

#[test]
fn format_3_entries_decode_to_the_same_entries_and_rewrite_in_the_current_format() {
    for (name, expected) in expected_entries() {
        let decoded: Entry = decode(&fixture(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded, expected, "{name}");
        let rewritten = encode(&decoded).expect("encode");
        assert_eq!(
            u32::from(rewritten[0]),
            <Entry as leasehold_raft_store::codec::Persisted>::FORMAT_VERSION
        );
        assert_eq!(decode::<Entry>(&rewritten).expect("decode"), expected);
    }
}

#[test]
fn a_format_3_snapshot_decodes_to_the_state_the_current_code_reaches() {
    let envelope: SnapshotEnvelope = decode(&fixture("snapshot")).expect("decode");
    assert_eq!(
        envelope.last_applied,
        Some(log_id(2, last_proposal_index()))
    );
    assert_eq!(envelope.membership, StoredMembership::default());
    let expected = expected_snapshot_state();
    assert_eq!(envelope.state, expected);
    // The history counted a shadow policy's would-deny decisions.
    assert_eq!(expected.shadow_tallies().count(), 1);
    // The upgraded state keeps working: a region joins the fair key's next
    // window ahead, in the last quarter of the live one ([2 000, 3 000)).
    let join = Proposal {
        stamp_ms: 2_800,
        commands: vec![Command::PoolJoinNext {
            key: Key::new("fair/f").expect("key"),
            region: RegionId::new("eu").expect("region"),
            region_weight: 2,
            want_total: 30,
            window_start_ms: 3_000,
            retire: false,
            request_id: None,
            caller: Principal::Region(RegionId::new("eu").expect("region")),
        }],
    };
    let mut upgraded = envelope.state;
    let mut current = expected;
    let applied = upgraded.apply(&join);
    assert_eq!(applied, current.apply(&join));
    assert!(
        matches!(
            applied.outcomes.as_slice(),
            [Outcome::PoolGrant(grant)] if grant.window_start_ms == 3_000 && grant.granted_total == 30
        ),
        "{applied:?}"
    );
    assert_eq!(upgraded, current);
}

#[tokio::test]
async fn a_store_holding_format_3_entries_opens_and_serves_them() -> anyhow::Result<()> {
    let count = last_proposal_index() + 1;
    let disk = PowerLossDisk::new();
    {
        let (mut log, _sm) = open_with_engine(disk.open_engine())?;
        log.blocking_append(entries(1, count)).await?;
    }
    // Put the format-3 bytes where the current code wrote the entries.
    let engine = disk.open_engine();
    let keys: Vec<Vec<u8>> = engine
        .range(Keyspace::Log, (Bound::Unbounded, Bound::Unbounded))?
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(keys.len() as u64, count);
    for (key, (name, _)) in keys.iter().zip(expected_entries()) {
        engine.insert(Keyspace::Log, key, fixture(&name))?;
    }
    drop(engine);

    let (mut log, mut sm) = open_with_engine(disk.open_engine())?;
    let read = log.try_get_log_entries(1..=count).await?;
    let expected: Vec<Entry> = expected_entries().into_iter().map(|(_, e)| e).collect();
    assert_eq!(read, expected);
    sm.apply(read).await?;
    assert_eq!(sm.read(|state| state.clone()), expected_state());
    Ok(())
}

#[tokio::test]
async fn a_format_3_snapshot_installs() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (_log, mut sm) = open_with_engine(disk.open_engine())?;
    let mut meta = sm.get_snapshot_builder().await.build_snapshot().await?.meta;
    meta.last_log_id = Some(log_id(2, last_proposal_index()));
    sm.install_snapshot(&meta, Box::new(Cursor::new(fixture("snapshot"))))
        .await?;
    assert_eq!(sm.read(|state| state.clone()), expected_snapshot_state());
    assert_eq!(sm.last_applied(), Some(log_id(2, last_proposal_index())));
    let rebuilt = sm.get_snapshot_builder().await.build_snapshot().await?;
    assert_eq!(
        u32::from(rebuilt.snapshot.get_ref()[0]),
        <SnapshotEnvelope as leasehold_raft_store::codec::Persisted>::FORMAT_VERSION
    );
    Ok(())
}
