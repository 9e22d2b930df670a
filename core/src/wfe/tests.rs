//! Worked vectors and the theorems T1–T4 as properties.

use proptest::prelude::*;

use super::*;

const WINDOW: WindowBounds = WindowBounds {
    start_ms: 0,
    end_ms: 1_000,
};

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).unwrap()
}

fn tenants(weights: &[u64]) -> Vec<(TenantId, u64)> {
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| (tenant(&format!("t{i}")), *w))
        .collect()
}

/// Every tenant asks `cost` in turn until a whole round is denied.
fn backlog(
    escrow: &mut WeightedFairEscrow,
    set: &[(TenantId, u64)],
    cost: u64,
    pool: &mut impl PoolAccess,
) {
    loop {
        let mut any = false;
        for (t, w) in set {
            any |= escrow.check(t, *w, cost, WINDOW, 10, pool).allowed;
        }
        if !any {
            break;
        }
    }
}

#[test]
fn golden_vector_four_to_one() {
    // L = 10, w(high) = 4, w(low) = 1: high warms up, then low, then 18 alternating calls.
    let (high, low) = (tenant("high"), tenant("low"));
    let mut escrow = WeightedFairEscrow::new(10, 64);
    let mut pool = WholeBudget(10);
    let first = escrow.check(&high, 4, 1, WINDOW, 0, &mut pool);
    assert_eq!((first.allowed, first.limit, first.remaining), (true, 10, 9));
    let second = escrow.check(&low, 1, 1, WINDOW, 0, &mut pool);
    assert_eq!(
        (second.allowed, second.limit, second.remaining),
        (true, 2, 1)
    );
    for i in 0..18 {
        let who = if i % 2 == 0 { &high } else { &low };
        let w = if i % 2 == 0 { 4 } else { 1 };
        escrow.check(who, w, 1, WINDOW, 0, &mut pool);
    }
    assert_eq!(escrow.used_by(&high), 8);
    assert_eq!(escrow.used_by(&low), 2);
}

#[test]
fn an_absent_tenant_strands_nothing_and_a_paused_one_keeps_its_reserve() {
    let (high, low) = (tenant("high"), tenant("low"));
    let mut alone = WeightedFairEscrow::new(10, 64);
    backlog(&mut alone, &[(low.clone(), 1)], 1, &mut WholeBudget(10));
    assert_eq!(alone.used_by(&low), 10);

    let mut paused = WeightedFairEscrow::new(10, 64);
    assert!(
        paused
            .check(&high, 4, 1, WINDOW, 0, &mut WholeBudget(10))
            .allowed
    );
    backlog(&mut paused, &[(low.clone(), 1)], 1, &mut WholeBudget(10));
    assert_eq!(
        paused.used_by(&low),
        2,
        "high's unclaimed guarantee stays reserved"
    );
}

#[test]
fn a_flood_of_unique_tenants_cannot_over_admit() {
    let mut escrow = WeightedFairEscrow::new(100, 1);
    let mut admitted = 0;
    for i in 0..5_000 {
        if escrow
            .check(
                &tenant(&format!("flood-{i}")),
                1,
                1,
                WINDOW,
                0,
                &mut WholeBudget(100),
            )
            .allowed
        {
            admitted += 1;
        }
    }
    assert!(admitted <= 100, "{admitted}");
    assert_eq!(escrow.tenant_count(), 1);
}

#[test]
fn a_new_window_starts_afresh() {
    let t = tenant("a");
    let mut escrow = WeightedFairEscrow::new(5, 8);
    backlog(&mut escrow, &[(t.clone(), 1)], 1, &mut WholeBudget(5));
    assert_eq!(escrow.total_used(), 5);
    let next = WindowBounds {
        start_ms: 1_000,
        end_ms: 2_000,
    };
    assert!(
        escrow
            .check(&t, 1, 1, next, 1_000, &mut WholeBudget(5))
            .allowed
    );
    assert_eq!(escrow.total_used(), 1);
}

