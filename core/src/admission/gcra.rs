//! The generic cell rate algorithm (GCRA): at most `limit` requests per
//! `period_ms`, with a burst of up to `limit` after an idle period.
//!
//! State is one number, the theoretical arrival time (TAT). Time is kept in
//! ticks of `1/limit` ms, so the emission interval `period_ms / limit` is
//! an exact integer (`period_ms` ticks) whatever the ratio.
//!
//! Laws (property-tested below):
//! - **bounded admission**: starting idle at `t0`, the units admitted by
//!   time `t` are at most `limit + floor((t - t0) · limit / period_ms)`;
//! - **denials change nothing**: a denied `try_acquire` leaves the state as
//!   it was;
//! - **a denial's wait suffices**: retrying the same cost after
//!   `retry_after_ms` (with nothing admitted meanwhile) is allowed;
//! - **refund undoes**: `try_acquire(now, n)` then `refund(now, n)` leaves
//!   a state that admits exactly what the original would.

use super::AdmissionConfigError;
use crate::decision::Decision;

/// Parameters of a [`Gcra`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcraParams {
    /// Requests per period, and the largest burst (≥ 1).
    pub limit: u64,
    /// The period in milliseconds (≥ 1).
    pub period_ms: u64,
}

impl GcraParams {
    /// Checks that both numbers are at least 1.
    pub fn validate(&self) -> Result<(), AdmissionConfigError> {
        if self.limit == 0 {
            return Err(AdmissionConfigError::NotPositive("gcra limit"));
        }
        if self.period_ms == 0 {
            return Err(AdmissionConfigError::NotPositive("gcra period_ms"));
        }
        Ok(())
    }
}

/// One key's GCRA state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gcra {
    params: GcraParams,
    /// Theoretical arrival time, in ticks of `1/limit` ms.
    tat_ticks: u128,
}

impl Gcra {
    /// A fresh, idle state (a full burst is available).
    pub fn new(params: GcraParams) -> Result<Self, AdmissionConfigError> {
        params.validate()?;
        Ok(Gcra {
            params,
            tat_ticks: 0,
        })
    }

    /// The parameters.
    pub fn params(&self) -> GcraParams {
        self.params
    }

    fn now_ticks(&self, now_ms: u64) -> u128 {
        now_ms as u128 * self.params.limit as u128
    }

    /// The emission interval of one unit, in ticks.
    fn interval(&self) -> u128 {
        self.params.period_ms as u128
    }

    /// The span a full burst covers, in ticks.
    fn burst_span(&self) -> u128 {
        self.params.limit as u128 * self.interval()
    }

    /// Takes `cost` units at `now_ms` if the rate allows it.
    pub fn try_acquire(&mut self, now_ms: u64, cost: u64) -> Decision {
        let now = self.now_ticks(now_ms);
        let limit = self.params.limit as u128;
        let new_tat = self.tat_ticks.max(now) + cost as u128 * self.interval();
        let horizon = now + self.burst_span();
        if new_tat <= horizon {
            self.tat_ticks = new_tat;
            Decision {
                allowed: true,
                limit: self.params.limit,
                remaining: to_u64((horizon - new_tat) / self.interval()),
                reset_at_ms: to_u64(new_tat.div_ceil(limit)),
                retry_after_ms: 0,
            }
        } else {
            let current = self.tat_ticks.max(now);
            Decision {
                allowed: false,
                limit: self.params.limit,
                remaining: to_u64(horizon.saturating_sub(current) / self.interval()),
                reset_at_ms: to_u64(current.div_ceil(limit)),
                retry_after_ms: to_u64((new_tat - horizon).div_ceil(limit)).max(1),
            }
        }
    }

    /// What [`try_acquire`](Self::try_acquire) would decide for `cost`
    /// units at `now_ms`, taking nothing: the wait of an axis asked after
    /// an earlier one denied.
    pub fn peek(&self, now_ms: u64, cost: u64) -> Decision {
        self.clone().try_acquire(now_ms, cost)
    }

