//! The concurrency axis: a process-wide ceiling on requests in flight whose
//! limit adapts to what the service can take.
//!
//! Two update rules, both clamped to `min_limit..=max_limit`:
//! - [`LimitRule::Aimd`]: additive increase (+1 after a success that found
//!   the ceiling at least half used), multiplicative decrease (× `backoff`)
//!   on a dropped request;
//! - [`LimitRule::Gradient`]: the ratio of the long-run to the latest
//!   latency scales the limit (× `backoff` on a drop), plus a headroom of
//!   `√limit` so it can grow when latency is flat; smoothed.
//!
//! Laws (property-tested below):
//! - **bounded**: the limit stays within `min_limit..=max_limit`, and an
//!   acquire is allowed only while `in_flight < limit`;
//! - **drops contract**: a release with `dropped = true` never raises the
//!   limit, and lowers it unless it is already `min_limit`;
//! - **conservation**: `in_flight` equals acquires allowed minus releases.
//! - **an honest wait**: a denial's `retry_after_ms` is the shortest wait
//!   after which enough slots have freed for one more request with
//!   probability [`SLOT_FREE_CONFIDENCE`], each request in flight ending
//!   after a latency drawn from the last [`LATENCY_SAMPLES`] completed ones
//!   given how long it has run already (one that has run longer than every
//!   sample is expected to end a median latency from now). With constant
//!   latencies a denied request retried after its wait finds a slot free,
//!   and not a millisecond earlier (property below). Until a request has
//!   completed the caller's fallback is returned.

use std::collections::{BTreeMap, VecDeque};

use super::AdmissionConfigError;
use crate::decision::Decision;

/// How the limit adapts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimitRule {
    /// Additive increase, multiplicative decrease.
    Aimd {
        /// The factor applied on a drop, in `(0, 1)` (0.9 is typical).
        backoff: f64,
    },
    /// Gradient on latency (long-run average over latest sample).
    Gradient {
        /// The factor applied on a drop, in `(0, 1)`.
        backoff: f64,
        /// Weight of a new sample in the smoothed limit, in `(0, 1]`.
        smoothing: f64,
    },
}

/// Parameters of a [`ConcurrencyLimit`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConcurrencyParams {
    /// The floor (≥ 1).
    pub min_limit: u64,
    /// The ceiling (≥ `min_limit`).
    pub max_limit: u64,
    /// Where the limit starts (within the bounds).
    pub initial_limit: u64,
    /// The update rule.
    pub rule: LimitRule,
}

impl ConcurrencyParams {
    /// AIMD between `min_limit` and `max_limit`, starting at `min_limit`.
    pub fn aimd(min_limit: u64, max_limit: u64) -> Self {
        ConcurrencyParams {
            min_limit,
            max_limit,
            initial_limit: min_limit,
            rule: LimitRule::Aimd { backoff: 0.9 },
        }
    }

    /// Gradient between `min_limit` and `max_limit`, starting at `min_limit`.
    pub fn gradient(min_limit: u64, max_limit: u64) -> Self {
        ConcurrencyParams {
            min_limit,
            max_limit,
            initial_limit: min_limit,
            rule: LimitRule::Gradient {
                backoff: 0.9,
                smoothing: 0.2,
            },
        }
    }

    /// Checks the bounds and ratios.
    pub fn validate(&self) -> Result<(), AdmissionConfigError> {
        if self.min_limit == 0
            || self.min_limit > self.max_limit
            || !(self.min_limit..=self.max_limit).contains(&self.initial_limit)
        {
            return Err(AdmissionConfigError::LimitBounds {
                min_limit: self.min_limit,
                initial_limit: self.initial_limit,
                max_limit: self.max_limit,
            });
        }
        let backoff = match self.rule {
            LimitRule::Aimd { backoff } => backoff,
            LimitRule::Gradient { backoff, smoothing } => {
                if !(smoothing > 0.0 && smoothing <= 1.0) {
                    return Err(AdmissionConfigError::OutOfRange {
                        name: "smoothing",
                        range: "(0, 1]",
                        value: smoothing,
                    });
                }
                backoff
            }
        };
        if !(backoff > 0.0 && backoff < 1.0) {
            return Err(AdmissionConfigError::OutOfRange {
                name: "backoff",
                range: "(0, 1)",
                value: backoff,
            });
        }
        Ok(())
    }
}

