//! Keys changing hands between shards (ADR 0025): a source (the meta
//! group, or a shard that releases them) moves slots out with their keys'
//! window state, the new owner acquires them in parts, and at no point do
//! two groups admit in one key's window — an oracle sums every grant,
//! minus every credit, per (key, window) across every group and holds it
//! to the limit, whatever the interleaving.

mod coordinator_support;

use std::collections::BTreeMap;

use coordinator_support::*;
use leasehold_core::coordinator::sharding::{self, MoveId, PlacementChange};
use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, Outcome, Proposal, ShardingOutcome,
};
use leasehold_core::principal::Principal;
use leasehold_core::shard::{slot_of, ShardId, SLOTS};
use proptest::prelude::*;

const LIMIT: u64 = 10;
const WINDOW_MS: u64 = 1_000;

fn split_into_one(version: u64) -> Command {
    Command::ChangePlacement {
        expected_version: version,
        change: PlacementChange::Split {
            shard: ShardId(0),
            into: ShardId(1),
            replicas: vec![1, 2, 3],
        },
    }
}

/// A new group that became shard 1, with the policy.
fn shard_one(at: u64) -> CoordinatorState {
    let mut shard = CoordinatorState::default();
    assert_eq!(
        run(&mut shard, at, Command::BecomeShard { shard: ShardId(1) }),
        Outcome::Sharding(ShardingOutcome::BecameShard { shard: ShardId(1) })
    );
    run(&mut shard, at, counter("k", LIMIT, WINDOW_MS));
    shard
}

/// Applies the sessions and the next key part of every move `source`
/// released into `shard`;
/// returns whether every such move is complete.
fn acquire_next_parts(source: &CoordinatorState, shard: &mut CoordinatorState, at: u64) -> bool {
    let (from, to) = (source.sharding().shard(), shard.sharding().shard());
    let moves: Vec<(MoveId, _)> = source
        .sharding()
        .outgoing()
        .iter()
        .filter(|(_, m)| m.slots.from == from && m.slots.to == to)
        .map(|(id, m)| (*id, m.clone()))
        .collect();
    let mut complete = true;
    for (id, outgoing) in moves {
        // Every part of the move's sessions, then its next key part.
        loop {
            let arrival = shard.sharding().arrival(id);
            if arrival.complete {
                break;
            }
            match run(shard, at, outgoing.next_part(id, arrival)) {
                Outcome::Sharding(ShardingOutcome::Acquired { complete: done, .. }) => {
                    complete &= done;
                    break;
                }
                Outcome::Sharding(ShardingOutcome::AcquiredSessions { .. }) => {}
                other => panic!("acquire refused: {other:?}"),
            }
        }
    }
    complete
}

fn is_not_owner(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Rejected(CommandError::NotOwner(_)))
}

fn moves_out(key: &str) -> bool {
    slot_of(key) >= SLOTS / 2
}

/// The first key `k<i>` that a split of shard 0 moves out (or keeps).
fn fixture_key(moving: bool) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| moves_out(k) == moving)
        .expect("some key")
}

#[test]
fn a_split_moves_the_upper_half_with_its_windows_and_the_new_owner_continues_them() {
    let (low, high) = (&fixture_key(false), &fixture_key(true));
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
    assert_eq!(granted(&run(&mut meta, 100, lease(high, "eu", 7))), 7);
    assert_eq!(granted(&run(&mut meta, 100, lease(low, "eu", 7))), 7);

    assert_eq!(
        run(&mut meta, 200, split_into_one(0)),
        Outcome::Sharding(ShardingOutcome::PlacementChanged { version: 1 })
    );
    assert!(is_not_owner(&run(&mut meta, 210, lease(high, "eu", 1))));
    assert_eq!(granted(&run(&mut meta, 210, lease(low, "eu", 5))), 3);

    let mut shard = shard_one(220);
    assert!(
        is_not_owner(&run(&mut shard, 230, lease(high, "eu", 1))),
        "nothing is served before the move is acquired"
    );
    assert!(acquire_next_parts(&meta, &mut shard, 240));
    assert_eq!(
        granted(&run(&mut shard, 250, lease(high, "eu", 5))),
        3,
        "the window's 7 granted moved with it"
    );
    assert!(is_not_owner(&run(&mut shard, 250, lease(low, "eu", 1))));
    assert_eq!(
        granted(&run(&mut shard, 1_100, lease(high, "eu", 20))),
        10,
        "the next window opens in full"
    );
}

