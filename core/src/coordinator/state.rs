//! The coordinator state (the Raft snapshot) and `apply`, which dispatches
//! each command to its own module.
//!
//! # Applying a proposal
//! 1. The clock becomes `max(previous now, min(proposal.stamp_ms,
//!    MAX_CLOCK_MS))`: it never goes back, whatever the leaders' wall clocks say.
//! 2. Garbage is collected at that clock (windows whose end is `<= now`,
//!    expired tombstones and sessions; see `gc`). The clock is fixed for
//!    the rest of the proposal, so nothing else dies during it, and the state
//!    after a proposal depends only on the state before and the proposal.
//!    Every `Tick` of the proposal reports the number of windows this pass
//!    collected.
//! 3. Each command, in order: if it carries a request id, the session table is
//!    consulted first (a retry returns the first outcome and changes nothing);
//!    otherwise, or for a new id, it is executed.
//!
//! Everything is integer arithmetic over `BTreeMap`s, so two replicas applying
//! the same proposals reach equal states and produce equal outcomes.

use serde::{Deserialize, Serialize};

use super::command::*;
use super::sessions::{SessionLookup, Sessions, SESSION_MIN_RETAIN_MS};
use super::windows::WindowTable;
use crate::ids::{Key, RequestId};
use crate::policy::{Policy, PolicyTable};

/// Largest clock value the state machine uses: larger stamps count as this, so
/// every window end (`start + window_ms`) stays representable and is > now.
pub const MAX_CLOCK_MS: u64 = 1 << 62;

/// A read-only view of one key's current window (for `GetWindow`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowView {
    /// The policy matching the key.
    pub policy: Policy,
    /// Effective limit of the window.
    pub limit: u64,
    /// Window start.
    pub window_start_ms: u64,
    /// Window end.
    pub window_end_ms: u64,
    /// Σ granted.
    pub granted: u64,
    /// Σ credited back.
    pub returned: u64,
    /// Per region: (region, granted, returned, pool weight), sorted by region.
    pub regions: Vec<RegionView>,
    /// The time the view was taken at: the later of the caller's clock and
    /// the state-machine clock (the window shown is the one current then).
    pub coordinator_now_ms: u64,
}

/// One region's use of a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionView {
    /// Region id.
    pub region: String,
    /// Granted to it.
    pub granted: u64,
    /// Credited back by it.
    pub returned: u64,
    /// Its last pool weight (fair keys), else 0.
    pub pool_weight: u64,
}

/// The whole replicated coordinator state; a snapshot is this value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorState {
    pub(super) now_ms: u64,
    pub(super) policies: PolicyTable,
    pub(super) windows: WindowTable,
    pub(super) sessions: Sessions,
}

impl CoordinatorState {
    /// Applies one proposal; deterministic (see the module doc).
    pub fn apply(&mut self, proposal: &Proposal) -> ProposalResult {
        self.now_ms = self.now_ms.max(proposal.stamp_ms.min(MAX_CLOCK_MS));
        let collected_windows = self.collect_garbage();
        let outcomes = proposal
            .commands
            .iter()
            .map(|command| self.apply_command(command, collected_windows))
            .collect();
        ProposalResult { outcomes }
    }

    fn apply_command(&mut self, command: &Command, collected_windows: u64) -> Outcome {
        match command {
            Command::Tick => Outcome::Ticked { collected_windows },
            Command::SetPolicy(policy) => self.set_policy(policy),
            Command::DeletePolicy { prefix } => self.delete_policy(prefix),
            Command::Lease {
                key,
                region,
                tokens,
                request_id,
            } => self.exactly_once(request_id.as_ref(), |state| {
                state.lease(key, region, *tokens)
            }),
            Command::Reconcile {
                key,
                region,
                leftover,
                window_start_ms,
                request_id,
            } => self.exactly_once(request_id.as_ref(), |state| {
                state.reconcile(key, region, *leftover, *window_start_ms)
            }),
            Command::PoolGrant {
                key,
                region,
                region_weight,
                want_total,
                request_id,
            } => self.exactly_once(request_id.as_ref(), |state| {
                state.pool_grant(key, region, *region_weight, *want_total)
            }),
        }
    }

    /// Runs `execute` once per request id: a retry gets the stored outcome.
    fn exactly_once(
        &mut self,
        request_id: Option<&RequestId>,
        execute: impl FnOnce(&mut Self) -> Outcome,
    ) -> Outcome {
        let Some(id) = request_id else {
            return execute(self);
        };
        match self.sessions.lookup(id) {
            SessionLookup::Replay(outcome) => outcome,
            SessionLookup::TooOld => Outcome::Rejected(CommandError::InvalidArgument(
                "request id too old".to_string(),
            )),
            SessionLookup::New => {
                let outcome = execute(self);
                let window_end = match &outcome {
                    Outcome::Lease(grant) => grant.window_end_ms,
                    Outcome::PoolGrant(grant) => grant.window_end_ms,
                    _ => 0,
                };
                let retain_until =
                    window_end.max(self.now_ms.saturating_add(SESSION_MIN_RETAIN_MS));
                self.sessions.record(id, &outcome, retain_until);
                outcome
            }
        }
    }

    /// The state-machine clock.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// All policies, sorted by prefix.
    pub fn policies(&self) -> Vec<Policy> {
        self.policies.iter().cloned().collect()
    }

    /// The policy matching `key` (longest prefix).
    pub fn policy_for(&self, key: &Key) -> Option<&Policy> {
        self.policies.lookup(key.as_str())
    }

    /// The current window of `key` as of `max(now_ms, state clock)`
    /// (read-only; does not create it): the live record if there is one,
    /// otherwise the window a lease would create then, with nothing granted.
    /// `NoPolicy` when no policy governs the key.
    pub fn window_view(&self, key: &Key, now_ms: u64) -> Result<WindowView, CommandError> {
        let policy = self
            .policy_for(key)
            .ok_or_else(|| CommandError::NoPolicy(key.to_string()))?;
        let now = now_ms.min(MAX_CLOCK_MS).max(self.now_ms);
        let view = match self.windows.live(key, now) {
            Some(record) => WindowView {
                policy: policy.clone(),
                limit: record.limit,
                window_start_ms: record.bounds.start_ms,
                window_end_ms: record.bounds.end_ms,
                granted: record.granted,
                returned: record.returned,
                regions: record
                    .regions
                    .iter()
                    .map(|(region, used)| RegionView {
                        region: region.to_string(),
                        granted: used.granted,
                        returned: used.returned,
                        pool_weight: used.pool_weight,
                    })
                    .collect(),
                coordinator_now_ms: now,
            },
            None => {
                let bounds = self.windows.next_bounds(key, policy.window_ms, now);
                WindowView {
                    policy: policy.clone(),
                    limit: policy.limit,
                    window_start_ms: bounds.start_ms,
                    window_end_ms: bounds.end_ms,
                    granted: 0,
                    returned: 0,
                    regions: Vec::new(),
                    coordinator_now_ms: now,
                }
            }
        };
        Ok(view)
    }

    /// Number of window records held.
    pub fn live_windows(&self) -> u64 {
        self.windows.live_count()
    }

    /// Number of keys with any window state (a live window or the tombstone
    /// that keeps window starts increasing; see the window creation rule).
    pub fn tracked_keys(&self) -> u64 {
        self.windows.key_count()
    }

    /// Number of client sessions held (bounded by [`super::MAX_SESSIONS`]).
    pub fn client_sessions(&self) -> u64 {
        self.sessions.len()
    }
}
