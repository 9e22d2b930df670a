//! The fair key's demand split: what it reports, what it learns from the
//! settled totals and the weight a tenant then has in the region. The
//! fleet of fair keys against the coordinator's region fair pool, through
//! the key machine, is `core/tests/fleet_fair_pool.rs`.

use proptest::prelude::*;

use super::*;

const WINDOW_MS: u64 = 1_000;
const LEASE_SIZE: u64 = 4;
const RE_ASK_MS: u64 = 50;

fn tenant(i: usize) -> TenantId {
    TenantId::new(format!("t{i}")).expect("valid tenant")
}

/// A tenant's demand of one window is reported when the next is joined,
/// and the settled totals (two windows back) the pool answers split its
/// weight by its share of its demand.
#[test]
fn a_spanning_tenant_weighs_its_share_of_its_demand() {
    let mut key: FairKey<u64> = FairKey::new(8);
    let answer = |start: u64, now: u64| PoolAnswer {
        granted_total: 100,
        granted_increment: 0,
        limit: 1_000,
        window: WindowBounds {
            start_ms: start,
            end_ms: start + WINDOW_MS,
        },
        remaining_lifetime_ms: start + WINDOW_MS - now,
        standing: None,
        expected: None,
        reserved_unheld: 0,
        retired_kept: 0,
        late_released_before: 0,
    };
    key.on_sole_answer(answer(0, 10), 10, 10, 10, RE_ASK_MS);
    key.note_demand(&tenant(1), 30);
    key.note_demand(&tenant(2), 10);
    key.note_demand(&tenant(1), 10);
    // Nothing to report while the first window runs; full weights.
    assert_eq!(key.demand_report(500), None);
    assert_eq!(key.split_weight(&tenant(1), 2), 2 * WEIGHT_SCALE);
    // Its grant expired: a join reports the window that just ended.
    let ended = Some((0, vec![(tenant(1), 40), (tenant(2), 10)]));
    assert_eq!(key.demand_report(WINDOW_MS + 5), ended);
    key.on_sole_answer(
        answer(WINDOW_MS, WINDOW_MS + 5),
        10,
        WINDOW_MS + 5,
        WINDOW_MS + 5,
        RE_ASK_MS,
    );
    // Within the next window, asks report the same (previous) window.
    assert_eq!(key.demand_report(WINDOW_MS + 6), ended);
    key.note_demand(&tenant(1), 5);
    let later = 2 * WINDOW_MS + 5;
    key.on_sole_answer(answer(2 * WINDOW_MS, later), 10, later, later, RE_ASK_MS);
    // t1 asked here for 40 of its 80: half its weight; t2 only here: all of it.
    key.on_tenant_demands(0, vec![(tenant(1), 80), (tenant(2), 10)]);
    assert_eq!(key.split_weight(&tenant(1), 2), WEIGHT_SCALE);
    assert_eq!(key.split_weight(&tenant(2), 3), 3 * WEIGHT_SCALE);
    assert_eq!(key.split_weight(&tenant(3), 1), WEIGHT_SCALE);
    // The region weight asked for carries the split weight.
    match key.decide(&tenant(1), 2, 200, LEASE_SIZE, true, later + 1) {
        FairStep::Ask { region_weight, .. } => assert_eq!(region_weight, WEIGHT_SCALE),
        other => panic!("expected an ask, got {other:?}"),
    }
    // Totals of a window other than the settled one (0) do not split.
    key.on_tenant_demands(WINDOW_MS, vec![(tenant(1), 400)]);
    assert_eq!(key.split_weight(&tenant(1), 2), WEIGHT_SCALE);
    let mut other: FairKey<u64> = FairKey::new(8);
    other.on_sole_answer(answer(0, 10), 10, 10, 10, RE_ASK_MS);
    other.note_demand(&tenant(1), 40);
    other.on_sole_answer(answer(WINDOW_MS, WINDOW_MS + 5), 10, 5, 5, RE_ASK_MS);
    other.on_sole_answer(answer(2 * WINDOW_MS, later), 10, later, later, RE_ASK_MS);
    other.on_tenant_demands(WINDOW_MS, vec![(tenant(1), 80)]);
    assert_eq!(other.split_weight(&tenant(1), 2), 2 * WEIGHT_SCALE);
}

