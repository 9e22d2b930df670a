//! The key machine against a model coordinator: scenarios pinning each
//! rule, and properties over random event sequences with lost, late and
//! refused answers.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;
use crate::fair_throttle::FairThrottleConfig;
use crate::ids::ClientId;
use crate::policy::OutagePolicy;
use crate::principal::Principal;

const WINDOW_MS: u64 = 1_000;
const PROBE_MS: u64 = 100;
const RELEASE_IDLE_MS: u64 = 300;
const EVICT_MS: u64 = 2_500;
/// The wall clock runs this far ahead of the monotonic one.
const WALL_SKEW_MS: u64 = 7_777;

type Machine = KeyMachine<&'static str>;

fn config(batch: u64) -> KeyMachineConfig {
    KeyMachineConfig {
        sizer: LeaseSizer::Fixed(batch),
        probe_interval_ms: PROBE_MS,
        pool_release_idle_ms: RELEASE_IDLE_MS,
        idle_evict_ms: EVICT_MS,
        max_tenants: 16,
        holder_limits: HolderLimits::default(),
    }
}

fn policy(kind: PolicyKind, limit: u64, outage: OutagePolicy, shadow: bool) -> Policy {
    Policy {
        prefix: "k".into(),
        limit,
        window_ms: WINDOW_MS,
        kind,
        outage,
        shadow,
    }
}

fn at(mono_ms: u64) -> Now {
    Now {
        mono_ms,
        wall_ms: mono_ms + WALL_SKEW_MS,
    }
}

fn tenant(i: u64) -> TenantId {
    TenantId::new(format!("t{i}")).expect("valid tenant")
}

fn holder() -> Holder {
    Holder {
        principal: Principal::Anonymous,
        client: ClientId::new("c").expect("valid client id"),
    }
}

fn request(id: u64, tokens: u64, policy: &Policy) -> AcquireRequest {
    AcquireRequest {
        id,
        tokens,
        tenant: None,
        weight: 1,
        from: None,
        caller: None,
        serving: Serving::Part,
        policy: Some(policy.clone()),
        node_reachable: true,
    }
}

fn window_of(now_ms: u64) -> WindowBounds {
    let start_ms = now_ms - now_ms % WINDOW_MS;
    WindowBounds {
        start_ms,
        end_ms: start_ms + WINDOW_MS,
    }
}

fn answers(
    actions: &[Action<&'static str>],
) -> Vec<(u64, Result<Acquired, Refused<&'static str>>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Answer { id, answer } => Some((*id, answer.clone())),
            _ => None,
        })
        .collect()
}

fn granted(answer: &Result<Acquired, Refused<&'static str>>) -> Option<u64> {
    match answer {
        Ok(Acquired::Credits { served, .. }) => Some(served.granted),
        _ => None,
    }
}

fn lease_ticket(actions: &[Action<&'static str>]) -> LeaseTicket {
    actions
        .iter()
        .find_map(|a| match a {
            Action::SendLease(ticket) => Some(*ticket),
            _ => None,
        })
        .expect("a lease was sent")
}

fn pool_call(actions: &[Action<&'static str>]) -> Option<(u64, u64)> {
    actions.iter().find_map(|a| match a {
        Action::SendPoolGrant {
            call, want_total, ..
        } => Some((*call, *want_total)),
        _ => None,
    })
}

fn release_sent(actions: &[Action<&'static str>]) -> Option<PendingRelease<u64>> {
    actions.iter().find_map(|a| match a {
        Action::SendPoolRelease(pending) => Some(pending.clone()),
        _ => None,
    })
}

/// A pool answer of a region whose one holder is the machine under test:
/// all of `granted_total` is its own (the window's first grant).
fn pool_answer(granted_total: u64, limit: u64, now_ms: u64) -> PoolAnswer {
    let window = window_of(now_ms);
    PoolAnswer {
        granted_total,
        granted_increment: granted_total,
        limit,
        window,
        remaining_lifetime_ms: window.end_ms - now_ms,
        standing: None,
        expected: None,
        reserved_unheld: 0,
        retired_kept: 0,
        late_released_before: 0,
    }
}

#[test]
fn a_counter_key_leases_once_then_serves_from_its_credits() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(10), None, 0);
    let sent = m.handle(Event::Acquire(request(1, 3, &counter)), at(5));
    let ticket = lease_ticket(&sent);
    assert_eq!(ticket.tokens, 10);
    assert!(answers(&sent).is_empty(), "the request waits on its lease");
    let grant = CoordinatorGrant {
        granted: 10,
        window_start_ms: 0,
        window_end_ms: WINDOW_MS,
        remaining_lifetime_ms: 995,
    };
    let done = m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant,
        },
        at(8),
    );
    assert_eq!(granted(&answers(&done)[0].1), Some(3));
    assert!(matches!(done.last(), Some(Action::ArmTimer { .. })));
    let again = m.handle(Event::Acquire(request(2, 7, &counter)), at(9));
    assert_eq!(answers(&again), vec![(2, answers(&again)[0].1.clone())]);
    assert_eq!(granted(&answers(&again)[0].1), Some(7));
    assert!(!again.iter().any(|a| matches!(a, Action::SendLease(_))));
    // A second grant for the same ticket is not credited.
    m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant,
        },
        at(10),
    );
    assert_eq!(m.counters().tokens_credited, 10);
    assert_eq!(m.counters().unexpected_grants, 1);
}

