//! The static-partition baseline: a budget L split once, evenly, among K
//! regions, with no coordination at all.
//!
//! It is exact (`Σ slices = L`, so Δ = 0) but not work conserving: under
//! full skew the hot region is capped at about `L/K` while the others'
//! slices go unused. Leasing from the coordinator exists to beat it; tests,
//! the client's `StaticPartition` and `leasehold demo` all take their
//! shares from this one rule.
//!
//! Law: `base = floor(L/K)`, `remainder = L − base·K`. Regions are ranked
//! by their sorted id (byte-wise, as [`RegionId`] orders); the region of
//! rank `r` (0-based) gets `base + 1` if `r < remainder`, else `base`.
//! Hence `Σ = L`, any two slices differ by at most 1, and a region's share
//! depends only on the set of regions, never on the order a process lists
//! them in — every process computes the same split.

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

/// Splits `limit` among `regions` by the module law: each region's share
/// follows its rank in sorted id order. The result lists the regions in
/// the order given (slice `i` is `regions[i]`'s), so it zips with anything
/// indexed like the input, as [`admitted_under`] does.
pub fn static_partition(limit: u64, regions: &[RegionId]) -> Result<Vec<Slice>, PartitionError> {
    if regions.is_empty() {
        return Err(PartitionError::NoRegions);
    }
    // Input positions in sorted id order: `by_rank[r]` is the rank-`r` region.
    let mut by_rank: Vec<usize> = (0..regions.len()).collect();
    by_rank.sort_by(|a, b| regions[*a].cmp(&regions[*b]));
    if let Some(pair) = by_rank.windows(2).find(|p| regions[p[0]] == regions[p[1]]) {
        return Err(PartitionError::DuplicateRegion(
            regions[pair[0]].as_str().to_owned(),
        ));
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
    let mut tokens = vec![base; regions.len()];
    for (rank, position) in by_rank.into_iter().enumerate() {
        tokens[position] += u64::from((rank as u64) < remainder);
    }
    Ok(regions
        .iter()
        .zip(tokens)
        .map(|(region, tokens)| Slice {
            region: region.clone(),
            tokens,
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
    fn the_remainder_follows_sorted_rank_not_listing_order() {
        let named = |names: &[&str]| -> Vec<RegionId> {
            names.iter().map(|n| RegionId::new(*n).unwrap()).collect()
        };
        // "ap" < "eu" < "us": ap and eu take the two remainder tokens.
        let slices = static_partition(11, &named(&["us", "eu", "ap"])).unwrap();
        assert_eq!(tokens(&slices), [3, 4, 4]);
        assert_eq!(slices[0].region.as_str(), "us");
        // Byte-wise order: "r10" ranks before "r2".
        let slices = static_partition(4, &named(&["r2", "r10", "r3"])).unwrap();
        assert_eq!(tokens(&slices), [1, 2, 1]);
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

    fn by_region(slices: &[Slice]) -> std::collections::BTreeMap<String, u64> {
        slices
            .iter()
            .map(|s| (s.region.as_str().to_owned(), s.tokens))
            .collect()
    }

    /// Distinct region ids, arbitrary names (so sorted order differs from
    /// generation order), with a limit of at least one token each.
    fn regions_and_limit() -> impl Strategy<Value = (Vec<RegionId>, u64)> {
        proptest::collection::btree_set("[a-z0-9]{1,8}", 1..48).prop_flat_map(|names| {
            let k = names.len() as u64;
            let regions: Vec<RegionId> = names
                .into_iter()
                .map(|n| RegionId::new(n).unwrap())
                .collect();
            (Just(regions).prop_shuffle(), k..k + 100_000)
        })
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
            // Non-increasing in sorted id order: the remainder went to the
            // first regions by rank ("r10" < "r2", so not the listing order).
            let mut ranked = slices.clone();
            ranked.sort_by(|a, b| a.region.cmp(&b.region));
            prop_assert!(ranked.windows(2).all(|w| w[0].tokens >= w[1].tokens));
        }

        /// Shares sum to the limit, and permuting the input changes no
        /// region's share: every process computes the same split.
        #[test]
        fn shares_sum_to_the_limit_whatever_the_listing_order(
            (regions, limit) in regions_and_limit(),
            seed in any::<u64>(),
        ) {
            let slices = static_partition(limit, &regions).unwrap();
            prop_assert_eq!(slices.iter().map(|s| s.tokens).sum::<u64>(), limit);
            // The result follows the input order.
            prop_assert!(slices.iter().zip(&regions).all(|(s, r)| &s.region == r));
            // Another listing of the same regions: reversed, then rotated.
            let mut permuted = regions.clone();
            permuted.reverse();
            let len = permuted.len();
            permuted.rotate_left((seed % len as u64) as usize);
            let again = static_partition(limit, &permuted).unwrap();
            prop_assert_eq!(by_region(&slices), by_region(&again));
            // And the sorted listing, whose shares are non-increasing.
            let mut sorted = regions.clone();
            sorted.sort();
            let ranked = static_partition(limit, &sorted).unwrap();
            prop_assert_eq!(by_region(&slices), by_region(&ranked));
            prop_assert!(ranked.windows(2).all(|w| w[0].tokens >= w[1].tokens));
        }
    }
}
