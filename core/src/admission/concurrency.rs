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
//!   after which enough requests in flight have ended for one more to
//!   fit with probability [`SLOT_FREE_CONFIDENCE`] ([`SlotWait`],
//!   [`ConcurrencyLimit::slot_wait`]):
//!   - "enough" is under the limit the completions leave: the update
//!     rule's next steps, each completion a success reporting the last
//!     [`NEXT_STEP_SAMPLES`] latencies in turn (a completion may lower a
//!     gradient limit, so one may not free a slot; an AIMD success also
//!     raises it by one, so a limit below the count in flight is caught
//!     up twice as fast);
//!   - each request ends by the product-limit (Kaplan–Meier) survival of
//!     the last [`LATENCY_SAMPLES`] completed latencies, the requests in
//!     flight counted as still running at their age, given how long it
//!     has run: never before the shortest sample above its age;
//!   - past the longest sample a scale-free tail (`S(t) ∝ 1/t`): a
//!     request older than every sample is as likely as not to run as long
//!     again, never "a median from now"; when the wait rests on such
//!     requests [`SlotWait::Estimated`] says so (`beyond_history`);
//!   - until a request has completed, [`SlotWait::NoHistory`]: the
//!     caller's fallback is returned.
//!
//!   With constant latencies a denied request retried after its wait
//!   finds a slot free, and, under a fixed limit, not a millisecond
//!   earlier; the wait is never before the first moment a request in
//!   flight can end by the samples; `slots_needed` completions through
//!   the update rule leave a slot and one fewer does not (properties
//!   below).

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

    /// The limit (and the gradient's long-run latency) after a completion
    /// of `latency_ms` that found `was_in_flight` requests in flight: the
    /// update rule, shared by [`ConcurrencyLimit::release`] and the wait's
    /// model of the next completions.
    fn adapt(
        &self,
        limit: f64,
        long_latency_ms: Option<f64>,
        was_in_flight: u64,
        latency_ms: u64,
        dropped: bool,
    ) -> (f64, Option<f64>) {
        let (min, max) = (self.min_limit as f64, self.max_limit as f64);
        let floor = (limit.floor().max(0.0) as u64).clamp(self.min_limit, self.max_limit);
        let (next, long_latency_ms) = match self.rule {
            LimitRule::Aimd { backoff } => {
                let next = if dropped {
                    limit * backoff
                } else if was_in_flight * 2 >= floor {
                    limit + 1.0
                } else {
                    limit
                };
                (next, long_latency_ms)
            }
            LimitRule::Gradient { backoff, smoothing } => {
                let sample = latency_ms.max(1) as f64;
                let long = long_latency_ms.unwrap_or(sample);
                let next = if dropped {
                    limit * backoff
                } else {
                    let gradient = (long / sample).clamp(0.5, 1.0);
                    let target = limit * gradient + limit.sqrt();
                    limit * (1.0 - smoothing) + target * smoothing
                };
                (next, Some(long * 0.95 + sample * 0.05))
            }
        };
        let next = if dropped {
            // A drop always contracts by at least one slot (above the floor).
            next.min(limit.floor() - 1.0)
        } else {
            next
        };
        let next = if next.is_finite() {
            next.clamp(min, max)
        } else {
            min
        };
        (next, long_latency_ms)
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

/// How many of the latest completed latencies the next completions are
/// taken to report, in turn, for the limit those completions leave.
pub const NEXT_STEP_SAMPLES: usize = 16;

/// The longest wait [`ConcurrencyLimit::slot_wait`] answers (a day).
pub const MAX_SLOT_WAIT_MS: u64 = 86_400_000;

/// The survival function of a request's latency, by the product-limit
/// (Kaplan–Meier) estimate over the recent completed latencies (ends)
/// and the requests in flight (still running at their age: censored), so
/// that long requests not yet ended weigh against the short ones that
/// have. Past the longest sample `M` a scale-free tail continues it:
/// `S(t) = S(M) · M / t`.
struct Survival {
    /// Distinct sample values, increasing, and `S` just after each.
    values: Vec<u64>,
    after: Vec<f64>,
}

impl Survival {
    fn new(sorted_latencies: &[u64], sorted_ages: &[u64]) -> Self {
        let (mut values, mut after) = (Vec::new(), Vec::new());
        let mut survival = 1.0f64;
        let mut i = 0;
        while i < sorted_latencies.len() {
            let value = sorted_latencies[i];
            let ended = sorted_latencies[i..].partition_point(|&l| l == value);
            let running = sorted_ages.len() - sorted_ages.partition_point(|&a| a < value);
            let at_risk = (sorted_latencies.len() - i + running) as f64;
            survival *= 1.0 - ended as f64 / at_risk;
            values.push(value);
            after.push(survival);
            i += ended;
        }
        Survival { values, after }
    }

    /// `S(t)`, the tail past the longest sample only with `tail`.
    fn at(&self, t: u64, tail: bool) -> f64 {
        let n = self.values.partition_point(|&v| v <= t);
        let s = if n == 0 { 1.0 } else { self.after[n - 1] };
        match self.values.last() {
            Some(&longest) if tail && t > longest => s * longest.max(1) as f64 / t as f64,
            _ => s,
        }
    }

    /// The probability that a request that has run `age` ms ends within
    /// `wait` ms more. One that has run longer than every sample is given
    /// the tail alone (0 without `tail`).
    fn ends_within(&self, age: u64, wait: u64, tail: bool) -> f64 {
        let longest = self.values.last().copied().unwrap_or(0);
        if age >= longest {
            if !tail {
                return 0.0;
            }
            let (age, wait) = (age.max(1) as f64, wait as f64);
            return wait / (age + wait);
        }
        let now = self.at(age, tail);
        if now <= 0.0 {
            return 1.0;
        }
        (1.0 - self.at(age.saturating_add(wait), tail) / now).clamp(0.0, 1.0)
    }
}

/// How a concurrency denial's `retry_after_ms` was found
/// ([`ConcurrencyLimit::try_acquire_explained`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitBasis {
    /// From the latencies seen: a slot frees by then with probability
    /// [`SLOT_FREE_CONFIDENCE`].
    Estimated,
    /// The same, but resting on requests in flight that have run longer
    /// than every latency seen, and so on the assumed scale-free tail.
    BeyondHistory,
    /// No request has completed yet: the wait is the configured fallback,
    /// not an estimate.
    NoHistory,
}