/// An answer naming more tenants than any report can (a buggy or hostile
/// coordinator) is kept to [`MAX_REPORTED_TENANTS`]: memory stays bounded.
#[test]
fn demand_totals_from_an_answer_are_bounded() {
    let mut key: FairKey<u64> = FairKey::new(8);
    let flood = |n: usize| (0..n).map(|i| (tenant(i), 1)).collect::<Vec<_>>();
    key.on_tenant_demands(0, flood(10_000));
    key.on_tenant_demands(0, flood(20_000).split_off(10_000));
    let held: usize = key.totals.values().map(BTreeMap::len).sum();
    assert_eq!(held, MAX_REPORTED_TENANTS);
    // Windows too: the latest few are kept, an older one is not taken.
    for w in 1..=10 {
        key.on_tenant_demands(w * WINDOW_MS, flood(2));
    }
    key.on_tenant_demands(0, flood(2));
    assert_eq!(
        key.totals.keys().copied().collect::<Vec<_>>(),
        (8..=10).map(|w| w * WINDOW_MS).collect::<Vec<_>>()
    );
}

proptest! {
    /// The split weights of one tenant over the regions that reported it
    /// add up to its declared weight (in thousandths, within rounding).
    #[test]
    fn split_weights_add_up_to_the_declared_weight(
        weight in 1u64..1_000,
        demands in proptest::collection::vec(1u64..10_000, 1..6),
    ) {
        let total: u64 = demands.iter().sum();
        let mut sum = 0;
        for own in &demands {
            let mut key: FairKey<u64> = FairKey::new(8);
            let answer = |start: u64| PoolAnswer {
                granted_total: 1,
                granted_increment: 0,
                limit: 1,
                window: WindowBounds { start_ms: start, end_ms: start + WINDOW_MS },
                remaining_lifetime_ms: WINDOW_MS,
                standing: None,
                expected: None,
                reserved_unheld: 0,
                retired_kept: 0,
                late_released_before: 0,
            };
            key.on_sole_answer(answer(0), 1, 0, 0, RE_ASK_MS);
            key.note_demand(&tenant(0), *own);
            key.on_sole_answer(answer(WINDOW_MS), 1, WINDOW_MS, WINDOW_MS, RE_ASK_MS);
            key.on_sole_answer(answer(2 * WINDOW_MS), 1, 2 * WINDOW_MS, 2 * WINDOW_MS, RE_ASK_MS);
            key.on_tenant_demands(0, vec![(tenant(0), total)]);
            sum += key.split_weight(&tenant(0), weight);
        }
        let declared = weight * WEIGHT_SCALE;
        prop_assert!(sum <= declared + demands.len() as u64 && sum + demands.len() as u64 >= declared,
            "shares {} vs declared {}", sum, declared);
    }
}

fn window(start: u64) -> WindowBounds {
    WindowBounds {
        start_ms: start,
        end_ms: start + WINDOW_MS,
    }
}

fn standing(guarantee: u64, ceiling: u64) -> Option<PoolStanding> {
    Some(PoolStanding { guarantee, ceiling })
}

/// A grant of `granted` for the window starting at `start`, answered at
/// `now` (sent then too) with the given standings.
fn grant(
    granted: u64,
    start: u64,
    now: u64,
    plain: Option<PoolStanding>,
    expected: Option<PoolStanding>,
) -> PoolAnswer {
    PoolAnswer {
        granted_total: granted,
        granted_increment: 0,
        limit: 1_000,
        window: window(start),
        remaining_lifetime_ms: start + WINDOW_MS - now,
        standing: plain,
        expected,
        reserved_unheld: 0,
        retired_kept: 0,
        late_released_before: 0,
    }
}

/// A key that admitted `used` (one tenant, weight 1) under a grant of
/// `granted` in window 0 whose answer carried `expected`; returns its join
/// of window 1.
fn join_after(used: u64, granted: u64, expected: Option<PoolStanding>) -> FairStep {
    let mut key: FairKey<u64> = FairKey::new(8);
    match key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1) {
        FairStep::Join { .. } => {}
        other => panic!("a new key joins, got {other:?}"),
    }
    key.on_sole_answer(
        grant(granted, 0, 1, standing(300, 300), expected),
        1,
        1,
        1,
        RE_ASK_MS,
    );
    for _ in 0..used {
        assert!(matches!(
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 2),
            FairStep::Admit { .. }
        ));
    }
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, WINDOW_MS + 1)
}

/// Spends what `key` holds at `now` (one tenant, weight 1) and returns how
/// long the denial that follows says to wait.
fn spend_then_wait(key: &mut FairKey<u64>, now: u64) -> u64 {
    while matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, now),
        FairStep::Admit { .. }
    ) {}
    match key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, now) {
        FairStep::Deny { retry_after_ms, .. } => retry_after_ms,
        other => panic!("denied once spent, got {other:?}"),
    }
}

