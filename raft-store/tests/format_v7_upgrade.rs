//! A snapshot written in storage format 7 (before shards) stays readable:
//! the fixture `tests/fixtures/format_v7.hex`, written by the format-7
//! code from the format-6 history (`support/format_v6.rs`) and then sealed
//! by a restore at 2 900 ms, decodes to exactly the state the current code
//! reaches from the same history and seal — the meta group of a cluster
//! never sharded, serving every key — and is rewritten in the current
//! format.

mod support;

use leasehold_core::ids::Key;
use leasehold_core::shard::{ShardId, SLOTS};
use leasehold_raft_store::codec::{decode, encode, Persisted};
use leasehold_raft_store::{open_with_engine, PowerLossDisk, SnapshotEnvelope};
use openraft::storage::RaftStateMachine;
use support::format_v6::entries;

const FIXTURES: &str = include_str!("fixtures/format_v7.hex");

#[tokio::test]
async fn a_format_7_snapshot_reads_as_the_meta_group_of_a_cluster_never_sharded() {
    let bytes = support::hex_fixture(FIXTURES, "snapshot");
    assert_eq!(bytes[0], 7);
    let read: SnapshotEnvelope = decode(&bytes).expect("decode");
    let expected = {
        let (_log, mut state_machine) =
            open_with_engine(PowerLossDisk::new().open_engine()).unwrap();
        state_machine.apply(entries()).await.unwrap();
        let mut envelope = state_machine.envelope();
        envelope.state.seal_after_restore(2_900);
        envelope.state = envelope.state.with_answers_of_unknown_slot();
        envelope
    };
    assert_eq!(read, expected);
    assert_eq!(read.state.restored_at_ms(), 2_900);
    let sharding = read.state.sharding();
    assert_eq!(sharding.shard(), ShardId(0));
    assert_eq!(sharding.placement().version(), 0);
    assert_eq!(sharding.owned_slots(), u32::from(SLOTS));
    assert!(read.state.owns(&Key::new("fair/f").unwrap()));
    let rewritten = encode(&read).unwrap();
    assert_eq!(u32::from(rewritten[0]), SnapshotEnvelope::FORMAT_VERSION);
    assert_eq!(decode::<SnapshotEnvelope>(&rewritten).unwrap(), read);
}
