//! An in-memory credit source that simulates a coordinator window on tokio
//! time: per-window limit, partial grants, relative lifetimes, a
//! configurable (or seeded random) delay before and after each grant is
//! applied, injected failures, and an exact record of what it granted.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use leasehold_client::{
    AcquireRequest, CheckReply, CheckRequest, ClientError, CreditSource, Decision, Grant,
    ReturnRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

/// Usage of one window at the fake coordinator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowUsage {
    /// Σ granted by `acquire`.
    pub granted: u64,
    /// Σ credited back by `give_back`.
    pub returned: u64,
    /// Σ admitted by strict `check`.
    pub checked: u64,
}

/// Delay before the grant is applied and after (on the way back).
#[derive(Debug, Clone, Copy, Default)]
pub struct Flight {
    pub before: Duration,
    pub after: Duration,
}

#[derive(Default)]
struct State {
    windows: BTreeMap<u64, WindowUsage>,
    scripted: VecDeque<Flight>,
    failures_left: u32,
    rng: Option<(StdRng, u64)>,
    request_ids: Vec<(String, u64)>,
    asked: Vec<u64>,
}

/// The fake coordinator. Its clock reads `base_ms` at construction and
/// advances with tokio time (paused in tests).
pub struct FakeCoordinator {
    start: Instant,
    base_ms: u64,
    pub window_ms: u64,
    pub limit: u64,
    /// Retry hint of a strict denial (0: until the window ends).
    pub deny_retry_after_ms: u64,
    state: Mutex<State>,
    pub acquire_calls: AtomicU64,
    pub check_calls: AtomicU64,
    pub return_calls: AtomicU64,
}

impl FakeCoordinator {
    pub fn new(limit: u64, window_ms: u64, base_ms: u64) -> Arc<Self> {
        Arc::new(FakeCoordinator {
            start: Instant::now(),
            base_ms,
            window_ms,
            limit,
            deny_retry_after_ms: 0,
            state: Mutex::new(State::default()),
            acquire_calls: AtomicU64::new(0),
            check_calls: AtomicU64::new(0),
            return_calls: AtomicU64::new(0),
        })
    }

    pub fn with_deny_retry_after(limit: u64, window_ms: u64, retry_ms: u64) -> Arc<Self> {
        let mut fake = Arc::into_inner(Self::new(limit, window_ms, 0)).expect("fresh");
        fake.deny_retry_after_ms = retry_ms;
        Arc::new(fake)
    }

    /// The coordinator clock, epoch ms.
    pub fn now_ms(&self) -> u64 {
        let elapsed = Instant::now().duration_since(self.start).as_millis();
        self.base_ms + u64::try_from(elapsed).expect("small")
    }

    /// The real (tokio) instant at which the coordinator clock reads `ms`.
    pub fn instant_of(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms.saturating_sub(self.base_ms))
    }

    fn window_of(&self, now_ms: u64) -> (u64, u64) {
        let start = now_ms - now_ms % self.window_ms;
        (start, start + self.window_ms)
    }

    /// The next flights of `acquire`, in order; then `random` or no delay.
    pub fn script(&self, flights: impl IntoIterator<Item = Flight>) {
        self.state.lock().expect("lock").scripted.extend(flights);
    }

    /// Random delays up to `max_ms` before and after each later flight.
    pub fn random_delays(&self, seed: u64, max_ms: u64) {
        self.state.lock().expect("lock").rng = Some((StdRng::seed_from_u64(seed), max_ms));
    }

    /// The next `n` acquires fail as unreachable.
    pub fn fail_next(&self, n: u32) {
        self.state.lock().expect("lock").failures_left = n;
    }

    pub fn usage(&self) -> BTreeMap<u64, WindowUsage> {
        self.state.lock().expect("lock").windows.clone()
    }

    pub fn total_granted(&self) -> u64 {
        self.usage().values().map(|u| u.granted).sum()
    }

    pub fn request_ids(&self) -> Vec<(String, u64)> {
        self.state.lock().expect("lock").request_ids.clone()
    }

    /// The `tokens` of every acquire, in order.
    pub fn asked(&self) -> Vec<u64> {
        self.state.lock().expect("lock").asked.clone()
    }

    fn next_flight(&self) -> Flight {
        let mut state = self.state.lock().expect("lock");
        if let Some(f) = state.scripted.pop_front() {
            return f;
        }
        match &mut state.rng {
            Some((rng, max)) => Flight {
                before: Duration::from_millis(rng.gen_range(0..=*max)),
                after: Duration::from_millis(rng.gen_range(0..=*max)),
            },
            None => Flight::default(),
        }
    }

    fn apply_acquire(&self, tokens: u64) -> Grant {
        let now = self.now_ms();
        let (start, end) = self.window_of(now);
        let mut state = self.state.lock().expect("lock");
        let usage = state.windows.entry(start).or_default();
        let left = self.limit - (usage.granted - usage.returned) - usage.checked;
        let granted = tokens.min(left);
        usage.granted += granted;
        Grant {
            granted,
            limit: self.limit,
            window_start_ms: start,
            window_end_ms: end,
            remaining_lifetime_ms: end - now,
            retry_after_ms: if granted == 0 { end - now } else { 0 },
        }
    }
}

