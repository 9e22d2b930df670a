//! Property tests of the wallet laws against a model coordinator whose clock
//! is offset from the wallet's, with grants applied at arbitrary points of
//! their flight.

use super::*;
use leasehold_core::window_credit::{grant_fate, ArrivingGrant, GrantFate, HeldWindow};
use proptest::prelude::*;

/// One step of a random history. Times are milliseconds of real time.
#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    BeginRefill,
    /// Deliver the in-flight grant: the coordinator applied it at
    /// `sent + apply_permille/1000 · (now − sent)`.
    Deliver {
        granted: u64,
        apply_permille: u64,
    },
    Abandon,
    Spend(u64),
    Withdraw,
    /// Lend up to this many live credits to an outside spender.
    Lend(u64),
    /// The outside spender spends from its loan.
    SpendFromLoan(u64),
    /// The outside spender hands back what it did not spend.
    Repay,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u64..400).prop_map(Step::Advance),
        2 => Just(Step::BeginRefill),
        3 => (0u64..50, 0u64..=1000)
            .prop_map(|(granted, apply_permille)| Step::Deliver { granted, apply_permille }),
        1 => Just(Step::Abandon),
        5 => (0u64..12).prop_map(Step::Spend),
        1 => Just(Step::Withdraw),
        2 => (1u64..40).prop_map(Step::Lend),
        4 => (0u64..12).prop_map(Step::SpendFromLoan),
        1 => Just(Step::Repay),
    ]
}

