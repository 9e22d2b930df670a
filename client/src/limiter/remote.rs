//! Strict and cached-deny modes: the backend decides every admission.
//!
//! Cached-deny remembers a denial of cost `c` until its `retry_after`
//! passes. Within that time a check of the same key with cost `≥ c` is
//! denied locally (it would be denied remotely too: the remaining budget is
//! below `c`); a smaller cost still asks, and an allow clears the entry.
//! Admissions always come from the backend, so they stay globally exact.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::ids::Key;
use tokio::time::Instant;

use super::leased::millis_until;
use super::{lock, Inner};
use crate::decision::{denied, well_formed, Admission, Decision};
use crate::error::ClientError;
use crate::source::CheckRequest;
use crate::stats::bump;

/// A remembered denial of one key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CachedDenial {
    /// Denials are served locally until this instant.
    until: Instant,
    /// The smallest cost denied while the entry was live.
    min_cost: u64,
    /// The denial as the backend gave it.
    decision: Decision,
}

impl Inner {
    pub(super) async fn check_strict(
        self: &Arc<Self>,
        key: Key,
        cost: u64,
    ) -> Result<Admission, ClientError> {
        bump(&self.stats.backend_calls, 1);
        let request = CheckRequest {
            key,
            tenant: self.config.tenant.clone(),
            weight: self.config.weight,
            cost,
        };
        let sent = tokio::time::Instant::now();
        let reply = self.source.check(request).await;
        self.stats.record_backend_answer(&reply, sent.elapsed());
        let reply = reply?;
        let decision = well_formed(reply.decision);
        Ok(Admission {
            decision,
            window_start_ms: decision.allowed.then_some(reply.window_start_ms),
        })
    }

    pub(super) async fn check_cached_deny(
        self: &Arc<Self>,
        key: Key,
        cost: u64,
    ) -> Result<Admission, ClientError> {
        let now = Instant::now();
        if let Some(decision) = self.cached_denial(key.as_str(), cost, now) {
            bump(&self.stats.denied_from_cache, 1);
            return Ok(Admission {
                decision,
                window_start_ms: None,
            });
        }
        let name = key.as_str().to_string();
        let admission = self.check_strict(key, cost).await?;
        let mut denials = lock(&self.denials);
        if admission.decision.allowed {
            denials.remove(&name);
        } else {
            let until = now + Duration::from_millis(admission.decision.retry_after_ms);
            if denials.len() >= self.config.max_keys {
                denials.retain(|_, d| d.until > now);
            }
            if denials.len() < self.config.max_keys || denials.contains_key(&name) {
                let entry = denials.entry(name).or_insert(CachedDenial {
                    until,
                    min_cost: cost,
                    decision: admission.decision,
                });
                if entry.until <= now {
                    *entry = CachedDenial {
                        until,
                        min_cost: cost,
                        decision: admission.decision,
                    };
                } else {
                    entry.until = entry.until.max(until);
                    entry.min_cost = entry.min_cost.min(cost);
                    entry.decision = admission.decision;
                }
            }
        }
        Ok(admission)
    }

    /// The cached denial of `key` for `cost` at `now`, with its retry hint
    /// shortened to the time actually left.
    fn cached_denial(&self, key: &str, cost: u64, now: Instant) -> Option<Decision> {
        let mut denials = lock(&self.denials);
        let entry = *denials.get(key)?;
        if now >= entry.until {
            denials.remove(key);
            return None;
        }
        if cost < entry.min_cost {
            return None;
        }
        let d = entry.decision;
        Some(denied(
            d.limit,
            d.remaining,
            d.reset_at_ms,
            millis_until(now, entry.until),
        ))
    }
}