/// With the leader's expected guarantee the key joins the next window for
/// all it expects to need in one call (and a hundredth of L beyond, which
/// the leader's cap trims to the expected ceiling); without it, for half.
#[test]
fn a_key_joins_for_its_whole_share_only_after_an_expected_guarantee() {
    // Admitted 300 of 300; needs min(300 + 75, 300) = 300 next window,
    // asks 300 + 1 000 / 100.
    match join_after(300, 300, standing(300, 300)) {
        FairStep::Join { want_total, .. } => assert_eq!(want_total, 310),
        other => panic!("expected a join, got {other:?}"),
    }
    match join_after(300, 300, None) {
        FairStep::Join { want_total, .. } => assert_eq!(want_total, 150),
        other => panic!("expected a join, got {other:?}"),
    }
    // Admitted 100: needs min(100 + 25, 300) = 125, asks 135.
    match join_after(100, 300, standing(300, 300)) {
        FairStep::Join { want_total, .. } => assert_eq!(want_total, 135),
        other => panic!("expected a join, got {other:?}"),
    }
}

/// The warm start scales the guarantee by the region's weight now over
/// the weight it was heard with.
#[test]
fn the_warm_start_follows_the_region_weight() {
    let mut key: FairKey<u64> = FairKey::new(8);
    // Weight 2 (a tenant of weight 2) when the guarantee was heard.
    assert!(matches!(
        key.decide(&tenant(0), 2, 1, LEASE_SIZE, true, 1),
        FairStep::Join {
            region_weight: 2_000,
            ..
        }
    ));
    key.on_sole_answer(
        grant(400, 0, 1, standing(400, 400), standing(400, 400)),
        1,
        1,
        1,
        RE_ASK_MS,
    );
    while matches!(
        key.decide(&tenant(0), 2, 1, LEASE_SIZE, true, 2),
        FairStep::Admit { .. }
    ) {}
    // The next window's join weighs 1: half the weight, half the share
    // (200, asked with a hundredth of L beyond).
    match key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, WINDOW_MS + 1) {
        FairStep::Join {
            region_weight,
            want_total,
        } => assert_eq!((region_weight, want_total), (1_000, 210)),
        other => panic!("expected a join, got {other:?}"),
    }
}

/// Credits are served in part when the tenant may take fewer than asked;
/// a whole-or-nothing request is denied instead.
#[test]
fn credits_are_served_in_part_but_checks_whole_or_nothing() {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
    // The pool grants 10 and says that is the ceiling.
    key.on_sole_answer(grant(10, 0, 1, standing(10, 10), None), 1, 1, 1, RE_ASK_MS);
    for _ in 0..2 {
        assert!(matches!(
            key.decide(&tenant(0), 1, 4, LEASE_SIZE, true, 2),
            FairStep::Admit {
                served: Served { granted: 4, .. },
                ..
            }
        ));
    }
    assert!(matches!(
        key.decide(&tenant(0), 1, 4, LEASE_SIZE, true, 3),
        FairStep::Deny { .. }
    ));
    match key.decide(&tenant(0), 1, 4, LEASE_SIZE, false, 3) {
        FairStep::Admit { served, .. } => assert_eq!(served.granted, 2),
        other => panic!("expected a part serve, got {other:?}"),
    }
    assert!(matches!(
        key.decide(&tenant(0), 1, 4, LEASE_SIZE, false, 4),
        FairStep::Deny { .. }
    ));
}

/// Right after its grant's deadline the key waits a round trip for the
/// leader's window to roll before it joins the next.
#[test]
fn a_key_joins_the_next_window_only_once_the_leader_has_rolled() {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 100);
    // Sent at 100, answered at 106 (a 6 ms round trip), 900 ms left: the
    // deadline is 1 000 here.
    let answer = PoolAnswer {
        remaining_lifetime_ms: 900,
        ..grant(50, 0, 100, standing(50, 1_000), None)
    };
    key.on_sole_answer(answer, 1, 100, 106, RE_ASK_MS);
    match key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1_002) {
        FairStep::Deny { retry_after_ms, .. } => assert_eq!(retry_after_ms, 4),
        other => panic!("expected a wait for the roll, got {other:?}"),
    }
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1_006),
        FairStep::Join { .. }
    ));
}

