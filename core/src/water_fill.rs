//! The flat weighted max-min (water-filling) allocation: the ideal the
//! federated fair escrow approximates, used as an oracle by tests and by
//! `leasehold demo`.
//!
//! Law: raise a common water level λ; every claimant gets
//! `min(demand_i, w_i·λ)`; stop when Σ reaches L or every demand is met.
//! Integer version: claimants whose demand lies below the level are
//! satisfied exactly; the others get `floor(w_i·rest/W)` of the rest, so
//! `Σ ≤ L` and the result is within one token per claimant of the real
//! water-fill.

/// One claimant: weight ≥ 1 and demand in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    /// Weight (0 is treated as 1).
    pub weight: u64,
    /// Tokens wanted.
    pub demand: u64,
}

/// Allocations in the order of `claims`.
pub fn water_fill(limit: u64, claims: &[Claim]) -> Vec<u64> {
    let mut alloc = vec![0u64; claims.len()];
    let mut open: Vec<usize> = (0..claims.len())
        .filter(|i| claims[*i].demand > 0)
        .collect();
    let mut rest = limit;
    loop {
        let total_weight: u128 = open
            .iter()
            .map(|i| u128::from(claims[*i].weight.max(1)))
            .sum();
        if open.is_empty() || total_weight == 0 {
            break;
        }
        // Claimants whose whole demand fits under the current level.
        let satisfied: Vec<usize> = open
            .iter()
            .copied()
            .filter(|i| {
                u128::from(claims[*i].demand) * total_weight
                    <= u128::from(claims[*i].weight.max(1)) * u128::from(rest)
            })
            .collect();
        if satisfied.is_empty() {
            for i in &open {
                let share = u128::from(claims[*i].weight.max(1)) * u128::from(rest) / total_weight;
                alloc[*i] = u64::try_from(share).unwrap_or(u64::MAX);
            }
            break;
        }
        for i in &satisfied {
            alloc[*i] = claims[*i].demand;
            rest -= claims[*i].demand;
        }
        open.retain(|i| !satisfied.contains(i));
    }
    alloc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_textbook_case() {
        // L = 300, weights 2/1/1, all backlogged: 150 / 75 / 75.
        let claims = [
            Claim {
                weight: 2,
                demand: 1_000,
            },
            Claim {
                weight: 1,
                demand: 1_000,
            },
            Claim {
                weight: 1,
                demand: 1_000,
            },
        ];
        assert_eq!(water_fill(300, &claims), vec![150, 75, 75]);
        // A small demand is met and its surplus flows to the others by weight.
        let claims = [
            Claim {
                weight: 1,
                demand: 10,
            },
            Claim {
                weight: 3,
                demand: 1_000,
            },
            Claim {
                weight: 1,
                demand: 1_000,
            },
        ];
        assert_eq!(water_fill(110, &claims), vec![10, 75, 25]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn feasible_work_conserving_and_fair(
            limit in 0u64..10_000,
            claims in proptest::collection::vec((1u64..8, 0u64..5_000), 1..8),
        ) {
            let claims: Vec<Claim> = claims.into_iter().map(|(weight, demand)| Claim { weight, demand }).collect();
            let alloc = water_fill(limit, &claims);
            let total: u64 = alloc.iter().sum();
            prop_assert!(total <= limit);
            for (a, c) in alloc.iter().zip(&claims) {
                prop_assert!(*a <= c.demand);
            }
            // Work conserving up to one token per claimant of rounding.
            let demand: u64 = claims.iter().map(|c| c.demand).sum();
            prop_assert!(total + claims.len() as u64 >= demand.min(limit));
            // An unsatisfied claimant is never behind another by more than rounding, per weight.
            for (i, ci) in claims.iter().enumerate() {
                if alloc[i] < ci.demand {
                    for (j, cj) in claims.iter().enumerate() {
                        // a_j / w_j ≤ (a_i + 1) / w_i
                        prop_assert!(u128::from(alloc[j]) * u128::from(ci.weight) <= (u128::from(alloc[i]) + 1) * u128::from(cj.weight));
                    }
                }
            }
        }
    }
}
