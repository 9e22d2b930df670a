//! The token bucket: up to `capacity` tokens, refilled continuously at
//! `refill_per_sec` tokens per second; a request of cost `n` takes `n`.
//!
//! The level is kept in millitokens, so a refill of `r` tokens per second
//! adds exactly `r` millitokens per millisecond: integer arithmetic, no
//! drift.
//!
//! Laws (property-tested below):
//! - **bounded admission**: starting full at `t0`, the tokens admitted by
//!   time `t` are at most `capacity + floor((t - t0) · refill_per_sec / 1000)`;
//! - **denials change nothing** observable: a denied `try_acquire` leaves
//!   the level as it was (only the refill up to `now` is applied);
//! - **a denial's wait suffices**: retrying the same cost after
//!   `retry_after_ms` is allowed;
//! - **refund undoes**, and the level never exceeds `capacity`.

use super::AdmissionConfigError;
use crate::decision::Decision;

/// Parameters of a [`TokenBucket`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucketParams {
    /// Largest number of tokens held (≥ 1); also the largest cost that can
    /// ever be admitted.
    pub capacity: u64,
    /// Tokens added per second (≥ 1).
    pub refill_per_sec: u64,
}

impl TokenBucketParams {
    /// Checks that both numbers are at least 1.
    pub fn validate(&self) -> Result<(), AdmissionConfigError> {
        if self.capacity == 0 {
            return Err(AdmissionConfigError::NotPositive("token bucket capacity"));
        }
        if self.refill_per_sec == 0 {
            return Err(AdmissionConfigError::NotPositive(
                "token bucket refill_per_sec",
            ));
        }
        Ok(())
    }
}

const MILLI: u128 = 1_000;

/// One key's token bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    params: TokenBucketParams,
    level_milli: u128,
    updated_ms: u64,
}

impl TokenBucket {
    /// A full bucket, last updated at `now_ms`.
    pub fn new(params: TokenBucketParams, now_ms: u64) -> Result<Self, AdmissionConfigError> {
        params.validate()?;
        Ok(TokenBucket {
            params,
            level_milli: params.capacity as u128 * MILLI,
            updated_ms: now_ms,
        })
    }

    /// The parameters.
    pub fn params(&self) -> TokenBucketParams {
        self.params
    }

    fn capacity_milli(&self) -> u128 {
        self.params.capacity as u128 * MILLI
    }

    /// Applies the refill up to `now_ms` (a clock going backwards adds nothing).
    fn refill(&mut self, now_ms: u64) {
        if now_ms > self.updated_ms {
            let added = (now_ms - self.updated_ms) as u128 * self.params.refill_per_sec as u128;
            self.level_milli = (self.level_milli + added).min(self.capacity_milli());
            self.updated_ms = now_ms;
        }
    }

    /// Whole tokens available at `now_ms`.
    pub fn available(&mut self, now_ms: u64) -> u64 {
        self.refill(now_ms);
        to_u64(self.level_milli / MILLI)
    }

    /// Takes `cost` tokens at `now_ms` if the bucket holds them.
    pub fn try_acquire(&mut self, now_ms: u64, cost: u64) -> Decision {
        self.refill(now_ms);
        let need = cost as u128 * MILLI;
        let rate = self.params.refill_per_sec as u128;
        if need <= self.level_milli {
            self.level_milli -= need;
            let missing = self.capacity_milli() - self.level_milli;
            Decision {
                allowed: true,
                limit: self.params.capacity,
                remaining: to_u64(self.level_milli / MILLI),
                reset_at_ms: now_ms.saturating_add(to_u64(missing.div_ceil(rate))),
                retry_after_ms: 0,
            }
        } else {
            let missing = self.capacity_milli() - self.level_milli;
            Decision {
                allowed: false,
                limit: self.params.capacity,
                remaining: to_u64(self.level_milli / MILLI),
                reset_at_ms: now_ms.saturating_add(to_u64(missing.div_ceil(rate))),
                retry_after_ms: to_u64((need - self.level_milli).div_ceil(rate)).max(1),
            }
        }
    }