/// A key that spent its whole grant at its share has nothing to release;
/// one holding unspent tokens or a larger guarantee does. A few tokens
/// are not worth a call of their own: they go back only at the late check,
/// with the join of the next window that call carries (an idle key's
/// release carries none, so it sends nothing).
#[test]
fn only_a_key_holding_something_back_releases() {
    let held = |granted: u64, guarantee: u64, used: u64| {
        let mut key: FairKey<u64> = FairKey::new(8);
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
        key.on_sole_answer(
            grant(granted, 0, 1, standing(guarantee, granted), None),
            1,
            1,
            1,
            RE_ASK_MS,
        );
        for _ in 0..used {
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 2);
        }
        (
            key.release_at(2, 100, 0, 10, 3).is_some(),
            key.begin_release(7, true, 3).is_some(),
        )
    };
    // L = 1 000: worth a call from 10 tokens on.
    assert_eq!(held(100, 100, 100), (false, false), "spent at its share");
    // 5 unspent: the late check is due (an eighth before the end, plus a
    // hundredth), and from then a release hands them back with its join.
    let mut few: FairKey<u64> = FairKey::new(8);
    few.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
    few.on_sole_answer(
        grant(100, 0, 1, standing(100, 100), None),
        1,
        1,
        1,
        RE_ASK_MS,
    );
    for _ in 0..95 {
        few.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 2);
    }
    assert_eq!(few.release_at(2, 100, 0, 10, 3), Some(1_000 - 125 + 10));
    let late = few.begin_release(7, false, 990).cloned();
    assert_eq!(late.map(|r| (r.from_total, r.keep_total)), Some((100, 95)));
    assert_eq!(held(100, 100, 60), (true, true), "40 unspent");
    // Not at once: at the late check.
    assert_eq!(held(100, 100, 95), (true, false), "5 unspent");
    assert_eq!(
        held(100, 300, 100),
        (true, true),
        "a guarantee above its total"
    );
    assert_eq!(held(100, 104, 100), (false, false), "above it by rounding");
}

/// A ceiling within the pool's rounding (L / 200) is the ceiling, and a
/// look raising the total by no more than that counts as fruitless; when
/// only regions the leader still expects hold the key back, it looks
/// again once they are no longer expected.
#[test]
fn rounding_is_not_worth_a_call_and_expected_regions_lapse() {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
    // L = 1 000: slack 5. Ceiling 104 for a grant of 100: at the ceiling.
    key.on_sole_answer(
        grant(100, 0, 1, standing(100, 104), standing(100, 104)),
        1,
        1,
        1,
        RE_ASK_MS,
    );
    while matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 2),
        FairStep::Admit { .. }
    ) {}
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 3),
        FairStep::Deny { retry_after_ms, .. } if retry_after_ms == RE_ASK_MS - 2
    ));
    // The look after the wait raises by 3 (rounding): fruitless, so the
    // next wait doubles.
    let at = 1 + RE_ASK_MS;
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, at),
        FairStep::Ask { .. }
    ));
    key.on_sole_answer(
        grant(103, 0, at, standing(100, 103), None),
        200,
        at,
        at,
        RE_ASK_MS,
    );
    while matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, at),
        FairStep::Admit { .. }
    ) {}
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, at),
        FairStep::Deny { retry_after_ms, .. } if retry_after_ms == 2 * RE_ASK_MS
    ));

    // Held back by an expected region only (expected ceiling 100, plain
    // 600), with a long wait: the key looks again when the first quarter
    // (plus a hundredth) is over and the quiet regions' surplus checks
    // have run (a fiftieth later): at 250 + 10 + 20 here.
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
    key.on_sole_answer(
        grant(100, 0, 1, standing(600, 600), standing(100, 100)),
        1,
        1,
        1,
        10_000,
    );
    assert_eq!(spend_then_wait(&mut key, 2), 278);
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 280),
        FairStep::Ask { .. }
    ));
}

/// A quarter window in, a region that asks less than its share hands back
/// the guarantee it will not need, keeping what its pace so far needs; a
/// region spending its whole grant keeps its weight.
#[test]
fn a_quiet_region_hands_back_the_guarantee_its_pace_does_not_need() {
    let checked = |used: u64| {
        let mut key: FairKey<u64> = FairKey::new(8);
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 0);
        // A grant of 100 with a guarantee of 500, L = 1 000.
        key.on_sole_answer(
            grant(100, 0, 0, standing(500, 500), None),
            1,
            0,
            0,
            RE_ASK_MS,
        );
        for _ in 0..used {
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 100);
        }
        // The check falls due when the first quarter (plus a hundredth) is over.
        assert_eq!(key.release_at(100, 1_000, 0, 10, 200), Some(260));
        key.begin_release(9, false, 260)
            .map(|p| (p.from_total, p.keep_total))
    };
    // 10 used in 260 ms: 10 + 10·740/260·9/8 + 2 = 44 kept of 100.
    assert_eq!(checked(10), Some((100, 44)));
    // All 100 spent: its pace needs far more than its guarantee; it keeps it.
    assert_eq!(checked(100), None);
}

