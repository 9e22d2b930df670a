//! Federated fairness, in-process: K regions, each a `WeightedFairEscrow`
//! over one shared `RegionFairPool`; every tenant's *global* allocation
//! (summed over the regions it is active in) is compared with the flat
//! weighted max-min oracle.

use leasehold_core::fair_pool::RegionFairPool;
use leasehold_core::ids::{RegionId, TenantId};
use leasehold_core::water_fill::{water_fill, Claim};
use leasehold_core::wfe::{PoolSeat, WeightedFairEscrow};
use leasehold_core::window::WindowBounds;

const L: u64 = 600;
const WINDOW: WindowBounds = WindowBounds {
    start_ms: 0,
    end_ms: 1_000,
};

/// (region, tenant, weight declared in that region)
type Placement = (usize, &'static str, u64);

/// Everyone backlogged, round-robin over placements, cost 1; returns the
/// global allocation per tenant name.
fn run(placements: &[Placement]) -> std::collections::BTreeMap<&'static str, u64> {
    let regions: Vec<RegionId> = (0..3)
        .map(|r| RegionId::new(format!("r{r}")).unwrap())
        .collect();
    let mut pool = RegionFairPool::new(L, 1_000).unwrap();
    let mut escrows: Vec<WeightedFairEscrow> =
        (0..3).map(|_| WeightedFairEscrow::new(L, 64)).collect();
    let mut got = std::collections::BTreeMap::new();
    loop {
        let mut any = false;
        for (region, tenant, weight) in placements {
            let t = TenantId::new(*tenant).unwrap();
            let seat = &mut PoolSeat {
                pool: &mut pool,
                region: &regions[*region],
                now_ms: 5,
            };
            if escrows[*region]
                .check(&t, *weight, 1, WINDOW, 5, seat)
                .allowed
            {
                *got.entry(*tenant).or_insert(0) += 1;
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    got
}

#[test]
fn global_allocations_match_the_flat_water_fill_with_a_split_spanning_tenant() {
    // alpha w3 (r0), beta w2 spanning r0 and r2 with equal demand (declares 1 + 1),
    // gamma w2 (r1), delta w1 (r2).
    let placements: [Placement; 5] = [
        (0, "alpha", 3),
        (0, "beta", 1),
        (1, "gamma", 2),
        (2, "beta", 1),
        (2, "delta", 1),
    ];
    let got = run(&placements);
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
    let total: u64 = got.values().sum();
    assert!(total <= L);
    for ((name, _, span), ideal) in tenants.iter().zip(&ideal) {
        let a = got.get(name).copied().unwrap_or(0);
        // T-FED-3: |a_t − a*_t| ≤ span(t)·(2·q + 1), q = the per-call quantum (cost 1).
        assert!(
            a.abs_diff(*ideal) <= span * 3,
            "{name}: got {a}, ideal {ideal}"
        );
    }
}

#[test]
fn declaring_the_full_weight_in_every_region_over_serves_a_spanning_tenant() {
    // F2: beta declares its whole weight 2 in both regions.
    let placements: [Placement; 5] = [
        (0, "alpha", 3),
        (0, "beta", 2),
        (1, "gamma", 2),
        (2, "beta", 2),
        (2, "delta", 1),
    ];
    let got = run(&placements);
    let ideal_beta = L * 2 / 8;
    let beta = got.get("beta").copied().unwrap_or(0);
    assert!(
        beta > ideal_beta + 20,
        "beta got {beta}, ideal {ideal_beta}: the split matters"
    );
    assert!(got.values().sum::<u64>() <= L);
}
