//! The [`Limiter`] services embed: one object per budget family, shared by
//! every task of the service (it is `Clone` and cheap to clone).
//!
//! The mode-specific paths live in private submodules: `leased` (local
//! credits, coalesced refills, prefetch), `remote` (strict and cached-deny),
//! `idle` (returning idle credits, key eviction), `keys` (the bounded
//! per-key table), `credit_lane` (the lock-free per-key credits a check
//! with credits held spends), `recent_cells` (each thread's cache of the
//! cells it checked lately) and `counter_clock` (the cycle-counter bound on
//! the clock such a check may read instead of the clock).

pub(crate) mod counter_clock;
mod credit_lane;
mod idle;
mod keys;
mod leased;
mod recent_cells;
mod remote;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use leasehold_core::ids::{ClientId, Key, RequestId};

use crate::config::{CheckClock, LimiterConfig, Mode};
use crate::decision::{Admission, Decision};
use crate::error::{ClientError, ConfigError};
use crate::source::CreditSource;
use crate::stats::{bump, LimiterStats, StatsCounters};

use keys::KeyTable;
use remote::CachedDenial;

/// An admission limiter for many keys, in one of three [`Mode`]s.
///
/// `check` never blocks a thread: it awaits at most one backend call (or
/// one coalesced refill) per round, bounded by the configured call timeout.
/// Must be used inside a tokio runtime (real or simulated).
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// State shared by every clone of a limiter and by its background tasks.
pub(crate) struct Inner {
    source: Arc<dyn CreditSource>,
    config: LimiterConfig,
    keys: KeyTable,
    denials: Mutex<HashMap<String, CachedDenial>>,
    stats: StatsCounters,
    /// The client id of this limiter's request ids (its incarnation).
    client_id: ClientId,
    next_seq: AtomicU64,
    sweeper_started: AtomicBool,
    /// The instant the credit lanes count their nanoseconds from.
    clock_origin: tokio::time::Instant,
    /// What a check with credits held reads as the time.
    lane_clock: LaneClock,
}

/// The time source of the lock-free spend ([`CheckClock`], resolved): the
/// cycle-counter bound, whose origin lies `origin_ns` before the limiter's
/// clock origin, or tokio's clock ([`LaneClock::RUNTIME`]). Under
/// [`CheckClock::Auto`] it falls back to tokio's clock for good the first
/// time a refill finds that clock paused or moved off real time.
#[derive(Debug)]
struct LaneClock {
    origin_ns: AtomicU64,
    /// Whether refills still look for a paused runtime clock.
    auto: bool,
}

impl LaneClock {
    /// `origin_ns` when checks read `tokio::time::Instant::now()`.
    const RUNTIME: u64 = u64::MAX;

    fn new(counter_origin_ns: Option<u64>, auto: bool) -> Self {
        LaneClock {
            origin_ns: AtomicU64::new(counter_origin_ns.unwrap_or(Self::RUNTIME)),
            auto: auto && counter_origin_ns.is_some(),
        }
    }

    /// The counter's origin, or `None` when checks read tokio's clock.
    #[inline(always)]
    fn counter_origin_ns(&self) -> Option<u64> {
        let origin = self.origin_ns.load(Ordering::Acquire);
        (origin != Self::RUNTIME).then_some(origin)
    }

    /// Under [`CheckClock::Auto`], before a refill's credits are dated:
    /// falls back to tokio's clock for good if it no longer reads real
    /// time.
    fn recheck(&self) {
        if self.auto
            && self.counter_origin_ns().is_some()
            && !counter_clock::runtime_clock_is_real_time()
        {
            self.origin_ns.store(Self::RUNTIME, Ordering::Release);
            tracing::info!(
                "tokio's clock is paused or moved off real time: this limiter's checks read it \
                 from now on instead of the cycle counter"
            );
        }
    }
}

impl Limiter {
    /// A limiter drawing on `source`. Fails if the configuration is invalid.
    pub fn new(source: impl CreditSource, config: LimiterConfig) -> Result<Self, ConfigError> {
        Self::with_shared_source(Arc::new(source), config)
    }

    /// A limiter drawing on a source shared with other limiters.
    pub fn with_shared_source(
        source: Arc<dyn CreditSource>,
        config: LimiterConfig,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        let max_keys = config.max_keys;
        let client_id = if config.fresh_incarnation {
            crate::config::incarnation_id(&config.client_id)
        } else {
            config.client_id.clone()
        };
        let clock = match &config.mode {
            Mode::Leased(options) => options.clock,
            Mode::Strict | Mode::CachedDeny => CheckClock::Runtime,
        };
        // Auto reads the counter only where tokio's clock is real time
        // (not paused, advanced or resumed by a test).
        let wants_counter = match clock {
            CheckClock::CycleCounter => true,
            CheckClock::Auto => counter_clock::runtime_clock_is_real_time(),
            CheckClock::Runtime => false,
        };
        if wants_counter {
            // Before the limiter's origin is read: the counter's origin
            // must not be later.
            counter_clock::start();
        }
        let clock_origin = tokio::time::Instant::now();
        let counter_origin_ns = || {
            let since = clock_origin
                .into_std()
                .checked_duration_since(counter_clock::origin())?;
            u64::try_from(since.as_nanos()).ok()
        };
        let lane_clock = LaneClock::new(
            wants_counter.then(counter_origin_ns).flatten(),
            clock == CheckClock::Auto,
        );
        Ok(Limiter {
            inner: Arc::new(Inner {
                source,
                config,
                keys: KeyTable::new(max_keys),
                denials: Mutex::new(HashMap::new()),
                stats: StatsCounters::default(),
                client_id,
                next_seq: AtomicU64::new(1),
                sweeper_started: AtomicBool::new(false),
                clock_origin,
                lane_clock,
            }),
        })
    }