/// A region whose pace needs more than it holds while its guarantee lies
/// well above that need raises its total to the need and then retires at
/// it (once a window); an eighth of the window before its end it hands
/// back what is left of its margin.
#[test]
fn a_region_short_of_its_pace_raises_to_it_retires_and_hands_back_its_margin_late() {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 0);
    // A grant of 100 with a guarantee of 500, L = 1 000.
    key.on_sole_answer(
        grant(100, 0, 0, standing(500, 500), None),
        1,
        0,
        0,
        RE_ASK_MS,
    );
    for _ in 0..40 {
        assert!(matches!(
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 100),
            FairStep::Admit { .. }
        ));
    }
    assert_eq!(key.release_at(100, 1_000, 0, 10, 200), Some(260));
    // 40 used in 260 ms: needs 40 + 40·740/260·9/8 + 2 = 170 > 100 held.
    assert!(key.begin_release(9, false, 260).is_none());
    let (weight, want_total) = key.take_retiring_raise(260).expect("a raise to the need");
    assert_eq!((weight, want_total), (WEIGHT_SCALE, 170));
    assert_eq!(key.take_retiring_raise(260), None, "taken once");
    key.on_sole_answer(
        grant(170, 0, 260, standing(500, 500), None),
        want_total,
        260,
        260,
        RE_ASK_MS,
    );
    // Checked again at once: retires keeping its need (169 a ms later).
    let pending = key.begin_release(10, false, 261).expect("retires");
    assert_eq!((pending.from_total, pending.keep_total), (170, 169));
    key.on_release_answer(ReleaseAnswer::Released {
        released: 1,
        granted_total: 169,
    });
    assert_eq!(key.take_retiring_raise(300), None, "once a window");
    // Retired, it spends what it kept; the late check falls due an eighth
    // of the window before its end (plus a hundredth): 1 000 − 125 + 10.
    for _ in 40..120 {
        assert!(matches!(
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 800),
            FairStep::Admit { .. }
        ));
    }
    assert_eq!(key.release_at(800, 1_000, 0, 10, 800), Some(885));
    // 120 used in 885 ms: the rest at that pace is 120·115/885 = 15, and
    // late in the window it keeps no margin: needs 135 of 169.
    let pending = key
        .begin_release(11, false, 885)
        .expect("hands back its margin");
    assert_eq!((pending.from_total, pending.keep_total), (169, 135));
    key.on_release_answer(ReleaseAnswer::Released {
        released: 34,
        granted_total: 135,
    });
    assert_eq!(
        key.release_at(800, 1_000, 0, 10, 886),
        None,
        "nothing more to check"
    );
}

/// A region denied at the pool's ceiling in a window wants more than its
/// pace shows (its pace is what it was let have): its late check hands
/// nothing back, even when a late look just raised its total.
#[test]
fn a_region_held_back_by_the_ceiling_hands_nothing_back_late() {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 0);
    // At its ceiling from the start: a grant of 100, all it could hold;
    // it looks again 850 ms later.
    key.on_sole_answer(grant(100, 0, 0, standing(100, 100), None), 150, 0, 0, 850);
    for _ in 0..100 {
        assert!(matches!(
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 100),
            FairStep::Admit { .. }
        ));
    }
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 100),
        FairStep::Deny { .. }
    ));
    // A look just before the late check finds 100 more (another region
    // handed back); it admits 10 of them by then.
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 880),
        FairStep::Ask { .. }
    ));
    key.on_sole_answer(
        grant(200, 0, 880, standing(100, 200), None),
        200,
        880,
        880,
        RE_ASK_MS,
    );
    for _ in 0..10 {
        assert!(matches!(
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 881),
            FairStep::Admit { .. }
        ));
    }
    // Its pace (110 in 885 ms) would need 127 of 200: it keeps them all.
    assert!(key.release_at(881, 1_000, 0, 10, 881).is_some());
    assert!(key.begin_release(12, false, 885).is_none());
    assert_eq!(key.pending_release(), None);
}

/// No surplus check runs before the window's first quarter is over: a
/// pace from a few ms of a window says nothing (a raise answered late, in
/// the next window, must not retire the region there at once).
#[test]
fn no_surplus_check_before_the_first_quarter_is_over() {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 0);
    key.on_sole_answer(
        grant(100, 0, 0, standing(500, 500), None),
        1,
        0,
        0,
        RE_ASK_MS,
    );
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 5);
    // 1 admitted in 10 ms would "need" 1 + 1·990/10·9/8 + 2 = 114, more
    // than it holds, with a guarantee far above: a raise, then a retire.
    assert!(key.begin_release(1, false, 10).is_none());
    assert_eq!(key.take_retiring_raise(10), None);
    // An idle key still hands back what it did not admit.
    let pending = key.begin_release(2, true, 10).expect("idle release");
    assert_eq!((pending.from_total, pending.keep_total), (100, 1));
}

/// A key held at its ceiling from 1 ms on with a backoff of 10 s, at its
/// look just after window 0's late check (1 000 − 125 + 10 + 20 = 905),
/// which it makes though the backoff says later.
fn looking_after_the_late_check() -> FairKey<u64> {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
    let joined = grant(100, 0, 1, standing(100, 100), standing(100, 100));
    key.on_sole_answer(joined, 100, 1, 1, 10_000);
    assert_eq!(spend_then_wait(&mut key, 2), 903);
    assert!(matches!(
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 905),
        FairStep::Ask { .. }
    ));
    key
}

