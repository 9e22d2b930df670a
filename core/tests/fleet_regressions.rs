//! Regressions for the original's federation defects, each replayed against
//! the real coordinator state machine and the real region escrow:
//! - a coalesced lease is credited once per waiter set, not once per waiter;
//! - reconcile markers are per region, so two regions' returns both count;
//! - a grant that lands after its window died locally is returned to its own
//!   window (where the coordinator forfeits it) and never credited to the next;
//! - while the coordinator is unreachable, `fail_closed` admits only what was
//!   granted and `fallback` at most its static share per region and window.

mod fleet_support;

use fleet_support::{as_escrow_grant, Coordinator};
use leasehold_core::coordinator::ReconcileDisposition;
use leasehold_core::escrow::{Reconcile, RegionEscrow};
use leasehold_core::policy::{OutagePolicy, PolicyKind};

const WINDOW_MS: u64 = 1_000;
/// The coordinator's clock: epoch ms, aligned to a window start.
const T0: u64 = 1_700_000_000_000;

#[test]
fn a_coalesced_lease_is_credited_once_per_waiter_set() {
    let mut coordinator = Coordinator::new(100, WINDOW_MS, PolicyKind::Counter, T0);
    let mut escrow = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    // 50 clients find the escrow empty at once: one lease goes out.
    let tickets: Vec<_> = (0..50).filter_map(|_| escrow.send_lease(1, 0)).collect();
    assert_eq!(tickets.len(), 1);
    let grant = coordinator.lease(0, tickets[0].tokens, T0 + 5);
    assert_eq!(grant.granted, 10);
    assert_eq!(
        escrow.on_grant_for(tickets[0].id, as_escrow_grant(&grant), 10),
        None
    );
    // Every waiter re-checks the balance: 10 tokens between them, not 10 each.
    let served: u64 = (0..50)
        .filter_map(|_| escrow.serve(1, 11))
        .map(|s| s.granted)
        .sum();
    assert_eq!(served, 10);
    // The coordinator counted the same 10: the rest of L is still there.
    let ticket = escrow.send_lease(1_000, 12).unwrap();
    let rest = coordinator.lease(0, ticket.tokens, T0 + 15);
    assert_eq!(rest.granted, 90);
    escrow.on_grant_for(ticket.id, as_escrow_grant(&rest), 20);
    let more: u64 = std::iter::from_fn(|| escrow.serve(7, 21))
        .map(|s| s.granted)
        .sum();
    assert_eq!(served + more, 100);
}

#[test]
fn reconcile_markers_are_per_region_so_both_returns_are_credited() {
    let mut coordinator = Coordinator::new(100, WINDOW_MS, PolicyKind::Counter, T0);
    let mut escrows: Vec<RegionEscrow> = (0..2)
        .map(|_| RegionEscrow::new(40, 500, OutagePolicy::FailClosed))
        .collect();
    let mut admitted = 0;
    let mut returns = Vec::new();
    for (r, escrow) in escrows.iter_mut().enumerate() {
        let ticket = escrow.send_lease(1, 0).unwrap();
        let grant = coordinator.lease(r, ticket.tokens, T0 + 1);
        assert_eq!(grant.granted, 40);
        escrow.on_grant_for(ticket.id, as_escrow_grant(&grant), 2);
        admitted += escrow.serve(10, 3).unwrap().granted;
        // Idle credits go back early, while the window is current.
        returns.push(escrow.return_all(4).unwrap());
    }
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
    let mut escrow = RegionEscrow::new(60, 500, OutagePolicy::FailClosed);
    // The region's monotonic clock is unrelated to the coordinator's epoch
    // clock; sent at local 5_000, applied at coordinator T0 + 990.
    let ticket = escrow.send_lease(1, 5_000).unwrap();
    let grant = coordinator.lease(0, ticket.tokens, T0 + 990);
    assert_eq!((grant.granted, grant.window_start_ms), (60, T0));
    // The answer takes 30 ms: the window (10 ms of lifetime left) died on the way.
    let back = escrow.on_grant_for(ticket.id, as_escrow_grant(&grant), 5_030);
    assert_eq!(
        back,
        Some(Reconcile {
            window_start_ms: T0,
            leftover: 60
        })
    );
    assert_eq!(escrow.balance(5_030), 0);
    assert!(escrow.serve(1, 5_030).is_none());
    // By the time the return reaches the coordinator its window is over: forfeited.
    let outcome = coordinator.reconcile(0, back.unwrap(), T0 + WINDOW_MS + 35);
    assert_eq!(outcome.disposition, ReconcileDisposition::WindowEnded);
    assert_eq!(outcome.credited, 0);
    // The next window's credits come from a fresh lease of the next window.
    let ticket = escrow.send_lease(1, 5_040).unwrap();
    let next = coordinator.lease(0, ticket.tokens, T0 + WINDOW_MS + 40);
    assert_eq!(next.window_start_ms, T0 + WINDOW_MS);
    escrow.on_grant_for(ticket.id, as_escrow_grant(&next), 5_045);
    let served: u64 = std::iter::from_fn(|| escrow.serve(25, 5_050))
        .map(|s| {
            assert_eq!(s.window_start_ms, T0 + WINDOW_MS);
            s.granted
        })
        .sum();
    assert_eq!(served, 60, "the late 60 were not added to these");
}

/// K regions that each hold `held` credits when the coordinator becomes
/// unreachable, then face heavy demand for two windows.
fn admitted_during_outage(k: usize, outage: OutagePolicy, held: u64) -> Vec<u64> {
    let limit = 100;
    let mut coordinator = Coordinator::new(limit, WINDOW_MS, PolicyKind::Counter, T0);
    let mut per_window = vec![0u64; 2];
    for r in 0..k {
        let mut escrow = RegionEscrow::new(held, 250, outage);
        let ticket = escrow.send_lease(1, 0).unwrap();
        let grant = coordinator.lease(r, ticket.tokens, T0);
        escrow.on_grant_for(ticket.id, as_escrow_grant(&grant), 0);
        // Local clock = coordinator clock − T0 here; every lease from now fails.
        for now in 1..2 * WINDOW_MS {
            let wall = T0 + now;
            let window = usize::from(now >= WINDOW_MS);
            if let Some(s) = escrow.serve(3, now) {
                per_window[window] += s.granted;
                continue;
            }
            if let Some(ticket) = escrow.send_lease(3, now) {
                escrow.on_lease_failed_for(ticket.id, now);
            }
            if let Some(s) = escrow.serve_outage_at(3, wall, WINDOW_MS) {
                assert!(s.from_fallback);
                assert_eq!(s.window_start_ms, T0 + window as u64 * WINDOW_MS);
                per_window[window] += s.granted;
            }
        }
        let counters = escrow.counters();
        // One probe per 250 ms, not one per request.
        assert!(counters.leases_failed <= 2 * WINDOW_MS / 250 + 1);
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
