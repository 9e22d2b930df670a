//! Federated fairness with every tenant backlogged, in lock step: three
//! regions, each the key machine an escrow node runs for a `fair` key
//! (`KeyMachine`), against the real coordinator state machine over a
//! network without delay. A tenant declares its whole weight in every
//! region it is active in; every tenant's *global* allocation (summed over
//! its regions) is compared with the flat weighted max-min oracle once the
//! demand split has settled (the leader's totals of a window are answered
//! two windows later, and a region splits a window by the totals it knew
//! when it joined it).

mod fleet_support;

use std::collections::BTreeMap;

use fleet_support::region::{config, credits, Region};
use fleet_support::{Admissions, Coordinator, Delivery};
use leasehold_core::escrow::machine::Now;
use leasehold_core::ids::TenantId;
use leasehold_core::policy::PolicyKind;
use leasehold_core::sizer::LeaseSizer;
use leasehold_core::water_fill::{water_fill, Claim};

const L: u64 = 600;
const WINDOW_MS: u64 = 1_000;
const WINDOWS: u64 = 7;
/// The first window every region joins with the split weights (the
/// totals of window 0 are answered with the joins of window 2 and weigh
/// from the next join on: the split holds for a whole window).
const FIRST_SPLIT_WINDOW: u64 = 4;
/// A fair key's batch beyond the need (its lease size).
const LEASE_SIZE: u64 = 4;
/// The escrow node's default `--pool-release-idle-ms`.
const RELEASE_IDLE_MS: u64 = 1_000;

/// (region, tenant, its whole weight)
type Placement = (usize, &'static str, u64);

/// Admissions of one window per tenant name.
type Allocation = BTreeMap<&'static str, u64>;

fn at(now_ms: u64) -> Now {
    Now {
        mono_ms: now_ms,
        wall_ms: now_ms,
    }
}

/// Everyone backlogged: every millisecond each placement asks for 1 token
/// (round-robin, cost 1). Returns the global allocation per tenant in each
/// window from [`FIRST_SPLIT_WINDOW`] on; `totals`: whether the leader
/// answers the tenants' demand totals (without them nothing is split).
fn run(placements: &[Placement], totals: bool) -> Vec<Allocation> {
    let mut coordinator = Coordinator::new(L, WINDOW_MS, PolicyKind::Fair, 0);
    if !totals {
        coordinator.desk = std::mem::take(&mut coordinator.desk).without_demand_totals();
    }
    let mut regions: Vec<Region> = (0..3)
        .map(|_| {
            let config = config(LeaseSizer::Fixed(LEASE_SIZE), RELEASE_IDLE_MS);
            Region::new(config, coordinator.policy.clone(), 0)
        })
        .collect();
    let mut got: Admissions<&'static str> = Admissions::default();
    for now in 0..WINDOWS * WINDOW_MS {
        for (region, tenant, weight) in placements {
            let node = &mut regions[*region];
            let asker = Some(TenantId::new(*tenant).expect("valid tenant"));
            let (_, calls) = node.acquire(asker, *weight, 1, at(now));
            coordinator.settle(*region, node, calls, now, at(now), |_| Delivery::Answered);
            for (_, answer) in node.take_answers() {
                if let Some(served) = credits(&answer) {
                    got.record(*tenant, &served, now);
                }
            }
        }
    }
    (FIRST_SPLIT_WINDOW..WINDOWS)
        .map(|w| got.per_window.remove(&(w * WINDOW_MS)).unwrap_or_default())
        .collect()
}

/// alpha w3 (r0), beta w2 spanning r0 and r2 with equal demand, gamma w2
/// (r1), delta w1 (r2).
const SPANNING: [Placement; 5] = [
    (0, "alpha", 3),
    (0, "beta", 2),
    (1, "gamma", 2),
    (2, "beta", 2),
    (2, "delta", 1),
];

#[test]
fn global_allocations_match_the_flat_water_fill_with_a_split_spanning_tenant() {
    let tenants = [
        ("alpha", 3, 1u64),
        ("beta", 2, 2),
        ("delta", 1, 1),
        ("gamma", 2, 1),
    ];
    let claims: Vec<Claim> = tenants
        .iter()
        .map(|(_, w, _)| Claim {
            weight: *w,
            demand: u64::MAX / 8,
        })
        .collect();
    let ideal = water_fill(L, &claims);
    for got in run(&SPANNING, true) {
        let total: u64 = got.values().sum();
        assert!(total <= L);
        for ((name, _, span), ideal) in tenants.iter().zip(&ideal) {
            let a = got.get(name).copied().unwrap_or(0);
            // T-FED-3: |a_t − a*_t| ≤ span(t)·(2·q + 1), q = the per-call quantum (cost 1).
            assert!(
                a.abs_diff(*ideal) <= span * 3,
                "{name}: got {a}, ideal {ideal} ({got:?})"
            );
        }
    }
}

#[test]
fn declaring_the_full_weight_in_every_region_over_serves_a_spanning_tenant() {
    // F2: without the leader's totals, beta weighs its whole 2 in both regions.
    let ideal_beta = L * 2 / 8;
    for got in run(&SPANNING, false) {
        let beta = got.get("beta").copied().unwrap_or(0);
        assert!(
            beta > ideal_beta + 20,
            "beta got {beta}, ideal {ideal_beta}: the split matters"
        );
        assert!(got.values().sum::<u64>() <= L);
    }
}