#[test]
fn a_retry_is_answered_by_the_group_that_executed_it_even_after_its_key_moved() {
    let high = &fixture_key(true);
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
    let with_id = |seq| Command::Lease {
        key: key(high),
        region: region("eu"),
        tokens: 4,
        request_id: Some(request("c", seq)),
        caller: Principal::Anonymous,
    };
    let first = run(&mut meta, 100, with_id(1));
    assert_eq!(granted(&first), 4);
    run(&mut meta, 200, split_into_one(0));
    assert_eq!(run(&mut meta, 300, with_id(1)), first, "the retry's answer");
    assert!(
        is_not_owner(&run(&mut meta, 300, with_id(2))),
        "a new request is refused"
    );
}

/// What one client id's `seqs` are answered by `group`, at `at`: every
/// seq leases 1 token of `key` (seq 7 leases 3).
fn answers(
    group: &mut CoordinatorState,
    key_name: &str,
    seqs: impl IntoIterator<Item = u64>,
    at: u64,
) -> BTreeMap<u64, Outcome> {
    seqs.into_iter()
        .map(|seq| {
            let command = Command::Lease {
                key: key(key_name),
                region: region("eu"),
                tokens: if seq == 7 { 3 } else { 1 },
                request_id: Some(request("c", seq)),
                caller: Principal::Anonymous,
            };
            (seq, run(group, at, command))
        })
        .collect()
}

fn is_expired(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Rejected(CommandError::SessionExpired(_)))
}

#[test]
fn a_group_that_does_not_serve_a_key_leaves_every_id_it_cannot_place_to_the_owner() {
    // One client fills its session on shard 0 (seqs 1..=64) and leases
    // seq 65 of a key the split moves; its answer is lost. Resent to
    // shard 1 before the move's sessions arrive, seq 65 (above the
    // opening seqs of a session shard 1 does not know yet) and a new seq
    // 66 are the owner's to answer: `NOT_OWNER`, never `SESSION_EXPIRED`
    // (the client would send the lease again under a new id), never run.
    // Once the move is acquired shard 1 answers seq 65 as shard 0 did and
    // runs 66 once; shard 0, which no longer serves the key, answers the
    // id it executed and refuses the one it cannot place.
    let high = &fixture_key(true);
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, 60_000));
    answers(&mut meta, &fixture_key(false), 1..=64, 100);
    let first = answers(&mut meta, high, [65], 100);
    run(&mut meta, 200, split_into_one(0));
    let mut shard = shard_one(210);
    run(&mut shard, 210, counter("k", LIMIT, 60_000));
    let early = answers(&mut shard, high, [65, 66], 220);
    assert!(early.values().all(is_not_owner), "{early:?}");
    while !acquire_next_parts(&meta, &mut shard, 230) {}
    let again = answers(&mut shard, high, [65, 66], 240);
    assert_eq!(again[&65], first[&65], "its first answer");
    assert_eq!(granted(&again[&66]), 1);
    assert_eq!(
        shard.window_view(&key(high), 250).expect("window").granted,
        2,
        "65 and 66 counted once each"
    );
    let at_source = answers(&mut meta, high, [65, 67], 260);
    assert_eq!(at_source[&65], first[&65], "the id it executed");
    assert!(is_not_owner(&at_source[&67]), "{:?}", at_source[&67]);
}

