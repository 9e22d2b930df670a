//! Data-driven tests of `Lease`, `SetPolicy` and `DeletePolicy`.

mod coordinator_support;

use coordinator_support::*;
use leasehold_core::coordinator::{CommandError, CoordinatorState, LeaseGrant, Outcome, Proposal};

#[test]
fn lease_grants_first_come_then_partial_then_zero() {
    let mut s = CoordinatorState::default();
    assert_eq!(
        run(&mut s, 1_000, counter("api/", 10, 1_000)),
        Outcome::PolicySet
    );
    assert_eq!(
        run(&mut s, 1_250, lease("api/x", "us", 6)),
        Outcome::Lease(LeaseGrant {
            granted: 6,
            limit: 10,
            window_start_ms: 1_000,
            window_end_ms: 2_000,
            coordinator_now_ms: 1_250
        })
    );
    assert_eq!(granted(&run(&mut s, 1_300, lease("api/x", "eu", 6))), 4);
    assert_eq!(granted(&run(&mut s, 1_400, lease("api/x", "us", 1))), 0);
    // A different key under the same policy has its own window.
    assert_eq!(granted(&run(&mut s, 1_400, lease("api/y", "us", 3))), 3);
    // The next window starts fresh.
    assert_eq!(granted(&run(&mut s, 2_000, lease("api/x", "us", 10))), 10);
}

#[test]
fn invalid_leases_are_rejected_without_state_change() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("c/", 10, 1_000));
    run(&mut s, 0, fair("f/", 10, 1_000));
    let before = s.clone();
    let cases = [
        (lease("c/a", "us", 0), "tokens"),
        (lease("nope", "us", 1), "no policy"),
        (lease("f/a", "us", 1), "fair"),
    ];
    for (command, why) in cases {
        let outcome = run(&mut s, 0, command);
        assert!(
            matches!(outcome, Outcome::Rejected(_)),
            "{why}: {outcome:?}"
        );
        assert_eq!(s, before, "{why}: state changed");
    }
    assert_eq!(
        run(&mut s, 0, lease("nope", "us", 1)),
        Outcome::Rejected(CommandError::NoPolicy("nope".into()))
    );
}

#[test]
fn clock_is_monotonic_across_backward_stamps() {
    let mut s = CoordinatorState::default();
    run(&mut s, 5_000, counter("", 10, 1_000));
    let outcome = run(&mut s, 3_000, lease("k", "us", 1));
    assert_eq!(s.now_ms(), 5_000);
    match outcome {
        Outcome::Lease(g) => {
            assert_eq!(
                (g.window_start_ms, g.window_end_ms, g.coordinator_now_ms),
                (5_000, 6_000, 5_000)
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_policy_is_rejected_and_nothing_changes() {
    let mut s = CoordinatorState::default();
    let before = s.clone();
    let outcome = run(&mut s, 0, counter("a", 0, 1_000));
    assert!(
        matches!(outcome, Outcome::Rejected(CommandError::InvalidArgument(_))),
        "{outcome:?}"
    );
    assert_eq!(s.policies(), Vec::new());
    assert_eq!(s, before);
}

#[test]
fn longest_prefix_policy_governs() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("", 100, 1_000));
    run(&mut s, 0, counter("tight/", 2, 1_000));
    assert_eq!(granted(&run(&mut s, 0, lease("tight/a", "us", 5))), 2);
    assert_eq!(granted(&run(&mut s, 0, lease("loose", "us", 5))), 5);
    assert_eq!(s.policy_for(&key("tight/zz")).map(|p| p.limit), Some(2));
    assert_eq!(
        s.policies()
            .iter()
            .map(|p| p.prefix.as_str())
            .collect::<Vec<_>>(),
        ["", "tight/"]
    );
}

#[test]
fn limit_decrease_applies_now_increase_applies_next_window() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 1_000));
    assert_eq!(granted(&run(&mut s, 100, lease("k", "us", 4))), 4);
    run(&mut s, 200, counter("k", 6, 1_000));
    assert_eq!(
        granted(&run(&mut s, 300, lease("k", "us", 10))),
        2,
        "lowered to 6, 4 out"
    );
    run(&mut s, 400, counter("k", 50, 1_000));
    assert_eq!(
        granted(&run(&mut s, 500, lease("k", "us", 10))),
        0,
        "raise waits for the next window"
    );
    assert_eq!(s.window_view(&key("k"), 500).map(|v| v.limit), Ok(6));
    assert_eq!(granted(&run(&mut s, 1_000, lease("k", "us", 100))), 50);
}

