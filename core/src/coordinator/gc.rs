//! Garbage collection: keeps the state bounded.
//!
//! Run at the start of every proposal, once the clock has advanced: drops every window record
//! whose end is `<= now` (its grants are dead; a reconcile of it is forfeit
//! anyway), every key tombstone past its retention (see [`super::windows`]),
//! and every session whose outcomes are all past retention (see
//! [`super::sessions`]). Both are driven by deadline indices, so a pass costs
//! O(collected · log n) and is identical on every replica.

use super::state::CoordinatorState;

impl CoordinatorState {
    /// Collects dead windows and sessions at the current clock; returns the
    /// number of window records dropped.
    pub(super) fn collect_garbage(&mut self) -> u64 {
        let collected_windows = self.windows.collect(self.now_ms);
        self.sessions.collect(self.now_ms);
        self.sharding.collect(self.now_ms);
        collected_windows
    }
}
