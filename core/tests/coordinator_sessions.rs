//! Exactly-once effects through `apply`: retries, too-old ids, bounds, and GC.

mod coordinator_support;

use coordinator_support::*;
use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, Outcome, Proposal, MAX_RESPONSES_PER_SESSION,
    SESSION_MIN_RETAIN_MS,
};

fn lease_with_id(k: &str, r: &str, tokens: u64, client: &str, seq: u64) -> Command {
    Command::Lease {
        key: key(k),
        region: region(r),
        tokens,
        request_id: Some(request(client, seq)),
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
    assert_eq!(
        run(&mut s, 0, lease_with_id("k", "us", 1, "c", 1)),
        Outcome::Rejected(CommandError::InvalidArgument("request id too old".into()))
    );
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