impl CreditSource for FakeCoordinator {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        async move {
            self.acquire_calls.fetch_add(1, Ordering::SeqCst);
            {
                let mut state = self.state.lock().expect("lock");
                state.asked.push(request.tokens);
                state.request_ids.push((
                    request.request_id.client.as_str().to_string(),
                    request.request_id.seq,
                ));
                if state.failures_left > 0 {
                    state.failures_left -= 1;
                    return Err(ClientError::Unavailable("injected".into()));
                }
            }
            let flight = self.next_flight();
            tokio::time::sleep(flight.before).await;
            let grant = self.apply_acquire(request.tokens);
            tokio::time::sleep(flight.after).await;
            Ok(grant)
        }
        .boxed()
    }

    fn check(&self, request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        async move {
            self.check_calls.fetch_add(1, Ordering::SeqCst);
            let now = self.now_ms();
            let (start, end) = self.window_of(now);
            let mut state = self.state.lock().expect("lock");
            let usage = state.windows.entry(start).or_default();
            let left = self.limit - (usage.granted - usage.returned) - usage.checked;
            let decision = if request.cost <= left {
                usage.checked += request.cost;
                Decision {
                    allowed: true,
                    limit: self.limit,
                    remaining: left - request.cost,
                    reset_at_ms: end,
                    retry_after_ms: 0,
                }
            } else {
                let retry = if self.deny_retry_after_ms > 0 {
                    self.deny_retry_after_ms
                } else {
                    end - now
                };
                Decision {
                    allowed: false,
                    limit: self.limit,
                    remaining: left,
                    reset_at_ms: end,
                    retry_after_ms: retry,
                }
            };
            Ok(CheckReply {
                decision,
                window_start_ms: start,
            })
        }
        .boxed()
    }

    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        async move {
            self.return_calls.fetch_add(1, Ordering::SeqCst);
            let (start, _) = self.window_of(self.now_ms());
            if request.window_start_ms != start {
                return Ok(0);
            }
            let mut state = self.state.lock().expect("lock");
            let usage = state.windows.entry(start).or_default();
            let accepted = request.tokens.min(usage.granted - usage.returned);
            usage.returned += accepted;
            Ok(accepted)
        }
        .boxed()
    }
}

/// Asserts the decision contract: `retry_after_ms == 0` iff allowed, and
/// an admission carries a window label iff it is allowed.
pub fn assert_well_formed(admission: &leasehold_client::Admission) {
    let d = admission.decision;
    assert_eq!(
        d.allowed,
        d.retry_after_ms == 0,
        "retry_after must be 0 iff allowed: {d:?}"
    );
    assert_eq!(
        d.allowed,
        admission.window_start_ms.is_some(),
        "label iff allowed: {admission:?}"
    );
}