/// How a request that held a slot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// When it took the slot (the `now_ms` of its acquire).
    pub started_ms: u64,
    /// How long it held the slot, in milliseconds.
    pub latency_ms: u64,
    /// Whether it was dropped (timed out, overloaded, the client hung up):
    /// an overload signal that contracts the limit.
    pub dropped: bool,
}

/// The in-flight count and its adaptive limit.
#[derive(Debug, Clone, PartialEq)]
pub struct ConcurrencyLimit {
    params: ConcurrencyParams,
    limit: f64,
    in_flight: u64,
    long_latency_ms: Option<f64>,
    /// When each request in flight started: start ms → how many. Their
    /// counts sum to `in_flight`.
    started: BTreeMap<u64, u64>,
    /// The latencies of the last completed requests, oldest first, and the
    /// same sorted.
    latencies: VecDeque<u64>,
    sorted_latencies: Vec<u64>,
}

/// How many completed latencies the wait estimate draws on.
pub const LATENCY_SAMPLES: usize = 256;

/// The probability with which a denial's wait frees the slots needed.
pub const SLOT_FREE_CONFIDENCE: f64 = 0.9;

impl ConcurrencyLimit {
    /// Validates the parameters; nothing in flight.
    pub fn new(params: ConcurrencyParams) -> Result<Self, AdmissionConfigError> {
        params.validate()?;
        Ok(ConcurrencyLimit {
            params,
            limit: params.initial_limit as f64,
            in_flight: 0,
            long_latency_ms: None,
            started: BTreeMap::new(),
            latencies: VecDeque::with_capacity(LATENCY_SAMPLES),
            sorted_latencies: Vec::with_capacity(LATENCY_SAMPLES),
        })
    }

