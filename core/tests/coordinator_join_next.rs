//! `PoolJoinNext` through `apply`: a region joins a `fair` key's next
//! window ahead, in the last quarter of the live one; the next window keeps
//! its own pool (Σ granted ≤ L there too), is lowered by policy changes
//! like a live one, becomes the live window when the current one ends with
//! what it granted, and is collected with it. Joins naming any other
//! window, or made too early, change nothing.

mod coordinator_support;

use coordinator_support::*;
use leasehold_core::coordinator::{Command, CommandError, CoordinatorState, Outcome};
use leasehold_core::principal::Principal;

fn join_next(k: &str, r: &str, weight: u64, want: u64, window_start_ms: u64) -> Command {
    join_next_retiring(k, r, weight, want, window_start_ms, false)
}

fn join_next_retiring(
    k: &str,
    r: &str,
    weight: u64,
    want: u64,
    window_start_ms: u64,
    retire: bool,
) -> Command {
    Command::PoolJoinNext {
        key: key(k),
        region: region(r),
        region_weight: weight,
        want_total: want,
        window_start_ms,
        retire,
        request_id: None,
        caller: Principal::Anonymous,
    }
}

/// (window start, granted total) of a pool grant outcome.
fn grant(outcome: &Outcome) -> (u64, u64) {
    match outcome {
        Outcome::PoolGrant(g) => (g.window_start_ms, g.granted_total),
        other => panic!("expected a pool grant, got {other:?}"),
    }
}

fn invalid(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Rejected(CommandError::InvalidArgument(_)))
}

/// L = 100 in windows of 1 s; `eu` holds 60 of [1 000, 2 000).
fn live_window_with_a_grant() -> CoordinatorState {
    let mut s = CoordinatorState::default();
    run(&mut s, 1_000, fair("f/", 100, 1_000));
    assert_eq!(
        grant(&run(&mut s, 1_100, pool("f/k", "eu", 1, 60))),
        (1_000, 60)
    );
    s
}

#[test]
fn the_next_window_is_joined_in_the_last_quarter_and_becomes_live_with_its_grants() {
    let mut s = live_window_with_a_grant();
    // Before the last quarter: refused, nothing opened.
    assert!(invalid(&run(
        &mut s,
        1_700,
        join_next("f/k", "eu", 1, 70, 2_000)
    )));
    assert_eq!(
        grant(&run(&mut s, 1_760, join_next("f/k", "eu", 1, 70, 2_000))),
        (2_000, 70)
    );
    // The next window's own pool: us, of equal weight, finds 30.
    assert_eq!(
        grant(&run(&mut s, 1_800, join_next("f/k", "us", 1, 50, 2_000))),
        (2_000, 30)
    );
    // The live window is untouched.
    let live = s.window_view(&key("f/k"), 1_900).expect("policy");
    assert_eq!((live.window_start_ms, live.granted), (1_000, 60));
    // Once it ends, the next window is the live one, with what it granted.
    let next = s.window_view(&key("f/k"), 2_000).expect("policy");
    assert_eq!(
        (next.window_start_ms, next.window_end_ms, next.granted),
        (2_000, 3_000, 100)
    );
    run(&mut s, 2_100, Command::Tick);
    let rolled = s.window_view(&key("f/k"), 2_100).expect("policy");
    let totals: Vec<(&str, u64)> = rolled
        .regions
        .iter()
        .map(|r| (r.region.as_str(), r.granted))
        .collect();
    assert_eq!(totals, [("eu", 70), ("us", 30)]);
    // No room is left in it.
    assert_eq!(
        grant(&run(&mut s, 2_200, pool("f/k", "ap", 1, 10))),
        (2_000, 0)
    );
}

#[test]
fn a_join_naming_the_live_window_is_a_grant_in_it_and_any_other_window_is_refused() {
    let mut s = live_window_with_a_grant();
    assert_eq!(
        grant(&run(&mut s, 1_900, join_next("f/k", "us", 1, 30, 1_000))),
        (1_000, 30)
    );
    for start in [0, 500, 1_500, 3_000] {
        assert!(
            invalid(&run(&mut s, 1_900, join_next("f/k", "us", 1, 30, start))),
            "{start}"
        );
    }
    // Without a live window, the one a grant opens now.
    assert_eq!(
        grant(&run(&mut s, 5_100, join_next("f/k", "us", 1, 30, 5_000))),
        (5_000, 30)
    );
}

