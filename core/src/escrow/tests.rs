//! Escrow rules: regressions for the original's defects and properties.

use proptest::prelude::*;

use super::*;

fn grant(granted: u64, window_start_ms: u64, lifetime: u64) -> CoordinatorGrant {
    CoordinatorGrant {
        granted,
        window_start_ms,
        window_end_ms: window_start_ms + 1_000,
        remaining_lifetime_ms: lifetime,
    }
}

#[test]
fn one_lease_in_flight_and_its_grant_is_credited_once() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    assert_eq!(e.lease_to_send(3, 0), Some(10));
    // Concurrent shortages while the lease is out do not send another.
    for _ in 0..50 {
        assert_eq!(e.lease_to_send(3, 1), None);
    }
    assert_eq!(e.on_grant(grant(10, 0, 900), 5), None);
    // The 50 waiters re-check the balance: 10 tokens in all, not 10 each.
    let served: u64 = (0..50)
        .filter_map(|_| e.serve(1, 6))
        .map(|s| s.granted)
        .sum();
    assert_eq!(served, 10);
    assert_eq!(e.counters().tokens_credited, 10);
}

#[test]
fn a_late_grant_is_returned_to_its_own_window_not_credited_to_the_next() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    e.lease_to_send(1, 0);
    // Lifetime 100 ms from the send at 0: dead on arrival at 150.
    let back = e.on_grant(grant(10, 0, 100), 150);
    assert_eq!(
        back,
        Some(Reconcile {
            window_start_ms: 0,
            leftover: 10
        })
    );
    assert_eq!(e.balance(150), 0);
    // A stale grant for an older window than the one held is not credited either.
    e.lease_to_send(1, 200);
    e.on_grant(grant(5, 1_000, 900), 210);
    e.lease_to_send(1, 220);
    assert_eq!(
        e.on_grant(grant(7, 0, 900), 230),
        Some(Reconcile {
            window_start_ms: 0,
            leftover: 7
        })
    );
    assert_eq!(e.balance(231), 5);
}

#[test]
fn credits_die_at_the_send_time_plus_lifetime() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    e.lease_to_send(1, 1_000);
    e.on_grant(grant(10, 0, 300), 1_050);
    let s = e.serve(2, 1_100).unwrap();
    assert_eq!(
        s.remaining_lifetime_ms, 200,
        "deadline 1300 counted from the send, not the arrival"
    );
    assert!(e.serve(1, 1_300).is_none());
    assert_eq!(e.counters().tokens_expired, 8);
}

#[test]
fn fail_closed_probes_on_a_cadence_and_denies_meanwhile() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    e.lease_to_send(1, 0);
    e.on_lease_failed(10);
    assert!(e.coordinator_unreachable());
    assert_eq!(e.lease_to_send(1, 100), None);
    assert!(e.serve_outage(1, 0, 1_000).is_none());
    assert!(e.retry_after_ms(100) >= 400);
    assert!(e.lease_to_send(1, 510).is_some(), "one probe per interval");
    e.on_grant(grant(10, 0, 900), 520);
    assert!(!e.coordinator_unreachable());
}

#[test]
fn fallback_admits_at_most_its_share_per_window() {
    let mut e = RegionEscrow::new(
        10,
        500,
        OutagePolicy::Fallback {
            tokens_per_region: 5,
        },
    );
    e.lease_to_send(1, 0);
    e.on_lease_failed(0);
    let first: u64 = (0..10)
        .filter_map(|_| e.serve_outage(1, 0, 1_000))
        .map(|s| s.granted)
        .sum();
    assert_eq!(first, 5);
    let second: u64 = (0..10)
        .filter_map(|_| e.serve_outage(1, 1_000, 1_000))
        .map(|s| s.granted)
        .sum();
    assert_eq!(second, 5);
    assert_eq!(e.counters().fallback_tokens, 10);
}

#[derive(Debug, Clone)]
enum Step {
    Lease(u64),
    Grant {
        granted: u64,
        window: u64,
        lifetime: u64,
    },
    Fail,
    Serve(u64),
    TakeBack(u64),
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u64..20).prop_map(Step::Lease),
        (0u64..30, 0u64..4, 0u64..1_500).prop_map(|(granted, w, lifetime)| Step::Grant {
            granted,
            window: w * 1_000,
            lifetime
        }),
        Just(Step::Fail),
        (1u64..10).prop_map(Step::Serve),
        (1u64..5).prop_map(Step::TakeBack),
        (0u64..400).prop_map(Step::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Never serves more than was credited (plus what clients gave back),
    /// never serves a credit at or after its deadline, and at most one
    /// lease is ever outstanding.
    #[test]
    fn serves_only_live_credited_tokens(steps in proptest::collection::vec(step(), 1..120)) {
        let mut e = RegionEscrow::new(8, 200, OutagePolicy::FailClosed);
        let mut now = 0u64;
        let mut outstanding: Option<u64> = None;
        let mut served_per_window: std::collections::BTreeMap<u64, u64> = Default::default();
        let mut credited_per_window: std::collections::BTreeMap<u64, u64> = Default::default();
        let mut deadlines: std::collections::BTreeMap<u64, u64> = Default::default();
        for s in steps {
            match s {
                Step::Lease(want) => {
                    let sent = e.lease_to_send(want, now);
                    if sent.is_some() {
                        prop_assert!(outstanding.is_none(), "two leases in flight");
                        outstanding = Some(now);
                    }
                }
                Step::Grant { granted, window, lifetime } => {
                    if let Some(sent) = outstanding.take() {
                        let before = e.counters().tokens_credited;
                        e.on_grant(grant(granted, window, lifetime), now);
                        let credited = e.counters().tokens_credited - before;
                        if credited > 0 {
                            *credited_per_window.entry(window).or_default() += credited;
                            // The latest deadline any credited grant of the window allows.
                            let d = deadlines.entry(window).or_insert(sent + lifetime);
                            *d = (*d).max(sent + lifetime);
                        }
                    }
                }
                Step::Fail => {
                    if outstanding.take().is_some() {
                        e.on_lease_failed(now);
                    }
                }
                Step::Serve(n) => {
                    if let Some(s) = e.serve(n, now) {
                        prop_assert!(s.granted <= n);
                        let deadline = deadlines.get(&s.window_start_ms).copied().unwrap_or(0);
                        prop_assert!(now < deadline, "served at {} past deadline {}", now, deadline);
                        prop_assert!(now + s.remaining_lifetime_ms <= deadline);
                        *served_per_window.entry(s.window_start_ms).or_default() += s.granted;
                    }
                }
                Step::TakeBack(n) => {
                    // A client gives back credits it holds of the current window.
                    if let Some((&w, served)) = served_per_window.iter_mut().next_back() {
                        let n = n.min(*served);
                        let accepted = e.take_back(n, w, now);
                        *served -= accepted;
                    }
                }
                Step::Advance(ms) => now += ms,
            }
        }
        for (w, served) in served_per_window {
            prop_assert!(served <= credited_per_window.get(&w).copied().unwrap_or(0));
        }
    }
}
