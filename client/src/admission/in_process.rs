//! Per-key in-process limits (GCRA or token bucket) behind one mutex: the
//! rate axis, or an in-process cost axis.

use std::collections::HashMap;
use std::sync::Mutex;

use leasehold_core::admission::gcra::{Gcra, GcraParams};
use leasehold_core::admission::token_bucket::{TokenBucket, TokenBucketParams};
use leasehold_core::decision::Decision;

use super::error::AdmissionError;
use crate::limiter::lock;

/// An in-process limit, applied per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InProcessLimit {
    /// GCRA: `limit` units per `period_ms`, bursts up to `limit`.
    Gcra(GcraParams),
    /// Token bucket: `capacity` units, refilled at `refill_per_sec`.
    TokenBucket(TokenBucketParams),
}

impl InProcessLimit {
    /// GCRA with `limit` units per `period_ms`.
    pub fn gcra(limit: u64, period_ms: u64) -> Self {
        InProcessLimit::Gcra(GcraParams { limit, period_ms })
    }

    /// A token bucket of `capacity` refilled at `refill_per_sec`.
    pub fn token_bucket(capacity: u64, refill_per_sec: u64) -> Self {
        InProcessLimit::TokenBucket(TokenBucketParams {
            capacity,
            refill_per_sec,
        })
    }

    /// The largest cost one request can ever be granted.
    pub fn capacity(&self) -> u64 {
        match self {
            InProcessLimit::Gcra(p) => p.limit,
            InProcessLimit::TokenBucket(p) => p.capacity,
        }
    }

    /// A fresh (idle, full) state; a bucket full at time 0 stays full.
    fn fresh(&self) -> Result<KeyState, AdmissionError> {
        Ok(match self {
            InProcessLimit::Gcra(p) => KeyState::Gcra(Gcra::new(*p)?),
            InProcessLimit::TokenBucket(p) => KeyState::Bucket(TokenBucket::new(*p, 0)?),
        })
    }
}

#[derive(Debug, Clone)]
enum KeyState {
    Gcra(Gcra),
    Bucket(TokenBucket),
}

impl KeyState {
    fn try_acquire(&mut self, now_ms: u64, cost: u64) -> Decision {
        match self {
            KeyState::Gcra(g) => g.try_acquire(now_ms, cost),
            KeyState::Bucket(b) => b.try_acquire(now_ms, cost),
        }
    }
    fn peek(&self, now_ms: u64, cost: u64) -> Decision {
        match self {
            KeyState::Gcra(g) => g.peek(now_ms, cost),
            KeyState::Bucket(b) => b.peek(now_ms, cost),
        }
    }
    fn refund(&mut self, now_ms: u64, cost: u64) {
        match self {
            KeyState::Gcra(g) => g.refund(now_ms, cost),
            KeyState::Bucket(b) => b.refund(now_ms, cost),
        }
    }
    fn is_idle(&mut self, now_ms: u64) -> bool {
        match self {
            KeyState::Gcra(g) => g.is_idle(now_ms),
            KeyState::Bucket(b) => b.is_idle(now_ms),
        }
    }
}

/// One in-process limit kept per key. When a new key arrives at a full
/// table, keys whose state equals a fresh one are forgotten; if none is,
/// the table grows past `max_keys` rather than forget a key's spending
/// (forgetting it would hand the key a fresh budget).
#[derive(Debug)]
pub(crate) struct KeyedLimit {
    pub(crate) limit: InProcessLimit,
    fresh: KeyState,
    max_keys: usize,
    keys: Mutex<HashMap<String, KeyState>>,
}

impl KeyedLimit {
    pub(crate) fn new(limit: InProcessLimit, max_keys: usize) -> Result<Self, AdmissionError> {
        Ok(KeyedLimit {
            limit,
            fresh: limit.fresh()?,
            max_keys: max_keys.max(1),
            keys: Mutex::new(HashMap::new()),
        })
    }

    pub(crate) fn try_acquire(&self, key: &str, now_ms: u64, cost: u64) -> Decision {
        let mut keys = lock(&self.keys);
        if !keys.contains_key(key) && keys.len() >= self.max_keys {
            keys.retain(|_, state| !state.is_idle(now_ms));
        }
        match keys.get_mut(key) {
            Some(state) => state.try_acquire(now_ms, cost),
            None => keys
                .entry(key.to_string())
                .or_insert_with(|| self.fresh.clone())
                .try_acquire(now_ms, cost),
        }
    }

    /// What [`try_acquire`](Self::try_acquire) would decide, taking
    /// nothing and tracking no new key.
    pub(crate) fn peek(&self, key: &str, now_ms: u64, cost: u64) -> Decision {
        match lock(&self.keys).get(key) {
            Some(state) => state.peek(now_ms, cost),
            None => self.fresh.peek(now_ms, cost),
        }
    }

    pub(crate) fn refund(&self, key: &str, now_ms: u64, cost: u64) {
        if let Some(state) = lock(&self.keys).get_mut(key) {
            state.refund(now_ms, cost);
        }
    }

    #[cfg(test)]
    pub(crate) fn tracked_keys(&self) -> usize {
        lock(&self.keys).len()
    }
}