#[test]
fn joins_ahead_are_refused_as_grants_are() {
    let mut s = live_window_with_a_grant();
    run(&mut s, 1_100, counter("c/", 100, 1_000));
    run(&mut s, 1_100, lease("c/k", "eu", 1));
    assert!(invalid(&run(
        &mut s,
        1_800,
        join_next("f/k", "eu", 0, 10, 2_000)
    )));
    assert!(matches!(
        run(&mut s, 1_800, join_next("c/k", "eu", 1, 10, 2_000)),
        Outcome::Rejected(CommandError::WrongKind(_))
    ));
    assert!(matches!(
        run(&mut s, 1_800, join_next("none/k", "eu", 1, 10, 2_000)),
        Outcome::Rejected(CommandError::NoPolicy(_))
    ));
    assert!(s.window_view(&key("f/k"), 2_000).expect("policy").granted == 0);
}

#[test]
fn a_lowered_limit_caps_the_next_window_too() {
    let mut s = live_window_with_a_grant();
    assert_eq!(
        grant(&run(&mut s, 1_800, join_next("f/k", "eu", 1, 20, 2_000))),
        (2_000, 20)
    );
    run(&mut s, 1_850, fair("f/", 40, 1_000));
    assert_eq!(
        grant(&run(&mut s, 1_900, join_next("f/k", "us", 1, 50, 2_000))),
        (2_000, 20)
    );
    let next = s.window_view(&key("f/k"), 2_000).expect("policy");
    assert_eq!((next.limit, next.granted), (40, 40));
}

#[test]
fn both_windows_are_collected_once_both_have_ended() {
    let mut s = live_window_with_a_grant();
    run(&mut s, 1_800, join_next("f/k", "eu", 1, 20, 2_000));
    assert_eq!(
        run(&mut s, 3_500, Command::Tick),
        Outcome::Ticked {
            collected_windows: 2
        }
    );
    // The key's next window starts after both.
    assert_eq!(
        grant(&run(&mut s, 3_600, pool("f/k", "eu", 1, 5))),
        (3_000, 5)
    );
}

/// A join ahead that retires holds its total there with weight 0: the
/// pool reserves it nothing beyond, so a region joining after it finds
/// everything else; asking again rejoins with the weight it sends.
#[test]
fn a_region_that_joins_retired_reserves_nothing_beyond_its_total() {
    let mut s = live_window_with_a_grant();
    let joined = run(
        &mut s,
        1_800,
        join_next_retiring("f/k", "eu", 1, 20, 2_000, true),
    );
    assert_eq!(grant(&joined), (2_000, 20));
    // us, of equal weight, finds all but eu's 20 (not only its half).
    assert_eq!(
        grant(&run(&mut s, 1_850, join_next("f/k", "us", 1, 100, 2_000))),
        (2_000, 80)
    );
    let view = s.window_view(&key("f/k"), 2_100).expect("policy");
    let eu = view.regions.iter().find(|r| r.region == "eu").expect("eu");
    assert_eq!((eu.granted, eu.pool_weight), (20, 0));
    // eu asks again: it rejoins with its weight, and the pool has nothing
    // left to give it.
    assert_eq!(
        grant(&run(&mut s, 2_200, pool("f/k", "eu", 1, 50))),
        (2_000, 20)
    );
    let view = s.window_view(&key("f/k"), 2_200).expect("policy");
    let eu = view.regions.iter().find(|r| r.region == "eu").expect("eu");
    assert_eq!(eu.pool_weight, 1);
}

/// The last quarter starts at exactly `end − length / 4`: a join ahead a
/// millisecond before it is refused, one at it is granted.
#[test]
fn the_last_quarter_starts_at_its_exact_boundary() {
    let mut s = live_window_with_a_grant();
    assert!(invalid(&run(
        &mut s,
        1_749,
        join_next("f/k", "eu", 1, 70, 2_000)
    )));
    assert_eq!(
        grant(&run(&mut s, 1_750, join_next("f/k", "eu", 1, 70, 2_000))),
        (2_000, 70)
    );
}