#[test]
fn regions_share_one_pool_by_weight() {
    // Cross-region 3:1 at L = 400, all backlogged: about 300 / 100.
    let mut pool = RegionFairPool::new(400, 1_000).unwrap();
    let (us, eu) = (RegionId::new("us").unwrap(), RegionId::new("eu").unwrap());
    let (big, small) = (tenant("big"), tenant("small"));
    let mut us_escrow = WeightedFairEscrow::new(400, 64);
    let mut eu_escrow = WeightedFairEscrow::new(400, 64);
    loop {
        let a = us_escrow.check(
            &big,
            3,
            1,
            WINDOW,
            5,
            &mut PoolSeat {
                pool: &mut pool,
                region: &us,
                now_ms: 5,
            },
        );
        let b = eu_escrow.check(
            &small,
            1,
            1,
            WINDOW,
            5,
            &mut PoolSeat {
                pool: &mut pool,
                region: &eu,
                now_ms: 5,
            },
        );
        if !a.allowed && !b.allowed {
            break;
        }
    }
    let (a, b) = (us_escrow.total_used(), eu_escrow.total_used());
    assert!(a + b <= 400);
    assert!(a.abs_diff(300) <= 2 && b.abs_diff(100) <= 2, "{a} / {b}");
}

#[test]
fn asking_the_pool_asynchronously_decides_like_asking_it_inline() {
    // The same requests through RecordedAsk + observe_grant give the same
    // decisions as the synchronous PoolSeat.
    let region = RegionId::new("r").unwrap();
    let mut inline_pool = RegionFairPool::new(50, 1_000).unwrap();
    let mut async_pool = RegionFairPool::new(50, 1_000).unwrap();
    let mut inline = WeightedFairEscrow::new(50, 8);
    let mut split = WeightedFairEscrow::new(50, 8);
    for i in 0..80u64 {
        let (t, w, cost) = (tenant(&format!("t{}", i % 3)), 1 + i % 3, 1 + i % 2);
        let a = inline.check(
            &t,
            w,
            cost,
            WINDOW,
            1,
            &mut PoolSeat {
                pool: &mut inline_pool,
                region: &region,
                now_ms: 1,
            },
        );
        let b = loop {
            let mut ask = RecordedAsk {
                current: split.budget(),
                asked: None,
            };
            let d = split.check(&t, w, cost, WINDOW, 1, &mut ask);
            match ask.asked {
                Some((rw, want)) if !d.allowed => {
                    let before = split.budget();
                    let total = async_pool.grant(&region, rw, want, 1).unwrap();
                    split.observe_grant(WINDOW, total);
                    if split.budget() <= before {
                        break d;
                    }
                }
                _ => break d,
            }
        };
        assert_eq!(a.allowed, b.allowed, "request {i}");
    }
    assert_eq!(inline.total_used(), split.total_used());
}

