//! `Reconcile`: a region hands unused credits of a window back.
//!
//! Decision table, in order (the first matching row wins):
//!
//! | condition | outcome | state change |
//! |---|---|---|
//! | the key's policy (or, with none, its live window) is `fair` | `Rejected(WrongKind)` | none |
//! | `window_start_ms` is not the start of the key's live window | `WindowEnded`, credited 0 | none (forfeit) |
//! | this region already reconciled this window | `Duplicate`, credited 0 | none |
//! | `leftover == 0` | `Credited`, credited 0 | none: an empty return does not use up the region's one return |
//! | otherwise | `Credited`, `min(leftover, granted_r − returned_r)` | credited; the region is marked |
//!
//! The marker is per `(key, region, window)`: one region's return never
//! blocks another's (the original shared one marker per window). Pool grants
//! of `fair` keys are totals that never shrink, so they are not reconciled.

use super::outcome::{CommandError, Outcome, ReconcileDisposition, ReconcileOutcome};
use super::state::CoordinatorState;
use crate::ids::{Key, RegionId};
use crate::policy::PolicyKind;

impl CoordinatorState {
    pub(super) fn reconcile(
        &mut self,
        key: &Key,
        region: &RegionId,
        leftover: u64,
        window_start_ms: u64,
    ) -> Outcome {
        let now = self.now_ms;
        let governing_kind = self.policies.lookup(key.as_str()).map(|p| p.kind);
        let live = self.windows.live_mut(key, now);
        let kind = governing_kind.or_else(|| live.as_ref().map(|r| r.kind));
        if kind == Some(PolicyKind::Fair) {
            return Outcome::Rejected(CommandError::WrongKind(
                "key is fair: pool grants are not reconciled".to_string(),
            ));
        }
        let outcome = |credited, disposition| {
            Outcome::Reconcile(ReconcileOutcome {
                credited,
                disposition,
            })
        };
        let Some(record) = live.filter(|r| r.bounds.start_ms == window_start_ms) else {
            return outcome(0, ReconcileDisposition::WindowEnded);
        };
        let Some(used) = record.regions.get_mut(region) else {
            // Nothing was granted to this region in this window: nothing to credit.
            return outcome(0, ReconcileDisposition::Credited);
        };
        if used.reconciled {
            return outcome(0, ReconcileDisposition::Duplicate);
        }
        if leftover == 0 {
            return outcome(0, ReconcileDisposition::Credited);
        }
        let credited = leftover.min(used.granted.saturating_sub(used.returned));
        used.returned += credited;
        used.reconciled = true;
        record.returned += credited;
        outcome(credited, ReconcileDisposition::Credited)
    }
}