#[test]
fn window_ms_change_keeps_live_bounds_and_next_window_starts_at_old_end() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 10_000));
    run(&mut s, 2_000, lease("k", "us", 1));
    run(&mut s, 2_500, counter("k", 10, 3_000));
    match run(&mut s, 9_000, lease("k", "us", 1)) {
        Outcome::Lease(g) => assert_eq!((g.window_start_ms, g.window_end_ms), (0, 10_000)),
        other => panic!("{other:?}"),
    }
    // Aligned 3 s window containing 10 500 is [9 000, 12 000): starts at the old end instead.
    match run(&mut s, 10_500, lease("k", "us", 1)) {
        Outcome::Lease(g) => assert_eq!((g.window_start_ms, g.window_end_ms), (10_000, 12_000)),
        other => panic!("{other:?}"),
    }
    match run(&mut s, 12_000, lease("k", "us", 1)) {
        Outcome::Lease(g) => assert_eq!((g.window_start_ms, g.window_end_ms), (12_000, 15_000)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn window_start_never_repeats_after_growing_window_ms_even_when_idle() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 1_000));
    run(&mut s, 20_500, lease("k", "us", 1)); // window [20 000, 21 000)
    run(&mut s, 20_600, counter("k", 10, 60_000));
    // Long idle: the record is collected, the tombstone remains.
    run(&mut s, 30_000, leasehold_core::coordinator::Command::Tick);
    assert_eq!(s.live_windows(), 0);
    match run(&mut s, 30_000, lease("k", "us", 1)) {
        Outcome::Lease(g) => assert_eq!((g.window_start_ms, g.window_end_ms), (21_000, 60_000)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn delete_policy_refuses_later_leases_but_keeps_the_live_window() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 1_000));
    run(&mut s, 0, lease("k", "us", 7));
    assert_eq!(
        run(
            &mut s,
            1,
            leasehold_core::coordinator::Command::DeletePolicy { prefix: "k".into() }
        ),
        Outcome::PolicyDeleted { existed: true }
    );
    assert_eq!(
        run(
            &mut s,
            1,
            leasehold_core::coordinator::Command::DeletePolicy { prefix: "k".into() }
        ),
        Outcome::PolicyDeleted { existed: false }
    );
    assert_eq!(
        run(&mut s, 2, lease("k", "us", 1)),
        Outcome::Rejected(CommandError::NoPolicy("k".into()))
    );
    assert_eq!(s.live_windows(), 1);
    // Re-adding the policy within the window: the 7 granted still count.
    run(&mut s, 3, counter("k", 10, 1_000));
    assert_eq!(granted(&run(&mut s, 4, lease("k", "us", 10))), 3);
}

#[test]
fn batch_applies_in_order_with_one_clock() {
    let mut s = CoordinatorState::default();
    let result = s.apply(&Proposal {
        stamp_ms: 7_000,
        commands: vec![
            counter("", 5, 1_000),
            lease("a", "us", 3),
            lease("a", "eu", 3),
        ],
    });
    assert_eq!(result.outcomes.len(), 3);
    assert_eq!(granted(&result.outcomes[1]), 3);
    assert_eq!(granted(&result.outcomes[2]), 2);
}

#[test]
fn window_view_reads_without_creating() {
    let mut s = CoordinatorState::default();
    assert_eq!(
        s.window_view(&key("k"), 0),
        Err(CommandError::NoPolicy("k".into()))
    );
    run(&mut s, 1_500, counter("", 10, 1_000));
    let empty = s.window_view(&key("k"), 1_500).expect("policy exists");
    assert_eq!(
        (empty.window_start_ms, empty.granted, empty.limit),
        (1_000, 0, 10)
    );
    assert_eq!(s.live_windows(), 0);
    run(&mut s, 1_600, lease("k", "us", 4));
    let view = s.window_view(&key("k"), 1_600).expect("policy exists");
    assert_eq!((view.granted, view.returned, view.regions.len()), (4, 0, 1));
    assert_eq!(view.regions[0].region, "us");
    // As of a later time the next (empty) window is shown.
    assert_eq!(
        s.window_view(&key("k"), 2_000)
            .map(|v| (v.window_start_ms, v.granted)),
        Ok((2_000, 0))
    );
}

#[test]
fn window_start_never_repeats_when_window_grows_after_the_tombstone_is_dropped() {
    let mut s = CoordinatorState::default();
    run(&mut s, 1_000_000, counter("", 1, 500));
    run(&mut s, 1_000_051, lease("zz", "us", 1)); // [1 000 000, 1 000 500)
                                                  // At 1 001 000 the record and its tombstone are both collected, then the
                                                  // window grows: the aligned 3 s window [999 000, 1 002 000) would overlap.
    run(&mut s, 1_001_000, counter("", 1, 3_000));
    match run(&mut s, 1_001_000, lease("zz", "us", 1)) {
        Outcome::Lease(g) => {
            assert_eq!((g.window_start_ms, g.window_end_ms), (1_000_500, 1_002_000))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn absurd_stamps_are_clamped_and_windows_stay_well_formed() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("", 10, 1_000));
    let first = run(&mut s, u64::MAX, lease("k", "us", 6));
    let second = run(&mut s, u64::MAX, lease("k", "us", 6));
    assert_eq!(s.now_ms(), leasehold_core::coordinator::MAX_CLOCK_MS);
    match (first, second) {
        (Outcome::Lease(a), Outcome::Lease(b)) => {
            assert_eq!(
                (a.granted, b.granted),
                (6, 4),
                "same window, limit respected"
            );
            assert_eq!(a.window_start_ms, b.window_start_ms);
            assert!(a.window_start_ms <= s.now_ms() && s.now_ms() < a.window_end_ms);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn usage_by_policy_sums_the_live_windows_of_each_policy() {
    let mut s = CoordinatorState::default();
    run(&mut s, 1_000, counter("api/", 10, 1_000));
    run(&mut s, 1_000, counter("jobs/", 100, 60_000));
    run(&mut s, 1_100, lease("api/x", "us", 6));
    run(&mut s, 1_100, lease("api/y", "eu", 3));
    run(&mut s, 1_100, lease("jobs/z", "eu", 40));
    let usage = s.usage_by_policy(1_200);
    let rows: Vec<_> = usage
        .iter()
        .map(|u| {
            (
                u.policy.prefix.as_str(),
                u.live_windows,
                u.limit_in_live_windows,
                u.granted,
            )
        })
        .collect();
    assert_eq!(rows, vec![("api/", 2, 20, 9), ("jobs/", 1, 100, 40)]);
    // Once api/'s windows end they no longer count; jobs/'s still does.
    let usage = s.usage_by_policy(2_000);
    assert_eq!(usage[0].live_windows, 0);
    assert_eq!(usage[0].granted, 0);
    assert_eq!(usage[1].granted, 40);
}
