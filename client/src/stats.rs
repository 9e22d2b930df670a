//! Counters a limiter keeps about itself, read with
//! [`Limiter::stats`](crate::Limiter::stats).

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a limiter's counters (monotonic since construction).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterStats {
    /// Checks answered `allowed`.
    pub admitted: u64,
    /// Tokens spent by admitted checks (Σ cost).
    pub admitted_tokens: u64,
    /// Checks answered `denied`.
    pub denied: u64,
    /// Denials answered from the local denial cache (cached-deny mode).
    pub denied_from_cache: u64,
    /// Checks that failed with an error.
    pub errors: u64,
    /// Backend calls made: refills (`Acquire`) in leased mode, `Check`s otherwise.
    pub backend_calls: u64,
    /// Refills (`Acquire` calls) issued, including prefetches.
    pub refills: u64,
    /// Refills started by the low-water prefetch.
    pub prefetches: u64,
    /// Tokens credited to local wallets from grants.
    pub tokens_leased: u64,
    /// Tokens the backend accepted back via `Return`.
    pub tokens_returned: u64,
    /// Tokens that died at their deadline unspent.
    pub tokens_expired: u64,
    /// Grants dropped on arrival (past their deadline or for an older window).
    pub late_grants_dropped: u64,
    /// Tokens of those dropped grants.
    pub late_tokens_dropped: u64,
}

/// The live counters behind [`LimiterStats`].
#[derive(Debug, Default)]
pub(crate) struct StatsCounters {
    pub admitted: AtomicU64,
    pub admitted_tokens: AtomicU64,
    pub denied: AtomicU64,
    pub denied_from_cache: AtomicU64,
    pub errors: AtomicU64,
    pub backend_calls: AtomicU64,
    pub refills: AtomicU64,
    pub prefetches: AtomicU64,
    pub tokens_leased: AtomicU64,
    pub tokens_returned: AtomicU64,
    pub tokens_expired: AtomicU64,
    pub late_grants_dropped: AtomicU64,
    pub late_tokens_dropped: AtomicU64,
}

/// Adds `n` to a counter.
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl StatsCounters {
    pub(crate) fn snapshot(&self) -> LimiterStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LimiterStats {
            admitted: get(&self.admitted),
            admitted_tokens: get(&self.admitted_tokens),
            denied: get(&self.denied),
            denied_from_cache: get(&self.denied_from_cache),
            errors: get(&self.errors),
            backend_calls: get(&self.backend_calls),
            refills: get(&self.refills),
            prefetches: get(&self.prefetches),
            tokens_leased: get(&self.tokens_leased),
            tokens_returned: get(&self.tokens_returned),
            tokens_expired: get(&self.tokens_expired),
            late_grants_dropped: get(&self.late_grants_dropped),
            late_tokens_dropped: get(&self.late_tokens_dropped),
        }
    }
}
