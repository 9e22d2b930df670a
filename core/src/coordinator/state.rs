//! The coordinator state and `apply`. (Interface fixed; body being written.)

use serde::{Deserialize, Serialize};

use super::command::*;
use crate::ids::Key;
use crate::policy::Policy;

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
    /// State-machine clock.
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
    now_ms: u64,
    policies: Vec<Policy>,
}

impl CoordinatorState {
    /// Applies one proposal; deterministic.
    pub fn apply(&mut self, proposal: &Proposal) -> ProposalResult {
        self.now_ms = self.now_ms.max(proposal.stamp_ms);
        ProposalResult { outcomes: proposal.commands.iter().map(|_| Outcome::Ticked { collected_windows: 0 }).collect() }
    }
    /// The state-machine clock.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }
    /// All policies, sorted by prefix.
    pub fn policies(&self) -> Vec<Policy> {
        self.policies.clone()
    }
    /// The policy matching `key` (longest prefix).
    pub fn policy_for(&self, _key: &Key) -> Option<&Policy> {
        None
    }
    /// The current window of `key` as of `now_ms` (read-only; does not create it).
    pub fn window_view(&self, key: &Key, _now_ms: u64) -> Result<WindowView, CommandError> {
        Err(CommandError::NoPolicy(key.to_string()))
    }
    /// Number of window records held.
    pub fn live_windows(&self) -> u64 {
        0
    }
}
