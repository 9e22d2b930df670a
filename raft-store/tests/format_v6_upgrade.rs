//! A snapshot written in storage format 6 (before a restore could seal
//! windows) stays readable: the fixture `tests/fixtures/format_v6.hex`,
//! written by the format-6 code from the history in `support/format_v6.rs`
//! (a fair key's next window, a retired member), decodes to exactly the
//! state the current code reaches from the same history — never restored
//! — installs, and is rewritten in the current format.

mod support;

use std::collections::BTreeSet;
use std::io::Cursor;

use leasehold_raft_store::codec::{decode, encode, Persisted};
use leasehold_raft_store::{open_with_engine, PowerLossDisk, SnapshotEnvelope};
use openraft::storage::RaftStateMachine;
use openraft::RaftSnapshotBuilder;
use support::format_v6::entries;

const FIXTURES: &str = include_str!("fixtures/format_v6.hex");

/// The state the current code reaches from the fixture's history.
async fn current() -> SnapshotEnvelope {
    let (_log, mut state_machine) = open_with_engine(PowerLossDisk::new().open_engine()).unwrap();
    state_machine.apply(entries()).await.unwrap();
    state_machine.envelope()
}

#[tokio::test]
async fn a_format_6_snapshot_reads_as_the_same_state_never_restored() {
    let bytes = support::hex_fixture(FIXTURES, "snapshot");
    assert_eq!(bytes[0], 6);
    let read: SnapshotEnvelope = decode(&bytes).expect("decode");
    let mut expected = current().await;
    expected.state = expected.state.with_answers_of_unknown_slot();
    assert_eq!(read, expected);
    assert_eq!(read.state.restored_at_ms(), 0);
    assert_eq!(read.retired_members, BTreeSet::from([4]));
    assert!(
        read.state
            .pool_view_at(
                &leasehold_core::ids::Key::new("fair/f").unwrap(),
                3_000,
                2_800
            )
            .is_some_and(|view| !view.regions.is_empty()),
        "the next window joined ahead is kept"
    );
    let rewritten = encode(&read).unwrap();
    assert_eq!(u32::from(rewritten[0]), SnapshotEnvelope::FORMAT_VERSION);
    assert_eq!(decode::<SnapshotEnvelope>(&rewritten).unwrap(), read);
}

#[tokio::test]
async fn a_format_6_snapshot_installs_and_snapshots_again_in_the_current_format() {
    let bytes = support::hex_fixture(FIXTURES, "snapshot");
    let mut expected = current().await;
    expected.state = expected.state.with_answers_of_unknown_slot();
    let (_log, mut state_machine) = open_with_engine(PowerLossDisk::new().open_engine()).unwrap();
    let mut leader = {
        let (_log, mut leader) = open_with_engine(PowerLossDisk::new().open_engine()).unwrap();
        leader.apply(entries()).await.unwrap();
        leader
    };
    let meta = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap()
        .meta;
    state_machine
        .install_snapshot(&meta, Box::new(Cursor::new(bytes)))
        .await
        .unwrap();
    assert_eq!(state_machine.envelope(), expected);
    let rebuilt = state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    assert_eq!(
        u32::from(rebuilt.snapshot.get_ref()[0]),
        SnapshotEnvelope::FORMAT_VERSION
    );
}
