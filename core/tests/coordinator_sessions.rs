//! Exactly-once effects through `apply`: retries, too-old ids, bounds, and GC.

mod coordinator_support;

use coordinator_support::*;
use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, Outcome, Proposal, MAX_RESPONSES_PER_SESSION,
    MAX_SESSIONS_PER_PRINCIPAL, SESSION_MIN_RETAIN_MS,
};
use leasehold_core::principal::Principal;

fn lease_with_id(k: &str, r: &str, tokens: u64, client: &str, seq: u64) -> Command {
    Command::Lease {
        key: key(k),
        region: region(r),
        tokens,
        request_id: Some(request(client, seq)),
        caller: Principal::Anonymous,
    }
}

#[test]
fn retried_lease_returns_the_first_grant_and_changes_nothing() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 1_000));
    let first = run(&mut s, 100, lease_with_id("k", "us", 6, "c", 1));
    let after_first = s.clone();
    let retry = run(&mut s, 100, lease_with_id("k", "us", 6, "c", 1));
    assert_eq!(retry, first);
    assert_eq!(s, after_first);
    // Later in the window: still the first outcome (clock moved, nothing else).
    assert_eq!(run(&mut s, 900, lease_with_id("k", "us", 6, "c", 1)), first);
    assert_eq!(s.window_view(&key("k"), 900).map(|v| v.granted), Ok(6));
    // A new seq is a new request.
    assert_eq!(
        granted(&run(&mut s, 900, lease_with_id("k", "us", 6, "c", 2))),
        4
    );
}

#[test]
fn retried_reconcile_does_not_credit_twice_and_rejections_replay() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 1_000));
    run(&mut s, 0, lease("k", "us", 10));
    let rec = Command::Reconcile {
        key: key("k"),
        region: region("us"),
        leftover: 4,
        window_start_ms: 0,
        request_id: Some(request("c", 7)),
        caller: Principal::Anonymous,
    };
    let first = run(&mut s, 10, rec.clone());
    assert_eq!(run(&mut s, 20, rec), first);
    assert_eq!(s.window_view(&key("k"), 20).map(|v| v.returned), Ok(4));
    // A rejection is replayed too, even once the cause is gone.
    let rejected = run(&mut s, 30, lease_with_id("other", "us", 1, "c", 8));
    assert_eq!(
        rejected,
        Outcome::Rejected(CommandError::NoPolicy("other".into()))
    );
    run(&mut s, 40, counter("other", 5, 1_000));
    assert_eq!(
        run(&mut s, 50, lease_with_id("other", "us", 1, "c", 8)),
        rejected
    );
}

#[test]
fn ids_older_than_the_retained_range_are_refused() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 1_000, 1_000));
    let n = MAX_RESPONSES_PER_SESSION as u64 + 2;
    for seq in 0..n {
        assert_eq!(
            granted(&run(&mut s, 0, lease_with_id("k", "us", 1, "c", seq))),
            1
        );
    }
    let before = s.clone();
    assert!(matches!(
        run(&mut s, 0, lease_with_id("k", "us", 1, "c", 1)),
        Outcome::Rejected(CommandError::SessionExpired(_))
    ));
    assert_eq!(s, before);
    assert_eq!(
        granted(&run(&mut s, 0, lease_with_id("k", "us", 1, "c", 2))),
        1,
        "still retained: replayed"
    );
    assert_eq!(s.window_view(&key("k"), 0).map(|v| v.granted), Ok(n));
}

#[test]
fn sessions_expire_after_their_windows_and_the_minimum_retention() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 100_000));
    run(&mut s, 0, lease_with_id("k", "us", 1, "a", 1)); // window ends at 100 000
    run(&mut s, 0, lease_with_id("nokey", "us", 1, "b", 1)); // rejection: kept 60 s
    assert_eq!(s.client_sessions(), 2);
    run(&mut s, SESSION_MIN_RETAIN_MS - 1, Command::Tick);
    assert_eq!(s.client_sessions(), 2);
    run(&mut s, SESSION_MIN_RETAIN_MS, Command::Tick);
    assert_eq!(s.client_sessions(), 1);
    run(&mut s, 100_000, Command::Tick);
    assert_eq!(s.client_sessions(), 0);
}

#[test]
fn garbage_collection_bounds_windows_and_tick_reports_it() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("", 10, 1_000));
    for i in 0..50 {
        run(&mut s, 10, lease(&format!("k{i}"), "us", 1));
    }
    assert_eq!(s.live_windows(), 50);
    assert_eq!(
        run(&mut s, 999, Command::Tick),
        Outcome::Ticked {
            collected_windows: 0
        }
    );
    assert_eq!(
        run(&mut s, 1_000, Command::Tick),
        Outcome::Ticked {
            collected_windows: 50
        }
    );
    assert_eq!(s.live_windows(), 0);
    // Tombstones go once no later window could start before their end.
    assert_eq!(s.tracked_keys(), 50);
    run(&mut s, 2_000, Command::Tick);
    assert_eq!(s.tracked_keys(), 0);
    // Collection happens once per proposal; every Tick in it reports that pass.
    run(&mut s, 2_000, lease("z", "us", 1));
    let result = s.apply(&Proposal {
        stamp_ms: 3_000,
        commands: vec![Command::Tick, Command::Tick],
    });
    assert_eq!(
        result.outcomes,
        [
            Outcome::Ticked {
                collected_windows: 1
            },
            Outcome::Ticked {
                collected_windows: 1
            }
        ]
    );
    // An empty proposal collects too.
    run(&mut s, 3_000, lease("z", "us", 1));
    s.apply(&Proposal {
        stamp_ms: 4_000,
        commands: vec![],
    });
    assert_eq!(s.live_windows(), 0);
}

