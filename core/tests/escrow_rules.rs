//! The region escrow's rules seen from its caller (the key machine, `escrow::machine`):
//! lease tickets, duplicate and stale grants, refused leases, idle returns, the outage
//! fallback's lifetime, the lease sizer and the status snapshot.

use std::collections::BTreeMap;

use leasehold_core::escrow::{CoordinatorGrant, Reconcile, RegionEscrow};
use leasehold_core::policy::OutagePolicy;
use leasehold_core::sizer::{EoqParams, EoqSizer, LeaseSizer};
use proptest::prelude::*;

/// Coordinator windows are epoch ms, far from the caller's monotonic clock:
/// only the relative lifetime links them.
const EPOCH_WINDOW: u64 = 1_700_000_000_000;

fn grant(granted: u64, window_start_ms: u64, lifetime: u64) -> CoordinatorGrant {
    CoordinatorGrant {
        granted,
        window_start_ms,
        window_end_ms: window_start_ms + 1_000,
        remaining_lifetime_ms: lifetime,
    }
}

#[test]
fn a_grant_delivered_twice_is_credited_once() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    let ticket = e.send_lease(4, 0).unwrap();
    assert_eq!(ticket.tokens, 10);
    assert_eq!(
        e.on_grant_for(ticket.id, grant(10, EPOCH_WINDOW, 900), 3),
        None
    );
    assert_eq!(
        e.on_grant_for(ticket.id, grant(10, EPOCH_WINDOW, 900), 4),
        None
    );
    assert_eq!(e.balance(5), 10);
    let counters = e.counters();
    assert_eq!(counters.tokens_credited, 10);
    assert_eq!(counters.unexpected_grants, 1);
    // Without a lease outstanding, a grant for any id is ignored too.
    assert_eq!(
        e.on_grant_for(ticket.id + 1, grant(10, EPOCH_WINDOW, 900), 6),
        None
    );
    assert_eq!(e.balance(7), 10);
}

#[test]
fn a_grant_for_a_lease_given_up_is_not_credited_to_the_next_lease() {
    let mut e = RegionEscrow::new(10, 100, OutagePolicy::FailClosed);
    let first = e.send_lease(1, 0).unwrap();
    e.on_lease_failed_for(first.id, 50);
    let second = e.send_lease(1, 150).unwrap();
    assert_ne!(first.id, second.id);
    // The first lease's grant turns up late: its deadline would be counted
    // from the wrong send time, so it must not be credited.
    assert_eq!(
        e.on_grant_for(first.id, grant(10, EPOCH_WINDOW, 900), 160),
        None
    );
    assert_eq!(e.balance(160), 0);
    assert!(e.lease_in_flight(), "the second lease is still outstanding");
    e.on_grant_for(second.id, grant(7, EPOCH_WINDOW, 600), 170);
    assert_eq!(e.balance(170), 7);
    // Reporting a failure for a lease that is not outstanding changes nothing.
    e.on_lease_failed_for(first.id, 171);
    assert!(!e.coordinator_unreachable());
}

#[test]
fn idle_credits_go_back_to_their_window_while_it_is_current() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_grant_for(ticket.id, grant(10, EPOCH_WINDOW, 900), 10);
    e.serve(3, 20).unwrap();
    assert_eq!(
        e.return_all(30),
        Some(Reconcile {
            window_start_ms: EPOCH_WINDOW,
            leftover: 7
        })
    );
    assert_eq!(e.counters().tokens_returned, 7);
    assert_eq!(e.balance(31), 0);
    // Credits a client gives back afterwards are refused: the escrow holds
    // nothing of that window any more.
    assert_eq!(e.take_back(2, EPOCH_WINDOW, 32), 0);
    // Once the credits are dead there is nothing to return.
    let ticket = e.send_lease(1, 40).unwrap();
    e.on_grant_for(ticket.id, grant(5, EPOCH_WINDOW, 100), 45);
    assert_eq!(e.return_all(140), None);
}

