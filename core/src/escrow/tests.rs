//! Escrow rules: regressions for the original's defects. The property
//! tests over random event sequences live in `core/tests/escrow_rules.rs`.

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
    let ticket = e.send_lease(3, 0).unwrap();
    assert_eq!(ticket.tokens, 10);
    // Concurrent shortages while the lease is out do not send another.
    for _ in 0..50 {
        assert_eq!(e.send_lease(3, 1), None);
    }
    assert_eq!(e.on_grant_for(ticket.id, grant(10, 0, 900), 5), None);
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
    let ticket = e.send_lease(1, 0).unwrap();
    // Lifetime 100 ms from the send at 0: dead on arrival at 150.
    let back = e.on_grant_for(ticket.id, grant(10, 0, 100), 150);
    assert_eq!(
        back,
        Some(Reconcile {
            window_start_ms: 0,
            leftover: 10
        })
    );
    assert_eq!(e.balance(150), 0);
    // A stale grant for an older window than the one held is not credited either.
    let ticket = e.send_lease(1, 200).unwrap();
    e.on_grant_for(ticket.id, grant(10, 1_000, 900), 210);
    let ticket = e.send_lease(1, 220).unwrap();
    assert_eq!(
        e.on_grant_for(ticket.id, grant(7, 0, 900), 230),
        Some(Reconcile {
            window_start_ms: 0,
            leftover: 7
        })
    );
    assert_eq!(e.balance(231), 10);
}

#[test]
fn credits_die_at_the_send_time_plus_lifetime() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    let ticket = e.send_lease(1, 1_000).unwrap();
    e.on_grant_for(ticket.id, grant(10, 0, 300), 1_050);
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
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_lease_failed_for(ticket.id, 10);
    assert!(e.coordinator_unreachable());
    // The first probe 500 / 16 = 31 ms after the failure, then twice as long.
    assert_eq!(e.send_lease(1, 30), None);
    assert!(e.serve_outage_at(1, 30, 1_000).is_none());
    assert_eq!(e.retry_after_ms(30), 11);
    let probe = e.send_lease(1, 41).expect("the first probe");
    e.on_lease_failed_for(probe.id, 41);
    assert_eq!(e.send_lease(1, 102), None);
    let probe = e.send_lease(1, 103).expect("the second probe, 62 ms later");
    e.on_grant_for(probe.id, grant(10, 0, 900), 110);
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
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_lease_failed_for(ticket.id, 0);
    let first: u64 = (0..10)
        .filter_map(|_| e.serve_outage_at(1, 0, 1_000))
        .map(|s| s.granted)
        .sum();
    assert_eq!(first, 5);
    let second: u64 = (0..10)
        .filter_map(|_| e.serve_outage_at(1, 1_000, 1_000))
        .map(|s| s.granted)
        .sum();
    assert_eq!(second, 5);
    assert_eq!(e.counters().fallback_tokens, 10);
}

#[test]
fn shadow_credits_last_the_rest_of_the_local_window_and_are_not_returnable() {
    let served = RegionEscrow::serve_shadow_at(7, 12_345, 1_000);
    assert_eq!(served.granted, 7);
    assert_eq!(served.window_start_ms, 12_000);
    assert_eq!(served.window_end_ms, 13_000);
    assert_eq!(served.remaining_lifetime_ms, 655);
    assert!(
        served.from_fallback,
        "not from a grant: no holder may return it"
    );
    // A zero window length is treated as 1 ms, never a division by zero.
    assert_eq!(
        RegionEscrow::serve_shadow_at(1, 5, 0).remaining_lifetime_ms,
        1
    );
}

#[test]
fn a_partial_grant_means_the_window_is_exhausted() {
    let mut e = RegionEscrow::new(10, 50, OutagePolicy::FailClosed);
    let ticket = e.send_lease(1, 0).unwrap();
    assert_eq!(ticket.tokens, 10);
    e.on_grant_for(ticket.id, grant(4, 0, 1_000), 5);
    e.serve(4, 6);
    assert_eq!(e.send_lease(1, 7), None, "the window had only 4 left");
    assert_eq!(e.retry_after_ms(7), 993);
    // A full grant leaves the window open to more leases.
    let ticket = e.send_lease(1, 1_000).unwrap();
    assert_eq!(ticket.tokens, 10);
    e.on_grant_for(ticket.id, grant(10, 1_000, 1_000), 1_001);
    e.serve(10, 1_002);
    assert_eq!(e.send_lease(1, 1_003).map(|t| t.tokens), Some(10));
}