#[test]
fn the_new_owner_answers_every_resent_id_as_the_old_owner_would() {
    // One client leases seqs 1..=200 of a key the split moves, then every
    // id is sent again to the new owner: the 64 the session keeps get
    // their first answers, the older are refused as expired, and nothing
    // runs twice (the window counts each grant once).
    let high = &fixture_key(true);
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", 1_000, 60_000));
    let first = answers(&mut meta, high, 1..=200, 100);
    let granted_before = meta.window_view(&key(high), 150).expect("window").granted;
    assert_eq!(granted_before, 202);
    run(&mut meta, 200, split_into_one(0));
    let mut shard = shard_one(210);
    run(&mut shard, 210, counter("k", 1_000, 60_000));
    while !acquire_next_parts(&meta, &mut shard, 230) {}
    let again = answers(&mut shard, high, 1..=200, 300);
    for seq in 1..=200 {
        if seq > 200 - 64 {
            assert_eq!(again[&seq], first[&seq], "seq {seq}: its first answer");
        } else {
            assert!(is_expired(&again[&seq]), "seq {seq}: {:?}", again[&seq]);
        }
    }
    assert_eq!(
        shard.window_view(&key(high), 300).expect("window").granted,
        granted_before,
        "nothing executed twice"
    );
    // The old owner still answers its ids the same way (a client that
    // does not know the placement changed).
    let at_old = answers(&mut meta, high, 137..=200, 300);
    for seq in 137..=200 {
        assert_eq!(at_old[&seq], first[&seq]);
    }
    // New seqs run once at the new owner, and moving on again keeps that.
    let fresh = answers(&mut shard, high, 201..=210, 400);
    assert!(fresh.values().all(|o| granted(o) == 1));
    assert_eq!(answers(&mut shard, high, 201..=210, 500), fresh);
}

#[test]
fn a_request_refused_while_its_slot_moves_is_executed_by_the_new_owner_on_retry() {
    let high = &fixture_key(true);
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
    run(&mut meta, 10, split_into_one(0));
    let mut shard = shard_one(20);
    let with_id = Command::Lease {
        key: key(high),
        region: region("eu"),
        tokens: 4,
        request_id: Some(request("c", 1)),
        caller: Principal::Anonymous,
    };
    assert!(
        is_not_owner(&run(&mut shard, 30, with_id.clone())),
        "still moving"
    );
    assert!(acquire_next_parts(&meta, &mut shard, 40));
    let served = run(&mut shard, 50, with_id.clone());
    assert_eq!(
        granted(&served),
        4,
        "the retry is executed, not answered with the refusal"
    );
    assert_eq!(run(&mut shard, 60, with_id), served, "and answered once");
}

#[test]
fn placement_changes_are_checked_and_refusals_change_nothing() {
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
    run(&mut meta, 10, lease(&fixture_key(true), "eu", 3));
    let before = meta.clone();
    let refused =
        |outcome: &Outcome| matches!(outcome, Outcome::Rejected(CommandError::Placement(_)));
    for change in [
        split_into_one(7),
        Command::ChangePlacement {
            expected_version: 0,
            change: PlacementChange::SetReplicas {
                shard: ShardId(0),
                replicas: vec![1],
            },
        },
        Command::ChangePlacement {
            expected_version: 0,
            change: PlacementChange::MoveSlots {
                start: 0,
                end: 10,
                to: ShardId(4),
            },
        },
        Command::BecomeShard { shard: ShardId(2) },
    ] {
        let mut probe = before.clone();
        let outcome = run(&mut probe, 10, change.clone());
        assert!(refused(&outcome), "{change:?} → {outcome:?}");
        let mut expected = before.clone();
        run(&mut expected, 10, Command::Tick);
        assert_eq!(probe, expected, "{change:?} changed the state");
    }
    // Out of a shard other than 0, slots go to a shard on its replicas,
    // and never back into shard 0.
    run(&mut meta, 20, split_into_one(0));
    let add = |version, shard, replicas: Vec<u64>| Command::ChangePlacement {
        expected_version: version,
        change: PlacementChange::AddShard {
            shard: ShardId(shard),
            replicas,
        },
    };
    let move_from_one = |version, to| Command::ChangePlacement {
        expected_version: version,
        change: PlacementChange::MoveSlots {
            start: u32::from(SLOTS) - 10,
            end: u32::from(SLOTS),
            to: ShardId(to),
        },
    };
    assert!(!refused(&run(&mut meta, 30, add(1, 2, vec![3, 4]))));
    assert!(!refused(&run(&mut meta, 30, add(2, 3, vec![1, 3]))));
    for (to, why) in [(2, "a replica off shard 1"), (0, "back into shard 0")] {
        let before = meta.clone();
        let outcome = run(&mut meta, 40, move_from_one(3, to));
        assert!(refused(&outcome), "{why}: {outcome:?}");
        assert_eq!(meta.sharding(), before.sharding(), "{why}");
    }
    assert_eq!(
        run(&mut meta, 40, move_from_one(3, 3)),
        Outcome::Sharding(ShardingOutcome::PlacementChanged { version: 4 })
    );
    // A shard group takes no placement change.
    let mut shard = shard_one(50);
    assert!(refused(&run(&mut shard, 60, split_into_one(0))));
}