/// What the limit can say about when a slot frees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotWait {
    /// One more request fits now.
    Free,
    /// A slot frees within `wait_ms` with probability
    /// [`SLOT_FREE_CONFIDENCE`] (at least 1 ms), by the latency history.
    Estimated {
        /// The wait, in milliseconds.
        wait_ms: u64,
        /// The requests within the history alone would not free the slots
        /// needed by then: the estimate rests on the requests that have
        /// run longer than every sample, and so on the assumed tail.
        beyond_history: bool,
    },
    /// The ceiling is full and no request has completed yet: there is no
    /// latency to estimate from.
    NoHistory,
}

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
    /// `retry_after_ms` is the wait of [`ConcurrencyLimit::slot_wait`], or
    /// `fallback_retry_after_ms` until a request has completed
    /// ([`SlotWait::NoHistory`]).
    pub fn try_acquire(&mut self, now_ms: u64, fallback_retry_after_ms: u64) -> Decision {
        self.try_acquire_explained(now_ms, fallback_retry_after_ms)
            .0
    }

    /// [`ConcurrencyLimit::try_acquire`], with how a denial's
    /// `retry_after_ms` was found (`None` when allowed): a caller can tell
    /// an estimate from the fallback that stands for none.
    pub fn try_acquire_explained(
        &mut self,
        now_ms: u64,
        fallback_retry_after_ms: u64,
    ) -> (Decision, Option<WaitBasis>) {
        let limit = self.limit();
        if self.in_flight < limit {
            self.in_flight += 1;
            *self.started.entry(now_ms).or_default() += 1;
            let allowed = Decision {
                allowed: true,
                limit,
                remaining: limit - self.in_flight,
                reset_at_ms: 0,
                retry_after_ms: 0,
            };
            return (allowed, None);
        }
        let (wait, basis) = match self.slot_wait(now_ms) {
            SlotWait::Estimated {
                wait_ms,
                beyond_history,
            } => (
                wait_ms,
                if beyond_history {
                    WaitBasis::BeyondHistory
                } else {
                    WaitBasis::Estimated
                },
            ),
            // (Free cannot meet a full ceiling; it is read as no estimate.)
            SlotWait::Free | SlotWait::NoHistory => (fallback_retry_after_ms, WaitBasis::NoHistory),
        };
        let denied = Decision {
            allowed: false,
            limit,
            remaining: 0,
            reset_at_ms: 0,
            retry_after_ms: wait.max(1),
        };
        (denied, Some(basis))
    }

    /// How long from `now_ms` until a slot frees for one more request
    /// (0 when one fits now), or `None` until a request has completed:
    /// [`ConcurrencyLimit::slot_wait`] in milliseconds.
    pub fn wait_for_slot_ms(&self, now_ms: u64) -> Option<u64> {
        match self.slot_wait(now_ms) {
            SlotWait::Free => Some(0),
            SlotWait::Estimated { wait_ms, .. } => Some(wait_ms),
            SlotWait::NoHistory => None,
        }
    }

    /// When a slot frees for one more request, by what the limit knows:
    /// the ages of the requests in flight, the last [`LATENCY_SAMPLES`]
    /// completed latencies, and the adaptive limit's next steps.
    ///
    /// - `need` is how many requests must end before one more fits, under
    ///   the limit those completions leave: each is taken to succeed (a
    ///   drop is a failure nothing foreshadows) and to report, in turn, the
    ///   last [`NEXT_STEP_SAMPLES`] latencies, fed through the same
    ///   update rule as [`ConcurrencyLimit::release`]; a retry counts as
    ///   fitting only if it fits however many more than `need` have ended.
    /// - A request that has run `age` ms ends within `w` more with
    ///   probability `1 − S(age + w) / S(age)`, `S` the product-limit
    ///   (Kaplan–Meier) survival of the recent latencies in which the
    ///   requests in flight count as still running at their age: the
    ///   completed latencies alone are biased short (the long requests of
    ///   a burst or a slow phase have not ended yet). `S` only falls at a
    ///   sample, so no request is expected to end before the shortest
    ///   sample above its age.
    /// - Past the longest sample `M` the history says nothing; a
    ///   scale-free tail continues it, `S(t) = S(M) · M / t`, and a
    ///   request older than every sample ends within `w` more with
    ///   probability `w / (age + w)` (as likely to run as long again as it
    ///   has run): a long-overdue request, a leaked handle for instance,
    ///   is counted on less the longer it runs, never "a median from now".
    ///
    /// The wait is the shortest after which at least `need` have ended
    /// with probability [`SLOT_FREE_CONFIDENCE`] (at most
    /// [`MAX_SLOT_WAIT_MS`]); `beyond_history` says that the requests
    /// within the history alone would not have made it.
    pub fn slot_wait(&self, now_ms: u64) -> SlotWait {
        if self.sorted_latencies.is_empty() {
            return if self.in_flight < self.limit() {
                SlotWait::Free
            } else {
                SlotWait::NoHistory
            };
        }
        let need = self.slots_needed();
        if need == 0 {
            return SlotWait::Free;
        }
        let ages: Vec<(u64, u64)> = self
            .started
            .iter()
            .map(|(&start, &count)| (now_ms.saturating_sub(start), count))
            .collect();
        let mut sorted_ages: Vec<u64> = Vec::with_capacity(self.in_flight as usize);
        for &(age, count) in &ages {
            sorted_ages.extend(std::iter::repeat_n(age, count as usize));
        }
        sorted_ages.sort_unstable();
        let survival = Survival::new(&self.sorted_latencies, &sorted_ages);
        let freed =
            |wait: u64, tail: bool| freed_with_confidence(&survival, &ages, need, wait, tail);
        let longest = self.sorted_latencies.last().copied().unwrap_or(1);
        let mut high = longest.max(1);
        while !freed(high, true) {
            if high >= MAX_SLOT_WAIT_MS {
                return SlotWait::Estimated {
                    wait_ms: MAX_SLOT_WAIT_MS,
                    beyond_history: true,
                };
            }
            high = high.saturating_mul(2).min(MAX_SLOT_WAIT_MS);
        }
        let mut low = 1u64;
        while low < high {
            let mid = low + (high - low) / 2;
            if freed(mid, true) {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        // The tail may free a slot sooner than any request in flight can
        // end by the history; a wait that short is certain to fail.
        let wait_ms = self
            .earliest_possible_end_ms(now_ms)
            .map_or(low, |earliest| low.max(earliest));
        SlotWait::Estimated {
            wait_ms,
            beyond_history: !freed(wait_ms, false),
        }
    }

    /// How many requests in flight must end before one more fits, under
    /// the limit their completions leave (each a success reporting, in
    /// turn, the last [`NEXT_STEP_SAMPLES`] latencies): the smallest `k`
    /// such that one more fits after `k` or any larger number of
    /// completions. 0 when one fits now.
    pub fn slots_needed(&self) -> u64 {
        let latencies = self.next_step_latencies();
        let (mut limit, mut long) = (self.limit, self.long_latency_ms);
        let fits = |in_flight: u64, limit: f64| in_flight < self.clamped(limit);
        let mut need = if fits(self.in_flight, limit) { 0 } else { 1 };
        let mut in_flight = self.in_flight;
        let mut ended = 0;
        for &latency in latencies.iter().cycle().take(self.in_flight as usize) {
            (limit, long) = self.params.adapt(limit, long, in_flight, latency, false);
            in_flight -= 1;
            ended += 1;
            if !fits(in_flight, limit) {
                need = ended + 1;
            }
        }
        need.min(self.in_flight)
    }

    /// The latencies the next completions are taken to report, in turn:
    /// the last [`NEXT_STEP_SAMPLES`] completed, oldest first (1 ms with
    /// none).
    pub fn next_step_latencies(&self) -> Vec<u64> {
        let skip = self.latencies.len().saturating_sub(NEXT_STEP_SAMPLES);
        let recent: Vec<u64> = self.latencies.iter().skip(skip).copied().collect();
        if recent.is_empty() {
            vec![1]
        } else {
            recent
        }
    }

    fn clamped(&self, limit: f64) -> u64 {
        (limit.floor().max(0.0) as u64).clamp(self.params.min_limit, self.params.max_limit)
    }

    /// The earliest any request in flight can end by the history: the
    /// least, over the requests with a sample longer than their age, of
    /// the shortest such sample minus the age. `None` when no request in
    /// flight has one (nothing in flight, no history, or every request is
    /// beyond the history).
    pub fn earliest_possible_end_ms(&self, now_ms: u64) -> Option<u64> {
        let sorted = &self.sorted_latencies;
        self.started
            .keys()
            .filter_map(|&start| {
                let age = now_ms.saturating_sub(start);
                let i = sorted.partition_point(|&l| l <= age);
                sorted.get(i).map(|&l| l - age)
            })
            .min()
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
        (self.limit, self.long_latency_ms) = self.params.adapt(
            self.limit,
            self.long_latency_ms,
            was_in_flight,
            completion.latency_ms,
            completion.dropped,
        );
    }
}

/// Whether at least `need` of the requests of `ages` (age, count) end
/// within `wait` with probability [`SLOT_FREE_CONFIDENCE`]; the ones
/// beyond the history count only with `beyond_history`.
fn freed_with_confidence(
    survival: &Survival,
    ages: &[(u64, u64)],
    need: u64,
    wait: u64,
    beyond_history: bool,
) -> bool {
    let p = |age: u64| survival.ends_within(age, wait, beyond_history);
    if need == 1 {
        // The usual case: one slot, the complement of none ending.
        let none_ended: f64 = ages
            .iter()
            .map(|&(age, count)| {
                let exponent = i32::try_from(count).unwrap_or(i32::MAX);
                (1.0 - p(age)).powi(exponent)
            })
            .product();
        return 1.0 - none_ended >= SLOT_FREE_CONFIDENCE - 1e-12;
    }
    let need = need as usize;
    // ended[k]: the probability that k (need: at least need) have ended.
    let mut ended = vec![0.0f64; need + 1];
    ended[0] = 1.0;
    for &(age, count) in ages {
        let p = p(age);
        if p <= 0.0 {
            continue;
        }
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
    fn the_wait_is_until_the_oldest_request_is_expected_to_end_and_overdue_ones_are_not_counted_on()
    {
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
        // Both older than every sample: neither is counted on to end a
        // median from now; each is as likely as not to run as long again,
        // and the wait is where one of them has ended with probability
        // 0.9: (500 + w)(470 + w) >= 10 * 500 * 470.
        let wait = c.try_acquire(1_500, 5).retry_after_ms;
        assert_eq!(wait, 1_049);
        assert_eq!(
            c.slot_wait(1_500),
            SlotWait::Estimated {
                wait_ms: 1_049,
                beyond_history: true
            }
        );
        // At 1 101 the request of 1 000 has outrun the only sample: half
        // the requests seen ran past 100 ms, so the one of 1 030 may too
        // (S(100) = 1/2, then the tail), and the wait is where one of the
        // two has ended with probability 0.9:
        // (71 + w)(101 + w) >= 10 * 50 * 101.
        assert_eq!(c.try_acquire(1_101, 5).retry_after_ms, 140);
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

        /// Whatever the limit, its history and the ages in flight, a
        /// denial's wait is never before the first moment a request in
        /// flight can end by the samples (the shortest sample above its
        /// age, less its age); when every request in flight has run longer
        /// than every sample, the wait says it rests beyond the history.
        #[test]
        fn whatever_the_history_the_wait_is_never_before_the_first_possible_end(
            p in params(),
            history in proptest::collection::vec((1u64..1_000, any::<bool>()), 1..60),
            starts in proptest::collection::vec(0u64..3_000, 1..80),
            after in 0u64..2_000,
        ) {
            let mut c = ConcurrencyLimit::new(p).unwrap();
            for &(latency_ms, dropped) in &history {
                prop_assert!(c.try_acquire(0, 1).allowed || c.in_flight() > 0);
                c.release(Completion { started_ms: 0, latency_ms, dropped });
            }
            while c.in_flight() > 0 {
                c.cancel(0);
            }
            let mut starts = starts;
            starts.sort_unstable();
            for &start in &starts {
                c.try_acquire(start, 1);
            }
            let now = starts.last().copied().unwrap_or(0) + after;
            let d = c.try_acquire(now, 1);
            if d.allowed {
                return Ok(());
            }
            let wait = c.slot_wait(now);
            let SlotWait::Estimated { wait_ms, beyond_history } = wait else {
                return Err(TestCaseError::fail(format!("a history, a full ceiling: {wait:?}")));
            };
            prop_assert_eq!(d.retry_after_ms, wait_ms);
            match c.earliest_possible_end_ms(now) {
                Some(earliest) => prop_assert!(
                    wait_ms >= earliest,
                    "wait {} before the first possible end {}", wait_ms, earliest
                ),
                None => prop_assert!(beyond_history, "every request beyond the history"),
            }
        }

        /// The limit's next step: releasing `slots_needed()` requests, each
        /// a success reporting the recent latencies in turn, leaves room for one
        /// more, and releasing one fewer does not; whatever the rule, its
        /// state and what is in flight (a lowering gradient included).
        #[test]
        fn the_slots_needed_account_for_the_limit_the_completions_leave(
            p in params(),
            history in proptest::collection::vec((1u64..1_000, any::<bool>()), 1..60),
            extra in 0u64..40,
        ) {
            let mut c = ConcurrencyLimit::new(p).unwrap();
            for &(latency_ms, dropped) in &history {
                c.try_acquire(0, 1);
                c.release(Completion { started_ms: 0, latency_ms, dropped });
            }
            while c.try_acquire(0, 1).allowed {}
            // Pile a few more in flight than the limit allows (as after drops).
            for _ in 0..extra {
                *c.started.entry(0).or_default() += 1;
                c.in_flight += 1;
            }
            let need = c.slots_needed();
            prop_assert!(need >= 1, "a full ceiling needs a completion");
            let latencies = c.next_step_latencies();
            let release_n = |n: u64| {
                let mut after = c.clone();
                for &latency_ms in latencies.iter().cycle().take(n as usize) {
                    after.release(Completion { started_ms: 0, latency_ms, dropped: false });
                }
                after.in_flight() < after.limit()
            };
            prop_assert!(release_n(need), "one fits after {} completions", need);
            prop_assert!(!release_n(need - 1), "not after {}", need - 1);
            for more in need..=c.in_flight() {
                prop_assert!(release_n(more), "and after any more ({})", more);
            }
        }

        /// Every request takes exactly `latency` ms and the limit adapts
        /// (AIMD or gradient, drops never): a denial's wait, once a
        /// request has completed, is long enough that the requests in
        /// flight ending by then, released in order, leave a slot free.
        #[test]
        fn with_constant_latency_an_adaptive_limit_has_a_slot_free_after_the_wait(
            p in params(),
            latency in 1u64..200,
            gaps in proptest::collection::vec(0u64..40, 1..150),
        ) {
            let mut c = ConcurrencyLimit::new(p).unwrap();
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
                let mut replay = c.clone();
                for &(end, start) in ends.iter().filter(|(end, _)| *end <= now + d.retry_after_ms) {
                    replay.release(Completion { started_ms: start, latency_ms: end - start, dropped: false });
                }
                prop_assert!(
                    replay.in_flight() < replay.limit(),
                    "a slot is free after the wait {}", d.retry_after_ms
                );
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
