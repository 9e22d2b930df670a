//! The demand-proportional split of a region-spanning tenant's weight.
//!
//! Law (largest remainder): with `D = Σ d_r > 0`, region r gets
//! `floor(w·d_r/D)` plus one of the `w − Σ floors` leftover units, which go
//! to the largest remainders `w·d_r mod D` (ties to the earlier region).
//! So `Σ shares = w` exactly and each share is within 1 of `w·d_r/D`.
//! Regions with no demand get 0. With no demand anywhere (`D = 0`, e.g. the
//! first window) the weight is split evenly, the remainder to the first
//! regions.

/// Splits `weight` across regions in proportion to `demands` (one entry per
/// region the tenant spans, in a fixed order); see the module law.
pub fn split_weight(weight: u64, demands: &[u64]) -> Vec<u64> {
    if demands.is_empty() {
        return Vec::new();
    }
    let total: u128 = demands.iter().map(|d| u128::from(*d)).sum();
    let w = u128::from(weight);
    if total == 0 {
        let n = demands.len() as u64;
        return (0..n)
            .map(|i| weight / n + u64::from(i < weight % n))
            .collect();
    }
    // (index, floor share, remainder numerator)
    let mut parts: Vec<(usize, u64, u128)> = demands
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let exact = w * u128::from(*d);
            // exact / total ≤ w, so it fits in u64.
            let floor = u64::try_from(exact / total).unwrap_or(weight);
            (i, floor, exact % total)
        })
        .collect();
    let assigned: u64 = parts.iter().map(|p| p.1).sum();
    let mut leftover = weight - assigned;
    let mut by_remainder: Vec<usize> = (0..parts.len()).collect();
    by_remainder.sort_by(|a, b| parts[*b].2.cmp(&parts[*a].2).then(a.cmp(b)));
    for i in by_remainder {
        if leftover == 0 {
            break;
        }
        if parts[i].2 > 0 {
            parts[i].1 += 1;
            leftover -= 1;
        }
    }
    parts.into_iter().map(|p| p.1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_by_demand() {
        assert_eq!(split_weight(2_000, &[300, 100]), vec![1_500, 500]);
        assert_eq!(split_weight(3, &[1, 1]), vec![2, 1]);
        assert_eq!(split_weight(10, &[0, 5]), vec![0, 10]);
        assert_eq!(split_weight(5, &[0, 0]), vec![3, 2]);
        assert_eq!(split_weight(7, &[]), Vec::<u64>::new());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn shares_sum_to_the_weight_and_track_demand(
            weight in 0u64..1_000_000,
            demands in proptest::collection::vec(0u64..1_000_000, 1..8),
        ) {
            let shares = split_weight(weight, &demands);
            prop_assert_eq!(shares.len(), demands.len());
            prop_assert_eq!(shares.iter().sum::<u64>(), weight);
            let total: u128 = demands.iter().map(|d| u128::from(*d)).sum();
            if total > 0 {
                for (s, d) in shares.iter().zip(&demands) {
                    // |s·D − w·d| < D: within one unit of the exact share.
                    let exact = u128::from(weight) * u128::from(*d);
                    prop_assert!((u128::from(*s) * total).abs_diff(exact) < total);
                    if *d == 0 {
                        prop_assert_eq!(*s, 0);
                    }
                }
            }
        }
    }
}