/// A region held at its ceiling that has not joined the next window ahead
/// looks just after the late check however long its backoff and whatever
/// it heard: the look carries its join ahead, a call it would make at the
/// next window's start anyway, and finds what regions handed back at
/// their late checks.
#[test]
fn a_region_at_its_ceiling_looks_after_the_late_check_with_its_join_ahead() {
    let mut key = looking_after_the_late_check();
    let join = key
        .join_ahead(7, LEASE_SIZE, 905)
        .expect("the look joins ahead");
    assert_eq!(join.window_start_ms, WINDOW_MS);
}

/// Once joined ahead, a region held at its ceiling looks again after the
/// late check only when that is likely to pay: its late look raised its
/// total in the window before (regions hand back their margins late
/// window after window), or the leader says regions handed back a
/// hundredth of L or more late in one of the two windows before
/// (`late_released_before`); otherwise it waits as long as its backoff
/// says.
#[test]
fn a_region_joined_ahead_looks_after_the_late_check_only_when_it_paid() {
    // (late raise in the window before, late hand-backs heard, looks).
    for (late_raise, late_released, looks_late) in
        [(50, 0, true), (0, 10, true), (0, 9, false), (0, 0, false)]
    {
        let mut key = looking_after_the_late_check();
        key.on_sole_answer(
            grant(
                100 + late_raise,
                0,
                905,
                standing(100, 100 + late_raise),
                None,
            ),
            200,
            905,
            905,
            10_000,
        );
        // The next window: joined at the ceiling at its start.
        let at = WINDOW_MS + 1;
        assert!(matches!(
            key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, at),
            FairStep::Join { .. }
        ));
        key.on_sole_answer(
            grant(100, WINDOW_MS, at, standing(100, 100), standing(100, 100)),
            200,
            at,
            at,
            10_000,
        );
        spend_then_wait(&mut key, at);
        // Joined ahead at the late check (885 + 5), with an ask at the
        // ceiling answered then.
        let now = WINDOW_MS + 890;
        key.join_ahead(7, LEASE_SIZE, now).expect("joins ahead");
        let mut answer = grant(100, WINDOW_MS, now, standing(100, 100), standing(100, 100));
        answer.late_released_before = late_released;
        key.on_sole_answer(answer, 200, now, now, 10_000);
        let wait = spend_then_wait(&mut key, now);
        if looks_late {
            assert_eq!(wait, 15, "{late_raise} raised, {late_released} handed back");
        } else {
            assert!(
                wait > 15,
                "{late_raise} raised, {late_released} handed back: {wait}"
            );
        }
    }
}

/// Once the window's first quarter is over, an ask is capped at what the
/// region has admitted plus what it admits before the window ends at its
/// pace so far, with the surplus check's margin: a batch beyond it would
/// sit unspent at the window's end while regions at their ceiling go
/// without. Before, the pace says nothing and the batch stands.
#[test]
fn an_ask_after_the_first_quarter_is_capped_at_the_need_at_its_pace() {
    // 100 admitted by 900 ms: 100 + 100·100/900·9/8 + 6 = 118, under the
    // batch of 100 + 50; by 400 ms: 100 + 168 + 6 = 274, above it; by
    // 200 ms (the first quarter): the batch.
    for (at, want_total) in [(900, 118), (400, 150), (200, 150)] {
        let mut key: FairKey<u64> = FairKey::new(8);
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
        let answer = grant(100, 0, 1, standing(1_000, 1_000), None);
        key.on_sole_answer(answer, 100, 1, 1, RE_ASK_MS);
        for _ in 0..100 {
            assert!(matches!(
                key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, at),
                FairStep::Admit { .. }
            ));
        }
        match key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, at) {
            FairStep::Ask { want_total: w, .. } => assert_eq!(w, want_total, "at {at}"),
            other => panic!("expected an ask, got {other:?}"),
        }
    }
}

/// A key (one tenant, weight 1) granted `granted` of window 0 at 1 ms, with a guarantee of
/// `guarantee`, that then tried `admissions` requests of 1.
fn busy_key(granted: u64, guarantee: u64, admissions: u64) -> FairKey<u64> {
    let mut key: FairKey<u64> = FairKey::new(8);
    key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1);
    let answer = grant(granted, 0, 1, standing(guarantee, guarantee), None);
    key.on_sole_answer(answer, 1, 1, 1, RE_ASK_MS);
    for _ in 0..admissions {
        key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 2);
    }
    key
}