fn weight_sets() -> impl Strategy<Value = Vec<u64>> {
    proptest::collection::vec(1u64..7, 1..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// T1: Σ used ≤ budget ≤ L, whatever the order, weights, costs and pool.
    #[test]
    fn t1_never_over_admits(
        limit in 5u64..200,
        regions in 1usize..4,
        steps in proptest::collection::vec((0usize..4, 0usize..8, 1u64..7, 1u64..5), 1..300),
        max_tenants in 1usize..6,
    ) {
        let mut pool = RegionFairPool::new(limit, 1_000).unwrap();
        let ids: Vec<RegionId> = (0..regions).map(|r| RegionId::new(format!("r{r}")).unwrap()).collect();
        let mut escrows: Vec<WeightedFairEscrow> = (0..regions).map(|_| WeightedFairEscrow::new(limit, max_tenants)).collect();
        let mut admitted = 0u64;
        for (r, t, w, cost) in steps {
            let r = r % regions;
            let d = escrows[r].check(&tenant(&format!("t{t}")), w, cost, WINDOW, 1, &mut PoolSeat { pool: &mut pool, region: &ids[r], now_ms: 1 });
            if d.allowed {
                admitted += cost;
            }
            prop_assert!(escrows[r].total_used() <= escrows[r].budget());
            prop_assert!(escrows[r].budget() <= limit);
            prop_assert_eq!(d.allowed, d.retry_after_ms == 0);
        }
        prop_assert!(admitted <= limit);
    }

    /// T2 and T3: backlogged tenants (unit cost) each reach their guarantee
    /// floor(w·L/W), and together they use all of L.
    #[test]
    fn t2_t3_guarantee_and_work_conservation(limit in 1u64..300, weights in weight_sets()) {
        let set = tenants(&weights);
        let mut escrow = WeightedFairEscrow::new(limit, 64);
        // Every tenant joins before the backlog (asking while the region
        // has no budget yet) so W is the whole set.
        for (t, w) in &set {
            prop_assert!(!escrow.check(t, *w, 1, WINDOW, 1, &mut WholeBudget(0)).allowed);
        }
        backlog(&mut escrow, &set, 1, &mut WholeBudget(limit));
        let total_weight: u128 = weights.iter().map(|w| u128::from(*w)).sum();
        for (t, w) in &set {
            let floor = u64::try_from(u128::from(*w) * u128::from(limit) / total_weight).unwrap();
            prop_assert!(escrow.used_by(t) >= floor, "tenant below its guarantee");
        }
        prop_assert_eq!(escrow.total_used(), limit);
    }

    /// T4: |a_i/w_i − a_j/w_j| ≤ cost·(1/w_i + 1/w_j), cross-multiplied:
    /// |a_i·w_j − a_j·w_i| ≤ cost·(w_i + w_j).
    #[test]
    fn t4_bounded_unfairness(limit in 1u64..300, weights in weight_sets(), cost in 1u64..4) {
        let set = tenants(&weights);
        let mut escrow = WeightedFairEscrow::new(limit, 64);
        backlog(&mut escrow, &set, cost, &mut WholeBudget(limit));
        for (ti, wi) in &set {
            for (tj, wj) in &set {
                let (ai, aj) = (u128::from(escrow.used_by(ti)), u128::from(escrow.used_by(tj)));
                let lhs = (ai * u128::from(*wj)).abs_diff(aj * u128::from(*wi));
                let rhs = u128::from(cost) * u128::from(wi + wj);
                prop_assert!(lhs <= rhs, "a_i {} w_i {} a_j {} w_j {}", ai, wi, aj, wj);
            }
        }
    }
}

#[test]
fn tenants_lists_each_tenants_weight_and_use() {
    let mut escrow = WeightedFairEscrow::new(100, 10);
    let set = tenants(&[1, 3]);
    backlog(&mut escrow, &set, 1, &mut WholeBudget(100));
    let listed: Vec<(String, u64, u64)> = escrow
        .tenants()
        .map(|(t, weight, used)| (t.to_string(), weight, used))
        .collect();
    assert_eq!(listed.len(), 2);
    assert_eq!((listed[0].1, listed[1].1), (1, 3));
    assert_eq!(
        listed.iter().map(|(_, _, used)| used).sum::<u64>(),
        escrow.total_used()
    );
    assert_eq!(listed[0].2, escrow.used_by(&tenant("t0")));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `admissible` is the largest cost a check would admit from the
    /// budget held, after any history of checks.
    #[test]
    fn admissible_is_the_largest_cost_a_check_admits(
        budget in 1u64..120,
        steps in proptest::collection::vec((0usize..4, 1u64..5, 1u64..9), 0..40),
        asker in 0usize..4,
        asker_weight in 1u64..5,
        cost in 1u64..40,
    ) {
        let mut escrow = WeightedFairEscrow::new(budget, 8);
        let mut pool = WholeBudget(budget);
        for (t, w, c) in steps {
            escrow.check(&tenant(&format!("t{t}")), w, c, WINDOW, 10, &mut pool);
        }
        let who = tenant(&format!("t{asker}"));
        // The tenant must be known before it can be admitted anything.
        let mut probe = escrow.clone();
        probe.check(&who, asker_weight, u64::MAX, WINDOW, 10, &mut RecordedAsk { current: probe.budget(), asked: None });
        let got = probe.admissible(&who, cost);
        let largest = (1..=cost)
            .filter(|c| {
                let mut trial = probe.clone();
                let mut ask = RecordedAsk { current: trial.budget(), asked: None };
                trial.check(&who, asker_weight, *c, WINDOW, 10, &mut ask).allowed
            })
            .max()
            .unwrap_or(0);
        prop_assert_eq!(got, largest);
    }
}