    /// Decides whether a request spending `cost` tokens of `key` may proceed.
    ///
    /// A denial is `Ok` with `allowed == false` and `retry_after_ms ≥ 1`.
    /// Errors: [`ClientError::InvalidInput`] for an empty or too long key or
    /// a zero cost; [`ClientError::Unavailable`] /
    /// [`ClientError::DeadlineExceeded`] when the backend cannot answer in
    /// time (the caller chooses to fail open or closed).
    pub fn check<'a>(
        &'a self,
        key: &'a str,
        cost: u64,
    ) -> impl Future<Output = Result<Decision, ClientError>> + Send + 'a {
        self.checking(key, cost, |admission| admission.decision)
    }

    /// Like [`check`](Self::check), also reporting the window an admission
    /// is labelled with.
    ///
    /// In leased mode with enough live credits held, the check is decided on
    /// its first poll with no allocation, mutex, timer or await (the common
    /// case, measured by `benches/check.rs`); anything else runs the full
    /// path.
    pub fn check_labelled<'a>(
        &'a self,
        key: &'a str,
        cost: u64,
    ) -> impl Future<Output = Result<Admission, ClientError>> + Send + 'a {
        self.checking(key, cost, |admission| admission)
    }

    /// The check future, answering `report(admission)`.
    #[inline]
    fn checking<'a, T: 'a>(
        &'a self,
        key: &'a str,
        cost: u64,
        report: impl Fn(Admission) -> T + Send + Unpin + 'a,
    ) -> impl Future<Output = Result<T, ClientError>> + Send + 'a {
        Checking {
            limiter: self,
            key,
            cost,
            report,
            full_path: None,
        }
    }

    /// Polls the full path of a check, starting it on the first call.
    #[inline(never)]
    fn poll_full_path<'a>(
        &'a self,
        full_path: &mut Option<BoxFuture<'a, Result<Admission, ClientError>>>,
        key: &'a str,
        cost: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Admission, ClientError>> {
        full_path
            .get_or_insert_with(|| Box::pin(self.check_full_path(key, cost)))
            .as_mut()
            .poll(cx)
    }

    /// Validation, the mode's decision under the call timeout, and stats.
    async fn check_full_path(&self, key: &str, cost: u64) -> Result<Admission, ClientError> {
        let inner = &self.inner;
        let result = match validate_input(key, cost) {
            Err(e) => Err(e),
            Ok(key) => {
                let timeout = inner.config.call_timeout;
                match tokio::time::timeout(timeout, inner.decide(key, cost)).await {
                    Ok(result) => result,
                    Err(_) => Err(ClientError::DeadlineExceeded(timeout)),
                }
            }
        };
        match &result {
            Ok(a) if a.decision.allowed => {
                bump(&inner.stats.admitted, 1);
                bump(&inner.stats.admitted_tokens, cost);
            }
            Ok(_) => bump(&inner.stats.denied, 1),
            Err(_) => bump(&inner.stats.errors, 1),
        }
        result
    }

    /// The client id of this limiter's request ids: `config.client_id`
    /// plus a random suffix drawn when the limiter was made, unless
    /// `fresh_incarnation` was turned off.
    pub fn client_id(&self) -> &ClientId {
        &self.inner.client_id
    }

    /// This limiter's Prometheus metrics, for a service to serve on its own
    /// `/metrics`: `leasehold_client_*` counters (admitted, denied, backend
    /// calls, refills, tokens leased, returned and expired, …), whether the
    /// backend answers, the backend round-trip histogram, and (leased mode)
    /// the check clock in use. No series per key. Several limiters in one
    /// process: give each document its own `job`/instance, or use
    /// [`Limiter::stats`].
    pub fn write_metrics(&self, doc: &mut leasehold_core::metrics::Exposition) {
        let mode = match self.inner.config.mode {
            crate::Mode::Leased(_) => "leased",
            crate::Mode::Strict => "strict",
            crate::Mode::CachedDeny => "cached_deny",
        };
        self.inner.fold_lane_counters();
        self.inner.stats.write_metrics(doc, mode);
        if let crate::Mode::Leased(options) = &self.inner.config.mode {
            let chosen = match options.clock {
                CheckClock::Auto => "auto",
                CheckClock::Runtime => "runtime",
                CheckClock::CycleCounter => "cycle_counter",
            };
            let (clock, state) = match self.inner.lane_clock.counter_origin_ns() {
                None => ("runtime", "in_use"),
                Some(_) => ("cycle_counter", counter_clock::status().label()),
            };
            doc.family(
                "leasehold_client_check_clock",
                leasehold_core::metrics::MetricKind::Gauge,
                "Always 1; the clock a check with credits held reads (runtime, cycle_counter), \
                 its state (in_use; for the cycle counter also measuring, unavailable or \
                 disabled, when checks read the clock instead) and the option chosen (auto, \
                 runtime, cycle_counter).",
            );
            doc.sample(
                "leasehold_client_check_clock",
                &[("clock", clock), ("state", state), ("chosen", chosen)],
                1.0,
            );
        }
    }

    /// [`Limiter::write_metrics`] as a whole text exposition document.
    pub fn metrics_text(&self) -> String {
        let mut doc = leasehold_core::metrics::Exposition::new();
        self.write_metrics(&mut doc);
        doc.finish()
    }

    /// A snapshot of this limiter's counters.
    pub fn stats(&self) -> LimiterStats {
        self.inner.fold_lane_counters();
        self.inner.stats.snapshot()
    }

    /// The configuration this limiter was built with.
    pub fn config(&self) -> &LimiterConfig {
        &self.inner.config
    }

    /// A forecast of `key`'s demand (tokens) in its next window — the one
    /// after the current, or its first if it has none yet — for a
    /// predictive lease sizer ([`LeaseSizing::predictive`](crate::LeaseSizing::predictive)):
    /// it leases the EOQ of the forecast as one of its two experts, and
    /// learns from each window how much to trust them. A window without a
    /// forecast uses the last window's demand instead.
    /// Returns whether the key's sizer uses forecasts (false in strict and
    /// cached-deny modes and for fixed or EOQ sizing). An invalid key is an
    /// error.
    pub fn predict(&self, key: &str, demand: u64) -> Result<bool, ClientError> {
        let key = Key::new(key)?;
        Ok(match &self.inner.config.mode {
            Mode::Leased(options) => self.inner.predict(&key, options, demand),
            _ => false,
        })
    }

    /// Live local credits held for `key` (leased mode; 0 otherwise).
    pub fn local_balance(&self, key: &str) -> u64 {
        self.inner.local_balance(key)
    }

    /// Gives back (`Return`) the credits of every key untouched for at
    /// least `idle_for`, and forgets idle keys that hold nothing. Returns
    /// how many tokens the backend accepted. Leased mode runs this in the
    /// background when `return_idle_after` is set; call it directly to
    /// return credits on demand (`Duration::ZERO` before shutdown).
    pub async fn return_idle_credits(&self, idle_for: Duration) -> Result<u64, ClientError> {
        self.inner.return_idle(idle_for).await
    }
}

