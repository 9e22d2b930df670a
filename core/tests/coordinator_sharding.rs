//! Keys changing hands between shards (ADR 0025): the meta group moves
//! slots out with their keys' window state, the new owner acquires them
//! in parts, and at no point do two groups admit in one key's window — an
//! oracle sums every grant, minus every credit, per (key, window) across
//! both groups and holds it to the limit, whatever the interleaving.

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

/// Applies the next part of every move out of `meta` to `shard`; returns
/// whether every move is complete.
fn acquire_next_parts(meta: &CoordinatorState, shard: &mut CoordinatorState, at: u64) -> bool {
    let moves: Vec<(MoveId, _)> = meta
        .sharding()
        .outgoing()
        .iter()
        .map(|(id, m)| (*id, m.clone()))
        .collect();
    let mut complete = true;
    for (id, outgoing) in moves {
        let arrival = shard.sharding().arrival(id);
        if arrival.complete {
            continue;
        }
        let part = outgoing.part(id, arrival.acquired_keys);
        match run(shard, at, Command::AcquireSlots(part)) {
            Outcome::Sharding(ShardingOutcome::Acquired { complete: done, .. }) => {
                complete &= done;
            }
            other => panic!("acquire refused: {other:?}"),
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
    // Slots go out of shard 0 only: a move between two other shards waits
    // for the handoff across logs.
    run(&mut meta, 20, split_into_one(0));
    let add_two = Command::ChangePlacement {
        expected_version: 1,
        change: PlacementChange::AddShard {
            shard: ShardId(2),
            replicas: vec![1],
        },
    };
    assert!(!refused(&run(&mut meta, 30, add_two)));
    let from_one = Command::ChangePlacement {
        expected_version: 2,
        change: PlacementChange::MoveSlots {
            start: u32::from(SLOTS) - 10,
            end: u32::from(SLOTS),
            to: ShardId(2),
        },
    };
    assert!(refused(&run(&mut meta, 40, from_one)));
    // A shard group takes no placement change.
    let mut shard = shard_one(50);
    assert!(refused(&run(&mut shard, 60, split_into_one(0))));
}

#[test]
fn a_large_move_travels_in_parts_that_apply_once_and_in_order() {
    let mut meta = CoordinatorState::default();
    run(&mut meta, 0, counter("k", LIMIT, 60_000));
    let keys: Vec<String> = (0..3_000).map(|i| format!("k{i:0>200}")).collect();
    let commands: Vec<Command> = keys.iter().map(|k| lease(k, "eu", 2)).collect();
    meta.apply(&Proposal {
        stamp_ms: 100,
        commands,
    });
    run(&mut meta, 200, split_into_one(0));
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

/// One step of the interleaving.
#[derive(Debug, Clone)]
enum Step {
    /// Time passes.
    Wait(u64),
    /// A lease of a key, sent to the meta group or to shard 1.
    Lease {
        key: usize,
        tokens: u64,
        to_shard: bool,
    },
    /// A reconcile of a key's last grant, sent to either group.
    Reconcile {
        key: usize,
        leftover: u64,
        to_shard: bool,
    },
    /// The split of shard 0 (once; later ones are stale and refused).
    Split,
    /// Shard 1 applies the next part of the move.
    Acquire,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..400).prop_map(Step::Wait),
        6 => (0usize..6, 1u64..8, any::<bool>())
            .prop_map(|(key, tokens, to_shard)| Step::Lease { key, tokens, to_shard }),
        2 => (0usize..6, 0u64..8, any::<bool>())
            .prop_map(|(key, leftover, to_shard)| Step::Reconcile { key, leftover, to_shard }),
        1 => Just(Step::Split),
        2 => Just(Step::Acquire),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the interleaving of leases, reconciles, the split and the
    /// parts of the move, and whichever group each request reaches, Σ
    /// granted − Σ credited per (key, window) over both groups stays
    /// within the limit; and each key is served by one group at a time.
    #[test]
    fn two_groups_never_admit_in_one_window_together(steps in proptest::collection::vec(step(), 1..80)) {
        let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
        let mut meta = CoordinatorState::default();
        run(&mut meta, 0, counter("k", LIMIT, WINDOW_MS));
        let mut shard = shard_one(0);
        let mut now = 1u64;
        let mut outstanding: BTreeMap<(String, u64), i128> = BTreeMap::new();
        let mut last_window: BTreeMap<String, u64> = BTreeMap::new();
        for step in steps {
            match step {
                Step::Wait(ms) => now += ms,
                Step::Split => {
                    let version = meta.sharding().placement().version();
                    run(&mut meta, now, split_into_one(version));
                }
                Step::Acquire => {
                    acquire_next_parts(&meta, &mut shard, now);
                }
                Step::Lease { key, tokens, to_shard } => {
                    let k = &keys[key];
                    let group = if to_shard { &mut shard } else { &mut meta };
                    let outcome = run(group, now, lease(k, "eu", tokens));
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
                Step::Reconcile { key, leftover, to_shard } => {
                    let k = &keys[key];
                    let Some(&window) = last_window.get(k) else { continue };
                    let group = if to_shard { &mut shard } else { &mut meta };
                    if let Outcome::Reconcile(r) = run(group, now, reconcile(k, "eu", leftover, window)) {
                        *outstanding.entry((k.clone(), window)).or_default() -= i128::from(r.credited);
                    }
                }
            }
            // One group at a time serves each key.
            for k in &keys {
                let k = key(k);
                prop_assert!(!(meta.owns(&k) && shard.owns(&k)), "{k} served twice");
            }
        }
    }
}
