//! `SetPolicy` and `DeletePolicy`, and what a policy change does to live windows.
//!
//! # Limit change rule
//! Every live window keeps its own *effective limit*, captured from the
//! governing policy when the window was created. After any change to the
//! policy table, each live window whose key is still governed by some policy
//! gets `effective = min(effective, governing limit)`: a decrease takes effect
//! at once, an increase only from the key's next window. So no grant ever
//! takes a window's outstanding amount (`Σ granted − Σ credited`) past the
//! smallest limit that governed it so far (property-tested in
//! `core/tests/coordinator_properties.rs`). Grants are never revoked: tokens
//! granted before a decrease stay granted, and no new grant is made until the
//! outstanding amount falls below the lowered limit.
//!
//! # Window length change rule
//! A live window keeps its bounds until its end. The key's next window is the
//! aligned window of the new `window_ms` containing the clock, started no
//! earlier than the old window's end (see [`super::windows`]).
//!
//! # Shadow mode
//! A policy's `shadow` flag is read by every decision as it is applied:
//! turning it on lets the very next lease or pool grant exceed the limit
//! (counted as would-deny), turning it off enforces the window's effective
//! limit again at once — a window already past it grants nothing more until
//! it ends. The policy's would-deny tally is kept across such changes and
//! dropped when the policy is deleted.
//!
//! # Delete
//! Later leases and pool grants of keys that no policy governs any more are
//! refused with `NoPolicy`; their live windows are kept until they end, so
//! grants already made keep counting (and may still be reconciled).

use super::outcome::{CommandError, Outcome};
use super::state::CoordinatorState;
use crate::policy::Policy;

impl CoordinatorState {
    pub(super) fn set_policy(&mut self, policy: &Policy) -> Outcome {
        let before = self.governing_window_ms(&policy.prefix);
        if let Err(error) = self.policies.set(policy.clone()) {
            return Outcome::Rejected(CommandError::InvalidArgument(error.to_string()));
        }
        self.windows.on_window_length_change(
            &policy.prefix,
            before,
            Some(policy.window_ms),
            self.now_ms,
        );
        self.windows.on_policies_changed(&self.policies);
        Outcome::PolicySet
    }

    pub(super) fn delete_policy(&mut self, prefix: &str) -> Outcome {
        let removed = self.policies.remove(prefix);
        let existed = removed.is_some();
        self.shadow_tallies.remove(prefix);
        if let Some(removed) = removed {
            let after = self.governing_window_ms(prefix);
            self.windows.on_window_length_change(
                prefix,
                Some(removed.window_ms),
                after,
                self.now_ms,
            );
            self.windows.on_policies_changed(&self.policies);
        }
        Outcome::PolicyDeleted { existed }
    }

    /// The window length that governs keys under `prefix` that no longer
    /// prefix governs (the policy of the longest prefix of `prefix`).
    fn governing_window_ms(&self, prefix: &str) -> Option<u64> {
        self.policies.lookup(prefix).map(|policy| policy.window_ms)
    }
}
