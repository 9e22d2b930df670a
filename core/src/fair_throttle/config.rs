//! The parameters of a fair throttle, their defaults, and the typed error
//! every absurd value is refused with at construction.

use thiserror::Error;

/// The most levels a structure may have.
pub const MAX_LEVELS: u32 = 32;
/// The most buckets a level may have.
pub const MAX_BUCKETS: u32 = 1 << 24;
/// The most cells (`levels × buckets`) a structure may have (256 MiB).
pub const MAX_CELLS: u64 = 1 << 24;

/// The default increment `Pi`: 25 consecutive exhaustions take a cell from 0 to 1.
pub const DEFAULT_INCREMENT: f64 = 1.0 / 25.0;
/// The default decrement `Pd = Pi / 100`.
pub const DEFAULT_DECREMENT: f64 = DEFAULT_INCREMENT / 100.0;

/// How the levels' probabilities make the caller's throttle probability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LevelCombine {
    /// The least of the levels (a caller is throttled only as much as its
    /// least-shared cell): the default, and the one the collision bound holds for.
    #[default]
    Min,
    /// The mean of the levels: smoother, but a single shared cell raises it.
    Mean,
}

/// Why a fair-throttle configuration (or a caller id) was refused.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum FairThrottleError {
    /// `levels` was 0.
    #[error("levels must be at least 1")]
    ZeroLevels,
    /// `levels` was above [`MAX_LEVELS`].
    #[error("levels must be at most {max}, got {levels}")]
    TooManyLevels {
        /// What was asked.
        levels: u32,
        /// The bound.
        max: u32,
    },
    /// `buckets` was 0.
    #[error("buckets must be at least 1")]
    ZeroBuckets,
    /// `buckets` was above [`MAX_BUCKETS`].
    #[error("buckets must be at most {max}, got {buckets}")]
    TooManyBuckets {
        /// What was asked.
        buckets: u32,
        /// The bound.
        max: u32,
    },
    /// `levels × buckets` was above [`MAX_CELLS`].
    #[error("levels × buckets must be at most {max} cells, got {cells}")]
    TooManyCells {
        /// What was asked.
        cells: u64,
        /// The bound.
        max: u64,
    },
    /// The increment `Pi` was not in `(0, 1]` (or was NaN).
    #[error("the increment Pi must be in (0, 1], got {0}")]
    IncrementOutOfRange(f64),
    /// The decrement `Pd` was not in `(0, 1]` (or was NaN).
    #[error("the decrement Pd must be in (0, 1], got {0}")]
    DecrementOutOfRange(f64),
    /// The decay rate was negative, infinite or NaN.
    #[error("the decay rate must be finite and at least 0 per second, got {0}")]
    DecayRateOutOfRange(f64),
    /// The rotation interval was 0.
    #[error("the rotation interval must be at least 1 ms")]
    ZeroRotationInterval,
    /// The tuner's target collision probability was not in `(0, 1)` (or was NaN).
    #[error("the target collision probability must be in (0, 1), got {0}")]
    TargetOutOfRange(f64),
    /// With one bucket per level every caller shares every cell: no number of
    /// levels reaches the target.
    #[error("with {buckets} bucket(s) per level and {heavy_hitters} heavy hitter(s) no number of levels reaches the target")]
    TargetUnreachable {
        /// Buckets per level.
        buckets: u32,
        /// Expected heavy hitters.
        heavy_hitters: u64,
    },
    /// A caller id was empty.
    #[error("a caller id must not be empty")]
    EmptyCallerId,
}

/// The parameters of a fair throttle (both of its structures share them).
///
/// Defaults (the seed's): 3 levels × 1000 buckets, `Pi = 1/25`,
/// `Pd = Pi/100`, decay 0.01 per second, rotation every 5 minutes, `Min`.
/// A cell is 16 bytes, so the default structure holds 48 000 bytes of cells
/// and the live + shadow pair 96 000.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FairThrottleConfig {
    /// Levels `L`: each caller owns one cell per level.
    pub levels: u32,
    /// Buckets `B` per level.
    pub buckets: u32,
    /// `Pi`: what a resource-exhaustion outcome adds to each of the caller's cells.
    pub increment: f64,
    /// `Pd`: what a success subtracts from each of the caller's cells.
    pub decrement: f64,
    /// `λ`: a cell's probability decays as `p · e^(−λ·Δt)` (`Δt` in seconds).
    pub decay_per_sec: f64,
    /// How long a structure stays live before its shadow replaces it.
    pub rotation_interval_ms: u64,
    /// How the levels' probabilities combine.
    pub combine: LevelCombine,
}

impl Default for FairThrottleConfig {
    fn default() -> Self {
        FairThrottleConfig {
            levels: 3,
            buckets: 1000,
            increment: DEFAULT_INCREMENT,
            decrement: DEFAULT_DECREMENT,
            decay_per_sec: 0.01,
            rotation_interval_ms: 5 * 60 * 1000,
            combine: LevelCombine::Min,
        }
    }
}

