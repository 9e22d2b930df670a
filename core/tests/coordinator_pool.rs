//! `PoolGrant` and `PoolRelease` through `apply`: the reference golden
//! vector, validation, the effective limit after a limit change, and reclaim.

mod coordinator_support;

use coordinator_support::*;
use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, Outcome, PoolGrantOutcome, PoolReleaseDisposition,
    PoolReleaseOutcome,
};
use leasehold_core::pool::fair_pool::RegionFairPool;

const T0: u64 = 1_699_999_980_000;

/// (region, weight, want_total, expected total) with L = 100, one window.
const GOLDEN: [(&str, u64, u64, u64); 10] = [
    ("us", 3, 10, 10),
    ("eu", 1, 40, 25),
    ("us", 3, 80, 75),
    ("ap", 2, 30, 0),
    ("eu", 1, 5, 25),
    ("us", 3, 200, 75),
    ("ap", 2, 60, 0),
    ("eu", 1, 100, 25),
    ("us", 3, 100, 75),
    ("ap", 2, 100, 0),
];

fn total(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::PoolGrant(PoolGrantOutcome { granted_total, .. }) => *granted_total,
        other => panic!("expected a pool grant, got {other:?}"),
    }
}

#[test]
fn golden_vector_through_apply() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    for (name, weight, want, expected) in GOLDEN {
        let got = total(&run(&mut s, T0, pool("fed/k", name, weight, want)));
        assert_eq!(got, expected, "{name} w{weight} want {want}");
    }
    let view = s.window_view(&key("fed/k"), T0).expect("policy exists");
    assert_eq!(view.granted, 100);
    let weights: Vec<_> = view
        .regions
        .iter()
        .map(|r| (r.region.as_str(), r.pool_weight))
        .collect();
    assert_eq!(weights, [("ap", 2), ("eu", 1), ("us", 3)]);
}

#[test]
fn golden_vector_matches_the_in_process_pool_call_by_call() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    let mut reference = RegionFairPool::new(100, 60_000).expect("valid pool");
    for (name, weight, want, _) in GOLDEN {
        let via_apply = total(&run(&mut s, T0, pool("fed/k", name, weight, want)));
        let direct = reference
            .grant(&region(name), weight, want, T0)
            .expect("valid weight");
        assert_eq!(via_apply, direct);
    }
}

#[test]
fn pool_validation() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, fair("f/", 10, 1_000));
    run(&mut s, 0, counter("c/", 10, 1_000));
    let before = s.clone();
    assert!(matches!(
        run(&mut s, 0, pool("f/a", "us", 0, 5)),
        Outcome::Rejected(CommandError::InvalidArgument(_))
    ));
    assert!(matches!(
        run(&mut s, 0, pool("c/a", "us", 1, 5)),
        Outcome::Rejected(CommandError::WrongKind(_))
    ));
    assert_eq!(
        run(&mut s, 0, pool("x", "us", 1, 5)),
        Outcome::Rejected(CommandError::NoPolicy("x".into()))
    );
    assert_eq!(s, before);
}

#[test]
fn joining_with_zero_want_reserves_the_guarantee() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, fair("f", 100, 1_000));
    assert_eq!(total(&run(&mut s, 0, pool("f", "eu", 1, 0))), 0);
    assert_eq!(total(&run(&mut s, 0, pool("f", "us", 1, 100))), 50);
    assert_eq!(total(&run(&mut s, 0, pool("f", "eu", 1, 100))), 50);
}

#[test]
fn lowered_limit_caps_pool_grants_of_the_live_window() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, fair("f", 100, 1_000));
    assert_eq!(total(&run(&mut s, 0, pool("f", "us", 1, 30))), 30);
    run(&mut s, 1, fair("f", 40, 1_000));
    assert_eq!(total(&run(&mut s, 2, pool("f", "eu", 1, 100))), 10);
    assert_eq!(
        total(&run(&mut s, 3, pool("f", "us", 1, 100))),
        30,
        "never shrinks, never exceeds"
    );
    // Next window: the new limit applies in full.
    assert_eq!(total(&run(&mut s, 1_000, pool("f", "us", 1, 100))), 40);
}