    /// What [`try_acquire`](Self::try_acquire) would decide for `cost`
    /// units at `now_ms`, taking nothing: the wait of an axis asked after
    /// an earlier one denied.
    pub fn peek(&self, now_ms: u64, cost: u64) -> Decision {
        self.clone().try_acquire(now_ms, cost)
    }

    /// Gives back `cost` tokens (a later axis denied the request); the
    /// level stays at most `capacity`.
    pub fn refund(&mut self, now_ms: u64, cost: u64) {
        self.refill(now_ms);
        self.level_milli = (self.level_milli + cost as u128 * MILLI).min(self.capacity_milli());
    }

    /// Whether the bucket is full at `now_ms`, so the key can be forgotten.
    pub fn is_idle(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        self.level_milli == self.capacity_milli()
    }
}

fn to_u64(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bucket(capacity: u64, refill_per_sec: u64) -> TokenBucket {
        TokenBucket::new(
            TokenBucketParams {
                capacity,
                refill_per_sec,
            },
            0,
        )
        .unwrap()
    }

    #[test]
    fn drains_then_refills_at_the_configured_rate() {
        let mut b = bucket(100_000, 1_667);
        assert!(b.try_acquire(0, 100_000).allowed);
        let d = b.try_acquire(0, 1_667);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms, 1_000);
        assert!(b.try_acquire(1_000, 1_667).allowed);
        assert_eq!(b.available(1_000), 0);
    }

    #[test]
    fn zero_parameters_are_refused() {
        let zero_cap = TokenBucketParams {
            capacity: 0,
            refill_per_sec: 1,
        };
        assert!(TokenBucket::new(zero_cap, 0).is_err());
        let zero_rate = TokenBucketParams {
            capacity: 1,
            refill_per_sec: 0,
        };
        assert!(TokenBucket::new(zero_rate, 0).is_err());
    }

    #[test]
    fn a_clock_going_backwards_adds_nothing() {
        let mut b = bucket(10, 1);
        assert!(b.try_acquire(5_000, 10).allowed);
        assert!(!b.try_acquire(1_000, 1).allowed);
        assert!(b.try_acquire(6_000, 1).allowed);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn admissions_never_exceed_capacity_plus_refill(
            capacity in 1u64..1_000, refill in 1u64..5_000,
            steps in proptest::collection::vec((0u64..300, 1u64..200), 1..200),
        ) {
            let mut b = bucket(capacity, refill);
            let (mut now, mut admitted) = (0u64, 0u128);
            for (gap, cost) in steps {
                now += gap;
                if b.try_acquire(now, cost).allowed {
                    admitted += cost as u128;
                }
                let bound = capacity as u128 + now as u128 * refill as u128 / 1_000;
                prop_assert!(admitted <= bound);
                prop_assert!(b.available(now) <= capacity);
            }
        }

        #[test]
        fn a_denial_changes_nothing_and_its_wait_suffices(
            capacity in 1u64..1_000, refill in 1u64..5_000,
            drain in 0u64..1_000, cost in 1u64..1_000, now in 0u64..100_000,
        ) {
            prop_assume!(cost <= capacity);
            let mut b = bucket(capacity, refill);
            b.try_acquire(now, drain.min(capacity));
            let before = b.clone();
            let d = b.try_acquire(now, cost);
            if !d.allowed {
                prop_assert_eq!(&b, &before);
                prop_assert!(b.try_acquire(now + d.retry_after_ms, cost).allowed);
            }
        }

        #[test]
        fn refund_undoes_an_acquire(
            capacity in 1u64..1_000, refill in 1u64..5_000,
            drain in 0u64..1_000, cost in 1u64..100, probe in 1u64..1_000, now in 0u64..100_000,
        ) {
            let mut b = bucket(capacity, refill);
            b.try_acquire(now, drain.min(capacity));
            let mut original = b.clone();
            if b.try_acquire(now, cost).allowed {
                b.refund(now, cost);
            }
            prop_assert_eq!(b.try_acquire(now, probe), original.try_acquire(now, probe));
        }
    }
}