#[test]
fn an_exhausted_window_is_not_asked_again_before_its_deadline() {
    let mut e = RegionEscrow::new(10, 50, OutagePolicy::FailClosed);
    let ticket = e.send_lease(1, 100).unwrap();
    // Nothing left in the window; its credits would have lived until 100 + 600.
    assert_eq!(e.on_grant_for(ticket.id, grant(0, 0, 600), 110), None);
    for now in [111, 300, 699] {
        assert_eq!(e.send_lease(1, now), None, "asked again at {now}");
        assert_eq!(e.retry_after_ms(now), 700 - now);
    }
    assert!(e.send_lease(1, 700).is_some(), "the next window is asked");
    assert_eq!(e.counters().leases_sent, 2);
}

fn eoq_escrow() -> RegionEscrow {
    let sizer = crate::sizer::EoqSizer::new(crate::sizer::EoqParams {
        initial_size: 16,
        max_size: 500,
        ..Default::default()
    })
    .expect("valid parameters");
    RegionEscrow::with_sizer(LeaseSizer::Eoq(sizer), 50, OutagePolicy::FailClosed)
}

#[test]
fn a_learning_sizer_asks_the_next_window_for_what_the_last_one_kept() {
    let mut e = eoq_escrow();
    let ticket = e.send_lease(1, 0).unwrap();
    assert_eq!(ticket.tokens, 16);
    e.on_grant_for(ticket.id, grant(300, 0, 1_000), 1);
    let served: u64 = (0..90)
        .filter_map(|_| e.serve(1, 10))
        .map(|s| s.granted)
        .sum();
    assert_eq!(served, 90);
    assert_eq!(e.take_back(10, 0, 20), 10);
    // Still in the window: top-ups are sized by the learner alone.
    e.serve(210, 30);
    let ticket = e.send_lease(1, 40).unwrap();
    assert_eq!(ticket.tokens, 16);
    e.on_grant_for(ticket.id, grant(0, 0, 960), 41);
    // The next window (credits died at 1 000) starts with what this one
    // kept: 90 + 210 served, 10 taken back.
    assert_eq!(e.send_lease(1, 1_000).map(|t| t.tokens), Some(290));
}

#[test]
fn the_warm_start_is_capped_and_skips_windows_that_are_not_adjacent() {
    let mut e = eoq_escrow();
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_grant_for(ticket.id, grant(1_000, 0, 1_000), 1);
    e.serve(1_000, 10);
    // Capped by the learner's largest size.
    let ticket = e.send_lease(1, 1_000).unwrap();
    assert_eq!(ticket.tokens, 500);
    e.on_grant_for(ticket.id, grant(500, 1_000, 1_000), 1_001);
    e.serve(400, 1_010);
    // A window later than the next one: no warm start.
    let size = e.lease_size();
    assert_eq!(e.send_lease(1, 3_500).map(|t| t.tokens), Some(size));
    // A fixed batch never warm-starts.
    let mut fixed = RegionEscrow::new(10, 50, OutagePolicy::FailClosed);
    let ticket = fixed.send_lease(1, 0).unwrap();
    fixed.on_grant_for(ticket.id, grant(100, 0, 1_000), 1);
    fixed.serve(100, 10);
    assert_eq!(fixed.send_lease(1, 1_000).map(|t| t.tokens), Some(10));
}

#[test]
fn a_refused_lease_is_cleared_without_a_failure_or_an_outage() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    let ticket = e.send_lease(3, 0).unwrap();
    let before = e.counters();
    e.on_lease_refused_for(ticket.id, 5);
    assert!(!e.lease_in_flight());
    assert!(!e.coordinator_unreachable(), "a refusal is an answer");
    // Nothing to wait for: neither a probe interval nor an exhausted window.
    assert_eq!(e.retry_after_ms(5), 1);
    assert_eq!(e.balance(5), 0);
    assert_eq!(e.counters(), before, "only the send was counted");
    assert_eq!(before.leases_sent, 1);
    assert_eq!(before.leases_failed, 0);
    let next = e.send_lease(3, 6).expect("a new lease may go out at once");
    assert_ne!(next.id, ticket.id);
    // A refusal for a lease that is no longer outstanding changes nothing,
    // and the grant of the refused lease is not credited to the next one.
    e.on_lease_refused_for(ticket.id, 7);
    assert!(e.lease_in_flight());
    assert_eq!(e.on_grant_for(ticket.id, grant(10, 0, 900), 8), None);
    assert_eq!(e.balance(8), 0);
    assert_eq!(e.on_grant_for(next.id, grant(10, 0, 900), 9), None);
    assert_eq!(e.balance(9), 10);
}

#[test]
fn a_refused_probe_ends_an_outage() {
    let mut e = RegionEscrow::new(10, 500, OutagePolicy::FailClosed);
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_lease_failed_for(ticket.id, 10);
    assert!(e.coordinator_unreachable());
    let probe = e.send_lease(1, 510).unwrap();
    e.on_lease_refused_for(probe.id, 520);
    assert!(!e.coordinator_unreachable(), "the coordinator answered");
    assert_eq!(e.counters().leases_failed, 1, "the refusal is no failure");
    assert!(
        e.send_lease(1, 521).is_some(),
        "no probe interval after a refusal"
    );
}