/// A grant that comes back after its window ended is handed back, and the
/// request it was for leases once more in the window now current instead of
/// being denied; a second late grant denies it.
#[test]
fn a_request_whose_grant_came_back_too_late_leases_once_more() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(10), None, 0);
    // Sent 5 ms before the window's end (coordinator and local clocks agree).
    let sent = m.handle(Event::Acquire(request(1, 3, &counter)), at(WINDOW_MS - 5));
    let first = lease_ticket(&sent);
    let late = CoordinatorGrant {
        granted: 10,
        window_start_ms: 0,
        window_end_ms: WINDOW_MS,
        remaining_lifetime_ms: 4,
    };
    // Answered 30 ms later: the window (and the credits' lifetime) is over.
    let again = m.handle(
        Event::LeaseGranted {
            ticket: first.id,
            grant: late,
        },
        at(WINDOW_MS + 25),
    );
    assert!(answers(&again).is_empty(), "not denied: {again:?}");
    assert!(again
        .iter()
        .any(|a| matches!(a, Action::Reconcile(back) if back.leftover == 10)));
    let second = lease_ticket(&again);
    assert_ne!(second.id, first.id);
    let fresh = CoordinatorGrant {
        granted: 10,
        window_start_ms: WINDOW_MS,
        window_end_ms: 2 * WINDOW_MS,
        remaining_lifetime_ms: WINDOW_MS - 30,
    };
    let done = m.handle(
        Event::LeaseGranted {
            ticket: second.id,
            grant: fresh,
        },
        at(WINDOW_MS + 30),
    );
    assert_eq!(granted(&answers(&done)[0].1), Some(3));

    // Late twice: the second time the request is denied (no loop).
    let sent = m.handle(
        Event::Acquire(request(2, 20, &counter)),
        at(2 * WINDOW_MS - 5),
    );
    let first = lease_ticket(&sent);
    let late = |start| CoordinatorGrant {
        granted: 10,
        window_start_ms: start,
        window_end_ms: start + WINDOW_MS,
        remaining_lifetime_ms: 1,
    };
    let again = m.handle(
        Event::LeaseGranted {
            ticket: first.id,
            grant: late(WINDOW_MS),
        },
        at(2 * WINDOW_MS + 10),
    );
    let second = lease_ticket(&again);
    let denied = m.handle(
        Event::LeaseGranted {
            ticket: second.id,
            grant: late(2 * WINDOW_MS),
        },
        at(3 * WINDOW_MS + 10),
    );
    assert!(
        matches!(answers(&denied)[0].1, Ok(Acquired::Denied { .. })),
        "{denied:?}"
    );
}

#[test]
fn an_unknown_policy_is_refreshed_once_then_refused() {
    let mut m = Machine::new(config(10), None, 0);
    let mut unknown = request(
        1,
        1,
        &policy(PolicyKind::Counter, 1, OutagePolicy::FailClosed, false),
    );
    unknown.policy = None;
    let asked = m.handle(Event::Acquire(unknown), at(0));
    assert_eq!(asked, vec![Action::RefreshPolicy]);
    let refused = m.handle(Event::Policy(None), at(1));
    assert_eq!(answers(&refused), vec![(1, Err(Refused::NoPolicy))]);
}

#[test]
fn a_refused_lease_is_passed_to_the_request_and_a_failed_one_follows_the_outage_policy() {
    let fallback = policy(
        PolicyKind::Counter,
        100,
        OutagePolicy::Fallback {
            tokens_per_region: 4,
        },
        false,
    );
    let mut m = Machine::new(config(10), None, 0);
    let ticket = lease_ticket(&m.handle(Event::Acquire(request(1, 3, &fallback)), at(0)));
    let refused = m.handle(
        Event::LeaseRefused {
            ticket: ticket.id,
            refusal: "wrong kind",
        },
        at(1),
    );
    assert_eq!(
        answers(&refused),
        vec![(1, Err(Refused::Coordinator("wrong kind")))]
    );
    let ticket = lease_ticket(&m.handle(Event::Acquire(request(2, 3, &fallback)), at(2)));
    let failed = m.handle(Event::LeaseFailed { ticket: ticket.id }, at(3));
    let served = match answers(&failed)[0].1 {
        Ok(Acquired::Credits { served, .. }) => served,
        ref other => panic!("fallback should serve, got {other:?}"),
    };
    assert!(served.from_fallback && served.granted == 3);
    assert_eq!(served.window_start_ms, window_of(3 + WALL_SKEW_MS).start_ms);
    // The share is 4: one more token, then denials until the probe is due
    // (the first probe of an outage: 100 / 16 = 6 ms after the failure).
    let rest = m.handle(Event::Acquire(request(3, 3, &fallback)), at(4));
    assert_eq!(granted(&answers(&rest)[0].1), Some(1));
    let denied = m.handle(Event::Acquire(request(4, 3, &fallback)), at(5));
    assert!(matches!(
        answers(&denied)[0].1,
        Ok(Acquired::Denied {
            retry_after_ms: 4,
            ..
        })
    ));
    assert!(!denied.iter().any(|a| matches!(a, Action::SendLease(_))));
}

