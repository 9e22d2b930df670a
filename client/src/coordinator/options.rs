//! [`RetryOptions`]: the deadlines, retry budget and backoff of every
//! coordinator call.

use std::time::Duration;

use rand::Rng;

/// Deadlines and retry budget of a
/// [`CoordinatorClient`](super::CoordinatorClient).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryOptions {
    /// Deadline of one attempt against one node. Keep it above the
    /// coordinator's proposal timeout so a `UNAVAILABLE` answer arrives first.
    pub call_timeout: Duration,
    /// Budget of the whole call, retries and backoff included.
    pub total_timeout: Duration,
    /// Most attempts per call (redirects count).
    pub max_attempts: u32,
    /// First backoff; doubles per retry up to `backoff_max`, fully jittered.
    pub backoff_base: Duration,
    /// Largest backoff.
    pub backoff_max: Duration,
}

impl Default for RetryOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_millis(3_000),
            total_timeout: Duration::from_millis(10_000),
            max_attempts: 40,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(250),
        }
    }
}

impl RetryOptions {
    /// The pause before retry `retry`: `backoff_base` doubled per retry,
    /// at most `backoff_max` (and at least 1 ms), drawn from its upper half
    /// by `jitter`.
    pub(super) fn backoff(&self, retry: u32, jitter: &mut impl Rng) -> Duration {
        let exp = self.backoff_base.saturating_mul(1u32 << retry.min(16));
        let cap = exp.min(self.backoff_max);
        let millis = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX).max(1);
        Duration::from_millis(jitter.gen_range(millis / 2..=millis))
    }
}