fn lease_as(caller: Principal, k: &str, tokens: u64, client: &str, seq: u64) -> Command {
    match lease_with_id(k, "us", tokens, client, seq) {
        Command::Lease {
            key,
            region,
            tokens,
            request_id,
            ..
        } => Command::Lease {
            key,
            region,
            tokens,
            request_id,
            caller,
        },
        other => other,
    }
}

#[test]
fn a_reused_id_with_another_payload_is_refused_and_changes_nothing() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("a", 10, 1_000));
    run(&mut s, 0, counter("b", 10, 1_000));
    assert_eq!(
        granted(&run(&mut s, 0, lease_with_id("a", "us", 3, "c", 1))),
        3
    );
    let before = s.clone();
    for changed in [
        lease_with_id("b", "us", 3, "c", 1),
        lease_with_id("a", "us", 4, "c", 1),
        lease_with_id("a", "eu", 3, "c", 1),
    ] {
        assert!(
            matches!(
                run(&mut s, 10, changed.clone()),
                Outcome::Rejected(CommandError::RequestIdReused(_))
            ),
            "{changed:?}"
        );
    }
    assert_eq!(s.window_view(&key("b"), 10).map(|v| v.granted), Ok(0));
    assert_eq!(s.window_view(&key("a"), 10).map(|v| v.granted), Ok(3));
    assert_eq!(s.client_sessions(), before.client_sessions());
}

#[test]
fn one_principal_flooding_sessions_cannot_make_another_request_run_twice() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 1_000_000, 100_000));
    let victim = Principal::Region(region("us"));
    let flooder = Principal::Region(region("eu"));
    let first = run(&mut s, 0, lease_as(victim.clone(), "k", 7, "victim", 1));
    assert_eq!(granted(&first), 7);
    let mut refused = 0;
    for i in 0..(MAX_SESSIONS_PER_PRINCIPAL + 100) {
        let outcome = run(
            &mut s,
            1,
            lease_as(flooder.clone(), "k", 1, &format!("f{i}"), 1),
        );
        if matches!(
            outcome,
            Outcome::Rejected(CommandError::SessionsExhausted(_))
        ) {
            refused += 1;
        }
    }
    assert_eq!(refused, 100, "the flood stops at the per-principal quota");
    assert_eq!(
        run(&mut s, 2, lease_as(victim.clone(), "k", 7, "victim", 1)),
        first,
        "the victim's retry is replayed, not executed again"
    );
    assert_eq!(
        s.window_view(&key("k"), 2).map(|v| v.granted),
        Ok(7 + MAX_SESSIONS_PER_PRINCIPAL as u64)
    );
}

#[test]
fn the_same_client_id_under_two_principals_is_two_sessions() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 100, 1_000));
    let eu = Principal::Region(region("eu"));
    let us = Principal::Region(region("us"));
    assert_eq!(granted(&run(&mut s, 0, lease_as(eu, "k", 5, "c", 1))), 5);
    assert_eq!(
        granted(&run(&mut s, 0, lease_as(us, "k", 6, "c", 1))),
        6,
        "not a replay of another principal's outcome"
    );
}

proptest::proptest! {
    /// Commands that differ in kind, key, region or amount have different
    /// fingerprints; the request id and caller do not enter it.
    #[test]
    fn fingerprints_separate_requests(
        a in (0u64..3, "[a-c]{1,3}", "[a-c]{1,2}", 1u64..5, 0u64..3),
        b in (0u64..3, "[a-c]{1,3}", "[a-c]{1,2}", 1u64..5, 0u64..3),
        seq in 0u64..5,
    ) {
        let make = |(kind, k, r, n, w): &(u64, String, String, u64, u64), seq: u64| match kind {
            0 => lease_with_id(k, r, *n, "x", seq),
            1 => Command::Reconcile { key: key(k), region: region(r), leftover: *n, window_start_ms: *w, request_id: Some(request("x", seq)), caller: Principal::Anonymous },
            _ => Command::PoolGrant { key: key(k), region: region(r), region_weight: *w + 1, want_total: *n, request_id: None, caller: Principal::Member(1) },
        };
        let same_request = a.0 == b.0 && a.1 == b.1 && a.2 == b.2 && a.3 == b.3 && (a.0 == 0 || a.4 == b.4);
        proptest::prop_assert_eq!(make(&a, 1).fingerprint() == make(&b, seq).fingerprint(), same_request);
    }
}