#[test]
fn shadow_turns_a_denial_into_a_counted_admission() {
    let shadow = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, true);
    let mut m = Machine::new(config(10), None, 0);
    let ticket = lease_ticket(&m.handle(Event::Acquire(request(1, 5, &shadow)), at(0)));
    let done = m.handle(Event::LeaseFailed { ticket: ticket.id }, at(1));
    assert!(done.contains(&Action::CountShadowWouldDeny { tokens: 5 }));
    assert!(matches!(
        answers(&done)[0].1,
        Ok(Acquired::Credits {
            shadow_would_deny: true,
            served: Served {
                granted: 5,
                from_fallback: true,
                ..
            },
            ..
        })
    ));
}

#[test]
fn whole_or_nothing_puts_a_partial_serve_back() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(4), None, 0);
    let ticket = lease_ticket(&m.handle(Event::Acquire(request(1, 1, &counter)), at(0)));
    let grant = CoordinatorGrant {
        granted: 4,
        window_start_ms: 0,
        window_end_ms: WINDOW_MS,
        remaining_lifetime_ms: 1_000,
    };
    m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant,
        },
        at(1),
    );
    // 3 held; 10 asked whole: the node leases the 7 it lacks first...
    let mut whole = request(2, 10, &counter);
    whole.serving = Serving::Whole;
    let out = m.handle(Event::Acquire(whole.clone()), at(2));
    assert!(answers(&out).is_empty(), "no answer before the lease");
    let ticket = lease_ticket(&out);
    assert!(ticket.tokens >= 7, "asks at least the 7 missing");
    // ...and the window has only 2 more: the 5 served go back and the
    // answer is a denial.
    let done = m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant: CoordinatorGrant {
                granted: 2,
                window_start_ms: 0,
                window_end_ms: WINDOW_MS,
                remaining_lifetime_ms: 998,
            },
        },
        at(2),
    );
    assert!(matches!(
        answers(&done)[0].1,
        Ok(Acquired::Denied {
            retry_after_ms: 998,
            ..
        })
    ));
    assert_eq!(m.counter.balance(4), 5, "the partial serve went back");
    // The window gave less than asked: it is spent, and the next whole
    // request is denied without another lease.
    whole.id = 3;
    let done = m.handle(Event::Acquire(whole), at(5));
    assert!(matches!(answers(&done)[0].1, Ok(Acquired::Denied { .. })));
    assert_eq!(m.counter.balance(5), 5);
}

/// A whole request short of credits is served whole once its lease brings
/// the difference, where serving the part held would have denied it.
#[test]
fn a_whole_request_short_of_credits_leases_the_difference() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(4), None, 0);
    let ticket = lease_ticket(&m.handle(Event::Acquire(request(1, 1, &counter)), at(0)));
    let grant = |granted, remaining_lifetime_ms| CoordinatorGrant {
        granted,
        window_start_ms: 0,
        window_end_ms: WINDOW_MS,
        remaining_lifetime_ms,
    };
    m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant: grant(4, 1_000),
        },
        at(1),
    );
    let mut whole = request(2, 10, &counter);
    whole.serving = Serving::Whole;
    let ticket = lease_ticket(&m.handle(Event::Acquire(whole), at(2)));
    assert!(ticket.tokens >= 7);
    let done = m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant: grant(ticket.tokens, 998),
        },
        at(2),
    );
    assert!(matches!(
        answers(&done)[0].1,
        Ok(Acquired::Credits { served, .. }) if served.granted == 10
    ));
}

/// A probe spends nothing: it answers credits (0 granted) while any are
/// held or can be leased, and a denial once the window is spent; the
/// lease it took stays held for the requests that follow.
#[test]
fn a_probe_answers_whether_tokens_could_be_served_and_spends_nothing() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(4), None, 0);
    let mut probe = request(1, 1, &counter);
    probe.serving = Serving::Probe;
    let ticket = lease_ticket(&m.handle(Event::Acquire(probe.clone()), at(0)));
    let grant = CoordinatorGrant {
        granted: 4,
        window_start_ms: 0,
        window_end_ms: WINDOW_MS,
        remaining_lifetime_ms: 1_000,
    };
    let done = m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant,
        },
        at(1),
    );
    match answers(&done)[0].1 {
        Ok(Acquired::Credits { served, .. }) => {
            assert_eq!(served.granted, 0, "a probe spends nothing");
            assert_eq!(served.held_after, 4);
        }
        ref other => panic!("{other:?}"),
    }
    assert_eq!(m.counter.balance(4), 4, "all four still held");
    // Probing again and again spends nothing either.
    for id in 2..10 {
        probe.id = id;
        let done = m.handle(Event::Acquire(probe.clone()), at(2));
        assert!(matches!(
            answers(&done)[0].1,
            Ok(Acquired::Credits { served, .. }) if served.granted == 0
        ));
    }
    assert_eq!(m.counter.balance(4), 4);
    // The four are spent: a probe is denied.
    let done = m.handle(Event::Acquire(request(20, 4, &counter)), at(3));
    assert!(matches!(
        answers(&done)[0].1,
        Ok(Acquired::Credits { served, .. }) if served.granted == 4
    ));
    probe.id = 21;
    let out = m.handle(Event::Acquire(probe.clone()), at(4));
    // Nothing held: the probe leases to find out; the window has nothing.
    let ticket = lease_ticket(&out);
    let spent = CoordinatorGrant {
        granted: 0,
        window_start_ms: 0,
        window_end_ms: WINDOW_MS,
        remaining_lifetime_ms: 996,
    };
    let done = m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant: spent,
        },
        at(5),
    );
    assert!(matches!(answers(&done)[0].1, Ok(Acquired::Denied { .. })));
}