/// A meta group whose 3 000 keys of 200 bytes (2 tokens leased each, in
/// windows of `window_ms`) are split at 200 ms: a move of many parts.
fn split_with_many_keys(window_ms: u64) -> (CoordinatorState, Vec<String>) {
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, window_ms));
    let keys: Vec<String> = (0..3_000).map(|i| format!("k{i:0>200}")).collect();
    let commands: Vec<Command> = keys.iter().map(|k| lease(k, "eu", 2)).collect();
    meta.apply(&Proposal {
        stamp_ms: 100,
        commands,
    });
    run(&mut meta, 200, split_into_one(0));
    (meta, keys)
}

#[test]
fn a_large_move_travels_in_parts_that_apply_once_and_in_order() {
    let (meta, keys) = split_with_many_keys(60_000);
    let (id, outgoing) = meta
        .sharding()
        .outgoing()
        .iter()
        .next()
        .map(|(id, m)| (*id, m.clone()))
        .expect("one move");
    let moved = keys.iter().filter(|k| moves_out(k)).count();
    assert_eq!(outgoing.key_count(), moved);

    let mut shard = shard_one(300);
    let first = outgoing.part(id, 0);
    assert!(!first.last, "{} keys need several parts", moved);
    run(&mut shard, 300, Command::AcquireSlots(first.clone()));
    assert_eq!(
        shard.sharding().arrival(id).acquired_keys,
        0,
        "no key part before the move's sessions"
    );
    let sessions = outgoing.next_part(id, shard.sharding().arrival(id));
    run(&mut shard, 300, sessions);
    assert!(shard.sharding().arrival(id).sessions_complete);
    run(&mut shard, 300, Command::AcquireSlots(first.clone()));
    let after_first = shard.sharding().arrival(id);
    assert_eq!(after_first.acquired_keys, first.key_count() as u64);
    // The same part again, and a part from further on, change nothing.
    run(&mut shard, 300, Command::AcquireSlots(first));
    let skipped = outgoing.part(id, after_first.acquired_keys + 5);
    run(&mut shard, 300, Command::AcquireSlots(skipped));
    assert_eq!(shard.sharding().arrival(id), after_first);
    let mut parts = 1;
    while !acquire_next_parts(&meta, &mut shard, 400) {
        parts += 1;
    }
    assert!(parts >= 3, "{parts} parts");
    assert_eq!(shard.tracked_keys(), moved as u64);
    assert_eq!(shard.sharding().owned_slots(), u32::from(SLOTS) / 2);
    for k in keys.iter().filter(|k| moves_out(k)).take(20) {
        assert_eq!(granted(&run(&mut shard, 500, lease(k, "eu", 100))), 8);
    }
}