    /// Gives back `cost` units taken at or before `now_ms` (a later axis
    /// denied the request). Never makes more than a full burst available.
    pub fn refund(&mut self, now_ms: u64, cost: u64) {
        let now = self.now_ticks(now_ms);
        let back = cost as u128 * self.interval();
        self.tat_ticks = self
            .tat_ticks
            .saturating_sub(back)
            .max(now.min(self.tat_ticks));
    }

    /// Whether the state equals a fresh one at `now_ms` (a full burst is
    /// available), so the key can be forgotten.
    pub fn is_idle(&self, now_ms: u64) -> bool {
        self.tat_ticks <= self.now_ticks(now_ms)
    }
}

fn to_u64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gcra(limit: u64, period_ms: u64) -> Gcra {
        Gcra::new(GcraParams { limit, period_ms }).unwrap()
    }

    #[test]
    fn a_full_burst_then_one_per_interval() {
        let mut g = gcra(60, 60_000);
        for i in 0..60 {
            let d = g.try_acquire(1_000_000, 1);
            assert!(d.allowed, "request {i}");
            assert_eq!(d.remaining, 59 - i);
        }
        let denied = g.try_acquire(1_000_000, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 1_000);
        assert!(g.try_acquire(1_001_000, 1).allowed);
        assert!(!g.try_acquire(1_001_000, 1).allowed);
    }

    #[test]
    fn zero_limit_or_period_is_refused() {
        assert!(Gcra::new(GcraParams {
            limit: 0,
            period_ms: 1
        })
        .is_err());
        assert!(Gcra::new(GcraParams {
            limit: 1,
            period_ms: 0
        })
        .is_err());
    }

    #[test]
    fn a_cost_above_the_burst_is_always_denied_without_panicking() {
        let mut g = gcra(5, 1_000);
        let d = g.try_acquire(0, u64::MAX);
        assert!(!d.allowed);
        assert!(g.try_acquire(0, 5).allowed);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn admissions_never_exceed_burst_plus_rate(
            limit in 1u64..50, period_ms in 1u64..5_000,
            steps in proptest::collection::vec((0u64..400, 1u64..4), 1..200),
        ) {
            let mut g = gcra(limit, period_ms);
            let t0 = 10_000u64;
            let (mut now, mut admitted) = (t0, 0u128);
            for (gap, cost) in steps {
                now += gap;
                if g.try_acquire(now, cost).allowed {
                    admitted += cost as u128;
                }
                let bound = limit as u128 + (now - t0) as u128 * limit as u128 / period_ms as u128;
                prop_assert!(admitted <= bound, "admitted {} > bound {}", admitted, bound);
            }
        }

        #[test]
        fn a_denial_changes_nothing_and_its_wait_suffices(
            limit in 1u64..50, period_ms in 1u64..5_000,
            burst in 0u64..100, cost in 1u64..50, now in 0u64..1_000_000,
        ) {
            prop_assume!(cost <= limit);
            let mut g = gcra(limit, period_ms);
            for _ in 0..burst { g.try_acquire(now, 1); }
            let before = g.clone();
            let d = g.try_acquire(now, cost);
            if !d.allowed {
                prop_assert_eq!(&g, &before);
                prop_assert!(d.retry_after_ms >= 1);
                prop_assert!(g.try_acquire(now + d.retry_after_ms, cost).allowed);
            }
        }

        #[test]
        fn refund_restores_what_a_fresh_acquire_would_see(
            limit in 1u64..50, period_ms in 1u64..5_000,
            burst in 0u64..100, cost in 1u64..10, probe in 1u64..60, now in 0u64..1_000_000,
        ) {
            let mut g = gcra(limit, period_ms);
            for _ in 0..burst { g.try_acquire(now, 1); }
            let mut original = g.clone();
            if g.try_acquire(now, cost).allowed {
                g.refund(now, cost);
            }
            prop_assert_eq!(g.try_acquire(now, probe), original.try_acquire(now, probe));
        }
    }
}
