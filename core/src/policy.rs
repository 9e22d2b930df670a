//! Policies: key prefix → limit, window length, kind and outage policy.
//! Replicated through the coordinator log; the longest matching prefix wins.

use serde::{Deserialize, Serialize};

/// Largest limit accepted per window (keeps all u64 sums and u128 products exact).
pub const MAX_LIMIT: u64 = 1 << 48;
/// Longest window accepted: 31 days.
pub const MAX_WINDOW_MS: u64 = 31 * 24 * 3600 * 1000;

/// How a key's budget is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum PolicyKind {
    /// First-come leasing from the window's counter.
    #[default]
    Counter,
    /// Region fair pool across regions plus tenant weighted-fair escrow inside each.
    Fair,
}

/// What an escrow node does for this policy while the coordinator is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum OutagePolicy {
    /// Serve what is already held, then deny with a retry hint (Δ = 0 holds).
    #[default]
    FailClosed,
    /// Admit up to `tokens_per_region` per window per region while the
    /// coordinator is unreachable. Δ is then bounded by the sum of those
    /// shares over the regions in outage: the one mode that trades Δ for availability.
    Fallback {
        /// Static share of L each region may admit per window during an outage.
        tokens_per_region: u64,
    },
}

/// One policy row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// Key prefix this policy applies to (may be empty: matches every key).
    pub prefix: String,
    /// L: tokens per window, 1..=[`MAX_LIMIT`].
    pub limit: u64,
    /// Window length in milliseconds, 1..=[`MAX_WINDOW_MS`].
    pub window_ms: u64,
    /// Counter or fair.
    pub kind: PolicyKind,
    /// Outage behaviour of escrow nodes.
    pub outage: OutagePolicy,
}

/// Why a policy was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Limit out of range.
    #[error("limit must be between 1 and {MAX_LIMIT}, got {0}")]
    Limit(u64),
    /// Window out of range.
    #[error("window_ms must be between 1 and {MAX_WINDOW_MS}, got {0}")]
    Window(u64),
    /// Prefix longer than a key may be.
    #[error("prefix is {0} bytes, longer than the maximum key length of 256")]
    PrefixTooLong(usize),
    /// Fallback share larger than the limit.
    #[error("fallback tokens_per_region ({share}) must not exceed the limit ({limit})")]
    FallbackShare {
        /// The configured share.
        share: u64,
        /// The limit.
        limit: u64,
    },
}

impl Policy {
    /// Checks every field; a policy that passes can be applied without overflow.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(PolicyError::Limit(self.limit));
        }
        if self.window_ms == 0 || self.window_ms > MAX_WINDOW_MS {
            return Err(PolicyError::Window(self.window_ms));
        }
        if self.prefix.len() > crate::ids::MAX_KEY_BYTES {
            return Err(PolicyError::PrefixTooLong(self.prefix.len()));
        }
        if let OutagePolicy::Fallback { tokens_per_region } = self.outage {
            if tokens_per_region > self.limit {
                return Err(PolicyError::FallbackShare { share: tokens_per_region, limit: self.limit });
            }
        }
        Ok(())
    }
}