#[test]
fn a_move_acquired_after_its_keys_expired_is_empty_and_serves_fresh_windows() {
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
    let high = &fixture_key(true);
    run(&mut meta, 100, lease(high, "eu", 9));
    run(&mut meta, 200, split_into_one(0));
    run(&mut meta, 10_000, Command::Tick);
    let outgoing = meta.sharding().outgoing().values().next().unwrap().clone();
    assert_eq!(outgoing.key_count(), 0, "expired keys are dropped");
    let mut shard = shard_one(10_000);
    assert!(acquire_next_parts(&meta, &mut shard, 10_000));
    assert_eq!(granted(&run(&mut shard, 10_100, lease(high, "eu", 20))), 10);
}

#[test]
fn a_move_whose_keys_expire_between_two_parts_still_completes() {
    let (mut meta, _) = split_with_many_keys(WINDOW_MS);
    let mut shard = shard_one(300);
    assert!(!acquire_next_parts(&meta, &mut shard, 300), "several parts");
    let id = *meta.sharding().outgoing().keys().next().expect("a move");
    assert!(shard.sharding().arrival(id).acquired_keys > 0);
    // The frozen keys expire and are dropped before the next part.
    run(&mut meta, 60_000, Command::Tick);
    assert_eq!(meta.sharding().outgoing()[&id].key_count(), 0);
    assert!(acquire_next_parts(&meta, &mut shard, 60_000));
    assert_eq!(shard.sharding().owned_slots(), u32::from(SLOTS) / 2);
}

proptest! {
    /// Applying the sync commands to a shard leaves it with exactly the
    /// meta group's policies, whatever either held.
    #[test]
    fn policy_sync_makes_a_shards_policies_the_meta_groups(
        meta in proptest::collection::btree_map("[a-c]{0,2}", (1u64..50, 1u64..5_000), 0..5),
        shard in proptest::collection::btree_map("[a-c]{0,2}", (1u64..50, 1u64..5_000), 0..5),
    ) {
        let as_policies = |m: &BTreeMap<String, (u64, u64)>| -> Vec<_> {
            m.iter()
                .map(|(p, (limit, window))| {
                    policy(p, *limit, *window, leasehold_core::policy::PolicyKind::Counter)
                })
                .collect()
        };
        let (meta, held) = (as_policies(&meta), as_policies(&shard));
        let mut group = CoordinatorState::default();
        for p in &held {
            run(&mut group, 0, Command::SetPolicy(p.clone()));
        }
        let commands = sharding::policy_sync_commands(&meta, &group.policies());
        group.apply(&Proposal { stamp_ms: 1, commands });
        prop_assert_eq!(group.policies(), meta.clone());
        prop_assert!(sharding::policy_sync_commands(&meta, &group.policies()).is_empty());
    }
}

/// A new group that became `shard`, with the policy.
fn new_shard(shard: u32, at: u64) -> CoordinatorState {
    let mut group = CoordinatorState::default();
    run(
        &mut group,
        at,
        Command::BecomeShard {
            shard: ShardId(shard),
        },
    );
    run(&mut group, at, counter("k", LIMIT, WINDOW_MS));
    group
}

/// Shard 1 releases every move out of it the meta group recorded;
/// returns the outcomes of the releases it proposed.
fn release_moves(meta: &CoordinatorState, shard: &mut CoordinatorState, at: u64) -> Vec<Outcome> {
    let from = shard.sharding().shard();
    let moves: Vec<(MoveId, _)> = meta
        .sharding()
        .outgoing()
        .iter()
        .filter(|(id, m)| m.slots.from == from && !shard.sharding().outgoing().contains_key(*id))
        .map(|(id, m)| (*id, m.slots))
        .collect();
    moves
        .into_iter()
        .map(|(id, slots)| run(shard, at, Command::ReleaseSlots { id, slots }))
        .collect()
}

