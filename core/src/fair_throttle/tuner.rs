//! Picking the number of levels from the expected number of heavy hitters
//! `M`, the buckets per level `B` and the target probability `p` that an
//! innocent caller shares all its cells with some heavy hitter.
//!
//! With independent levels, one level's bucket of an innocent caller holds
//! at least one of `M` heavy hitters with probability `1 − (1 − 1/B)^M`, so
//!
//! ```text
//! P(collide on all levels) = (1 − (1 − 1/B)^M)^L
//! L = max(3, ⌈ln p / ln(1 − (1 − 1/B)^M)⌉)
//! ```
//!
//! e.g. 4 levels for `(M = 100, B = 512, p = 1e-3)` and 3 for
//! `(M = 1, B = 1000, p = 1e-4)`.
//! Law: the tuned `L` is the least `L ≥ 3` whose collision probability is
//! at most `p` (property-tested below).

use super::config::{FairThrottleConfig, FairThrottleError, MAX_BUCKETS, MAX_LEVELS};

/// The fewest levels the tuner ever picks.
pub const MIN_TUNED_LEVELS: u32 = 3;

/// `1 − (1 − 1/B)^M`: the chance one level's bucket holds a heavy hitter.
pub fn level_collision_probability(heavy_hitters: u64, buckets: u32) -> f64 {
    if buckets == 0 {
        return 1.0;
    }
    let per_bucket = (-1.0 / f64::from(buckets)).ln_1p();
    -(heavy_hitters as f64 * per_bucket).exp_m1()
}

/// `(1 − (1 − 1/B)^M)^L`: the chance an innocent caller shares all `L` of
/// its cells with heavy hitters.
pub fn all_level_collision_probability(heavy_hitters: u64, buckets: u32, levels: u32) -> f64 {
    level_collision_probability(heavy_hitters, buckets).powi(levels as i32)
}

/// The least `L ≥ 3` with collision probability at most `target`.
pub fn tuned_levels(
    heavy_hitters: u64,
    buckets: u32,
    target: f64,
) -> Result<u32, FairThrottleError> {
    if !(target > 0.0 && target < 1.0) {
        return Err(FairThrottleError::TargetOutOfRange(target));
    }
    if buckets == 0 {
        return Err(FairThrottleError::ZeroBuckets);
    }
    if buckets > MAX_BUCKETS {
        return Err(FairThrottleError::TooManyBuckets {
            buckets,
            max: MAX_BUCKETS,
        });
    }
    let q = level_collision_probability(heavy_hitters, buckets);
    if q <= 0.0 {
        return Ok(MIN_TUNED_LEVELS);
    }
    if q >= 1.0 {
        return Err(FairThrottleError::TargetUnreachable {
            buckets,
            heavy_hitters,
        });
    }
    let estimate = (target.ln() / q.ln()).ceil();
    if !estimate.is_finite() || estimate > f64::from(MAX_LEVELS) + 1.0 {
        return Err(FairThrottleError::TooManyLevels {
            levels: u32::MAX,
            max: MAX_LEVELS,
        });
    }
    // The ceiling of a float ratio can be off by one at exact boundaries:
    // settle on the least L that really meets the target.
    let mut levels = (estimate as u32).max(1);
    while levels > 1 && q.powi(levels as i32 - 1) <= target {
        levels -= 1;
    }
    while q.powi(levels as i32) > target {
        levels += 1;
    }
    let levels = levels.max(MIN_TUNED_LEVELS);
    if levels > MAX_LEVELS {
        return Err(FairThrottleError::TooManyLevels {
            levels,
            max: MAX_LEVELS,
        });
    }
    Ok(levels)
}

/// Buckets per level for a population of `callers` distinct callers per
/// rotation interval: one per caller, so a cell holds about one caller
/// (never fewer than the default 1 000, never more than the cell limit
/// allows at the default 3 levels).
pub fn buckets_for_population(callers: u64) -> u32 {
    let most = (super::config::MAX_CELLS / u64::from(MIN_TUNED_LEVELS)) as u32;
    let least = FairThrottleConfig::default().buckets;
    u32::try_from(callers)
        .unwrap_or(u32::MAX)
        .clamp(least, most)
}