#[test]
fn fallback_credits_live_only_for_the_rest_of_their_wall_clock_window() {
    let mut e = RegionEscrow::new(
        10,
        500,
        OutagePolicy::Fallback {
            tokens_per_region: 4,
        },
    );
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_lease_failed_for(ticket.id, 0);
    let served = e.serve_outage_at(3, 10_250, 1_000).unwrap();
    assert_eq!(served.window_start_ms, 10_000);
    assert_eq!(served.remaining_lifetime_ms, 750);
    assert!(served.from_fallback);
    assert_eq!(e.serve_outage_at(3, 10_900, 1_000).unwrap().granted, 1);
    assert!(e.serve_outage_at(1, 10_999, 1_000).is_none());
    assert_eq!(e.serve_outage_at(9, 11_000, 1_000).unwrap().granted, 4);
    assert_eq!(e.counters().fallback_tokens, 8);
    assert_eq!(e.counters().outage_denials, 1);
}

#[test]
fn fail_closed_serves_what_it_holds_then_denies() {
    let mut e = RegionEscrow::new(5, 1_000, OutagePolicy::FailClosed);
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_grant_for(ticket.id, grant(5, EPOCH_WINDOW, 900), 1);
    e.serve(4, 2).unwrap();
    let ticket = e.send_lease(5, 3).unwrap();
    e.on_lease_failed_for(ticket.id, 4);
    assert_eq!(
        e.serve(5, 5).unwrap().granted,
        1,
        "held credits still serve"
    );
    assert!(e.serve(1, 6).is_none());
    assert!(e.serve_outage_at(1, 99_999, 1_000).is_none());
    assert_eq!(e.counters().outage_denials, 1);
    // No lease before the probe is due, and the retry hint says when it is.
    // (The first probe of an outage: 1000 / 16 = 62 ms after the failure.)
    assert!(e.send_lease(1, 50).is_none());
    assert_eq!(e.retry_after_ms(50), 16);
    assert!(e.send_lease(1, 66).is_some());
}

#[test]
fn the_escrow_feeds_its_sizer_each_windows_served_demand() {
    let params = EoqParams {
        initial_size: 8,
        ..EoqParams::default()
    };
    let mut e = RegionEscrow::with_sizer(
        LeaseSizer::Eoq(EoqSizer::new(params).unwrap()),
        500,
        OutagePolicy::FailClosed,
    );
    assert_eq!(e.lease_size(), 8);
    let mut now = 0;
    // Heavy demand (800 tokens a window) pulls the size up.
    for window in 0..6u64 {
        let start = EPOCH_WINDOW + window * 1_000;
        let mut served = 0;
        while served < 800 {
            if let Some(s) = e.serve(800 - served, now) {
                served += s.granted;
            } else if let Some(ticket) = e.send_lease(1, now) {
                e.on_grant_for(ticket.id, grant(ticket.tokens, start, 900), now);
            }
            now += 1;
        }
        now = (window + 1) * 1_000;
    }
    assert!(e.lease_size() > 8, "size {}", e.lease_size());
    // A fixed batch of 0 leases 1 at least.
    let mut fixed = RegionEscrow::new(0, 500, OutagePolicy::FailClosed);
    assert_eq!(fixed.lease_size(), 1);
    assert_eq!(fixed.send_lease(3, 0).map(|t| t.tokens), Some(3));
}

#[test]
fn the_status_snapshot_reflects_the_state() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    let idle = e.status(0);
    assert_eq!((idle.balance, idle.window_start_ms), (0, None));
    let ticket = e.send_lease(1, 0).unwrap();
    assert!(e.status(1).lease_in_flight);
    e.on_grant_for(ticket.id, grant(10, EPOCH_WINDOW, 300), 2);
    let held = e.status(100);
    assert_eq!(held.balance, 10);
    assert_eq!(held.window_start_ms, Some(EPOCH_WINDOW));
    assert_eq!(held.remaining_lifetime_ms, 200);
    assert!(!held.lease_in_flight && !held.coordinator_unreachable);
    assert_eq!(held.lease_size, 10);
    let dead = e.status(300);
    assert_eq!((dead.balance, dead.counters.tokens_expired), (0, 10));
}