#[test]
fn a_shard_split_again_releases_its_slots_and_the_third_group_continues_their_windows() {
    let high = &fixture_key(true);
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, 60_000));
    run(&mut meta, 10, lease(high, "eu", 4));
    run(&mut meta, 20, split_into_one(0));
    let mut one = new_shard(1, 20);
    // Split shard 1 before it has acquired: it cannot release slots it
    // does not own yet, and keeps serving nothing of them meanwhile.
    let split_one = Command::ChangePlacement {
        expected_version: 1,
        change: PlacementChange::Split {
            shard: ShardId(1),
            into: ShardId(2),
            replicas: vec![1, 2],
        },
    };
    assert_eq!(
        run(&mut meta, 30, split_one),
        Outcome::Sharding(ShardingOutcome::PlacementChanged { version: 2 })
    );
    let early = release_moves(&meta, &mut one, 30);
    assert_eq!(early.len(), 1);
    assert!(
        matches!(early[0], Outcome::Rejected(CommandError::Placement(_))),
        "{early:?}"
    );
    assert!(acquire_next_parts(&meta, &mut one, 40));
    // Shard 1 serves the key until it releases it.
    assert_eq!(granted(&run(&mut one, 50, lease(high, "eu", 2))), 2);
    let moved_to_two = slot_of(high) >= SLOTS / 4 * 3;
    let released = release_moves(&meta, &mut one, 60);
    assert!(
        matches!(
            released[..],
            [Outcome::Sharding(ShardingOutcome::Released { .. })]
        ),
        "{released:?}"
    );
    assert_eq!(one.owns(&key(high)), !moved_to_two);
    // Released again: the same answer, nothing changes.
    let id = *one.sharding().outgoing().keys().next().expect("a release");
    let slots = one.sharding().outgoing()[&id].slots;
    let before = one.clone();
    let again = run(&mut one, 60, Command::ReleaseSlots { id, slots });
    assert!(matches!(
        again,
        Outcome::Sharding(ShardingOutcome::Released { .. })
    ));
    assert_eq!(one.sharding(), before.sharding());

    let mut two = new_shard(2, 70);
    assert!(acquire_next_parts(&one, &mut two, 80));
    assert_eq!(two.sharding().owned_slots(), u32::from(SLOTS) / 4);
    assert_eq!(
        one.sharding().owned_slots() + two.sharding().owned_slots(),
        u32::from(SLOTS) / 2
    );
    let (owner, other) = if moved_to_two {
        (&mut two, &mut one)
    } else {
        (&mut one, &mut two)
    };
    assert!(is_not_owner(&run(other, 90, lease(high, "eu", 1))));
    // 4 + 2 of the window's 10 were granted before: 4 remain.
    assert_eq!(granted(&run(owner, 90, lease(high, "eu", 100))), 4);
}

/// Eight keys, two in each quarter of the slots: the meta group keeps the
/// first half, shard 1 the third quarter, shard 2 the last.
fn two_keys_per_quarter() -> Vec<String> {
    (0..4u16)
        .flat_map(|quarter| {
            (0..)
                .map(|i| format!("k{i}"))
                .filter(move |k| slot_of(k) / (SLOTS / 4) == quarter)
                .take(2)
        })
        .collect()
}

