//! A snapshot written in storage format 8 (before sessions moved with
//! their slots) stays readable: the fixture `tests/fixtures/format_v8.hex`,
//! written by the format-8 code from the history in `support/format_v8.rs`
//! (the format-6 history, then a split of shard 0 into shard 1), decodes
//! to the state the current code reaches from the same history, except
//! what format 8 did not keep — the answers' slots, and the sessions of
//! the move — and is rewritten in the current format.

mod support;

use leasehold_core::coordinator::{Command, Outcome};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
use leasehold_core::principal::Principal;
use leasehold_core::shard::ShardId;
use leasehold_raft_store::codec::{decode, encode, Persisted};
use leasehold_raft_store::{open_with_engine, PowerLossDisk, SnapshotEnvelope};
use openraft::storage::RaftStateMachine;
use support::format_v8::entries;

const FIXTURES: &str = include_str!("fixtures/format_v8.hex");

#[tokio::test]
async fn a_format_8_snapshot_reads_with_its_placement_and_move_and_answers_as_before() {
    let bytes = support::hex_fixture(FIXTURES, "snapshot");
    assert_eq!(bytes[0], 8);
    let read: SnapshotEnvelope = decode(&bytes).expect("decode");
    let current = {
        let (_log, mut state_machine) =
            open_with_engine(PowerLossDisk::new().open_engine()).unwrap();
        state_machine.apply(entries()).await.unwrap();
        state_machine.envelope()
    };
    assert_eq!(read.last_applied, current.last_applied);
    assert_eq!(read.membership, current.membership);
    assert_eq!(read.retired_members, current.retired_members);

    // The placement, with each shard's replicas then as its founding ones.
    let (placement, now) = (
        read.state.sharding().placement(),
        current.state.sharding().placement(),
    );
    assert_eq!(placement, now);
    assert_eq!(placement.version(), 1);
    assert_eq!(
        placement.founding_replicas(ShardId(1)),
        now.replicas(ShardId(1))
    );

    // The move: the same frozen keys; no sessions (format 8 kept none).
    let (moves, now_moves) = (
        read.state.sharding().outgoing(),
        current.state.sharding().outgoing(),
    );
    assert_eq!(moves.len(), 1);
    for ((id, old), (now_id, new)) in moves.iter().zip(now_moves) {
        assert_eq!(id, now_id);
        assert_eq!(old.slots, new.slots);
        assert_eq!(old.key_count(), new.key_count());
        assert_eq!(old.session_count(), 0);
        assert!(
            new.session_count() > 0,
            "the current code copies the sessions"
        );
    }
    for key in ["api/a", "fair/f", "trial/t"] {
        let key = Key::new(key).unwrap();
        assert_eq!(read.state.owns(&key), current.state.owns(&key), "{key}");
    }

    // Every kept answer replays as before (its slot unknown).
    let retry = Command::Lease {
        key: Key::new("api/a").unwrap(),
        region: RegionId::new("eu").unwrap(),
        tokens: 30,
        request_id: Some(RequestId {
            client: ClientId::new("checkout-1").unwrap(),
            seq: 1,
        }),
        caller: Principal::Region(RegionId::new("eu").unwrap()),
    };
    let proposal = leasehold_core::coordinator::Proposal {
        stamp_ms: 2_900,
        commands: vec![retry],
    };
    let (mut upgraded, mut reached) = (read.state.clone(), current.state.clone());
    let (answer, expected) = (upgraded.apply(&proposal), reached.apply(&proposal));
    assert_eq!(answer, expected);
    assert!(
        matches!(answer.outcomes[0], Outcome::Lease(_)),
        "{answer:?}"
    );

    let rewritten = encode(&read).unwrap();
    assert_eq!(u32::from(rewritten[0]), SnapshotEnvelope::FORMAT_VERSION);
    assert_eq!(decode::<SnapshotEnvelope>(&rewritten).unwrap(), read);
}
