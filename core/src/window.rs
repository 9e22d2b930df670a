//! Epoch-aligned window arithmetic.
//!
//! Law: for `window_ms > 0`, `start(t) = floor(t / window_ms) * window_ms` and
//! `start(t) <= t < start(t) + window_ms`.

use serde::{Deserialize, Serialize};

/// One window of a key: `[start_ms, end_ms)` in coordinator milliseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WindowBounds {
    /// Inclusive start, epoch milliseconds.
    pub start_ms: u64,
    /// Exclusive end, epoch milliseconds.
    pub end_ms: u64,
}

impl WindowBounds {
    /// The aligned window containing `now_ms`. `window_ms` must be non-zero
    /// (policies are validated before they reach here); zero is treated as 1.
    pub fn containing(now_ms: u64, window_ms: u64) -> Self {
        let w = window_ms.max(1);
        let start_ms = now_ms - now_ms % w;
        WindowBounds {
            start_ms,
            end_ms: start_ms.saturating_add(w),
        }
    }

    /// Whether `now_ms` lies inside this window.
    pub fn contains(&self, now_ms: u64) -> bool {
        self.start_ms <= now_ms && now_ms < self.end_ms
    }

    /// Remaining lifetime at `now_ms`: `end - now`, zero once the window is over.
    /// This is what crosses process boundaries instead of absolute times (DESIGN §4).
    pub fn remaining_lifetime_ms(&self, now_ms: u64) -> u64 {
        self.end_ms.saturating_sub(now_ms)
    }
}
