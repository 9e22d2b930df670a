//! [`FairThrottle`]: constant-memory fairness in front of any limited
//! resource, for a service with many anonymous callers (API keys, IPs).
//!
//! It wraps the core's [`FairThrottleState`] (stochastic fair BLUE, live +
//! shadow structures) with a clock, a seeded random source and counters.
//! "Resource exhaustion" is whatever the wrapped resource says it is —
//! typically: the limiter behind it denied. Callers that keep exhausting the
//! resource are throttled before they reach it; modest callers get through.
//!
//! Two ways to use it:
//! - [`FairThrottle::admit`] with a [`ProtectedResource`] (synchronous:
//!   decide, try the resource, record the outcome, all in one call);
//! - [`FairThrottle::gate`] then [`FairThrottle::record`] around an
//!   asynchronous resource, e.g. a [`Limiter`](crate::Limiter) check:
//!
//! ```text
//! if throttle.gate(caller)?.proceeds() {
//!     let decision = limiter.check(key, 1).await?;
//!     throttle.record(caller, if decision.allowed { Outcome::Success } else { Outcome::Exhausted })?;
//! }
//! ```
//!
//! With `use_idle_capacity`, a throttled request still reaches a resource
//! that reports idle capacity ([`ProtectedResource::has_idle_capacity`]),
//! without feeding the throttle: fairness under contention, full
//! utilisation when there is none (see `docs/fair-throttle.md`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_core::fair_throttle::{
    CallerId, FairThrottleConfig, FairThrottleError, FairThrottleState, Outcome,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::transport::WallClock;

/// A resource a [`FairThrottle`] protects.
pub trait ProtectedResource {
    /// Tries to take one unit; `false` means the resource is exhausted.
    fn try_acquire(&self) -> bool;

    /// Whether the resource has capacity to spare beyond what unthrottled
    /// callers need (e.g. a token bucket above a reserve). Only consulted
    /// with `use_idle_capacity`; the default says never.
    fn has_idle_capacity(&self) -> bool {
        false
    }
}

/// Options of a [`FairThrottle`]: start from
/// [`FairThrottleOptions::default`] and change what you need with the
/// `with_` methods.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct FairThrottleOptions {
    /// The structures' parameters.
    pub config: FairThrottleConfig,
    /// Let throttled requests through when the resource has idle capacity.
    pub use_idle_capacity: bool,
}

impl FairThrottleOptions {
    /// The structures' parameters.
    pub fn with_config(mut self, config: FairThrottleConfig) -> Self {
        self.config = config;
        self
    }

    /// Let throttled requests through when the resource has idle capacity.
    pub fn with_idle_capacity(mut self, use_idle_capacity: bool) -> Self {
        self.use_idle_capacity = use_idle_capacity;
        self
    }
}

/// The throttle's gate for one request (two-phase use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FairGate {
    /// Go on to the resource, then [`FairThrottle::record`] its outcome.
    Proceed,
    /// Refused by the throttle: do not try the resource, record nothing.
    Throttled,
}

impl FairGate {
    /// Whether the request goes on to the resource.
    pub fn proceeds(self) -> bool {
        self == FairGate::Proceed
    }
}

/// What happened to one request under [`FairThrottle::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FairAdmission {
    /// The throttle let it through and the resource served it.
    Admitted,
    /// The throttle would have refused it, but the resource had idle capacity.
    AdmittedFromIdleCapacity,
    /// The throttle refused it; the resource was not asked.
    Throttled,
    /// The throttle let it through and the resource was exhausted.
    Exhausted,
}

impl FairAdmission {
    /// Whether the request was served.
    pub fn allowed(self) -> bool {
        matches!(
            self,
            FairAdmission::Admitted | FairAdmission::AdmittedFromIdleCapacity
        )
    }
}

/// A snapshot of a throttle's counters (monotonic since construction).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FairThrottleStats {
    /// Requests the throttle let through (gate `Proceed`).
    pub passed: u64,
    /// Requests refused by the throttle (the FAIR denials).
    pub fair_denials: u64,
    /// Throttled requests served from idle capacity.
    pub idle_admissions: u64,
    /// Outcomes recorded as success.
    pub successes: u64,
    /// Outcomes recorded as resource exhaustion.
    pub exhaustions: u64,
    /// Live/shadow rotations.
    pub rotations: u64,
}

#[derive(Debug, Default)]
struct Counters {
    passed: AtomicU64,
    fair_denials: AtomicU64,
    idle_admissions: AtomicU64,
    successes: AtomicU64,
    exhaustions: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    state: FairThrottleState,
    rng: StdRng,
}