/// A refund takes back at most what the node served in that window and
/// has not taken back; another window's refund takes nothing.
#[test]
fn a_refund_takes_back_at_most_what_was_served_in_its_window() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(4), None, 0);
    let ticket = lease_ticket(&m.handle(Event::Acquire(request(1, 3, &counter)), at(0)));
    m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant: CoordinatorGrant {
                granted: 4,
                window_start_ms: 0,
                window_end_ms: WINDOW_MS,
                remaining_lifetime_ms: 1_000,
            },
        },
        at(1),
    );
    assert_eq!(m.counter.balance(2), 1, "3 of 4 served");
    let settled = |actions: Vec<Action<&'static str>>| {
        actions.into_iter().find_map(|a| match a {
            Action::Settle { settled, .. } => Some(settled),
            _ => None,
        })
    };
    let refund = |id, tokens, window_start_ms| Event::Refund {
        id,
        tokens,
        window_start_ms,
    };
    let first = settled(m.handle(refund(2, 5, 0), at(2)));
    assert_eq!(
        first,
        Some(Ok(ReturnSettled {
            accepted: 3,
            refused: 2
        }))
    );
    assert_eq!(m.counter.balance(2), 4, "never more than was granted");
    let again = settled(m.handle(refund(3, 1, 0), at(2)));
    assert_eq!(
        again,
        Some(Ok(ReturnSettled {
            accepted: 0,
            refused: 1
        }))
    );
    let elsewhere = settled(m.handle(refund(4, 1, WINDOW_MS), at(2)));
    assert_eq!(
        elsewhere,
        Some(Ok(ReturnSettled {
            accepted: 0,
            refused: 1
        }))
    );
}

/// A fair key whose pool grant is live, holding `budget` of limit 100.
fn fair_key_with(budget: u64, now_ms: u64) -> (Machine, Policy) {
    let fair = policy(PolicyKind::Fair, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(5), None, 0);
    let mut first = request(1, 1, &fair);
    first.tenant = Some(tenant(1));
    let sent = m.handle(Event::Acquire(first), at(now_ms));
    let (call, _) = pool_call(&sent).expect("joins the pool");
    let done = m.handle(
        Event::PoolGranted {
            call,
            answer: pool_answer(budget, 100, now_ms),
            tenant_demands: Vec::new(),
            next_window: None,
            next_window_demands: Vec::new(),
        },
        at(now_ms),
    );
    assert_eq!(granted(&answers(&done)[0].1), Some(1));
    (m, fair)
}

#[test]
fn a_fair_key_at_its_ceiling_waits_before_asking_again() {
    let (mut m, fair) = fair_key_with(1, 10);
    let mut next = request(2, 1, &fair);
    next.tenant = Some(tenant(1));
    let sent = m.handle(Event::Acquire(next.clone()), at(20));
    let (call, want) = pool_call(&sent).expect("asks for more");
    assert!(want > 1);
    // Granted no more than held: at the ceiling.
    let denied = m.handle(
        Event::PoolGranted {
            call,
            answer: PoolAnswer {
                granted_increment: 0,
                ..pool_answer(1, 100, 20)
            },
            tenant_demands: Vec::new(),
            next_window: None,
            next_window_demands: Vec::new(),
        },
        at(21),
    );
    assert!(matches!(answers(&denied)[0].1, Ok(Acquired::Denied { .. })));
    next.id = 3;
    let waits = m.handle(Event::Acquire(next), at(30));
    assert!(pool_call(&waits).is_none(), "no ask before the re-ask wait");
    let (wait_ms, _) = (RELEASE_IDLE_MS.min(WINDOW_MS / 4), ());
    assert!(matches!(
        answers(&waits)[0].1,
        Ok(Acquired::Denied { retry_after_ms, .. }) if retry_after_ms == 21 + wait_ms - 30
    ));
}