fn window(coord_now: u64, window_ms: u64, limit: u64) -> WindowLabel {
    let start_ms = coord_now - coord_now % window_ms;
    WindowLabel {
        start_ms,
        end_ms: start_ms + window_ms,
        limit,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn wallet_laws_hold_for_any_history(
        steps in proptest::collection::vec(step(), 1..120),
        window_ms in 50u64..1000,
        // Coordinator clock = real time + offset: wall-clock disagreement.
        offset in 0u64..1_000_000,
        start in 0u64..10_000,
    ) {
        let mut wallet: CreditWallet<u64> = CreditWallet::new();
        let mut now = start;
        let mut ticket: Option<RefillTicket<u64>> = None;
        let mut credited_seen = 0u64;
        let mut spent_seen = 0u64;
        // The outstanding loan and what its spender has not spent yet.
        let mut loan: Option<(Loan<u64>, u64)> = None;
        for step in steps {
            // The protocol: a loan is repaid before any other wallet use.
            let uses_wallet = matches!(
                step,
                Step::Deliver { .. } | Step::Spend(_) | Step::Withdraw | Step::Repay | Step::Lend(_)
            );
            if uses_wallet {
                if let Some((lent, unspent)) = loan.take() {
                    let spent = wallet.repay(unspent, now);
                    prop_assert_eq!(spent, lent.tokens - unspent);
                    prop_assert_eq!(wallet.lent(), 0);
                }
            }
            match step {
                Step::Advance(dt) => now += dt,
                Step::BeginRefill => {
                    let issued = wallet.begin_refill(now);
                    // At most one refill in flight: coalescing.
                    prop_assert_eq!(issued.is_some(), ticket.is_none());
                    if let Some(t) = issued {
                        ticket = Some(t);
                    }
                }
                Step::Deliver { granted, apply_permille } => {
                    if let Some(t) = ticket.take() {
                        let sent = t.sent_at();
                        let applied_real = sent + (now - sent) * apply_permille / 1000;
                        let coord_now = applied_real + offset;
                        let label = window(coord_now, window_ms, 100);
                        let terms = GrantTerms {
                            granted,
                            window: label,
                            remaining_lifetime_ms: label.end_ms - coord_now,
                        };
                        let before = wallet.balance(now);
                        match wallet.credit(t, terms, now) {
                            CreditOutcome::Credited { tokens, .. } => {
                                prop_assert_eq!(tokens, granted);
                                credited_seen += tokens;
                                prop_assert!(wallet.balance(now) >= tokens);
                            }
                            CreditOutcome::Empty => prop_assert_eq!(granted, 0),
                            CreditOutcome::DroppedLate { tokens }
                            | CreditOutcome::DroppedStaleWindow { tokens } => {
                                prop_assert_eq!(tokens, granted);
                                prop_assert!(wallet.balance(now) <= before);
                            }
                        }
                        prop_assert!(!wallet.refill_in_flight());
                    }
                }
                Step::Abandon => {
                    if let Some(t) = ticket.take() {
                        wallet.abandon(t);
                        prop_assert!(!wallet.refill_in_flight());
                    }
                }
                Step::Spend(cost) => {
                    let deadline = wallet.deadline();
                    if let SpendOutcome::Spent { window: label, .. } = wallet.spend(now, cost) {
                        spent_seen += cost;
                        // Never at or past the local deadline ...
                        prop_assert!(deadline.is_some_and(|d| now < d));
                        // ... which is never past the window's end in real time.
                        prop_assert!(now < label.end_ms - offset,
                            "spent at {} a credit of a window ending at {}", now, label.end_ms - offset);
                    }
                }
                Step::Withdraw => {
                    if let Some(w) = wallet.withdraw_all(now) {
                        prop_assert!(w.tokens > 0);
                        prop_assert!(now < w.window.end_ms - offset);
                    }
                    prop_assert_eq!(wallet.balance(now), 0);
                }
                Step::Lend(max) => {
                    let live = wallet.balance(now);
                    match wallet.lend(now, max) {
                        Some(lent) => {
                            prop_assert_eq!(lent.tokens, live.min(max));
                            prop_assert_eq!(Some(lent.deadline), wallet.deadline());
                            prop_assert_eq!(wallet.balance, live - lent.tokens);
                            loan = Some((lent, lent.tokens));
                        }
                        None => prop_assert_eq!(live, 0),
                    }
                }
                Step::SpendFromLoan(cost) => {
                    if let Some((lent, unspent)) = &mut loan {
                        // The borrower's rule: enough left, strictly before the deadline.
                        if *unspent >= cost && now < lent.deadline {
                            *unspent -= cost;
                            spent_seen += cost;
                            prop_assert!(now < lent.window.end_ms - offset,
                                "spent at {} a lent credit of a window ending at {}", now, lent.window.end_ms - offset);
                        }
                    }
                }
                Step::Repay => {}
            }
            let t = wallet.totals();
            let spent_on_loan = loan.map_or(0, |(lent, unspent)| lent.tokens - unspent);
            // Conservation: balance + lent = credited − spent − expired − withdrawn.
            prop_assert_eq!(
                t.credited,
                t.spent + t.expired + t.withdrawn + wallet.balance + wallet.lent()
            );
            prop_assert_eq!(t.credited, credited_seen);
            prop_assert_eq!(t.spent + spent_on_loan, spent_seen);
            prop_assert!(t.spent <= t.credited);
        }
    }

    #[test]
    fn spend_never_exceeds_balance(grants in proptest::collection::vec(1u64..20, 1..10), costs in proptest::collection::vec(1u64..30, 1..40)) {
        let mut wallet: CreditWallet<u64> = CreditWallet::new();
        let label = WindowLabel { start_ms: 0, end_ms: 1000, limit: 1000 };
        let mut total = 0;
        for g in grants {
            let t = wallet.begin_refill(0).expect("no refill in flight");
            wallet.credit(t, GrantTerms { granted: g, window: label, remaining_lifetime_ms: 1000 }, 0);
            total += g;
        }
        let mut spent = 0;
        for c in costs {
            match wallet.spend(1, c) {
                SpendOutcome::Spent { remaining, .. } => { spent += c; prop_assert_eq!(remaining, total - spent); }
                SpendOutcome::Short { balance } => prop_assert!(balance < c),
            }
        }
        prop_assert!(spent <= total);
    }
}

#[test]
fn spend_at_the_deadline_discards() {
    let mut wallet: CreditWallet<u64> = CreditWallet::new();
    let label = WindowLabel {
        start_ms: 0,
        end_ms: 100,
        limit: 10,
    };
    let t = wallet.begin_refill(10).expect("first refill");
    let outcome = wallet.credit(
        t,
        GrantTerms {
            granted: 5,
            window: label,
            remaining_lifetime_ms: 50,
        },
        20,
    );
    assert_eq!(
        outcome,
        CreditOutcome::Credited {
            tokens: 5,
            closed_window_served: None
        }
    );
    assert!(matches!(
        wallet.spend(59, 1),
        SpendOutcome::Spent { remaining: 4, .. }
    ));
    // Deadline = sent (10) + lifetime (50) = 60: a spend at 60 finds nothing.
    assert_eq!(wallet.spend(60, 1), SpendOutcome::Short { balance: 0 });
    assert_eq!(wallet.totals().expired, 4);
}

#[test]
fn grant_arriving_after_its_deadline_is_dropped() {
    let mut wallet: CreditWallet<u64> = CreditWallet::new();
    let label = WindowLabel {
        start_ms: 0,
        end_ms: 100,
        limit: 10,
    };
    let t = wallet.begin_refill(0).expect("first refill");
    let outcome = wallet.credit(
        t,
        GrantTerms {
            granted: 5,
            window: label,
            remaining_lifetime_ms: 30,
        },
        30,
    );
    assert_eq!(outcome, CreditOutcome::DroppedLate { tokens: 5 });
    assert_eq!(wallet.balance(30), 0);
    assert_eq!(wallet.totals().dropped, 5);
}

#[test]
fn grant_of_an_older_window_is_dropped() {
    let mut wallet: CreditWallet<u64> = CreditWallet::new();
    let newer = WindowLabel {
        start_ms: 100,
        end_ms: 200,
        limit: 10,
    };
    let older = WindowLabel {
        start_ms: 0,
        end_ms: 100,
        limit: 10,
    };
    let t = wallet.begin_refill(0).expect("first refill");
    wallet.credit(
        t,
        GrantTerms {
            granted: 3,
            window: newer,
            remaining_lifetime_ms: 90,
        },
        1,
    );
    let t = wallet.begin_refill(2).expect("second refill");
    let outcome = wallet.credit(
        t,
        GrantTerms {
            granted: 4,
            window: older,
            remaining_lifetime_ms: 90,
        },
        3,
    );
    assert_eq!(outcome, CreditOutcome::DroppedStaleWindow { tokens: 4 });
    assert_eq!(wallet.balance(3), 3);
}

#[test]
fn a_newer_window_reports_the_served_demand_of_the_old_one() {
    let mut wallet: CreditWallet<u64> = CreditWallet::new();
    let first = WindowLabel {
        start_ms: 0,
        end_ms: 100,
        limit: 10,
    };
    let second = WindowLabel {
        start_ms: 100,
        end_ms: 200,
        limit: 10,
    };
    let t = wallet.begin_refill(0).expect("first refill");
    wallet.credit(
        t,
        GrantTerms {
            granted: 5,
            window: first,
            remaining_lifetime_ms: 100,
        },
        0,
    );
    assert!(matches!(wallet.spend(1, 3), SpendOutcome::Spent { .. }));
    let t = wallet.begin_refill(100).expect("second refill");
    let outcome = wallet.credit(
        t,
        GrantTerms {
            granted: 5,
            window: second,
            remaining_lifetime_ms: 100,
        },
        101,
    );
    assert_eq!(
        outcome,
        CreditOutcome::Credited {
            tokens: 5,
            closed_window_served: Some(3)
        }
    );
    assert_eq!(wallet.served_in_window(), 0);
}

#[test]
fn refills_are_coalesced() {
    let mut wallet: CreditWallet<u64> = CreditWallet::new();
    let t = wallet.begin_refill(0).expect("first refill");
    assert!(wallet.begin_refill(0).is_none());
    wallet.abandon(t);
    assert!(wallet.begin_refill(0).is_some());
}

fn label(window: u64) -> WindowLabel {
    WindowLabel {
        start_ms: window * 1_000,
        end_ms: (window + 1) * 1_000,
        limit: 100,
    }
}

proptest! {
    /// Whatever the wallet holds, a second grant is credited, dropped as
    /// late or dropped as stale exactly as the shared window-credit rule
    /// decides, and credited tokens die at the rule's deadline.
    #[test]
    fn the_wallet_credits_by_the_shared_window_rule(
        first in (0u64..4, 0u64..1_500, 0u64..500),
        second in (0u64..4, 0u64..1_500, 0u64..1_000, 0u64..1_000),
        granted in 1u64..50,
    ) {
        let (first_window, first_lifetime, first_latency) = first;
        let (second_window, second_lifetime, pause, second_latency) = second;
        let mut wallet: CreditWallet<u64> = CreditWallet::new();
        let t = wallet.begin_refill(0).expect("first refill");
        wallet.credit(
            t,
            GrantTerms { granted, window: label(first_window), remaining_lifetime_ms: first_lifetime },
            first_latency,
        );
        let sent = first_latency + pause;
        let now = sent + second_latency;
        let held = wallet.window().zip(wallet.deadline()).map(|(w, deadline)| HeldWindow {
            window_start_ms: w.start_ms,
            deadline,
        });
        let fate = grant_fate(
            held,
            ArrivingGrant {
                window_start_ms: label(second_window).start_ms,
                sent_at: sent,
                remaining_lifetime_ms: second_lifetime,
            },
            now,
        );
        let t = wallet.begin_refill(sent).expect("second refill");
        let outcome = wallet.credit(
            t,
            GrantTerms { granted, window: label(second_window), remaining_lifetime_ms: second_lifetime },
            now,
        );
        match fate {
            GrantFate::OlderWindow => {
                prop_assert_eq!(outcome, CreditOutcome::DroppedStaleWindow { tokens: granted })
            }
            GrantFate::Late => prop_assert_eq!(outcome, CreditOutcome::DroppedLate { tokens: granted }),
            GrantFate::SameWindow { deadline } | GrantFate::NewWindow { deadline } => {
                let credited = matches!(outcome, CreditOutcome::Credited { tokens, .. } if tokens == granted);
                prop_assert!(credited, "{:?}", outcome);
                prop_assert_eq!(wallet.deadline(), Some(deadline));
                prop_assert!(wallet.balance(now) >= granted);
                prop_assert_eq!(wallet.balance(deadline), 0);
            }
        }
    }
}

#[test]
fn a_grant_for_the_window_held_never_extends_its_credits() {
    let mut wallet: CreditWallet<u64> = CreditWallet::new();
    let t = wallet.begin_refill(0).expect("first refill");
    wallet.credit(
        t,
        GrantTerms {
            granted: 3,
            window: label(0),
            remaining_lifetime_ms: 500,
        },
        10,
    );
    let t = wallet.begin_refill(100).expect("second refill");
    wallet.credit(
        t,
        GrantTerms {
            granted: 4,
            window: label(0),
            remaining_lifetime_ms: 800,
        },
        110,
    );
    // 0 + 500 and 100 + 800: the earlier deadline holds for all seven.
    assert_eq!(wallet.deadline(), Some(500));
    assert_eq!(wallet.balance(499), 7);
    assert_eq!(wallet.balance(500), 0);
}
