//! Shadow mode at the coordinator: a shadow policy grants everything asked,
//! counts exactly the excess over its limit as would-deny (per window and
//! per policy), and enforces again the moment shadow mode is turned off.

mod coordinator_support;

use coordinator_support::*;
use leasehold_core::coordinator::{Command, CoordinatorState, Outcome};
use leasehold_core::policy::PolicyKind;
use leasehold_core::shadow::ShadowTally;
use proptest::prelude::*;

fn shadow_policy(prefix: &str, limit: u64, kind: PolicyKind, shadow: bool) -> Command {
    let mut policy = policy(prefix, limit, 1_000, kind);
    policy.shadow = shadow;
    Command::SetPolicy(policy)
}

fn tally(tokens: u64, requests: u64) -> ShadowTally {
    ShadowTally {
        would_deny_tokens: tokens,
        would_deny_requests: requests,
    }
}

#[test]
fn a_shadow_counter_admits_beyond_the_limit_and_counts_the_excess() {
    let mut s = CoordinatorState::default();
    run(
        &mut s,
        0,
        shadow_policy("api/", 10, PolicyKind::Counter, true),
    );
    assert_eq!(granted(&run(&mut s, 100, lease("api/x", "eu", 6))), 6);
    assert_eq!(granted(&run(&mut s, 200, lease("api/x", "us", 6))), 6);
    assert_eq!(granted(&run(&mut s, 300, lease("api/x", "eu", 5))), 5);
    let view = s.window_view(&key("api/x"), 300).unwrap();
    assert_eq!(view.granted, 17, "admitted beyond L = 10");
    assert_eq!(
        view.shadow,
        tally(7, 2),
        "2 of the 6 of the second lease, then all 5"
    );
    assert_eq!(s.shadow_total(), tally(7, 2));
    assert_eq!(
        s.shadow_tallies().collect::<Vec<_>>(),
        vec![("api/", tally(7, 2))]
    );

    // Shadow off at runtime: the window is past L, so nothing more is granted.
    run(
        &mut s,
        400,
        shadow_policy("api/", 10, PolicyKind::Counter, false),
    );
    assert_eq!(granted(&run(&mut s, 500, lease("api/x", "eu", 1))), 0);
    // ... and the next window is enforced from the start.
    assert_eq!(granted(&run(&mut s, 1_000, lease("api/x", "eu", 11))), 10);
    assert_eq!(
        s.shadow_total(),
        tally(7, 2),
        "enforced decisions count nothing"
    );
    let next = s.window_view(&key("api/x"), 1_000).unwrap();
    assert_eq!(next.shadow, ShadowTally::default());

    // Deleting the policy drops its tally.
    run(
        &mut s,
        1_100,
        Command::DeletePolicy {
            prefix: "api/".into(),
        },
    );
    assert_eq!(s.shadow_total(), ShadowTally::default());
}

#[test]
fn a_shadow_fair_pool_grants_what_is_wanted_and_counts_beyond_the_fair_total() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, shadow_policy("f/", 10, PolicyKind::Fair, true));
    let total = |outcome: &Outcome| match outcome {
        Outcome::PoolGrant(grant) => grant.granted_total,
        other => panic!("expected a pool grant, got {other:?}"),
    };
    assert_eq!(total(&run(&mut s, 10, pool("f/k", "eu", 1, 8))), 8);
    // Fair total for us is 2 (10 − 8 held by eu); shadow grants all 9.
    assert_eq!(total(&run(&mut s, 20, pool("f/k", "us", 1, 9))), 9);
    // A smaller want never lowers the region's total and counts nothing.
    assert_eq!(total(&run(&mut s, 30, pool("f/k", "us", 1, 3))), 9);
    let view = s.window_view(&key("f/k"), 30).unwrap();
    assert_eq!(view.granted, 17);
    assert_eq!(view.shadow, tally(7, 1));
}

#[test]
fn a_policy_that_is_not_shadow_counts_nothing() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("api/", 10, 1_000));
    for at in 0..5 {
        run(&mut s, at, lease("api/x", "eu", 4));
    }
    assert_eq!(s.window_view(&key("api/x"), 5).unwrap().granted, 10);
    assert_eq!(s.shadow_total(), ShadowTally::default());
    assert_eq!(s.shadow_tallies().count(), 0);
}

proptest! {
    /// Whatever the leases, a shadow window grants all of them, and its
    /// would-deny tokens are exactly Σ granted − L once past L (0 before).
    #[test]
    fn shadow_would_deny_is_exactly_the_excess(
        asks in proptest::collection::vec(1u64..40, 1..30),
        limit in 1u64..100,
    ) {
        let mut s = CoordinatorState::default();
        run(&mut s, 0, shadow_policy("k", limit, PolicyKind::Counter, true));
        for (i, tokens) in asks.iter().enumerate() {
            prop_assert_eq!(granted(&run(&mut s, i as u64, lease("k", "eu", *tokens))), *tokens);
        }
        let total: u64 = asks.iter().sum();
        let view = s.window_view(&key("k"), asks.len() as u64).unwrap();
        prop_assert_eq!(view.granted, total);
        prop_assert_eq!(view.shadow.would_deny_tokens, total.saturating_sub(limit));
        prop_assert_eq!(s.shadow_total(), view.shadow);
    }
}
