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
        limit: 1_000,
        window: WindowBounds {
            start_ms: start,
            end_ms: start + WINDOW_MS,
        },
        remaining_lifetime_ms: start + WINDOW_MS - now,
        standing: None,
    };
    key.on_pool_answer(answer(0, 10), 10, 10, 10, RE_ASK_MS);
    key.note_demand(&tenant(1), 30);
    key.note_demand(&tenant(2), 10);
    key.note_demand(&tenant(1), 10);
    // Nothing to report while the first window runs; full weights.
    assert_eq!(key.demand_report(500), None);
    assert_eq!(key.split_weight(&tenant(1), 2), 2 * WEIGHT_SCALE);
    // Its grant expired: a join reports the window that just ended.
    let ended = Some((0, vec![(tenant(1), 40), (tenant(2), 10)]));
    assert_eq!(key.demand_report(WINDOW_MS + 5), ended);
    key.on_pool_answer(
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
    key.on_pool_answer(answer(2 * WINDOW_MS, later), 10, later, later, RE_ASK_MS);
    // t1 asked here for 40 of its 80: half its weight; t2 only here: all of it.
    key.on_tenant_demands(0, vec![(tenant(1), 80), (tenant(2), 10)]);
    assert_eq!(key.split_weight(&tenant(1), 2), WEIGHT_SCALE);
    assert_eq!(key.split_weight(&tenant(2), 3), 3 * WEIGHT_SCALE);
    assert_eq!(key.split_weight(&tenant(3), 1), WEIGHT_SCALE);
    // The region weight asked for carries the split weight.
    match key.decide(&tenant(1), 2, 200, LEASE_SIZE, later + 1) {
        FairStep::Ask { region_weight, .. } => assert_eq!(region_weight, WEIGHT_SCALE),
        other => panic!("expected an ask, got {other:?}"),
    }
    // Totals of a window other than the settled one (0) do not split.
    key.on_tenant_demands(WINDOW_MS, vec![(tenant(1), 80)]);
    assert_eq!(key.split_weight(&tenant(1), 2), 2 * WEIGHT_SCALE);
}

/// An answer naming more tenants than any report can (a buggy or hostile
/// coordinator) is kept to [`MAX_REPORTED_TENANTS`]: memory stays bounded.
#[test]
fn demand_totals_from_an_answer_are_bounded() {
    let mut key: FairKey<u64> = FairKey::new(8);
    let flood = |n: usize| (0..n).map(|i| (tenant(i), 1)).collect::<Vec<_>>();
    key.on_tenant_demands(0, flood(10_000));
    key.on_tenant_demands(0, flood(20_000).split_off(10_000));
    let held = key.totals.as_ref().map_or(0, |(_, totals)| totals.len());
    assert_eq!(held, MAX_REPORTED_TENANTS);
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
                limit: 1,
                window: WindowBounds { start_ms: start, end_ms: start + WINDOW_MS },
                remaining_lifetime_ms: WINDOW_MS,
                standing: None,
            };
            key.on_pool_answer(answer(0), 1, 0, 0, RE_ASK_MS);
            key.note_demand(&tenant(0), *own);
            key.on_pool_answer(answer(WINDOW_MS), 1, WINDOW_MS, WINDOW_MS, RE_ASK_MS);
            key.on_pool_answer(answer(2 * WINDOW_MS), 1, 2 * WINDOW_MS, 2 * WINDOW_MS, RE_ASK_MS);
            key.on_tenant_demands(0, vec![(tenant(0), total)]);
            sum += key.split_weight(&tenant(0), weight);
        }
        let declared = weight * WEIGHT_SCALE;
        prop_assert!(sum <= declared + demands.len() as u64 && sum + demands.len() as u64 >= declared,
            "shares {} vs declared {}", sum, declared);
    }
}
