//! `Lease`: first-come grants from a `counter` key's current window.
//!
//! `granted = min(tokens, limit − (Σ granted − Σ credited))` (saturating), so
//! grant conservation `Σ granted − Σ credited ≤ limit` holds by construction.
//! Shadow mode (the policy's `shadow` flag): the whole `tokens` are
//! granted and the part beyond `limit − (Σ granted − Σ credited)` is counted
//! as would-deny in the window and in the policy's tally
//! ([`crate::shadow::decide`]); conservation does not hold for such a window.
//!
//! Refused without any state change: `tokens == 0` (`InvalidArgument`), no
//! governing policy (`NoPolicy`), a `fair` key (`WrongKind`: use `PoolGrant`),
//! a new region beyond [`MAX_REGIONS_PER_WINDOW`] (`InvalidArgument`).

use super::outcome::{CommandError, LeaseGrant, Outcome};
use super::state::CoordinatorState;
use crate::ids::{Key, RegionId};
use crate::policy::PolicyKind;
use crate::shadow;

/// Most distinct regions one window tracks; more are refused so one key's
/// record stays bounded.
pub const MAX_REGIONS_PER_WINDOW: usize = 1024;

impl CoordinatorState {
    pub(super) fn lease(&mut self, key: &Key, region: &RegionId, tokens: u64) -> Outcome {
        if tokens == 0 {
            return Outcome::Rejected(CommandError::InvalidArgument(
                "tokens must be at least 1".to_string(),
            ));
        }
        let Some(policy) = self.policies.lookup(key.as_str()) else {
            return Outcome::Rejected(CommandError::NoPolicy(key.to_string()));
        };
        if policy.kind == PolicyKind::Fair {
            return Outcome::Rejected(CommandError::WrongKind(
                "key is fair: use PoolGrant".to_string(),
            ));
        }
        let now = self.now_ms;
        let record = self.windows.live_or_create(key, policy, now);
        if !record.regions.contains_key(region) && record.regions.len() >= MAX_REGIONS_PER_WINDOW {
            return Outcome::Rejected(CommandError::InvalidArgument(format!(
                "window already tracks {MAX_REGIONS_PER_WINDOW} regions"
            )));
        }
        let verdict = shadow::decide(tokens, record.remaining(), policy.shadow);
        let granted = verdict.granted;
        record.granted = record.granted.saturating_add(granted);
        let used = record.regions.entry_or_default(region);
        used.granted = used.granted.saturating_add(granted);
        record.shadow.record(verdict.would_deny);
        let grant = LeaseGrant {
            granted,
            limit: record.limit,
            window_start_ms: record.bounds.start_ms,
            window_end_ms: record.bounds.end_ms,
            coordinator_now_ms: now,
        };
        let prefix = policy.prefix.clone();
        self.record_shadow(&prefix, verdict.would_deny);
        Outcome::Lease(grant)
    }
}