/// One step of the interleaving.
#[derive(Debug, Clone)]
enum Step {
    /// Time passes.
    Wait(u64),
    /// A lease of a key, sent to group 0 (the meta group), 1 or 2.
    Lease {
        key: usize,
        tokens: u64,
        group: usize,
    },
    /// A reconcile of a key's last grant, sent to any group.
    Reconcile {
        key: usize,
        leftover: u64,
        group: usize,
    },
    /// The split of shard 0 into shard 1 (once; later ones are stale).
    SplitMeta,
    /// The split of shard 1 into shard 2 (once shard 1 exists).
    SplitOne,
    /// Shard 1 releases what the placement moved out of it.
    Release,
    /// Shard 1 (`false`) or shard 2 (`true`) applies the next parts.
    Acquire(bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..400).prop_map(Step::Wait),
        6 => (0usize..8, 1u64..8, 0usize..3)
            .prop_map(|(key, tokens, group)| Step::Lease { key, tokens, group }),
        2 => (0usize..8, 0u64..8, 0usize..3)
            .prop_map(|(key, leftover, group)| Step::Reconcile { key, leftover, group }),
        1 => Just(Step::SplitMeta),
        1 => Just(Step::SplitOne),
        1 => Just(Step::Release),
        2 => any::<bool>().prop_map(Step::Acquire),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// Whatever the interleaving of leases, reconciles, the two splits
    /// (shard 0 into 1, then 1 into 2), shard 1's release and the parts
    /// of both moves, and whichever group each request reaches, Σ granted
    /// − Σ credited per (key, window) over the three groups stays within
    /// the limit; and each key is served by one group at a time.
    #[test]
    fn groups_never_admit_in_one_window_together(steps in proptest::collection::vec(step(), 1..100)) {
        let keys = two_keys_per_quarter();
        let mut meta = CoordinatorState::default();
        run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
        let mut groups = [meta, new_shard(1, 0), new_shard(2, 0)];
        let mut now = 1u64;
        let mut outstanding: BTreeMap<(String, u64), i128> = BTreeMap::new();
        let mut last_window: BTreeMap<String, u64> = BTreeMap::new();
        for step in steps {
            match step {
                Step::Wait(ms) => now += ms,
                Step::SplitMeta => {
                    let version = groups[0].sharding().placement().version();
                    run(&mut groups[0], now, split_into_one(version));
                }
                Step::SplitOne => {
                    let version = groups[0].sharding().placement().version();
                    run(&mut groups[0], now, Command::ChangePlacement {
                        expected_version: version,
                        change: PlacementChange::Split {
                            shard: ShardId(1),
                            into: ShardId(2),
                            replicas: vec![2, 3],
                        },
                    });
                }
                Step::Release => {
                    let [meta, one, _] = &mut groups;
                    release_moves(meta, one, now);
                }
                Step::Acquire(false) => {
                    let [meta, one, _] = &mut groups;
                    acquire_next_parts(meta, one, now);
                }
                Step::Acquire(true) => {
                    let [_, one, two] = &mut groups;
                    acquire_next_parts(one, two, now);
                }
                Step::Lease { key, tokens, group } => {
                    let k = &keys[key];
                    let outcome = run(&mut groups[group], now, lease(k, "eu", tokens));
                    if let Outcome::Lease(grant) = &outcome {
                        *outstanding.entry((k.clone(), grant.window_start_ms)).or_default() +=
                            i128::from(grant.granted);
                        last_window.insert(k.clone(), grant.window_start_ms);
                        prop_assert!(
                            outstanding[&(k.clone(), grant.window_start_ms)] <= i128::from(LIMIT),
                            "{k} over its limit in window {}", grant.window_start_ms
                        );
                    } else {
                        prop_assert!(is_not_owner(&outcome), "{outcome:?}");
                    }
                }
                Step::Reconcile { key, leftover, group } => {
                    let k = &keys[key];
                    let Some(&window) = last_window.get(k) else { continue };
                    if let Outcome::Reconcile(r) =
                        run(&mut groups[group], now, reconcile(k, "eu", leftover, window))
                    {
                        *outstanding.entry((k.clone(), window)).or_default() -= i128::from(r.credited);
                    }
                }
            }
            // One group at a time serves each key.
            for k in &keys {
                let k = key(k);
                let serving = groups.iter().filter(|g| g.owns(&k)).count();
                prop_assert!(serving <= 1, "{k} served by {serving} groups");
            }
        }
    }
}

/// One step of a client that re-sends old request ids across moves.
#[derive(Debug, Clone)]
enum IdStep {
    /// Splits, releases, acquisitions and time, as [`Step`].
    Placement(Step),
    /// A lease of a key under the client's next seq, sent to any group.
    Send {
        key: usize,
        tokens: u64,
        group: usize,
    },
    /// The request of an earlier seq (picked among those sent) sent again,
    /// unchanged, to any group: a retry, or a client that does not know
    /// the placement changed.
    Resend { pick: usize, group: usize },
}