#[test]
fn pool_grants_are_per_window() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, fair("f", 10, 1_000));
    assert_eq!(total(&run(&mut s, 0, pool("f", "us", 1, 10))), 10);
    assert_eq!(total(&run(&mut s, 999, pool("f", "eu", 1, 10))), 0);
    match run(&mut s, 1_000, pool("f", "eu", 1, 10)) {
        Outcome::PoolGrant(p) => assert_eq!(
            (p.granted_total, p.window_start_ms, p.window_end_ms),
            (10, 1_000, 2_000)
        ),
        other => panic!("{other:?}"),
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        /// Within one window, `apply(PoolGrant)` returns exactly what the
        /// in-process pool returns for the same calls, and Σ totals ≤ L.
        #[test]
        fn coordinator_pool_equals_in_process_pool(
            limit in 1u64..1_000,
            calls in prop::collection::vec((0usize..5, 1u64..8, 0u64..1_200), 1..40),
        ) {
            let names = ["a", "b", "c", "d", "e"];
            let mut s = CoordinatorState::default();
            run(&mut s, T0, fair("k", limit, 60_000));
            let mut reference = RegionFairPool::new(limit, 60_000).expect("valid pool");
            for (r, weight, want) in calls {
                let via_apply = total(&run(&mut s, T0, pool("k", names[r], weight, want)));
                let direct = reference.grant(&region(names[r]), weight, want, T0).expect("valid weight");
                prop_assert_eq!(via_apply, direct);
                let view = s.window_view(&key("k"), T0).expect("policy exists");
                prop_assert_eq!(view.granted, reference.stats().total_granted);
                prop_assert!(view.granted <= limit);
            }
        }
    }
}

fn release(k: &str, r: &str, from_total: u64, keep_total: u64, window_start_ms: u64) -> Command {
    Command::PoolRelease {
        key: key(k),
        region: region(r),
        from_total,
        keep_total,
        window_start_ms,
        request_id: None,
        caller: leasehold_core::principal::Principal::Anonymous,
    }
}

fn released(outcome: &Outcome) -> PoolReleaseOutcome {
    match outcome {
        Outcome::PoolRelease(release) => *release,
        other => panic!("expected a pool release, got {other:?}"),
    }
}

#[test]
fn a_retired_region_frees_its_reserve_for_the_others() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    let start = T0 - T0 % 60_000;
    assert_eq!(total(&run(&mut s, T0, pool("fed/k", "eu", 1, 1))), 1);
    assert_eq!(total(&run(&mut s, T0, pool("fed/k", "us", 3, 100))), 75);
    assert_eq!(total(&run(&mut s, T0, pool("fed/k", "eu", 1, 100))), 25);
    // A stale view changes nothing and tells the real total.
    let stale = released(&run(&mut s, T0, release("fed/k", "us", 70, 30, start)));
    assert_eq!(stale.disposition, PoolReleaseDisposition::StaleTotal);
    assert_eq!((stale.released, stale.granted_total), (0, 75));
    // Another window's release changes nothing.
    let ended = released(&run(
        &mut s,
        T0,
        release("fed/k", "us", 75, 30, start - 60_000),
    ));
    assert_eq!(ended.disposition, PoolReleaseDisposition::WindowEnded);
    assert_eq!(total(&run(&mut s, T0, pool("fed/k", "eu", 1, 100))), 25);
    // us goes idle having spent 30: the 45 it did not spend go to eu.
    let freed = released(&run(&mut s, T0, release("fed/k", "us", 75, 30, start)));
    assert_eq!(freed.disposition, PoolReleaseDisposition::Released);
    assert_eq!((freed.released, freed.granted_total), (45, 30));
    assert_eq!(total(&run(&mut s, T0, pool("fed/k", "eu", 1, 100))), 70);
    // us comes back: it rejoins from what it kept; nothing is left.
    assert_eq!(total(&run(&mut s, T0, pool("fed/k", "us", 3, 100))), 30);
    let view = s.window_view(&key("fed/k"), T0).expect("policy exists");
    assert_eq!(view.granted, 100);
}

