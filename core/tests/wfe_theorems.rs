//! The weighted-fair escrow's theorems T1–T4 through its public API, with
//! the preconditions under which each one is promised.
//!
//! Setting (as in the original's property suite): one region whose budget is
//! the whole limit L, tenants with integer weights ≥ 1 that all join (make
//! their first call) before the backlog, and "continuously backlogged"
//! meaning every tenant keeps asking, in round-robin order, until a whole
//! round is denied.
//!
//! - **T1 safety**: `Σ used ≤ L`, always: any order, any weights, any costs,
//!   any pool answers, any tenant-table bound.
//! - **T2 sharing incentive**: with unit cost (the original's
//!   precondition) every backlogged tenant gets at least its guarantee,
//!   `used_i ≥ g_i = floor(w_i·L/W)`; with a uniform cost c it stops short
//!   of it by less than one call, `used_i + c > g_i`. At any moment with
//!   fixed weights, a call that stays within the caller's guarantee and the
//!   unspent budget is admitted.
//! - **T3 work conservation**: with unit cost, `Σ used = L` under backlog;
//!   with a uniform cost c, each tenant strands less than one call:
//!   `L − Σ used ≤ n·(c − 1)` for n tenants.
//! - **T4 bounded unfairness**: with a uniform cost c (the DRR quantum),
//!   `|a_i/w_i − a_j/w_j| ≤ c·(1/w_i + 1/w_j)` for backlogged tenants.

use leasehold_core::ids::TenantId;
use leasehold_core::wfe::{WeightedFairEscrow, WholeBudget};
use leasehold_core::window::WindowBounds;
use proptest::prelude::*;

const WINDOW: WindowBounds = WindowBounds {
    start_ms: 0,
    end_ms: 1_000,
};

fn tenants(weights: &[u64]) -> Vec<(TenantId, u64)> {
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| (TenantId::new(format!("t{i}")).unwrap(), *w))
        .collect()
}

/// Every tenant joins (asks once while the region has no budget yet, so W
/// is the whole set from the start), then all ask `cost` in turn until a
/// whole round is denied.
fn backlogged(limit: u64, set: &[(TenantId, u64)], cost: u64) -> WeightedFairEscrow {
    let mut escrow = WeightedFairEscrow::new(limit, 64);
    join(&mut escrow, set);
    let mut pool = WholeBudget(limit);
    loop {
        let mut any = false;
        for (t, w) in set {
            any |= escrow.check(t, *w, cost, WINDOW, 1, &mut pool).allowed;
        }
        if !any {
            return escrow;
        }
    }
}

/// Makes every tenant active without admitting anything.
fn join(escrow: &mut WeightedFairEscrow, set: &[(TenantId, u64)]) {
    for (t, w) in set {
        assert!(
            !escrow
                .check(t, *w, 1, WINDOW, 1, &mut WholeBudget(0))
                .allowed
        );
    }
}

