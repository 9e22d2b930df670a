//! The static-partition baseline: a budget L split once, evenly, among K
//! regions, with no coordination at all.
//!
//! It is exact (`Σ slices = L`, so Δ = 0) but not work conserving: under
//! full skew the hot region is capped at about `L/K` while the others'
//! slices go unused. Leasing from the coordinator exists to beat it; tests
//! and `leasehold demo` use it as the comparison point.
//!
//! Law: `base = floor(L/K)`, `remainder = L − base·K`; region `i` (in the
//! order given) gets `base + 1` if `i < remainder`, else `base`. Hence
//! `Σ = L` and any two slices differ by at most 1.

use std::collections::BTreeSet;

use crate::ids::RegionId;

/// Why a budget cannot be partitioned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// No regions were given.
    #[error("a static partition needs at least one region")]
    NoRegions,
    /// Fewer tokens than regions: some region would get nothing.
    #[error("limit {limit} is smaller than the number of regions {regions}")]
    LimitBelowRegionCount {
        /// The budget.
        limit: u64,
        /// How many regions.
        regions: usize,
    },
    /// A region appears twice.
    #[error("region {0:?} appears more than once")]
    DuplicateRegion(String),
}

/// One region's slice of the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// The region.
    pub region: RegionId,
    /// Tokens it may admit per window.
    pub tokens: u64,
}

/// Splits `limit` among `regions` (in the order given; see the module law).
pub fn static_partition(limit: u64, regions: &[RegionId]) -> Result<Vec<Slice>, PartitionError> {
    if regions.is_empty() {
        return Err(PartitionError::NoRegions);
    }
    let mut seen = BTreeSet::new();
    for region in regions {
        if !seen.insert(region) {
            return Err(PartitionError::DuplicateRegion(region.as_str().to_owned()));
        }
    }
    let count = regions.len() as u64;
    if limit < count {
        return Err(PartitionError::LimitBelowRegionCount {
            limit,
            regions: regions.len(),
        });
    }
    let base = limit / count;
    let remainder = limit - base * count;
    Ok(regions
        .iter()
        .enumerate()
        .map(|(i, region)| Slice {
            region: region.clone(),
            tokens: base + u64::from((i as u64) < remainder),
        })
        .collect())
}

/// What a static partition admits in one window when region `i` wants
/// `demand[i]` tokens: `Σ min(demand_i, slice_i)`.
pub fn admitted_under(slices: &[Slice], demand: &[u64]) -> u64 {
    slices
        .iter()
        .zip(demand)
        .map(|(s, d)| s.tokens.min(*d))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn regions(n: usize) -> Vec<RegionId> {
        (0..n)
            .map(|i| RegionId::new(format!("r{i}")).unwrap())
            .collect()
    }

    fn tokens(slices: &[Slice]) -> Vec<u64> {
        slices.iter().map(|s| s.tokens).collect()
    }

    #[test]
    fn the_remainder_goes_to_the_first_regions() {
        assert_eq!(
            tokens(&static_partition(1_000, &regions(3)).unwrap()),
            [334, 333, 333]
        );
        assert_eq!(
            tokens(&static_partition(11, &regions(3)).unwrap()),
            [4, 4, 3]
        );
        assert_eq!(
            tokens(&static_partition(10, &regions(3)).unwrap()),
            [4, 3, 3]
        );
        assert_eq!(tokens(&static_partition(5, &regions(5)).unwrap()), [1; 5]);
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        assert_eq!(static_partition(10, &[]), Err(PartitionError::NoRegions));
        assert_eq!(
            static_partition(2, &regions(3)),
            Err(PartitionError::LimitBelowRegionCount {
                limit: 2,
                regions: 3
            })
        );
        let mut twice = regions(2);
        twice.push(twice[0].clone());
        assert_eq!(
            static_partition(10, &twice),
            Err(PartitionError::DuplicateRegion("r0".into()))
        );
    }

    #[test]
    fn full_skew_caps_the_hot_region_at_one_kth() {
        // K = 3, L = 300: all demand in one region admits 100 of 300.
        let slices = static_partition(300, &regions(3)).unwrap();
        assert_eq!(admitted_under(&slices, &[1_000, 0, 0]), 100);
        let slices = static_partition(500, &regions(5)).unwrap();
        assert_eq!(admitted_under(&slices, &[1_000, 0, 0, 0, 0]), 100);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn slices_sum_to_the_limit_and_differ_by_at_most_one(k in 1usize..64, extra in 0u64..1_000_000) {
            let limit = k as u64 + extra;
            let slices = static_partition(limit, &regions(k)).unwrap();
            prop_assert_eq!(slices.iter().map(|s| s.tokens).sum::<u64>(), limit);
            let max = slices.iter().map(|s| s.tokens).max().unwrap();
            let min = slices.iter().map(|s| s.tokens).min().unwrap();
            prop_assert!(max - min <= 1 && min >= 1);
            // Non-increasing: the remainder went to the first regions.
            prop_assert!(slices.windows(2).all(|w| w[0].tokens >= w[1].tokens));
        }
    }
}