impl FairThrottleConfig {
    /// The default configuration sized to `callers` distinct callers per
    /// rotation interval ([`buckets_for_population`]): memory grows with
    /// the population (`2 × 3 × B × 16` bytes: 9.6 MB for 100 000
    /// callers) and in return a modest caller rarely shares a cell with a
    /// heavy one. See docs/fair-throttle.md, "At scale".
    pub fn for_population(callers: u64) -> Result<Self, FairThrottleError> {
        let config = FairThrottleConfig {
            buckets: buckets_for_population(callers),
            ..FairThrottleConfig::default()
        };
        config.validate()?;
        Ok(config)
    }

    /// The default configuration with `buckets` and the tuned number of
    /// levels (see [`tuned_levels`]).
    pub fn tuned(heavy_hitters: u64, buckets: u32, target: f64) -> Result<Self, FairThrottleError> {
        let config = FairThrottleConfig {
            levels: tuned_levels(heavy_hitters, buckets, target)?,
            buckets,
            ..FairThrottleConfig::default()
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn population_sizing_gives_a_bucket_per_caller_within_bounds() {
        assert_eq!(buckets_for_population(10), 1_000);
        assert_eq!(buckets_for_population(100_000), 100_000);
        assert_eq!(buckets_for_population(u64::MAX), (1 << 24) / 3);
        let config = FairThrottleConfig::for_population(u64::MAX).unwrap();
        assert!(u64::from(config.levels) * u64::from(config.buckets) <= 1 << 24);
        assert_eq!(
            FairThrottleConfig::for_population(100_000).unwrap().buckets,
            100_000
        );
    }

    #[test]
    fn reproduces_the_seeds_figures() {
        let one = all_level_collision_probability(1, 512, 4);
        assert!((one - 1.5e-11).abs() < 0.1e-11, "{one}");
        let hundred = all_level_collision_probability(100, 512, 4);
        assert!((hundred - 1e-3).abs() < 0.1e-3, "{hundred}");
        assert_eq!(tuned_levels(100, 512, 1e-3), Ok(4));
        assert_eq!(tuned_levels(1, 1000, 1e-4), Ok(3));
        assert_eq!(tuned_levels(0, 1000, 1e-4), Ok(3));
        assert_eq!(tuned_levels(100, 1000, 1e-5), Ok(5));
    }

    #[test]
    fn refuses_what_it_cannot_tune() {
        assert_eq!(
            tuned_levels(10, 1000, 0.0),
            Err(FairThrottleError::TargetOutOfRange(0.0))
        );
        assert!(matches!(
            tuned_levels(10, 1000, f64::NAN),
            Err(FairThrottleError::TargetOutOfRange(v)) if v.is_nan()
        ));
        assert_eq!(
            tuned_levels(10, 0, 1e-3),
            Err(FairThrottleError::ZeroBuckets)
        );
        assert_eq!(
            tuned_levels(10, 1, 1e-3),
            Err(FairThrottleError::TargetUnreachable {
                buckets: 1,
                heavy_hitters: 10
            })
        );
        assert!(matches!(
            tuned_levels(64, 16, 1e-9),
            Err(FairThrottleError::TooManyLevels { .. })
        ));
    }

    proptest! {
        /// The tuned L is the least L ≥ 3 meeting the target.
        #[test]
        fn tuned_levels_is_the_least_that_meets_the_target(
            heavy in 0u64..2_000,
            buckets in 2u32..5_000,
            exponent in 1.0f64..12.0,
        ) {
            let target = 10f64.powf(-exponent);
            if let Ok(levels) = tuned_levels(heavy, buckets, target) {
                prop_assert!(levels >= MIN_TUNED_LEVELS);
                prop_assert!(all_level_collision_probability(heavy, buckets, levels) <= target);
                if levels > MIN_TUNED_LEVELS {
                    prop_assert!(all_level_collision_probability(heavy, buckets, levels - 1) > target);
                }
                prop_assert!(FairThrottleConfig::tuned(heavy, buckets, target).is_ok());
            } else {
                // Refused only when even MAX_LEVELS levels miss the target.
                prop_assert!(all_level_collision_probability(heavy, buckets, MAX_LEVELS) > target);
            }
        }
    }
}