#[test]
fn release_validation() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, fair("f/", 10, 1_000));
    run(&mut s, 0, counter("c/", 10, 1_000));
    let before = s.clone();
    assert!(matches!(
        run(&mut s, 0, release("f/a", "us", 1, 2, 0)),
        Outcome::Rejected(CommandError::InvalidArgument(_))
    ));
    assert!(matches!(
        run(&mut s, 0, release("c/a", "us", 0, 0, 0)),
        Outcome::Rejected(CommandError::WrongKind(_))
    ));
    assert!(matches!(
        run(&mut s, 0, release("x", "us", 0, 0, 0)),
        Outcome::Rejected(CommandError::NoPolicy(_))
    ));
    assert_eq!(s, before, "refusals change nothing");
}

fn increment(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::PoolGrant(PoolGrantOutcome {
            granted_increment, ..
        }) => *granted_increment,
        other => panic!("expected a pool grant, got {other:?}"),
    }
}

/// Every grant of the golden vector answers what it added to its region's
/// total; the increments of a region add up to its total.
#[test]
fn every_grant_answers_the_increment_it_added() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    let mut held: std::collections::BTreeMap<&str, u64> = Default::default();
    for (name, weight, want, expected) in GOLDEN {
        let outcome = run(&mut s, T0, pool("fed/k", name, weight, want));
        let before = held.get(name).copied().unwrap_or(0);
        assert_eq!(total(&outcome), expected);
        assert_eq!(
            increment(&outcome),
            expected - before,
            "{name} w{weight} want {want}"
        );
        held.insert(name, before + increment(&outcome));
    }
    assert_eq!(held.values().sum::<u64>(), 100);
}

/// A retried pool grant (same request id) answers the increment of its
/// first execution, even after other calls of the region raised the total:
/// a retry never hands its caller another call's tokens.
#[test]
fn a_retried_grant_answers_its_own_increment() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    let with_id = |want: u64, client: &str, seq: u64| Command::PoolGrant {
        key: key("fed/k"),
        region: region("eu"),
        region_weight: 1,
        want_total: want,
        request_id: Some(request(client, seq)),
        caller: leasehold_core::principal::Principal::Anonymous,
    };
    let first = run(&mut s, T0, with_id(30, "node-a", 1));
    assert_eq!((total(&first), increment(&first)), (30, 30));
    // A second process of the region raises the total.
    let other = run(&mut s, T0, with_id(70, "node-b", 1));
    assert_eq!((total(&other), increment(&other)), (70, 40));
    // node-a's retry: its own answer, not 70 − 0.
    let retry = run(&mut s, T0, with_id(30, "node-a", 1));
    assert_eq!(retry, first);
    // A fresh ask below the total adds nothing.
    let below = run(&mut s, T0, with_id(50, "node-a", 2));
    assert_eq!((total(&below), increment(&below)), (70, 0));
}

/// A join ahead answers its increment in the window it joins.
#[test]
fn a_join_ahead_answers_its_increment() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    let live = run(&mut s, T0, pool("fed/k", "eu", 1, 10));
    let PoolGrantOutcome { window_end_ms, .. } = match live {
        Outcome::PoolGrant(grant) => grant,
        other => panic!("{other:?}"),
    };
    let join = |want: u64| Command::PoolJoinNext {
        key: key("fed/k"),
        region: region("eu"),
        region_weight: 1,
        want_total: want,
        window_start_ms: window_end_ms,
        retire: false,
        request_id: None,
        caller: leasehold_core::principal::Principal::Anonymous,
    };
    let late = window_end_ms - 1_000;
    let first = run(&mut s, late, join(20));
    assert_eq!((total(&first), increment(&first)), (20, 20));
    let more = run(&mut s, late, join(35));
    assert_eq!((total(&more), increment(&more)), (35, 15));
}