#[derive(Debug, Clone)]
enum Event {
    Send(u64),
    /// Deliver a grant for the outstanding lease, or replay one already delivered.
    Deliver {
        replay: bool,
        granted: u64,
        window: u64,
        lifetime: u64,
    },
    Fail,
    Refuse,
    Serve(u64),
    ReturnIdle,
    Advance(u64),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (1u64..20).prop_map(Event::Send),
        (any::<bool>(), 0u64..30, 0u64..3, 0u64..1_200).prop_map(
            |(replay, granted, w, lifetime)| Event::Deliver {
                replay,
                granted,
                window: EPOCH_WINDOW + w * 1_000,
                lifetime
            }
        ),
        Just(Event::Fail),
        Just(Event::Refuse),
        (1u64..10).prop_map(Event::Serve),
        Just(Event::ReturnIdle),
        (0u64..300).prop_map(Event::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the caller delivers (replays, grants for failed or refused
    /// leases), each lease is credited at most once, what is served and
    /// returned per window never exceeds what was credited, and nothing is
    /// served at or after the deadline of the lease that brought it.
    #[test]
    fn each_lease_is_credited_at_most_once(events in proptest::collection::vec(event(), 1..150)) {
        let mut e = RegionEscrow::new(6, 150, OutagePolicy::FailClosed);
        let mut now = 0u64;
        let mut sent = Vec::new();
        let mut credited: BTreeMap<u64, u64> = BTreeMap::new();
        let mut used: BTreeMap<u64, u64> = BTreeMap::new();
        let mut deadline: BTreeMap<u64, u64> = BTreeMap::new();
        for ev in events {
            match ev {
                Event::Send(want) => {
                    let in_flight = e.lease_in_flight();
                    if let Some(t) = e.send_lease(want, now) {
                        prop_assert!(!in_flight, "a second lease while one is in flight");
                        prop_assert!(t.tokens >= want);
                        sent.push(t);
                    }
                }
                Event::Deliver { replay, granted, window, lifetime } => {
                    let ticket = if replay { sent.first().copied() } else { sent.last().copied() };
                    if let Some(t) = ticket {
                        let before = e.counters().tokens_credited;
                        e.on_grant_for(t.id, leasehold_core::escrow::CoordinatorGrant {
                            granted, window_start_ms: window, window_end_ms: window + 1_000,
                            remaining_lifetime_ms: lifetime,
                        }, now);
                        let got = e.counters().tokens_credited - before;
                        prop_assert!(got == 0 || got == granted);
                        if got > 0 {
                            *credited.entry(window).or_default() += got;
                            let d = deadline.entry(window).or_insert(t.sent_at_ms + lifetime);
                            *d = (*d).max(t.sent_at_ms + lifetime);
                        }
                    }
                }
                // The caller reports the last lease it sent; ignored once answered.
                Event::Fail => {
                    if let Some(t) = sent.last() {
                        e.on_lease_failed_for(t.id, now);
                    }
                }
                Event::Refuse => {
                    if let Some(t) = sent.last() {
                        e.on_lease_refused_for(t.id, now);
                    }
                }
                Event::Serve(n) => {
                    if let Some(s) = e.serve(n, now) {
                        prop_assert!(now < deadline.get(&s.window_start_ms).copied().unwrap_or(0));
                        *used.entry(s.window_start_ms).or_default() += s.granted;
                    }
                }
                Event::ReturnIdle => {
                    if let Some(r) = e.return_all(now) {
                        *used.entry(r.window_start_ms).or_default() += r.leftover;
                    }
                }
                Event::Advance(ms) => now += ms,
            }
        }
        for (w, u) in used {
            prop_assert!(u <= credited.get(&w).copied().unwrap_or(0), "window {} used {} credited {:?}", w, u, credited.get(&w));
        }
    }
}