/// A fair throttle shared by a service's request handlers (see the module doc).
#[derive(Debug)]
pub struct FairThrottle {
    inner: Mutex<Inner>,
    clock: Arc<dyn WallClock>,
    use_idle_capacity: bool,
    counters: Counters,
}

impl FairThrottle {
    /// A throttle with seeds from the operating system's randomness.
    pub fn new(
        options: FairThrottleOptions,
        clock: Arc<dyn WallClock>,
    ) -> Result<Self, FairThrottleError> {
        Self::with_seed(options, clock, rand::thread_rng().gen())
    }

    /// A throttle whose hash seeds and draws all follow from `seed`
    /// (reproducible runs and tests).
    pub fn with_seed(
        options: FairThrottleOptions,
        clock: Arc<dyn WallClock>,
        seed: u64,
    ) -> Result<Self, FairThrottleError> {
        let mut rng = StdRng::seed_from_u64(seed);
        let state = FairThrottleState::new(options.config, clock.now_ms(), rng.gen(), rng.gen())?;
        Ok(FairThrottle {
            inner: Mutex::new(Inner { state, rng }),
            clock,
            use_idle_capacity: options.use_idle_capacity,
            counters: Counters::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Phase one: whether `caller`'s request may go on to the resource.
    /// Rotates the structures when due. Refuses an empty caller id.
    pub fn gate(&self, caller: &[u8]) -> Result<FairGate, FairThrottleError> {
        let caller = CallerId::new(caller)?;
        let now_ms = self.clock.now_ms();
        let mut inner = self.lock();
        let fresh_seed = inner.rng.gen();
        inner.state.rotate_if_due(now_ms, fresh_seed);
        let draw = inner.rng.gen();
        let verdict = inner.state.decide(caller, now_ms, draw);
        drop(inner);
        if verdict.admit {
            self.counters.passed.fetch_add(1, Ordering::Relaxed);
            Ok(FairGate::Proceed)
        } else {
            self.counters.fair_denials.fetch_add(1, Ordering::Relaxed);
            Ok(FairGate::Throttled)
        }
    }

    /// Phase two: the outcome of a request the gate let through.
    pub fn record(&self, caller: &[u8], outcome: Outcome) -> Result<(), FairThrottleError> {
        let caller = CallerId::new(caller)?;
        let now_ms = self.clock.now_ms();
        self.lock().state.record(caller, outcome, now_ms);
        let counter = match outcome {
            Outcome::Success => &self.counters.successes,
            Outcome::Exhausted => &self.counters.exhaustions,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Gate, try `resource`, record the outcome: one call per request.
    pub fn admit<R: ProtectedResource + ?Sized>(
        &self,
        caller: &[u8],
        resource: &R,
    ) -> Result<FairAdmission, FairThrottleError> {
        match self.gate(caller)? {
            FairGate::Throttled => {
                if self.use_idle_capacity && resource.has_idle_capacity() && resource.try_acquire()
                {
                    self.counters
                        .idle_admissions
                        .fetch_add(1, Ordering::Relaxed);
                    Ok(FairAdmission::AdmittedFromIdleCapacity)
                } else {
                    Ok(FairAdmission::Throttled)
                }
            }
            FairGate::Proceed => {
                if resource.try_acquire() {
                    self.record(caller, Outcome::Success)?;
                    Ok(FairAdmission::Admitted)
                } else {
                    self.record(caller, Outcome::Exhausted)?;
                    Ok(FairAdmission::Exhausted)
                }
            }
        }
    }

    /// The caller's current throttle probability in the live structure.
    pub fn throttle_probability(&self, caller: &[u8]) -> Result<f64, FairThrottleError> {
        let caller = CallerId::new(caller)?;
        let now_ms = self.clock.now_ms();
        Ok(self.lock().state.throttle_probability(caller, now_ms))
    }

    /// Bytes of cells held (both structures; fixed at construction).
    pub fn memory_bytes(&self) -> usize {
        self.lock().state.memory_bytes()
    }

    /// The counters.
    pub fn stats(&self) -> FairThrottleStats {
        FairThrottleStats {
            passed: self.counters.passed.load(Ordering::Relaxed),
            fair_denials: self.counters.fair_denials.load(Ordering::Relaxed),
            idle_admissions: self.counters.idle_admissions.load(Ordering::Relaxed),
            successes: self.counters.successes.load(Ordering::Relaxed),
            exhaustions: self.counters.exhaustions.load(Ordering::Relaxed),
            rotations: self.lock().state.rotations(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    /// A settable clock.
    #[derive(Debug, Default)]
    struct ManualClock(AtomicU64);

    impl WallClock for ManualClock {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    /// A token bucket refilled by hand: `capacity` tokens, idle above `reserve`.
    struct Bucket {
        tokens: AtomicU64,
        reserve: u64,
    }

    impl ProtectedResource for Bucket {
        fn try_acquire(&self) -> bool {
            self.tokens
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| t.checked_sub(1))
                .is_ok()
        }
        fn has_idle_capacity(&self) -> bool {
            self.tokens.load(Ordering::SeqCst) > self.reserve
        }
    }

    fn throttle(use_idle_capacity: bool) -> (FairThrottle, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::default());
        let options = FairThrottleOptions {
            use_idle_capacity,
            ..FairThrottleOptions::default()
        };
        (
            FairThrottle::with_seed(options, clock.clone(), 42).unwrap(),
            clock,
        )
    }

    /// Each second the bucket gets 10 tokens; the heavy caller asks 30 times,
    /// five modest callers once each. The throttle learns to refuse the heavy
    /// caller, and the modest ones end up served.
    #[test]
    fn a_heavy_caller_is_throttled_and_modest_callers_are_served() {
        let (throttle, clock) = throttle(false);
        let bucket = Bucket {
            tokens: AtomicU64::new(10),
            reserve: 0,
        };
        let mut modest_served_late = 0;
        for second in 0..120u64 {
            clock.0.store(second * 1000, Ordering::SeqCst);
            bucket.tokens.store(10, Ordering::SeqCst);
            for i in 0..30 {
                let _ = throttle.admit(b"heavy", &bucket).unwrap();
                if i % 6 == 0 {
                    let id = format!("modest-{}", i / 6);
                    let served = throttle.admit(id.as_bytes(), &bucket).unwrap().allowed();
                    if second >= 60 && served {
                        modest_served_late += 1;
                    }
                }
            }
        }
        let stats = throttle.stats();
        assert!(stats.fair_denials > 0, "{stats:?}");
        assert!(throttle.throttle_probability(b"heavy").unwrap() > 0.5);
        assert!(throttle.throttle_probability(b"modest-0").unwrap() < 0.5);
        // 60 seconds × 5 modest requests: nearly all served.
        assert!(modest_served_late >= 270, "{modest_served_late}");
        assert_eq!(stats.passed + stats.fair_denials, 120 * 35);
        assert_eq!(stats.successes + stats.exhaustions, stats.passed);
    }

    #[test]
    fn idle_capacity_serves_throttled_callers_without_feeding_the_throttle() {
        let (throttle, clock) = throttle(true);
        let empty = Bucket {
            tokens: AtomicU64::new(0),
            reserve: 0,
        };
        for _ in 0..1_000 {
            let admission = throttle.admit(b"heavy", &empty).unwrap();
            assert!(!admission.allowed(), "{admission:?}");
        }
        assert!((throttle.throttle_probability(b"heavy").unwrap() - 1.0).abs() < 1e-9);
        let exhaustions = throttle.stats().exhaustions;
        clock.0.store(1, Ordering::SeqCst);
        let full = Bucket {
            tokens: AtomicU64::new(100),
            reserve: 10,
        };
        assert_eq!(
            throttle.admit(b"heavy", &full).unwrap(),
            FairAdmission::AdmittedFromIdleCapacity
        );
        let stats = throttle.stats();
        assert_eq!(stats.idle_admissions, 1);
        assert_eq!(stats.successes, 0);
        assert_eq!(stats.exhaustions, exhaustions);
        assert_eq!(full.tokens.load(Ordering::SeqCst), 99);
    }

    #[test]
    fn bad_input_gets_typed_errors() {
        let clock: Arc<dyn WallClock> = Arc::new(ManualClock::default());
        let options = FairThrottleOptions {
            config: FairThrottleConfig {
                levels: 0,
                ..FairThrottleConfig::default()
            },
            use_idle_capacity: false,
        };
        assert_eq!(
            FairThrottle::new(options, clock).unwrap_err(),
            FairThrottleError::ZeroLevels
        );
        let (throttle, _) = throttle(false);
        assert_eq!(
            throttle.gate(b"").unwrap_err(),
            FairThrottleError::EmptyCallerId
        );
        assert_eq!(
            throttle.record(b"", Outcome::Success).unwrap_err(),
            FairThrottleError::EmptyCallerId
        );
        assert_eq!(throttle.memory_bytes(), 96_000);
    }

    #[test]
    fn rotation_follows_the_clock() {
        let (throttle, clock) = throttle(false);
        let interval = FairThrottleConfig::default().rotation_interval_ms;
        throttle.gate(b"a").unwrap();
        assert_eq!(throttle.stats().rotations, 0);
        clock.0.store(interval, Ordering::SeqCst);
        throttle.gate(b"a").unwrap();
        assert_eq!(throttle.stats().rotations, 1);
    }
}