impl FairThrottleConfig {
    /// Refuses every value the structure cannot work with (see
    /// [`FairThrottleError`]); never panics.
    pub fn validate(&self) -> Result<(), FairThrottleError> {
        if self.levels == 0 {
            return Err(FairThrottleError::ZeroLevels);
        }
        if self.levels > MAX_LEVELS {
            return Err(FairThrottleError::TooManyLevels {
                levels: self.levels,
                max: MAX_LEVELS,
            });
        }
        if self.buckets == 0 {
            return Err(FairThrottleError::ZeroBuckets);
        }
        if self.buckets > MAX_BUCKETS {
            return Err(FairThrottleError::TooManyBuckets {
                buckets: self.buckets,
                max: MAX_BUCKETS,
            });
        }
        let cells = self.cells();
        if cells > MAX_CELLS {
            return Err(FairThrottleError::TooManyCells {
                cells,
                max: MAX_CELLS,
            });
        }
        if !(self.increment > 0.0 && self.increment <= 1.0) {
            return Err(FairThrottleError::IncrementOutOfRange(self.increment));
        }
        if !(self.decrement > 0.0 && self.decrement <= 1.0) {
            return Err(FairThrottleError::DecrementOutOfRange(self.decrement));
        }
        if !(self.decay_per_sec.is_finite() && self.decay_per_sec >= 0.0) {
            return Err(FairThrottleError::DecayRateOutOfRange(self.decay_per_sec));
        }
        if self.rotation_interval_ms == 0 {
            return Err(FairThrottleError::ZeroRotationInterval);
        }
        Ok(())
    }

    /// `levels × buckets`.
    pub fn cells(&self) -> u64 {
        u64::from(self.levels) * u64::from(self.buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_match_the_seed() {
        let config = FairThrottleConfig::default();
        assert_eq!(config.validate(), Ok(()));
        assert!((config.increment * 25.0 - 1.0).abs() < 1e-12);
        assert!((config.increment / config.decrement - 100.0).abs() < 1e-9);
        assert_eq!(config.structure_bytes(), 48_000);
    }

    #[test]
    fn absurd_values_get_typed_errors() {
        let ok = FairThrottleConfig::default();
        let cases: Vec<(FairThrottleConfig, FairThrottleError)> = vec![
            (
                FairThrottleConfig { levels: 0, ..ok },
                FairThrottleError::ZeroLevels,
            ),
            (
                FairThrottleConfig { levels: 33, ..ok },
                FairThrottleError::TooManyLevels {
                    levels: 33,
                    max: MAX_LEVELS,
                },
            ),
            (
                FairThrottleConfig { buckets: 0, ..ok },
                FairThrottleError::ZeroBuckets,
            ),
            (
                FairThrottleConfig {
                    buckets: u32::MAX,
                    ..ok
                },
                FairThrottleError::TooManyBuckets {
                    buckets: u32::MAX,
                    max: MAX_BUCKETS,
                },
            ),
            (
                FairThrottleConfig {
                    levels: 32,
                    buckets: MAX_BUCKETS,
                    ..ok
                },
                FairThrottleError::TooManyCells {
                    cells: 32 * u64::from(MAX_BUCKETS),
                    max: MAX_CELLS,
                },
            ),
            (
                FairThrottleConfig {
                    increment: 1.5,
                    ..ok
                },
                FairThrottleError::IncrementOutOfRange(1.5),
            ),
            (
                FairThrottleConfig {
                    increment: 0.0,
                    ..ok
                },
                FairThrottleError::IncrementOutOfRange(0.0),
            ),
            (
                FairThrottleConfig {
                    decrement: 0.0,
                    ..ok
                },
                FairThrottleError::DecrementOutOfRange(0.0),
            ),
            (
                FairThrottleConfig {
                    decrement: -0.1,
                    ..ok
                },
                FairThrottleError::DecrementOutOfRange(-0.1),
            ),
            (
                FairThrottleConfig {
                    decay_per_sec: f64::INFINITY,
                    ..ok
                },
                FairThrottleError::DecayRateOutOfRange(f64::INFINITY),
            ),
            (
                FairThrottleConfig {
                    decay_per_sec: -1.0,
                    ..ok
                },
                FairThrottleError::DecayRateOutOfRange(-1.0),
            ),
            (
                FairThrottleConfig {
                    rotation_interval_ms: 0,
                    ..ok
                },
                FairThrottleError::ZeroRotationInterval,
            ),
        ];
        for (config, expected) in cases {
            assert_eq!(config.validate(), Err(expected), "{config:?}");
        }
    }

    #[test]
    fn nan_is_refused_everywhere() {
        let ok = FairThrottleConfig::default();
        for config in [
            FairThrottleConfig {
                increment: f64::NAN,
                ..ok
            },
            FairThrottleConfig {
                decrement: f64::NAN,
                ..ok
            },
            FairThrottleConfig {
                decay_per_sec: f64::NAN,
                ..ok
            },
        ] {
            let err = config.validate().unwrap_err();
            assert!(
                matches!(
                    err,
                    FairThrottleError::IncrementOutOfRange(v)
                        | FairThrottleError::DecrementOutOfRange(v)
                        | FairThrottleError::DecayRateOutOfRange(v) if v.is_nan()
                ),
                "{err:?}"
            );
        }
    }
}