#[test]
fn an_unanswered_release_is_resent_with_its_id_before_the_next_pool_ask() {
    let (mut m, fair) = fair_key_with(50, 10);
    // Idle past the reclaim delay: the timer fires and the key releases.
    let release = release_sent(&m.handle(Event::Tick, at(10 + RELEASE_IDLE_MS)))
        .expect("an idle key releases");
    assert_eq!((release.from_total, release.keep_total), (50, 1));
    let lost = m.handle(
        Event::ReleaseFailed {
            release: release.request_id,
        },
        at(10 + RELEASE_IDLE_MS + 1),
    );
    assert!(
        matches!(lost.last(), Some(Action::ArmTimer { at_ms }) if *at_ms == 10 + RELEASE_IDLE_MS + PROBE_MS),
        "resent a probe interval after its last try"
    );
    let mut next = request(2, 1, &fair);
    next.tenant = Some(tenant(1));
    let later = 10 + RELEASE_IDLE_MS + 1 + PROBE_MS;
    let sent = m.handle(Event::Acquire(next), at(later));
    assert_eq!(
        release_sent(&sent),
        Some(release.clone()),
        "the same release first"
    );
    assert!(pool_call(&sent).is_none());
    let asked = m.handle(
        Event::ReleaseAnswered {
            release: release.request_id,
            answer: ReleaseAnswer::Released {
                released: 49,
                granted_total: release.keep_total,
            },
            next_window: None,
            next_window_demands: Vec::new(),
        },
        at(later + 1),
    );
    assert!(pool_call(&asked).is_some(), "then the pool ask");
}

#[test]
fn an_idle_key_is_evicted_and_hands_its_credits_back() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, false);
    let mut m = Machine::new(config(10), None, 0);
    let ticket = lease_ticket(&m.handle(Event::Acquire(request(1, 3, &counter)), at(0)));
    let grant = CoordinatorGrant {
        granted: 10,
        window_start_ms: 0,
        window_end_ms: 10 * WINDOW_MS,
        remaining_lifetime_ms: 10 * WINDOW_MS,
    };
    let armed = m.handle(
        Event::LeaseGranted {
            ticket: ticket.id,
            grant,
        },
        at(1),
    );
    assert!(armed.contains(&Action::ArmTimer { at_ms: EVICT_MS }));
    assert!(!m
        .handle(Event::Tick, at(EVICT_MS - 1))
        .contains(&Action::Evict));
    assert_eq!(m.handle(Event::Tick, at(EVICT_MS)), vec![Action::Evict]);
    assert_eq!(
        m.handle(Event::Shutdown, at(EVICT_MS + 1)),
        vec![Action::Reconcile(Reconcile {
            window_start_ms: 0,
            leftover: 7
        })]
    );
}

#[test]
fn a_throttled_request_is_denied_before_the_rules_and_shadow_still_applies() {
    let counter = policy(PolicyKind::Counter, 100, OutagePolicy::FailClosed, true);
    let gate = EscrowFairGate::new(FairThrottleConfig::default(), None, 0, 1, 2).expect("valid");
    // The last possible draw: refused once the throttle is sure, after
    // learning the caller keeps finding nothing.
    let throttle = ThrottleFront::new(gate, 42, Box::new(|| (3, u64::MAX)));
    let mut m = Machine::new(config(1), Some(throttle), 0);
    let now = 0;
    let mut throttled = None;
    for id in 0..100 {
        let mut asking = request(id, 1, &counter);
        asking.caller = Some(b"greedy".to_vec());
        let mut actions = m.handle(Event::Acquire(asking), at(now));
        if let Some(Action::SendLease(ticket)) = actions.first() {
            // Nothing left in the window: every request after it is denied.
            actions = m.handle(
                Event::LeaseGranted {
                    ticket: ticket.id,
                    grant: CoordinatorGrant {
                        granted: 0,
                        window_start_ms: 0,
                        window_end_ms: WINDOW_MS,
                        remaining_lifetime_ms: WINDOW_MS,
                    },
                },
                at(now),
            );
        }
        if m.throttle_counters().expect("a throttle").denials > 0 {
            throttled = Some(actions);
            break;
        }
        assert!(actions.contains(&Action::CountShadowWouldDeny { tokens: 1 }));
    }
    let actions = throttled.expect("an exhausted caller is throttled in the end");
    assert!(!actions.iter().any(|a| matches!(a, Action::SendLease(_))));
    assert!(actions.contains(&Action::CountShadowWouldDeny { tokens: 1 }));
    assert!(matches!(
        answers(&actions)[0].1,
        Ok(Acquired::Credits {
            shadow_would_deny: true,
            ..
        })
    ));
    let counts = m.throttle_counters().expect("a throttle");
    assert_eq!((counts.denials, counts.exhaustions), (1, counts.passes));
}

// ---- properties -------------------------------------------------------

/// How the model network treats one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Applied and answered.
    Answered,
    /// Applied, but the answer is lost: the machine sees a failure.
    LostAfterApply,
    /// Lost on the way: not applied, a failure.
    LostBeforeApply,
    /// Refused by the coordinator: not applied.
    Refused,
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        tokens: u64,
        tenant: u64,
        whole: bool,
        seq: Option<u64>,
        policy_known: bool,
    },
    Deliver(Fate),
    /// Time passes; the timer fires when due unless the caller is late.
    Wait {
        ms: u64,
        timer_late: bool,
    },
    Return(u64),
    Tick,
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        4 => Just(Fate::Answered),
        1 => Just(Fate::LostAfterApply),
        1 => Just(Fate::LostBeforeApply),
        1 => Just(Fate::Refused),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..12, 0u64..3, any::<bool>(), proptest::option::of(0u64..12), prop::bool::weighted(0.9))
            .prop_map(|(tokens, tenant, whole, seq, policy_known)| Op::Acquire {
                tokens,
                tenant,
                whole,
                seq,
                policy_known,
            }),
        4 => fate().prop_map(Op::Deliver),
        2 => (0u64..400, prop::bool::weighted(0.3))
            .prop_map(|(ms, timer_late)| Op::Wait { ms, timer_late }),
        1 => (1u64..6).prop_map(Op::Return),
        1 => Just(Op::Tick),
    ]
}

