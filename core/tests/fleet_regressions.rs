//! Regressions for the original's federation defects, each replayed against
//! the real coordinator state machine and the key machine an escrow node
//! runs (`KeyMachine`, through its events and actions):
//! - a coalesced lease is credited once per waiter set, not once per waiter;
//! - reconcile markers are per region, so two regions' returns both count;
//! - a grant that lands after its window died locally is returned to its own
//!   window (where the coordinator forfeits it) and never credited to the next;
//! - while the coordinator is unreachable, `fail_closed` admits only what was
//!   granted and `fallback` at most its static share per region and window.

mod fleet_support;

use fleet_support::region::{config, credits, Call, Region};
use fleet_support::{policy, Coordinator, Delivery};
use leasehold_core::coordinator::ReconcileDisposition;
use leasehold_core::escrow::machine::{Action, Event, KeyMachineConfig, Now};
use leasehold_core::escrow::{LeaseTicket, Reconcile};
use leasehold_core::policy::{OutagePolicy, PolicyKind};
use leasehold_core::sizer::LeaseSizer;

const WINDOW_MS: u64 = 1_000;
/// The coordinator's clock: epoch ms, aligned to a window start.
const T0: u64 = 1_700_000_000_000;

/// A region's key at monotonic `mono_ms` (the wall clock only labels
/// fallback credits).
fn at(mono_ms: u64) -> Now {
    Now {
        mono_ms,
        wall_ms: T0 + mono_ms,
    }
}

fn node(batch: u64, coordinator: &Coordinator) -> Region {
    let config = config(LeaseSizer::Fixed(batch), 0);
    Region::new(config, coordinator.policy.clone(), 0)
}

/// After a failed lease, an outage probes once per this many ms.
const OUTAGE_PROBE_MS: u64 = 250;

fn only_lease(calls: &[Call]) -> LeaseTicket {
    match calls {
        [Action::SendLease(ticket)] => *ticket,
        other => panic!("expected one lease, got {other:?}"),
    }
}

/// Tokens the answers given since the last look handed out.
fn served(node: &mut Region) -> u64 {
    node.take_answers()
        .iter()
        .filter_map(|(_, answer)| credits(answer))
        .map(|s| s.granted)
        .sum()
}

#[test]
fn a_coalesced_lease_is_credited_once_per_waiter_set() {
    let mut coordinator = Coordinator::new(100, WINDOW_MS, PolicyKind::Counter, T0);
    let mut escrow = node(10, &coordinator);
    // 50 clients find the escrow empty at once: one lease goes out.
    let calls: Vec<Call> = (0..50)
        .flat_map(|_| escrow.acquire(None, 1, 1, at(0)).1)
        .collect();
    let ticket = only_lease(&calls);
    assert_eq!(ticket.tokens, 10);
    let event = coordinator.answer(0, &calls[0], T0 + 5).unwrap();
    // Its grant, delivered twice, is credited once; the waiters share it:
    // 10 tokens between them, not 10 each, and the 11th asks again.
    let next = escrow.feed(event.clone(), at(10));
    assert!(escrow.feed(event, at(10)).is_empty());
    assert_eq!(escrow.machine().counters().unexpected_grants, 1);
    assert_eq!(served(&mut escrow), 10);
    let second = only_lease(&next);
    assert_ne!(second.id, ticket.id);
    // The coordinator counted the same 10 per lease: every waiter is served
    // from five leases of 10, and the rest of L is still there.
    coordinator.settle(0, &mut escrow, next, T0 + 15, at(20), |_| {
        Delivery::Answered
    });
    assert_eq!(served(&mut escrow), 40);
    assert_eq!(escrow.machine().counters().tokens_credited, 50);
    let rest = coordinator.lease(1, 1_000, T0 + 25);
    assert_eq!(rest.granted, 50);
}

#[test]
fn reconcile_markers_are_per_region_so_both_returns_are_credited() {
    let mut coordinator = Coordinator::new(100, WINDOW_MS, PolicyKind::Counter, T0);
    let mut admitted = 0;
    let mut returns = Vec::new();
    for r in 0..2 {
        let mut escrow = node(40, &coordinator);
        let (_, calls) = escrow.acquire(None, 1, 10, at(0));
        coordinator.settle(r, &mut escrow, calls, T0 + 1, at(2), |_| Delivery::Answered);
        admitted += served(&mut escrow);
        // Idle credits go back early, while the window is current: the key
        // is evicted.
        match escrow.shutdown(at(4)).as_slice() {
            [Action::Reconcile(back)] => returns.push(*back),
            other => panic!("expected one reconcile, got {other:?}"),
        }
    }
    assert_eq!(admitted, 20);
    assert_eq!(
        returns,
        vec![
            Reconcile {
                window_start_ms: T0,
                leftover: 30
            };
            2
        ]
    );
    for (r, back) in returns.iter().enumerate() {
        let outcome = coordinator.reconcile(r, *back, T0 + 5);
        assert_eq!(outcome.disposition, ReconcileDisposition::Credited);
        assert_eq!(outcome.credited, 30, "region {r}'s return counts too");
    }
    // A retry of region 0's return changes nothing.
    let again = coordinator.reconcile(0, returns[0], T0 + 6);
    assert_eq!(again.disposition, ReconcileDisposition::Duplicate);
    // A third region can now lease everything not admitted.
    let third = coordinator.lease(2, 1_000, T0 + 7);
    assert_eq!(third.granted, 100 - admitted);
}

