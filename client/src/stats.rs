//! Counters a limiter keeps about itself, read with
//! [`Limiter::stats`](crate::Limiter::stats).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use leasehold_core::metrics::{Exposition, Histogram, MetricKind};

use crate::error::ClientError;

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
#[derive(Debug)]
pub(crate) struct StatsCounters {
    /// Round trips of answered backend calls (`Acquire`, `Check`), µs.
    pub backend_round_trip: Histogram,
    /// Whether the last backend call was answered (false after a
    /// transient failure: unreachable, no quorum, timed out).
    pub backend_reachable: AtomicBool,
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

impl Default for StatsCounters {
    fn default() -> Self {
        Self {
            backend_round_trip: Histogram::latency(),
            backend_reachable: AtomicBool::new(true),
            admitted: AtomicU64::default(),
            admitted_tokens: AtomicU64::default(),
            denied: AtomicU64::default(),
            denied_from_cache: AtomicU64::default(),
            errors: AtomicU64::default(),
            backend_calls: AtomicU64::default(),
            refills: AtomicU64::default(),
            prefetches: AtomicU64::default(),
            tokens_leased: AtomicU64::default(),
            tokens_returned: AtomicU64::default(),
            tokens_expired: AtomicU64::default(),
            late_grants_dropped: AtomicU64::default(),
            late_tokens_dropped: AtomicU64::default(),
        }
    }
}

impl StatsCounters {
    /// Records how a backend call ended: its round trip when answered, and
    /// whether the backend is reachable.
    pub(crate) fn record_backend_answer<T>(&self, result: &Result<T, ClientError>, took: Duration) {
        match result {
            Ok(_) => {
                self.backend_round_trip.record_duration(took);
                self.backend_reachable.store(true, Ordering::Relaxed);
            }
            Err(e) if e.is_transient() => {
                self.backend_reachable.store(false, Ordering::Relaxed);
            }
            // The backend answered with a refusal: it is reachable.
            Err(_) => self.backend_reachable.store(true, Ordering::Relaxed),
        }
    }

    /// Writes the limiter's metrics into `doc` (see
    /// [`Limiter::write_metrics`](crate::Limiter::write_metrics)).
    pub(crate) fn write_metrics(&self, doc: &mut Exposition, mode: &str) {
        let stats = self.snapshot();
        doc.family(
            "leasehold_client_info",
            MetricKind::Gauge,
            "Always 1; labelled with the limiter's mode (leased, strict, cached_deny).",
        );
        doc.sample("leasehold_client_info", &[("mode", mode)], 1.0);
        doc.single(
            "leasehold_client_backend_reachable",
            MetricKind::Gauge,
            "1 while the last backend call was answered, 0 after a transient failure.",
            f64::from(u8::from(self.backend_reachable.load(Ordering::Relaxed))),
        );
        doc.histogram(
            "leasehold_client_backend_round_trip_seconds",
            "Round trip of answered backend calls (Acquire refills, Check).",
            &self.backend_round_trip.snapshot(),
            1e-6,
        );
        let counters: [(&str, &str, u64); 13] = [
            ("admitted", "Checks admitted.", stats.admitted),
            (
                "admitted_tokens",
                "Tokens spent by admitted checks.",
                stats.admitted_tokens,
            ),
            ("denied", "Checks denied.", stats.denied),
            (
                "denied_from_cache",
                "Denials answered from the local denial cache.",
                stats.denied_from_cache,
            ),
            ("errors", "Checks that failed with an error.", stats.errors),
            (
                "backend_calls",
                "Calls to the backend (refills in leased mode, checks otherwise).",
                stats.backend_calls,
            ),
            (
                "refills",
                "Refills (Acquire) issued, prefetches included.",
                stats.refills,
            ),
            (
                "prefetches",
                "Refills started by the low-water prefetch.",
                stats.prefetches,
            ),
            (
                "tokens_leased",
                "Tokens credited to local wallets from grants.",
                stats.tokens_leased,
            ),
            (
                "tokens_returned",
                "Tokens the backend took back.",
                stats.tokens_returned,
            ),
            (
                "tokens_expired",
                "Tokens that died unspent with their window.",
                stats.tokens_expired,
            ),
            (
                "late_grants_dropped",
                "Grants dropped on arrival (past their deadline or window).",
                stats.late_grants_dropped,
            ),
            (
                "late_tokens_dropped",
                "Tokens of the dropped grants.",
                stats.late_tokens_dropped,
            ),
        ];
        for (name, help, value) in counters {
            doc.single(
                &format!("leasehold_client_{name}_total"),
                MetricKind::Counter,
                help,
                value as f64,
            );
        }
    }

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