/// The model coordinator, the network and everything observed.
struct Sim {
    machine: Machine,
    policy: Policy,
    /// Highest total the pool grants the region (fair keys).
    ceiling: u64,
    now: u64,
    timer: Option<u64>,
    evicted: bool,
    /// The call in flight (one at most).
    in_flight: Option<Action<&'static str>>,
    /// Counter keys: tokens granted per window; fair keys: the region's total.
    coordinator: BTreeMap<u64, u64>,
    reconciled: BTreeMap<u64, u64>,
    /// Credits answered from grants per window (first answer of a seq only).
    admitted: BTreeMap<u64, u64>,
    /// Fallback credits per wall-clock window.
    fallback: BTreeMap<u64, u64>,
    taken_back: BTreeMap<u64, u64>,
    asked: BTreeSet<u64>,
    answered: BTreeSet<u64>,
    /// The first answer given to each holder seq.
    by_seq: BTreeMap<u64, Acquired>,
    /// Request id → its holder seq.
    seq_of: BTreeMap<u64, u64>,
    /// Credits the holder holds, to return: (window, tokens).
    holding: Vec<(u64, u64)>,
    /// A release sent and not definitively answered.
    unsettled_release: Option<u64>,
    next_id: u64,
    next_return_seq: u64,
}

impl Sim {
    fn new(policy: Policy, ceiling: u64, throttle: bool) -> Self {
        let front = throttle.then(|| {
            let gate = EscrowFairGate::new(FairThrottleConfig::default(), Some(8), 0, 1, 2)
                .expect("valid");
            let mut draws = 0u64;
            ThrottleFront::new(
                gate,
                25,
                Box::new(move || {
                    draws = draws
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((draws >> 40) as u32, draws)
                }),
            )
        });
        Sim {
            machine: Machine::new(config(4), front, 0),
            policy,
            ceiling,
            now: 0,
            timer: None,
            evicted: false,
            in_flight: None,
            coordinator: BTreeMap::new(),
            reconciled: BTreeMap::new(),
            admitted: BTreeMap::new(),
            fallback: BTreeMap::new(),
            taken_back: BTreeMap::new(),
            asked: BTreeSet::new(),
            answered: BTreeSet::new(),
            by_seq: BTreeMap::new(),
            seq_of: BTreeMap::new(),
            holding: Vec::new(),
            unsettled_release: None,
            next_id: 0,
            next_return_seq: 1_000,
        }
    }

    /// A pool answer of the region's `total` in `window`, now, the call
    /// having added `increment` to it.
    fn pool_answer(&self, total: u64, increment: u64, window: WindowBounds) -> PoolAnswer {
        PoolAnswer {
            granted_total: total,
            granted_increment: increment,
            limit: self.policy.limit,
            window,
            remaining_lifetime_ms: window.end_ms - self.now,
            standing: None,
            expected: None,
            reserved_unheld: 0,
            retired_kept: 0,
            late_released_before: 0,
        }
    }

    /// A join of the next window carried by a call in `window`, applied
    /// (when `applied`) as the coordinator does: only for the window right
    /// after it, in its last quarter; the region's total there grows
    /// towards the ask, up to the ceiling.
    fn join_ahead(
        &mut self,
        join: Option<JoinAhead<u64>>,
        window: WindowBounds,
        applied: bool,
    ) -> Option<PoolAnswer> {
        let join = join?;
        let length = window.end_ms - window.start_ms;
        let next = WindowBounds {
            start_ms: window.end_ms,
            end_ms: window.end_ms + length,
        };
        if !applied
            || join.window_start_ms != next.start_ms
            || self.now < window.end_ms - length / 4
        {
            return None;
        }
        let total = self.coordinator.entry(next.start_ms).or_default();
        let before = *total;
        *total = (*total).max(join.want_total.min(self.ceiling));
        let total = *total;
        Some(self.pool_answer(total, total - before, next))
    }

    fn feed(&mut self, event: Event<&'static str>) -> Result<(), TestCaseError> {
        let actions = self.machine.handle(event, at(self.now));
        for action in actions {
            self.perform(action)?;
        }
        Ok(())
    }