#[test]
fn a_late_grant_is_returned_to_its_own_window_not_credited_to_the_next() {
    let mut coordinator = Coordinator::new(100, WINDOW_MS, PolicyKind::Counter, T0);
    let mut escrow = node(60, &coordinator);
    // The region's monotonic clock is unrelated to the coordinator's epoch
    // clock; sent at local 5_000, applied at coordinator T0 + 990.
    let (_, calls) = escrow.acquire(None, 1, 1, at(5_000));
    let ticket = only_lease(&calls);
    let event = coordinator.answer(0, &calls[0], T0 + 990).unwrap();
    let Event::LeaseGranted { grant, .. } = &event else {
        panic!("expected a grant, got {event:?}");
    };
    assert_eq!((grant.granted, grant.window_start_ms), (60, T0));
    assert_eq!(ticket.sent_at_ms, 5_000);
    // The answer takes 30 ms: the window (10 ms of lifetime left) died on
    // the way. The grant goes back to its own window; the request leases
    // once more, in the window now current, instead of being denied.
    let back = escrow.feed(event, at(5_030));
    assert_eq!(
        back[0],
        Action::Reconcile(Reconcile {
            window_start_ms: T0,
            leftover: 60
        })
    );
    assert!(
        matches!(back[1..], [Action::SendLease(_)]),
        "the request leases again: {back:?}"
    );
    let lease_again = back[1].clone();
    assert_eq!(served(&mut escrow), 0);
    assert_eq!(escrow.machine().counters().tokens_credited, 0);
    // By the time the return reaches the coordinator its window is over: forfeited.
    let Action::Reconcile(back) = back[0] else {
        unreachable!("matched above")
    };
    let outcome = coordinator.reconcile(0, back, T0 + WINDOW_MS + 35);
    assert_eq!(outcome.disposition, ReconcileDisposition::WindowEnded);
    assert_eq!(outcome.credited, 0);
    // The next window's credits come from that fresh lease of the next
    // window: the waiting request's 1, then 25, 25 and the 9 left of 60.
    let event = coordinator
        .answer(0, &lease_again, T0 + WINDOW_MS + 40)
        .unwrap();
    escrow.feed(event, at(5_045));
    for _ in 0..3 {
        escrow.acquire(None, 1, 25, at(5_050));
    }
    let answers = escrow.take_answers();
    let granted: Vec<u64> = answers
        .iter()
        .filter_map(|(_, answer)| credits(answer))
        .map(|s| {
            assert_eq!(s.window_start_ms, T0 + WINDOW_MS);
            s.granted
        })
        .collect();
    assert_eq!(
        granted,
        vec![1, 25, 25, 9],
        "the late 60 were not added to these"
    );
}

/// K regions that each hold `held` credits when the coordinator becomes
/// unreachable, then face heavy demand for two windows.
fn admitted_during_outage(k: usize, outage: OutagePolicy, held: u64) -> Vec<u64> {
    let limit = 100;
    let policy = policy(limit, WINDOW_MS, PolicyKind::Counter, outage);
    let mut coordinator = Coordinator::with_policy(policy, T0);
    let mut per_window = vec![0u64; 2];
    for r in 0..k {
        let config = KeyMachineConfig {
            probe_interval_ms: OUTAGE_PROBE_MS,
            ..config(LeaseSizer::Fixed(held), 0)
        };
        let mut escrow = Region::new(config, coordinator.policy.clone(), 0);
        // Local clock = coordinator clock − T0 here; every lease from now fails.
        for now in 0..2 * WINDOW_MS {
            let (_, calls) = escrow.acquire(None, 1, 3, at(now));
            coordinator.settle(r, &mut escrow, calls, T0 + now, at(now), |_| {
                if now == 0 {
                    Delivery::Answered
                } else {
                    Delivery::NotApplied
                }
            });
            let window = usize::from(now >= WINDOW_MS);
            for (_, answer) in escrow.take_answers() {
                if let Some(s) = credits(&answer) {
                    if now > 0 && !s.from_fallback {
                        assert!(s.window_start_ms == T0, "granted credits of window 0 only");
                    }
                    if s.from_fallback {
                        assert_eq!(s.window_start_ms, T0 + window as u64 * WINDOW_MS);
                    }
                    per_window[window] += s.granted;
                }
            }
        }
        let counters = escrow.machine().counters();
        // One probe at a time, not one per request: the first four of the
        // outage sooner (a sixteenth of the interval, doubling), then one
        // per 250 ms.
        assert!(counters.leases_failed <= 2 * WINDOW_MS / OUTAGE_PROBE_MS + 5);
        assert!(counters.leases_failed + 1 >= 2 * WINDOW_MS / OUTAGE_PROBE_MS);
    }
    per_window
}

#[test]
fn fail_closed_admits_only_what_was_granted_during_an_outage() {
    for k in [1usize, 2, 4, 8] {
        let per_window = admitted_during_outage(k, OutagePolicy::FailClosed, 10);
        let granted = (10 * k as u64).min(100);
        assert_eq!(per_window[0], granted, "K = {k}");
        assert_eq!(per_window[1], 0, "K = {k}");
    }
}

#[test]
fn fallback_admits_at_most_its_share_per_region_and_window() {
    for k in [1usize, 2, 4, 8] {
        let share = 7;
        let outage = OutagePolicy::Fallback {
            tokens_per_region: share,
        };
        let per_window = admitted_during_outage(k, outage, 10);
        let granted = (10 * k as u64).min(100);
        // Δ during the outage is bounded by the sum of the shares.
        assert_eq!(per_window[0], granted + share * k as u64, "K = {k}");
        assert_eq!(per_window[1], share * k as u64, "K = {k}");
    }
}