/// The region cap of a window, at exactly its size: a new region is
/// refused (lease and pool grant alike), a region the window tracks is
/// still served.
#[test]
fn a_full_window_refuses_a_new_region_and_serves_the_ones_it_tracks() {
    use leasehold_core::coordinator::MAX_REGIONS_PER_WINDOW;
    for fair_key in [true, false] {
        let mut s = CoordinatorState::default();
        run(&mut s, T0, fair("f/", 1_000_000, 60_000));
        run(&mut s, T0, counter("c/", 1_000_000, 60_000));
        let call = |name: &str| {
            if fair_key {
                pool("f/k", name, 1, 1)
            } else {
                lease("c/k", name, 1)
            }
        };
        for i in 0..MAX_REGIONS_PER_WINDOW {
            let outcome = run(&mut s, T0, call(&format!("r{i}")));
            assert!(
                !matches!(outcome, Outcome::Rejected(_)),
                "region {i}: {outcome:?}"
            );
        }
        let before = s.clone();
        assert!(
            matches!(
                run(&mut s, T0, call("one-too-many")),
                Outcome::Rejected(CommandError::InvalidArgument(_))
            ),
            "fair {fair_key}"
        );
        assert_eq!(s, before, "a refusal changes nothing");
        let again = run(&mut s, T0, call("r7"));
        assert!(
            !matches!(again, Outcome::Rejected(_)),
            "fair {fair_key}: {again:?}"
        );
    }
}

/// `pool_view_at` answers the live window and the one right after it, and
/// nothing else: not a later window while one is live, and not the window
/// after the one a call would open when none is live.
#[test]
fn pool_view_at_answers_the_live_window_and_the_next_only() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    let k = key("fed/k");
    // No window live yet: the window a call would open, not the one after.
    let opens = s.pool_view(&k, T0).expect("a fair policy").bounds;
    assert!(s.pool_view_at(&k, opens.start_ms, T0).is_some());
    assert_eq!(s.pool_view_at(&k, opens.end_ms, T0), None);
    run(&mut s, T0, pool("fed/k", "eu", 1, 10));
    let live = s.pool_view(&k, T0).expect("live").bounds;
    assert_eq!(
        s.pool_view_at(&k, live.start_ms, T0).map(|v| v.bounds),
        Some(live)
    );
    let next = s
        .pool_view_at(&k, live.end_ms, T0)
        .expect("the next window");
    assert_eq!(next.bounds.start_ms, live.end_ms);
    let length = live.end_ms - live.start_ms;
    assert_eq!(s.pool_view_at(&k, live.end_ms + length, T0), None);
    assert_eq!(s.pool_view_at(&k, live.start_ms + 1, T0), None);
}

/// A next window joined ahead that became live before any collection
/// rolled it is the live view, and the window after it — asked for by a
/// join ahead of *it* — is its own view (its bounds, no regions), not the
/// same record again: the leader sizes and caps a join by the window it
/// joins.
#[test]
fn pool_view_at_the_window_after_a_next_window_that_became_live() {
    let mut s = CoordinatorState::default();
    run(&mut s, T0, fair("fed/", 100, 60_000));
    let k = key("fed/k");
    let live = match run(&mut s, T0, pool("fed/k", "eu", 1, 10)) {
        Outcome::PoolGrant(grant) => grant,
        other => panic!("{other:?}"),
    };
    let join = Command::PoolJoinNext {
        key: key("fed/k"),
        region: region("eu"),
        region_weight: 1,
        want_total: 30,
        window_start_ms: live.window_end_ms,
        retire: false,
        request_id: None,
        caller: leasehold_core::principal::Principal::Anonymous,
    };
    run(&mut s, live.window_end_ms - 1_000, join);
    // In the joined window, before anything rolls it.
    let now = live.window_end_ms + 1_000;
    let current = s.pool_view(&k, now).expect("live");
    assert_eq!(current.bounds.start_ms, live.window_end_ms);
    assert_eq!(current.regions.len(), 1);
    let after = s
        .pool_view_at(&k, current.bounds.end_ms, now)
        .expect("the window after");
    assert_eq!(after.bounds.start_ms, current.bounds.end_ms);
    assert!(after.regions.is_empty(), "{after:?}");
}