mod window_credit_rule {
    use super::*;
    use crate::window_credit::{grant_fate, ArrivingGrant, GrantFate, HeldWindow};
    use proptest::prelude::*;

    proptest! {
        /// Whatever the escrow holds, a second grant is credited or handed
        /// back to its own window exactly as the shared window-credit rule
        /// decides, and credited tokens die at the rule's deadline.
        #[test]
        fn the_escrow_credits_by_the_shared_window_rule(
            first in (0u64..4, 0u64..1_500, 0u64..500),
            second in (0u64..4, 0u64..1_500, 0u64..1_000, 0u64..1_000),
            granted in 1u64..50,
        ) {
            let (first_window, first_lifetime, first_latency) = first;
            let (second_window, second_lifetime, pause, second_latency) = second;
            let mut e = RegionEscrow::new(1, 500, OutagePolicy::FailClosed);
            let ticket = e.send_lease(1, 0).expect("first lease");
            e.on_grant_for(ticket.id, grant(granted, first_window * 1_000, first_lifetime), first_latency);
            let sent = first_latency + pause;
            let now = sent + second_latency;
            let ticket = e.send_lease(1, sent).expect("second lease");
            // What the escrow holds when the grant lands (dead credits are
            // forgotten then).
            let before = e.status(now);
            let held = before.window_start_ms.map(|window_start_ms| HeldWindow {
                window_start_ms,
                deadline: now + before.remaining_lifetime_ms,
            });
            let fate = grant_fate(
                held,
                ArrivingGrant {
                    window_start_ms: second_window * 1_000,
                    sent_at: sent,
                    remaining_lifetime_ms: second_lifetime,
                },
                now,
            );
            let back = e.on_grant_for(ticket.id, grant(granted, second_window * 1_000, second_lifetime), now);
            match fate {
                GrantFate::OlderWindow | GrantFate::Late => {
                    prop_assert_eq!(back, Some(Reconcile { window_start_ms: second_window * 1_000, leftover: granted }));
                }
                GrantFate::SameWindow { deadline } | GrantFate::NewWindow { deadline } => {
                    prop_assert_eq!(back, None);
                    let after = e.status(now);
                    prop_assert_eq!(after.window_start_ms, Some(second_window * 1_000));
                    prop_assert_eq!(now + after.remaining_lifetime_ms, deadline);
                    prop_assert!(after.balance >= granted);
                    prop_assert_eq!(e.balance(deadline), 0);
                }
            }
        }
    }
}

fn predictive_escrow() -> RegionEscrow {
    let sizer = crate::predictive_sizer::PredictiveSizer::new(
        crate::sizer::EoqParams {
            initial_size: 16,
            max_size: 100_000,
            ..Default::default()
        },
        crate::predictive_sizer::PredictiveParams::default(),
    )
    .expect("valid parameters");
    RegionEscrow::with_sizer(LeaseSizer::Predictive(sizer), 50, OutagePolicy::FailClosed)
}

#[test]
fn a_forecast_reaches_the_predictive_sizer_when_its_window_starts() {
    // Before any window: the first one is the next, the forecast applies now.
    let mut e = predictive_escrow();
    let cold = e.lease_size();
    assert!(e.forecast(50_000));
    assert!(e.lease_size() > cold, "{} vs {cold}", e.lease_size());

    // During a window: kept until the next one starts.
    let mut e = predictive_escrow();
    let ticket = e.send_lease(1, 0).unwrap();
    e.on_grant_for(ticket.id, grant(100, 0, 1_000), 1);
    e.serve(10, 10);
    let during = e.lease_size();
    assert!(e.forecast(50_000));
    assert_eq!(e.lease_size(), during, "not before its window");
    let mut unforecast = predictive_escrow();
    let ticket = unforecast.send_lease(1, 0).unwrap();
    unforecast.on_grant_for(ticket.id, grant(100, 0, 1_000), 1);
    unforecast.serve(10, 10);
    // The next window's first serve closes the last one for both.
    for escrow in [&mut e, &mut unforecast] {
        let ticket = escrow.send_lease(1, 1_000).unwrap();
        escrow.on_grant_for(ticket.id, grant(100, 1_000, 1_000), 1_001);
        escrow.serve(1, 1_002);
    }
    assert!(
        e.lease_size() > unforecast.lease_size(),
        "{} vs {}",
        e.lease_size(),
        unforecast.lease_size()
    );

    // Other sizers take no forecasts.
    assert!(!eoq_escrow().forecast(1_000));
    assert!(!RegionEscrow::new(10, 50, OutagePolicy::FailClosed).forecast(1_000));
}