fn id_step() -> impl Strategy<Value = IdStep> {
    prop_oneof![
        3 => (0u64..400).prop_map(|ms| IdStep::Placement(Step::Wait(ms))),
        1 => Just(IdStep::Placement(Step::SplitMeta)),
        1 => Just(IdStep::Placement(Step::SplitOne)),
        1 => Just(IdStep::Placement(Step::Release)),
        2 => any::<bool>().prop_map(|two| IdStep::Placement(Step::Acquire(two))),
        5 => (0usize..8, 1u64..4, 0usize..3)
            .prop_map(|(key, tokens, group)| IdStep::Send { key, tokens, group }),
        5 => (any::<usize>(), 0usize..3).prop_map(|(pick, group)| IdStep::Resend { pick, group }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    /// Exactly-once across moves: whatever the splits, releases and
    /// acquisitions, and whichever group a (re-)sent id reaches, no
    /// request id is executed twice — every answer to an id that was
    /// executed is its first answer, or `SESSION_EXPIRED`, or `NOT_OWNER`
    /// (nothing executed) — and Σ granted per (key, window), counted once
    /// per executed id, stays within the limit.
    #[test]
    fn no_request_id_runs_twice_across_moves(steps in proptest::collection::vec(id_step(), 1..120)) {
        let keys = two_keys_per_quarter();
        let mut meta = CoordinatorState::default();
        run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
        let mut groups = [meta, new_shard(1, 0), new_shard(2, 0)];
        let mut now = 1u64;
        let mut sent: Vec<Command> = Vec::new();
        let mut executed: BTreeMap<u64, Outcome> = BTreeMap::new();
        let mut per_window: BTreeMap<(String, u64), u64> = BTreeMap::new();
        for step in steps {
            let (command, group) = match step {
                IdStep::Placement(Step::Wait(ms)) => { now += ms; continue }
                IdStep::Placement(Step::SplitMeta) => {
                    let version = groups[0].sharding().placement().version();
                    run(&mut groups[0], now, split_into_one(version));
                    continue;
                }
                IdStep::Placement(Step::SplitOne) => {
                    let version = groups[0].sharding().placement().version();
                    run(&mut groups[0], now, Command::ChangePlacement {
                        expected_version: version,
                        change: PlacementChange::Split {
                            shard: ShardId(1),
                            into: ShardId(2),
                            replicas: vec![2, 3],
                        },
                    });
                    continue;
                }
                IdStep::Placement(Step::Release) => {
                    let [meta, one, _] = &mut groups;
                    release_moves(meta, one, now);
                    continue;
                }
                IdStep::Placement(Step::Acquire(two)) => {
                    let [meta, one, shard_two] = &mut groups;
                    if two { acquire_next_parts(one, shard_two, now); } else { acquire_next_parts(meta, one, now); }
                    continue;
                }
                IdStep::Placement(_) => continue,
                IdStep::Send { key: k, tokens, group } => {
                    let command = Command::Lease {
                        key: key(&keys[k]),
                        region: region("eu"),
                        tokens,
                        request_id: Some(request("c", sent.len() as u64 + 1)),
                        caller: Principal::Anonymous,
                    };
                    sent.push(command.clone());
                    (command, group)
                }
                IdStep::Resend { pick, group } => {
                    if sent.is_empty() { continue }
                    (sent[pick % sent.len()].clone(), group)
                }
            };
            let (_, id) = command.request().expect("an id");
            let seq = id.seq;
            let outcome = run(&mut groups[group], now, command.clone());
            match (&outcome, executed.get(&seq)) {
                (Outcome::Lease(_), Some(first)) => {
                    prop_assert_eq!(&outcome, first, "seq {} answered anew by group {}", seq, group);
                }
                (Outcome::Lease(grant), None) => {
                    let Command::Lease { key, .. } = &command else { unreachable!() };
                    let total = per_window
                        .entry((key.as_str().to_string(), grant.window_start_ms))
                        .or_default();
                    *total += grant.granted;
                    prop_assert!(*total <= LIMIT, "{key} over its limit");
                    executed.insert(seq, outcome.clone());
                }
                (Outcome::Rejected(CommandError::SessionExpired(_) | CommandError::NotOwner(_)), _) => {}
                (other, _) => prop_assert!(false, "seq {seq}: {other:?}"),
            }
        }
    }
}
