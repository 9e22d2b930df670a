//! The live + shadow pair: both structures learn from every outcome, only
//! the live one decides, and every rotation interval the shadow (already
//! warm) becomes live while the old live one is wiped and rehashed with a
//! fresh seed to become the new shadow.
//!
//! Laws (property-tested in `fair_throttle::tests`):
//! - **Same outcomes:** every recorded outcome reaches both structures.
//! - **Bounded collision penalty:** after a rotation, a caller's throttle
//!   probability depends only on the outcomes of callers that share *all*
//!   of its cells under the new live seed; a caller that merely shared a
//!   heavy hitter's cells under the old seed is throttled at most until
//!   the next rotation.
//! - **Constant memory:** rotation reuses the old live structure's cells.

use super::config::{FairThrottleConfig, FairThrottleError};
use super::structure::{CallerId, FairVerdict, Outcome, ThrottleStructure};

/// A fair throttle's state: live and shadow structures and the rotation clock.
#[derive(Debug, Clone)]
pub struct FairThrottleState {
    live: ThrottleStructure,
    shadow: ThrottleStructure,
    rotated_at_ms: u64,
    rotations: u64,
}

impl FairThrottleState {
    /// A cold pair starting its first interval at `now_ms`. The seeds come
    /// from the caller (this crate has no randomness); they should differ.
    pub fn new(
        config: FairThrottleConfig,
        now_ms: u64,
        live_seed: u32,
        shadow_seed: u32,
    ) -> Result<Self, FairThrottleError> {
        Ok(FairThrottleState {
            live: ThrottleStructure::new(config, live_seed)?,
            shadow: ThrottleStructure::new(config, shadow_seed)?,
            rotated_at_ms: now_ms,
            rotations: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FairThrottleConfig {
        self.live.config()
    }

    /// The structure that decides.
    pub fn live(&self) -> &ThrottleStructure {
        &self.live
    }

    /// The structure that learns to take over at the next rotation.
    pub fn shadow(&self) -> &ThrottleStructure {
        &self.shadow
    }

    /// Rotations so far.
    pub fn rotations(&self) -> u64 {
        self.rotations
    }

    /// Bytes of cells held by both structures (fixed at construction).
    pub fn memory_bytes(&self) -> usize {
        self.live.memory_bytes() + self.shadow.memory_bytes()
    }

    /// The live structure's verdict for one request (see
    /// [`ThrottleStructure::decide`]); `draw` is a uniform random `u64`.
    pub fn decide(&self, caller: CallerId<'_>, now_ms: u64, draw: u64) -> FairVerdict {
        self.live.decide(caller, now_ms, draw)
    }

    /// The caller's current throttle probability in the live structure.
    pub fn throttle_probability(&self, caller: CallerId<'_>, now_ms: u64) -> f64 {
        self.live.throttle_probability(caller, now_ms)
    }

    /// Feeds an admitted request's outcome to both structures.
    pub fn record(&mut self, caller: CallerId<'_>, outcome: Outcome, now_ms: u64) {
        self.live.record(caller, outcome, now_ms);
        self.shadow.record(caller, outcome, now_ms);
    }

    /// Whether the live structure has served its interval at `now_ms`.
    pub fn rotation_due(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.rotated_at_ms) >= self.config().rotation_interval_ms
    }

    /// Promotes the shadow to live; the old live structure is wiped and
    /// becomes the shadow, hashing with `fresh_seed`.
    pub fn rotate(&mut self, now_ms: u64, fresh_seed: u32) {
        std::mem::swap(&mut self.live, &mut self.shadow);
        self.shadow.reset(fresh_seed);
        self.rotated_at_ms = now_ms;
        self.rotations += 1;
    }

    /// [`rotate`](Self::rotate)s if [`rotation_due`](Self::rotation_due);
    /// says whether it did.
    pub fn rotate_if_due(&mut self, now_ms: u64, fresh_seed: u32) -> bool {
        let due = self.rotation_due(now_ms);
        if due {
            self.rotate(now_ms, fresh_seed);
        }
        due
    }
}