/// One check: decided on its first poll when the key's lane holds the
/// credits, else by the boxed full path. Only the lane's spend is inlined
/// into the caller's poll (`report` is a closure type, not a function
/// pointer, and the full path sits behind a call that is made only when
/// the lane cannot decide).
struct Checking<'a, R> {
    limiter: &'a Limiter,
    key: &'a str,
    cost: u64,
    /// Turns the admission into what the caller asked for.
    report: R,
    /// The full path, once the lane could not decide.
    full_path: Option<BoxFuture<'a, Result<Admission, ClientError>>>,
}

impl<T, R: Fn(Admission) -> T + Unpin> Future for Checking<'_, R> {
    type Output = Result<T, ClientError>;

    #[inline(always)]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.full_path.is_none() {
            // Counted in the key's lane; folded into the counters when
            // they are read.
            if let Some(admission) = this.limiter.inner.spend_held_credits(this.key, this.cost) {
                return Poll::Ready(Ok((this.report)(admission)));
            }
        }
        this.limiter
            .poll_full_path(&mut this.full_path, this.key, this.cost, cx)
            .map(|result| result.map(&this.report))
    }
}

impl Inner {
    async fn decide(self: &Arc<Self>, key: Key, cost: u64) -> Result<Admission, ClientError> {
        match &self.config.mode {
            Mode::Strict => self.check_strict(key, cost).await,
            Mode::CachedDeny => self.check_cached_deny(key, cost).await,
            Mode::Leased(options) => self.check_leased(key, cost, options).await,
        }
    }

    fn next_request_id(&self) -> RequestId {
        RequestId {
            client: self.client_id.clone(),
            seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
        }
    }
}

fn validate_input(key: &str, cost: u64) -> Result<Key, ClientError> {
    if cost == 0 {
        return Err(ClientError::InvalidInput("cost must be at least 1".into()));
    }
    Ok(Key::new(key)?)
}

/// Locks a mutex, recovering the data if another thread panicked while
/// holding it (every critical section leaves the state consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