fn guarantee(w: u64, limit: u64, total: u64) -> u64 {
    u64::try_from(u128::from(w) * u128::from(limit) / u128::from(total)).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn t1_safety_under_any_interleaving(
        limit in 1u64..400,
        max_tenants in 1usize..8,
        calls in proptest::collection::vec((0usize..10, 1u64..9, 1u64..12), 1..400),
    ) {
        let mut escrow = WeightedFairEscrow::new(limit, max_tenants);
        let mut admitted = 0u64;
        for (t, w, cost) in calls {
            let tenant = TenantId::new(format!("t{t}")).unwrap();
            let d = escrow.check(&tenant, w, cost, WINDOW, 1, &mut WholeBudget(limit));
            if d.allowed {
                admitted += cost;
                prop_assert!(d.remaining <= d.limit);
            } else {
                prop_assert!(d.retry_after_ms > 0);
            }
            prop_assert!(escrow.total_used() <= limit);
        }
        prop_assert!(admitted <= limit);
        prop_assert_eq!(admitted, escrow.total_used());
    }

    #[test]
    fn t2_every_backlogged_tenant_reaches_its_guarantee(
        limit in 1u64..400,
        weights in proptest::collection::vec(1u64..8, 1..7),
    ) {
        let set = tenants(&weights);
        let escrow = backlogged(limit, &set, 1);
        let total: u64 = weights.iter().sum();
        for (t, w) in &set {
            let g = guarantee(*w, limit, total);
            prop_assert!(escrow.used_by(t) >= g, "{:?} used {} g {}", t, escrow.used_by(t), g);
        }
    }

    #[test]
    fn t2_with_a_larger_uniform_cost_stops_short_by_less_than_one_call(
        limit in 1u64..400,
        weights in proptest::collection::vec(1u64..8, 1..7),
        cost in 2u64..6,
    ) {
        let set = tenants(&weights);
        let escrow = backlogged(limit, &set, cost);
        let total: u64 = weights.iter().sum();
        for (t, w) in &set {
            let g = guarantee(*w, limit, total);
            prop_assert!(escrow.used_by(t) + cost > g, "{:?} used {} g {}", t, escrow.used_by(t), g);
        }
    }

    #[test]
    fn t2_a_call_within_the_guarantee_is_admitted(
        limit in 1u64..300,
        weights in proptest::collection::vec(1u64..8, 1..6),
        calls in proptest::collection::vec((0usize..6, 1u64..6), 0..200),
    ) {
        let set = tenants(&weights);
        let mut escrow = WeightedFairEscrow::new(limit, 64);
        let mut pool = WholeBudget(limit);
        join(&mut escrow, &set);
        let total: u64 = weights.iter().sum();
        for (i, cost) in calls {
            let (t, w) = &set[i % set.len()];
            let g = guarantee(*w, limit, total);
            let fits = escrow.used_by(t) + cost <= g && escrow.total_used() + cost <= limit;
            let d = escrow.check(t, *w, cost, WINDOW, 1, &mut pool);
            prop_assert!(!fits || d.allowed, "{:?} within its guarantee {} was denied", t, g);
        }
    }

    #[test]
    fn t3_unit_cost_backlog_uses_the_whole_limit(
        limit in 1u64..400,
        weights in proptest::collection::vec(1u64..8, 1..7),
    ) {
        let escrow = backlogged(limit, &tenants(&weights), 1);
        prop_assert_eq!(escrow.total_used(), limit);
    }

    #[test]
    fn t3_a_larger_uniform_cost_strands_less_than_one_call_per_tenant(
        limit in 1u64..400,
        weights in proptest::collection::vec(1u64..8, 1..7),
        cost in 2u64..6,
    ) {
        let escrow = backlogged(limit, &tenants(&weights), cost);
        prop_assert!(limit - escrow.total_used() <= weights.len() as u64 * (cost - 1));
    }

    #[test]
    fn t4_bounded_unfairness_with_the_call_cost_as_quantum(
        limit in 1u64..400,
        weights in proptest::collection::vec(1u64..8, 2..7),
        cost in 1u64..5,
    ) {
        let set = tenants(&weights);
        let escrow = backlogged(limit, &set, cost);
        for (ti, wi) in &set {
            for (tj, wj) in &set {
                let (ai, aj) = (u128::from(escrow.used_by(ti)), u128::from(escrow.used_by(tj)));
                // |a_i/w_i − a_j/w_j| ≤ c(1/w_i + 1/w_j), times w_i·w_j.
                let lhs = (ai * u128::from(*wj)).abs_diff(aj * u128::from(*wi));
                prop_assert!(lhs <= u128::from(cost) * u128::from(wi + wj));
            }
        }
    }
}

#[test]
fn a_straddling_call_does_not_eat_another_tenants_guarantee() {
    // L = 217, weights 3/6/5/4/7, cost 2: guarantees 26/52/43/34/60 and a
    // surplus of 2. The w5 tenant's call from 42 to 44 straddles its
    // guarantee of 43; counting its own remainder as surplus would take one
    // token from the w7 tenant, leaving it at 58 (and breaking T4).
    let set = tenants(&[3, 6, 5, 4, 7]);
    let escrow = backlogged(217, &set, 2);
    assert_eq!(escrow.used_by(&set[4].0), 60);
    assert_eq!(escrow.used_by(&set[2].0), 42);
    assert!(escrow.total_used() >= 217 - 5);
}
