//! Data-driven tests of `Reconcile`: each case is a script of
//! `(stamp_ms, command, expected outcome)` steps on a fresh state with a
//! `counter` policy `k`: L = 10, 1 s windows, and a `fair` policy `f/`.

mod coordinator_support;

use coordinator_support::*;
use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, Outcome, ReconcileDisposition as D, ReconcileOutcome,
};

/// What a step must produce.
enum Expect {
    Granted(u64),
    Reconciled(u64, D),
    WrongKind,
    Any,
}

struct Case {
    name: &'static str,
    steps: Vec<(u64, Command, Expect)>,
}

fn cases() -> Vec<Case> {
    use Expect::*;
    vec![
        Case {
            name: "credit returns tokens to the current window",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (200, reconcile("k", "us", 4, 0), Reconciled(4, D::Credited)),
                (300, lease("k", "eu", 10), Granted(4)),
            ],
        },
        Case {
            name: "credit is capped at what the region was granted",
            steps: vec![
                (100, lease("k", "us", 3), Granted(3)),
                (100, lease("k", "eu", 7), Granted(7)),
                (200, reconcile("k", "us", 9, 0), Reconciled(3, D::Credited)),
                (300, lease("k", "ap", 10), Granted(3)),
            ],
        },
        Case {
            name: "second return of a region in a window is a duplicate",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (200, reconcile("k", "us", 2, 0), Reconciled(2, D::Credited)),
                (300, reconcile("k", "us", 2, 0), Reconciled(0, D::Duplicate)),
                (400, lease("k", "eu", 10), Granted(2)),
            ],
        },
        Case {
            name: "two regions are both credited (marker is per region)",
            steps: vec![
                (100, lease("k", "us", 5), Granted(5)),
                (100, lease("k", "eu", 5), Granted(5)),
                (200, reconcile("k", "us", 5, 0), Reconciled(5, D::Credited)),
                (200, reconcile("k", "eu", 5, 0), Reconciled(5, D::Credited)),
                (300, lease("k", "ap", 20), Granted(10)),
            ],
        },
        Case {
            name: "leftover of an ended window is forfeited",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (
                    1_000,
                    reconcile("k", "us", 10, 0),
                    Reconciled(0, D::WindowEnded),
                ),
                (1_000, lease("k", "us", 20), Granted(10)),
            ],
        },
        Case {
            name: "forfeit when the window ended even if the key is idle since",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (
                    5_000,
                    reconcile("k", "us", 10, 0),
                    Reconciled(0, D::WindowEnded),
                ),
            ],
        },
        Case {
            name: "a future window start is not the current window",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (
                    200,
                    reconcile("k", "us", 10, 1_000),
                    Reconciled(0, D::WindowEnded),
                ),
                (
                    300,
                    reconcile("k", "us", 10, 0),
                    Reconciled(10, D::Credited),
                ),
            ],
        },
        Case {
            name: "an empty return does not use up the region's return",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (200, reconcile("k", "us", 0, 0), Reconciled(0, D::Credited)),
                (300, reconcile("k", "us", 6, 0), Reconciled(6, D::Credited)),
                (400, reconcile("k", "us", 0, 0), Reconciled(0, D::Duplicate)),
            ],
        },
        Case {
            name: "a region that was granted nothing gets nothing credited",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (200, reconcile("k", "eu", 10, 0), Reconciled(0, D::Credited)),
                (300, lease("k", "eu", 1), Granted(0)),
            ],
        },
        Case {
            name: "a returned-then-spent window does not exceed the limit",
            steps: vec![
                (100, lease("k", "us", 10), Granted(10)),
                (
                    200,
                    reconcile("k", "us", 10, 0),
                    Reconciled(10, D::Credited),
                ),
                (300, lease("k", "us", 10), Granted(10)),
                (
                    400,
                    reconcile("k", "us", 10, 0),
                    Reconciled(0, D::Duplicate),
                ),
                (500, lease("k", "eu", 10), Granted(0)),
            ],
        },
        Case {
            name: "reconcile without any policy or window is forfeit, not an error",
            steps: vec![(
                100,
                reconcile("nokey", "us", 3, 0),
                Reconciled(0, D::WindowEnded),
            )],
        },
        Case {
            name: "reconcile of a fair key is refused",
            steps: vec![
                (100, pool("f/a", "us", 1, 5), Any),
                (200, reconcile("f/a", "us", 5, 0), WrongKind),
            ],
        },
        Case {
            name: "after the policy is deleted the live window can still be credited",
            steps: vec![
                (100, lease("k", "us", 8), Granted(8)),
                (150, Command::DeletePolicy { prefix: "k".into() }, Any),
                (200, reconcile("k", "us", 8, 0), Reconciled(8, D::Credited)),
            ],
        },
    ]
}

#[test]
fn reconcile_decision_table() {
    for case in cases() {
        let mut s = CoordinatorState::default();
        run(&mut s, 0, counter("k", 10, 1_000));
        run(&mut s, 0, fair("f/", 10, 1_000));
        for (i, (stamp, command, expect)) in case.steps.into_iter().enumerate() {
            let before = s.clone();
            let outcome = run(&mut s, stamp, command);
            let at = format!("case {:?}, step {i}: {outcome:?}", case.name);
            match expect {
                Expect::Granted(n) => assert_eq!(granted(&outcome), n, "{at}"),
                Expect::Reconciled(credited, disposition) => assert_eq!(
                    outcome,
                    Outcome::Reconcile(ReconcileOutcome {
                        credited,
                        disposition
                    }),
                    "{at}"
                ),
                Expect::WrongKind => {
                    assert!(
                        matches!(outcome, Outcome::Rejected(CommandError::WrongKind(_))),
                        "{at}"
                    );
                    let usage = |state: &CoordinatorState| {
                        state
                            .window_view(&key("f/a"), stamp)
                            .map(|v| (v.granted, v.returned, v.regions))
                    };
                    assert_eq!(usage(&s), usage(&before), "{at}");
                }
                Expect::Any => {}
            }
        }
    }
}

#[test]
fn credited_tokens_show_in_the_window_view() {
    let mut s = CoordinatorState::default();
    run(&mut s, 0, counter("k", 10, 1_000));
    run(&mut s, 10, lease("k", "us", 6));
    run(&mut s, 10, lease("k", "eu", 4));
    run(&mut s, 20, reconcile("k", "eu", 3, 0));
    let view = s.window_view(&key("k"), 20).expect("policy exists");
    assert_eq!((view.granted, view.returned), (10, 3));
    let per_region: Vec<_> = view
        .regions
        .iter()
        .map(|r| (r.region.as_str(), r.granted, r.returned))
        .collect();
    assert_eq!(per_region, [("eu", 4, 3), ("us", 6, 0)]);
}