    fn perform(&mut self, action: Action<&'static str>) -> Result<(), TestCaseError> {
        match action {
            Action::SendLease(_) | Action::SendPoolGrant { .. } | Action::SendPoolRelease(_) => {
                prop_assert!(self.in_flight.is_none(), "two calls in flight");
                match (&action, self.unsettled_release) {
                    (Action::SendPoolGrant { .. }, Some(release)) => {
                        prop_assert!(false, "a pool ask before release {} was resent", release)
                    }
                    (Action::SendPoolRelease(p), Some(release)) => prop_assert_eq!(
                        p.request_id,
                        release,
                        "another release before the pending one"
                    ),
                    (Action::SendPoolRelease(p), None) => {
                        self.unsettled_release = Some(p.request_id)
                    }
                    _ => {}
                }
                self.in_flight = Some(action);
            }
            Action::Reconcile(back) => {
                *self.reconciled.entry(back.window_start_ms).or_default() += back.leftover;
            }
            Action::RefreshPolicy => self.feed(Event::Policy(Some(self.policy.clone())))?,
            Action::Answer { id, answer } => {
                prop_assert!(self.asked.contains(&id), "answered unasked {}", id);
                prop_assert!(self.answered.insert(id), "request {} answered twice", id);
                if let Ok(answer) = answer {
                    self.observe(id, answer)?;
                }
            }
            Action::Settle { settled, .. } => {
                prop_assert!(settled.is_ok());
            }
            Action::CountShadowWouldDeny { .. } => {}
            Action::ArmTimer { at_ms } => self.timer = Some(at_ms),
            Action::Evict => {
                self.evicted = true;
                self.timer = None;
                self.feed(Event::Shutdown)?;
            }
        }
        Ok(())
    }

    fn observe(&mut self, id: u64, answer: Acquired) -> Result<(), TestCaseError> {
        if let Some(seq) = self.seq_of.get(&id) {
            if let Some(first) = self.by_seq.get(seq) {
                prop_assert_eq!(*first, answer, "a retry got another answer");
                return Ok(());
            }
            self.by_seq.insert(*seq, answer);
        }
        let Acquired::Credits {
            served,
            shadow_would_deny,
            ..
        } = answer
        else {
            return Ok(());
        };
        if shadow_would_deny {
            return Ok(());
        }
        if served.from_fallback {
            *self.fallback.entry(served.window_start_ms).or_default() += served.granted;
        } else {
            *self.admitted.entry(served.window_start_ms).or_default() += served.granted;
            if self.seq_of.contains_key(&id) {
                self.holding.push((served.window_start_ms, served.granted));
            }
        }
        Ok(())
    }

    /// Resolves the call in flight with `fate`.
    fn deliver(&mut self, fate: Fate) -> Result<(), TestCaseError> {
        let Some(call) = self.in_flight.take() else {
            return Ok(());
        };
        let applied = matches!(fate, Fate::Answered | Fate::LostAfterApply);
        let window = window_of(self.now);
        let event = match call {
            Action::SendLease(ticket) => {
                let mut grant = CoordinatorGrant {
                    granted: 0,
                    window_start_ms: window.start_ms,
                    window_end_ms: window.end_ms,
                    remaining_lifetime_ms: window.end_ms - self.now,
                };
                if applied {
                    let used = self.coordinator.entry(window.start_ms).or_default();
                    grant.granted = ticket.tokens.min(self.policy.limit - *used);
                    *used += grant.granted;
                }
                match fate {
                    Fate::Answered => Event::LeaseGranted {
                        ticket: ticket.id,
                        grant,
                    },
                    Fate::Refused => Event::LeaseRefused {
                        ticket: ticket.id,
                        refusal: "refused",
                    },
                    _ => Event::LeaseFailed { ticket: ticket.id },
                }
            }
            Action::SendPoolGrant {
                call,
                want_total,
                join_next,
                ..
            } => {
                let total = self.coordinator.entry(window.start_ms).or_default();
                let before = *total;
                if applied {
                    *total = (*total).max(want_total.min(self.ceiling));
                }
                let total = *total;
                let next_window = self.join_ahead(join_next, window, applied);
                match fate {
                    Fate::Answered => Event::PoolGranted {
                        call,
                        answer: self.pool_answer(total, total - before, window),
                        tenant_demands: Vec::new(),
                        next_window,
                        next_window_demands: Vec::new(),
                    },
                    Fate::Refused => Event::PoolRefused {
                        call,
                        refusal: "refused",
                    },
                    _ => Event::PoolFailed { call },
                }
            }
            Action::SendPoolRelease(pending) => {
                let release = pending.request_id;
                let next_window = self.join_ahead(pending.join_next.clone(), window, applied);
                let mut answer = ReleaseAnswer::WindowEnded;
                if applied && pending.window == window {
                    let total = self.coordinator.entry(window.start_ms).or_default();
                    answer = if *total == pending.from_total {
                        *total = pending.keep_total;
                        ReleaseAnswer::Released {
                            released: pending.from_total - pending.keep_total,
                            granted_total: *total,
                        }
                    } else {
                        ReleaseAnswer::StaleTotal {
                            granted_total: *total,
                        }
                    };
                }
                match fate {
                    Fate::Answered => {
                        self.unsettled_release = None;
                        Event::ReleaseAnswered {
                            release,
                            answer,
                            next_window,
                            next_window_demands: Vec::new(),
                        }
                    }
                    Fate::Refused => {
                        self.unsettled_release = None;
                        Event::ReleaseRefused { release }
                    }
                    _ => Event::ReleaseFailed { release },
                }
            }
            other => return Err(TestCaseError::fail(format!("not a call: {other:?}"))),
        };
        self.feed(event)
    }

    fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
        match op {
            Op::Acquire {
                tokens,
                tenant: t,
                whole,
                seq,
                policy_known,
            } if !self.evicted => {
                self.next_id += 1;
                let id = self.next_id;
                self.asked.insert(id);
                let mut asking = request(id, tokens, &self.policy);
                asking.tenant = Some(tenant(t));
                asking.serving = if whole { Serving::Whole } else { Serving::Part };
                asking.caller = Some(format!("caller{t}").into_bytes());
                if !policy_known {
                    asking.policy = None;
                }
                if let Some(seq) = seq {
                    self.seq_of.insert(id, seq);
                    asking.from = Some(HolderRequest {
                        holder: holder(),
                        seq,
                    });
                }
                self.feed(Event::Acquire(asking))
            }
            Op::Acquire { .. } => Ok(()),
            Op::Deliver(fate) => self.deliver(fate),
            Op::Wait { ms, timer_late } => {
                self.now += ms;
                match self.timer {
                    Some(due) if self.now >= due && self.in_flight.is_none() && !timer_late => {
                        self.timer = None;
                        self.feed(Event::Tick)
                    }
                    _ => Ok(()),
                }
            }
            Op::Return(tokens) => {
                let Some((window_start_ms, held)) = self.holding.pop() else {
                    return Ok(());
                };
                let offered = tokens.min(held);
                self.next_return_seq += 1;
                let from = HolderRequest {
                    holder: holder(),
                    seq: self.next_return_seq,
                };
                let claim = ReturnClaim {
                    tenant: None,
                    window_start_ms,
                    tokens: offered,
                };
                let settled = self
                    .machine
                    .handle(Event::Return { id: 0, from, claim }, at(self.now));
                for action in settled {
                    if let Action::Settle {
                        settled: Ok(settled),
                        ..
                    } = &action
                    {
                        *self.taken_back.entry(window_start_ms).or_default() += settled.accepted;
                    }
                    self.perform(action)?;
                }
                Ok(())
            }
            Op::Tick => self.feed(Event::Tick),
        }
    }

    /// Answers every call until nothing is in flight.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..10_000 {
            if self.in_flight.is_none() {
                return Ok(());
            }
            self.deliver(Fate::Answered)?;
        }
        Err(TestCaseError::fail("calls never stopped"))
    }

    fn check(&self, fallback_share: u64) -> Result<(), TestCaseError> {
        prop_assert_eq!(&self.asked, &self.answered, "every request answered");
        for (window, admitted) in &self.admitted {
            let granted = self.coordinator.get(window).copied().unwrap_or(0);
            let returned = self.reconciled.get(window).copied().unwrap_or(0);
            let taken_back = self.taken_back.get(window).copied().unwrap_or(0);
            prop_assert!(
                admitted - taken_back.min(*admitted) + returned <= granted,
                "window {}: admitted {} (− {} taken back) + {} handed back > {} granted",
                window,
                admitted,
                taken_back,
                returned,
                granted
            );
        }
        for (window, served) in &self.fallback {
            prop_assert!(
                *served <= fallback_share,
                "fallback window {}: {}",
                window,
                served
            );
        }
        Ok(())
    }
}

fn outage(fallback_share: Option<u64>) -> OutagePolicy {
    match fallback_share {
        Some(tokens_per_region) => OutagePolicy::Fallback { tokens_per_region },
        None => OutagePolicy::FailClosed,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Counter keys under lost, late and refused answers: every request is
    /// answered exactly once (a retried seq with the same answer), at most
    /// one call is in flight, Σ admitted − Σ taken back + Σ handed back ≤
    /// Σ granted per window, and the fallback stays within its share.
    #[test]
    fn a_counter_key_never_admits_past_its_grants(
        ops in proptest::collection::vec(op(), 1..150),
        limit in 1u64..60,
        fallback_share in proptest::option::of(0u64..10),
        shadow in prop::bool::weighted(0.2),
        throttle in any::<bool>(),
    ) {
        let policy = policy(PolicyKind::Counter, limit, outage(fallback_share), shadow);
        let mut sim = Sim::new(policy, limit, throttle);
        for op in ops {
            sim.step(op)?;
        }
        sim.drain()?;
        sim.check(fallback_share.unwrap_or(0))?;
    }

    /// Fair keys under lost, late and refused answers (releases included):
    /// the same, against the region's total at the pool, and a pending
    /// release is resent (same id) before any other pool call.
    #[test]
    fn a_fair_key_never_admits_past_its_pool_total(
        ops in proptest::collection::vec(op(), 1..150),
        limit in 1u64..60,
        ceiling_pct in 10u64..=100,
        fallback_share in proptest::option::of(0u64..10),
        shadow in prop::bool::weighted(0.2),
        throttle in any::<bool>(),
    ) {
        let policy = policy(PolicyKind::Fair, limit, outage(fallback_share), shadow);
        let mut sim = Sim::new(policy, (limit * ceiling_pct / 100).max(1), throttle);
        for op in ops {
            sim.step(op)?;
        }
        sim.drain()?;
        sim.check(fallback_share.unwrap_or(0))?;
    }
}