/// A key that admitted something joins the next window ahead once a
/// window, from the late check on; never before the late check, twice, or
/// without admissions. A key whose pace needs well under its share joins
/// retired at what the first surplus check would keep (its projected
/// admissions, an eighth and a sixteenth more); one held at its ceiling
/// joins for its projection and a quarter, up to its share, plus a
/// hundredth of L, keeping its weight.
#[test]
fn a_busy_key_joins_the_next_window_ahead_from_the_late_check_once() {
    let mut idle = busy_key(100, 300, 0);
    assert_eq!(
        idle.join_ahead(7, LEASE_SIZE, 900),
        None,
        "nothing admitted"
    );

    let mut key = busy_key(200, 300, 100);
    // The late check: an eighth before the end plus a hundredth.
    assert_eq!(
        key.join_ahead(7, LEASE_SIZE, 880),
        None,
        "before the late check"
    );
    let join = key.join_ahead(7, LEASE_SIZE, 900).expect("joins ahead");
    // 100 admitted in 900 ms: 111 projected, + 13 + 6, well under 300.
    assert_eq!(
        (
            join.request_id,
            join.window_start_ms,
            join.want_total,
            join.retire
        ),
        (7, WINDOW_MS, 111 + 13 + 6, true)
    );
    assert_eq!(join.region_weight, WEIGHT_SCALE);
    assert_eq!(key.join_ahead(8, LEASE_SIZE, 950), None, "once a window");

    // Held at a ceiling of 120 (its share 120): it keeps its weight.
    let mut held = busy_key(120, 120, 121);
    let join = held.join_ahead(9, LEASE_SIZE, 900).expect("joins ahead");
    // 120 admitted in 900 ms: 133 projected, + 33, up to its share 120.
    assert_eq!((join.want_total, join.retire), (120 + 10, false));
}

/// The grant of a join ahead is the key's from the next window on, with no
/// join call: before the next window has surely started at the coordinator
/// (the answer's arrival plus what was left of the live window when the
/// join was applied), requests are denied until it has; then they are
/// admitted from it, and a key joined retired has no surplus check a
/// quarter in, only the late one.
#[test]
fn a_grant_joined_ahead_is_used_from_the_next_window_without_a_join() {
    let mut key = busy_key(200, 300, 100);
    let join = key.join_ahead(7, LEASE_SIZE, 900).expect("joins ahead");
    assert!(join.retire, "its pace needs well under its share");
    // Sent at 900, applied when 95 ms were left of window 0, answered at 910.
    let ahead = PoolAnswer {
        remaining_lifetime_ms: 95 + WINDOW_MS,
        ..grant(150, WINDOW_MS, 905, standing(0, 150), None)
    };
    key.on_sole_ahead_answer(ahead, Vec::new(), join.want_total, 900, 910, RE_ASK_MS);
    // The live grant expires at 1 000 here; the next window has surely
    // started by 910 + 95.
    match key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1_001) {
        FairStep::Deny { retry_after_ms, .. } => assert_eq!(retry_after_ms, 4),
        other => panic!("expected a wait for the next window, got {other:?}"),
    }
    match key.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1_005) {
        FairStep::Admit { served, .. } => {
            assert_eq!(served.window_start_ms, WINDOW_MS);
            // Its deadline: sent at 900 plus the lifetime answered.
            assert_eq!(served.remaining_lifetime_ms, 900 + 95 + WINDOW_MS - 1_005);
        }
        other => panic!("expected an admission from the grant joined ahead, got {other:?}"),
    }
    assert_eq!(key.escrow().map(|e| e.budget()), Some(150));
    assert_eq!(
        key.release_at(1_005, 10_000, 0, 10, 1_300),
        Some(1_000 + 900 + 95 - WINDOW_MS / 8 + WINDOW_MS / 100)
    );
    // An answer for any other window is not kept.
    let mut other = busy_key(200, 300, 0);
    other.on_sole_ahead_answer(
        grant(150, 2 * WINDOW_MS, 905, None, None),
        Vec::new(),
        150,
        900,
        910,
        RE_ASK_MS,
    );
    assert!(matches!(
        other.decide(&tenant(0), 1, 1, LEASE_SIZE, true, 1_010),
        FairStep::Join { .. }
    ));
}