    /// The current ceiling (an integer within the bounds).
    pub fn limit(&self) -> u64 {
        (self.limit.floor() as u64).clamp(self.params.min_limit, self.params.max_limit)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// The median of the recent completed latencies, once one has
    /// completed (milliseconds, at least 1).
    pub fn typical_latency_ms(&self) -> Option<u64> {
        let sorted = &self.sorted_latencies;
        (!sorted.is_empty()).then(|| sorted[sorted.len() / 2].max(1))
    }

    /// Takes a slot at `now_ms` if one is free. A denial's
    /// `retry_after_ms` is [`ConcurrencyLimit::wait_for_slot_ms`], or
    /// `fallback_retry_after_ms` until a request has completed.
    pub fn try_acquire(&mut self, now_ms: u64, fallback_retry_after_ms: u64) -> Decision {
        let limit = self.limit();
        if self.in_flight < limit {
            self.in_flight += 1;
            *self.started.entry(now_ms).or_default() += 1;
            Decision {
                allowed: true,
                limit,
                remaining: limit - self.in_flight,
                reset_at_ms: 0,
                retry_after_ms: 0,
            }
        } else {
            let wait = self
                .wait_for_slot_ms(now_ms)
                .unwrap_or(fallback_retry_after_ms);
            Decision {
                allowed: false,
                limit,
                remaining: 0,
                reset_at_ms: 0,
                retry_after_ms: wait.max(1),
            }
        }
    }

    /// How long from `now_ms` until enough requests in flight have ended,
    /// with probability [`SLOT_FREE_CONFIDENCE`], for one more to fit under
    /// the current limit (at least 1 ms; 0 when one fits now). Each request
    /// ends after a latency drawn from the recent completed ones, given its
    /// age; one older than every sample ends a median latency from now.
    /// `None` until a request has completed.
    pub fn wait_for_slot_ms(&self, now_ms: u64) -> Option<u64> {
        let median = self.typical_latency_ms()?;
        let need = (self.in_flight + 1).saturating_sub(self.limit());
        if need == 0 {
            return Some(0);
        }
        let ages: Vec<(u64, u64)> = self
            .started
            .iter()
            .map(|(&start, &count)| (now_ms.saturating_sub(start), count))
            .collect();
        let longest = *self.sorted_latencies.last()?;
        // Past this every request has ended (or is an overdue one, which
        // ends a median from now).
        let horizon = longest.max(median).max(1);
        if self.freed_with_confidence(&ages, need, horizon) {
            let (mut low, mut high) = (1u64, horizon);
            while low < high {
                let mid = low + (high - low) / 2;
                if self.freed_with_confidence(&ages, need, mid) {
                    high = mid;
                } else {
                    low = mid + 1;
                }
            }
            Some(low)
        } else {
            Some(horizon)
        }
    }

    /// Whether at least `need` of the requests of `ages` (age, count) end
    /// within `wait` with probability [`SLOT_FREE_CONFIDENCE`].
    fn freed_with_confidence(&self, ages: &[(u64, u64)], need: u64, wait: u64) -> bool {
        if need == 1 {
            // The usual case: one slot, the complement of none ending.
            let none_ended: f64 = ages
                .iter()
                .map(|&(age, count)| {
                    let exponent = i32::try_from(count).unwrap_or(i32::MAX);
                    (1.0 - self.ends_within(age, wait)).powi(exponent)
                })
                .product();
            return 1.0 - none_ended >= SLOT_FREE_CONFIDENCE - 1e-12;
        }
        let need = need as usize;
        // at_least[k]: the probability that k (need: ≥ need) have ended.
        let mut ended = vec![0.0f64; need + 1];
        ended[0] = 1.0;
        for &(age, count) in ages {
            let p = self.ends_within(age, wait);
            for _ in 0..count {
                for k in (0..=need).rev() {
                    let stay = ended[k] * (1.0 - p);
                    let from_below = if k > 0 { ended[k - 1] * p } else { 0.0 };
                    ended[k] = if k == need {
                        ended[k] + from_below
                    } else {
                        stay + from_below
                    };
                }
            }
        }
        ended[need] >= SLOT_FREE_CONFIDENCE - 1e-12
    }

    /// The probability that a request that has run `age` ms ends within
    /// `wait` ms more, by the recent latencies.
    fn ends_within(&self, age: u64, wait: u64) -> f64 {
        let sorted = &self.sorted_latencies;
        let longer_than = |t: u64| sorted.len() - sorted.partition_point(|&l| l <= t);
        let alive = longer_than(age);
        if alive == 0 {
            // Older than every sample: a median from now.
            let median = self.typical_latency_ms().unwrap_or(1);
            return if wait >= median { 1.0 } else { 0.0 };
        }
        1.0 - longer_than(age.saturating_add(wait)) as f64 / alive as f64
    }

    /// Removes one request that started at `started_ms` from the starts in
    /// flight (the oldest if none did: the count and the starts never
    /// disagree).
    fn forget_start(&mut self, started_ms: u64) {
        let key = if self.started.contains_key(&started_ms) {
            Some(started_ms)
        } else {
            self.started.keys().next().copied()
        };
        if let Some(key) = key {
            if let Some(count) = self.started.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    self.started.remove(&key);
                }
            }
        }
    }

    /// Keeps `latency` among the recent ones, dropping the oldest.
    fn record_latency(&mut self, latency: u64) {
        if self.latencies.len() == LATENCY_SAMPLES {
            if let Some(oldest) = self.latencies.pop_front() {
                if let Ok(i) = self.sorted_latencies.binary_search(&oldest) {
                    self.sorted_latencies.remove(i);
                }
            }
        }
        self.latencies.push_back(latency);
        let at = self.sorted_latencies.partition_point(|&l| l < latency);
        self.sorted_latencies.insert(at, latency);
    }

    /// Frees the slot taken at `started_ms` without feeding the limit (the
    /// request never ran, for example because a later axis denied it). A
    /// no-op with nothing in flight.
    pub fn cancel(&mut self, started_ms: u64) {
        if self.in_flight > 0 {
            self.forget_start(started_ms);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Frees a slot and adapts the limit to how the request ended. A no-op
    /// on the count with nothing in flight (the limit still learns).
    pub fn release(&mut self, completion: Completion) {
        let was_in_flight = self.in_flight;
        if was_in_flight > 0 {
            self.forget_start(completion.started_ms);
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.record_latency(completion.latency_ms);
        let (min, max) = (self.params.min_limit as f64, self.params.max_limit as f64);
        let next = match self.params.rule {
            LimitRule::Aimd { backoff } => {
                if completion.dropped {
                    self.limit * backoff
                } else if was_in_flight * 2 >= self.limit() {
                    self.limit + 1.0
                } else {
                    self.limit
                }
            }
            LimitRule::Gradient { backoff, smoothing } => {
                let sample = completion.latency_ms.max(1) as f64;
                let long = self.long_latency_ms.unwrap_or(sample);
                self.long_latency_ms = Some(long * 0.95 + sample * 0.05);
                if completion.dropped {
                    self.limit * backoff
                } else {
                    let gradient = (long / sample).clamp(0.5, 1.0);
                    let target = self.limit * gradient + self.limit.sqrt();
                    self.limit * (1.0 - smoothing) + target * smoothing
                }
            }
        };
        let next = if completion.dropped {
            // A drop always contracts by at least one slot (above the floor).
            next.min(self.limit.floor() - 1.0)
        } else {
            next
        };
        self.limit = if next.is_finite() {
            next.clamp(min, max)
        } else {
            min
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bad_bounds_and_ratios_are_refused() {
        assert!(ConcurrencyLimit::new(ConcurrencyParams::aimd(0, 4)).is_err());
        assert!(ConcurrencyLimit::new(ConcurrencyParams::aimd(5, 4)).is_err());
        let nan_backoff = ConcurrencyParams {
            rule: LimitRule::Aimd { backoff: f64::NAN },
            ..ConcurrencyParams::aimd(1, 4)
        };
        assert!(ConcurrencyLimit::new(nan_backoff).is_err());
        let zero_smoothing = ConcurrencyParams {
            rule: LimitRule::Gradient {
                backoff: 0.5,
                smoothing: 0.0,
            },
            ..ConcurrencyParams::gradient(1, 4)
        };
        assert!(ConcurrencyLimit::new(zero_smoothing).is_err());
    }

    #[test]
    fn aimd_grows_under_load_and_halts_at_max() {
        let mut c = ConcurrencyLimit::new(ConcurrencyParams::aimd(4, 32)).unwrap();
        for _ in 0..200 {
            while c.try_acquire(0, 10).allowed {}
            c.release(Completion {
                started_ms: 0,
                latency_ms: 10,
                dropped: false,
            });
        }
        assert_eq!(c.limit(), 32);
        assert!(!c.try_acquire(0, 10).allowed || c.in_flight() <= 32);
    }

    #[test]
    fn a_full_ceiling_denies_with_the_fallback_until_a_latency_is_known() {
        let mut c = ConcurrencyLimit::new(ConcurrencyParams::aimd(2, 2)).unwrap();
        assert!(c.try_acquire(0, 5).allowed);
        assert!(c.try_acquire(0, 5).allowed);
        let d = c.try_acquire(0, 5);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms, 5);
        c.cancel(0);
        assert!(c.try_acquire(0, 5).allowed);
    }

    #[test]
    fn the_wait_is_until_the_oldest_request_is_expected_to_end() {
        let mut c = ConcurrencyLimit::new(ConcurrencyParams::aimd(2, 2)).unwrap();
        assert!(c.try_acquire(0, 5).allowed);
        c.release(Completion {
            started_ms: 0,
            latency_ms: 100,
            dropped: false,
        });
        assert_eq!(c.typical_latency_ms(), Some(100));
        assert!(c.try_acquire(1_000, 5).allowed);
        assert!(c.try_acquire(1_030, 5).allowed);
        // The request of 1 000 is expected to end at 1 100.
        assert_eq!(c.try_acquire(1_040, 5).retry_after_ms, 60);
        // Both overdue: a typical latency from now.
        assert_eq!(c.try_acquire(1_500, 5).retry_after_ms, 100);
        // The one of 1 030 is still expected at 1 130.
        assert_eq!(c.try_acquire(1_101, 5).retry_after_ms, 29);
    }

    fn params() -> impl Strategy<Value = ConcurrencyParams> {
        (
            1u64..20,
            0u64..50,
            any::<bool>(),
            0.05f64..0.99,
            0.05f64..1.0,
        )
            .prop_map(
                |(min, span, gradient, backoff, smoothing)| ConcurrencyParams {
                    min_limit: min,
                    max_limit: min + span,
                    initial_limit: min + span / 2,
                    rule: if gradient {
                        LimitRule::Gradient { backoff, smoothing }
                    } else {
                        LimitRule::Aimd { backoff }
                    },
                },
            )
    }

    #[derive(Debug, Clone)]
    enum Step {
        Acquire,
        Release(u64, bool),
        Cancel,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Acquire),
            (0u64..1_000, any::<bool>()).prop_map(|(l, d)| Step::Release(l, d)),
            Just(Step::Cancel),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn limit_bounded_in_flight_conserved_drops_contract(
            p in params(), steps in proptest::collection::vec(step(), 0..300),
        ) {
            let mut c = ConcurrencyLimit::new(p).unwrap();
            let mut expected_in_flight = 0u64;
            for s in steps {
                match s {
                    Step::Acquire => {
                        let limit = c.limit();
                        let d = c.try_acquire(0, 1);
                        prop_assert_eq!(d.allowed, expected_in_flight < limit);
                        if d.allowed { expected_in_flight += 1; }
                    }
                    Step::Release(latency_ms, dropped) => {
                        let before = c.limit();
                        c.release(Completion { started_ms: 0, latency_ms, dropped });
                        expected_in_flight = expected_in_flight.saturating_sub(1);
                        if dropped {
                            prop_assert!(c.limit() <= before);
                            if before > p.min_limit {
                                prop_assert!(c.limit() < before);
                            }
                        }
                    }
                    Step::Cancel => {
                        c.cancel(0);
                        expected_in_flight = expected_in_flight.saturating_sub(1);
                    }
                }
                prop_assert!((p.min_limit..=p.max_limit).contains(&c.limit()));
                prop_assert_eq!(c.in_flight(), expected_in_flight);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Every request takes exactly `latency` ms and the limit is
        /// fixed: once one has completed, a denial's wait is exactly when
        /// a slot frees, so the request retried then fits, and a
        /// millisecond earlier it would not.
        #[test]
        fn with_constant_latency_a_denial_waits_exactly_until_a_slot_frees(
            limit in 1u64..6,
            latency in 1u64..200,
            gaps in proptest::collection::vec(0u64..80, 1..120),
        ) {
            let mut c = ConcurrencyLimit::new(ConcurrencyParams::aimd(limit, limit)).unwrap();
            let mut ends: Vec<(u64, u64)> = Vec::new(); // (end, start) in flight
            let mut now = 0u64;
            let mut completed = false;
            for gap in gaps {
                now += gap;
                ends.sort_unstable();
                while let Some(&(end, start)) = ends.first() {
                    if end > now { break; }
                    ends.remove(0);
                    c.release(Completion { started_ms: start, latency_ms: latency, dropped: false });
                    completed = true;
                }
                let d = c.try_acquire(now, 7);
                if d.allowed {
                    ends.push((now + latency, now));
                    continue;
                }
                if !completed {
                    prop_assert_eq!(d.retry_after_ms, 7);
                    continue;
                }
                let ended_by = |t: u64| ends.iter().filter(|(end, _)| *end <= t).count() as u64;
                let need = ends.len() as u64 + 1 - limit;
                prop_assert!(ended_by(now + d.retry_after_ms) >= need, "a slot frees by the wait");
                prop_assert!(ended_by(now + d.retry_after_ms - 1) < need, "not before it");
            }
        }

        /// Whatever the order of acquires, releases and cancels, and
        /// whatever start times they name, the starts kept in flight
        /// always number `in_flight`.
        #[test]
        fn the_starts_in_flight_always_match_the_count(
            steps in proptest::collection::vec((0u8..3, 0u64..50), 0..200),
        ) {
            let mut c = ConcurrencyLimit::new(ConcurrencyParams::aimd(1, 8)).unwrap();
            for (kind, t) in steps {
                match kind {
                    0 => { c.try_acquire(t, 1); }
                    1 => c.release(Completion { started_ms: t, latency_ms: t, dropped: false }),
                    _ => c.cancel(t),
                }
                prop_assert_eq!(c.started.values().sum::<u64>(), c.in_flight());
            }
        }
    }
}