/// A region that joined the next window ahead (retired or not) and then
/// has no request in it hands the grant back at that window's first
/// surplus check (a quarter in, plus a hundredth), as a region that
/// joined at the window's start and fell quiet would: a request would
/// have made the join its grant; none did, so the release makes it so
/// and keeps what the pace of nothing needs (2).
#[test]
fn a_join_ahead_no_request_takes_up_is_handed_back_a_quarter_in() {
    // Held at its ceiling of 120: joins ahead keeping its weight.
    let mut key = busy_key(120, 120, 121);
    let join = key.join_ahead(7, LEASE_SIZE, 900).expect("joins ahead");
    assert!(!join.retire);
    let ahead = PoolAnswer {
        remaining_lifetime_ms: 95 + WINDOW_MS,
        ..grant(130, WINDOW_MS, 905, standing(120, 130), None)
    };
    key.on_sole_ahead_answer(ahead, Vec::new(), join.want_total, 900, 910, RE_ASK_MS);
    // Its deadline here 900 + 95 + 1 000; a quarter in: 1 995 − 750 + 10.
    let quarter_in = 1_255;
    assert_eq!(key.release_at(2, 10_000, 0, 10, 950), Some(quarter_in));
    let pending = key
        .begin_release(11, false, quarter_in)
        .expect("hands the join back");
    assert_eq!(
        (pending.from_total, pending.keep_total, pending.window),
        (130, 2, window(WINDOW_MS))
    );

    // Joined retired at its pace's need: handed back all the same.
    let mut light = busy_key(200, 300, 100);
    let join = light.join_ahead(7, LEASE_SIZE, 900).expect("joins ahead");
    assert!(join.retire);
    let ahead = PoolAnswer {
        remaining_lifetime_ms: 95 + WINDOW_MS,
        ..grant(join.want_total, WINDOW_MS, 905, standing(0, 150), None)
    };
    light.on_sole_ahead_answer(ahead, Vec::new(), join.want_total, 900, 910, RE_ASK_MS);
    // (Once its live grant has expired: before, its own checks come first.)
    assert_eq!(light.release_at(2, 10_000, 0, 10, 1_001), Some(quarter_in));
    let pending = light
        .begin_release(11, false, quarter_in)
        .expect("hands the retired join back");
    assert_eq!(
        (pending.from_total, pending.keep_total),
        (join.want_total, 2)
    );
}

/// A join ahead carries the live window's demand projected to its end
/// (counts so far · window / elapsed) and weighs the next window by the
/// split a join at its start would freeze — the settled window's, two
/// before the live one — not by the live window's: a tenant active in
/// other regions too weighs its share of its demand there. The grant
/// joined ahead is used with that split, the key reports the projected
/// counts for the window again later (every region reads one report of
/// it), and the join's answer brings the totals the next join splits by.
#[test]
fn a_join_ahead_reports_its_window_projected_and_weighs_the_next_by_the_settled_split() {
    let mut key: FairKey<u64> = FairKey::new(8);
    // Windows 0, 1 and 2 joined at their start; tenant 0 (weight 2) asks
    // for 40 here in each. Window 0's totals (heard in window 2): 160.
    for k in 0..=2 {
        let at = k * WINDOW_MS + 1;
        key.decide(&tenant(0), 2, 1, LEASE_SIZE, true, at);
        let answer = grant(300, k * WINDOW_MS, at, standing(300, 300), None);
        key.on_sole_answer(answer, 1, at, at, RE_ASK_MS);
        key.note_demand(&tenant(0), 40);
    }
    key.on_tenant_demands(0, vec![(tenant(0), 160)]);
    for _ in 0..10 {
        key.decide(&tenant(0), 2, 1, LEASE_SIZE, true, 2 * WINDOW_MS + 2);
    }
    // Window 2 was joined before window 0's totals came: its full weight.
    assert_eq!(key.split_weight(&tenant(0), 2), 2 * WEIGHT_SCALE);
    let join = key
        .join_ahead(7, LEASE_SIZE, 2 * WINDOW_MS + 900)
        .expect("joins ahead");
    // A quarter of its demand was here in window 0: a quarter of 2.
    assert_eq!(join.region_weight, WEIGHT_SCALE / 2);
    // 40 asked in 900 ms of 1 000.
    assert_eq!(join.demands, vec![(tenant(0), 44)]);
    // Answered with window 1's settled totals: half of it here.
    let ahead = grant(
        300,
        3 * WINDOW_MS,
        2 * WINDOW_MS + 905,
        standing(300, 300),
        None,
    );
    key.on_sole_ahead_answer(
        ahead,
        vec![(tenant(0), 80)],
        join.want_total,
        2 * WINDOW_MS + 900,
        2 * WINDOW_MS + 910,
        RE_ASK_MS,
    );
    assert!(matches!(
        key.decide(&tenant(0), 2, 1, LEASE_SIZE, true, 3 * WINDOW_MS + 10),
        FairStep::Admit { .. }
    ));
    assert_eq!(key.window().map(|w| w.start_ms), Some(3 * WINDOW_MS));
    assert_eq!(key.split_weight(&tenant(0), 2), WEIGHT_SCALE / 2);
    assert_eq!(
        key.demand_report(3 * WINDOW_MS + 10),
        Some((2 * WINDOW_MS, vec![(tenant(0), 44)])),
        "the projected report, again"
    );
    // The next join ahead splits by window 1: half of 2.
    key.note_demand(&tenant(0), 40);
    let join = key
        .join_ahead(8, LEASE_SIZE, 3 * WINDOW_MS + 900)
        .expect("joins ahead again");
    assert_eq!(join.region_weight, WEIGHT_SCALE);
}
