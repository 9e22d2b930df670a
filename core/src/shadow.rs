//! Shadow mode: a policy whose decisions are computed and counted but never
//! enforced, so an operator can see what a limit *would* refuse before
//! turning it on.
//!
//! Every tier that decides for a key (the coordinator's `Lease` and
//! `PoolGrant`, an escrow node's `Acquire` and `Check`) first computes what
//! the policy admits (`fits`), then asks [`decide`]: a shadow policy hands
//! out everything asked and counts the difference as would-deny in a
//! [`ShadowTally`]. A policy that is not in shadow mode is untouched
//! (`granted = fits`, nothing counted).
//!
//! Δ = 0 does not hold for a shadow policy by design: its windows may grant
//! more than L. Nothing else is weakened: grants are still counted, credited
//! back and killed at their window's end, and turning shadow mode off takes
//! effect for the very next decision (a window already past L grants
//! nothing more until it ends).

use serde::{Deserialize, Serialize};

/// Would-deny counts of a shadow policy (per window, per policy, per node).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowTally {
    /// Tokens handed out that the policy would have refused.
    pub would_deny_tokens: u64,
    /// Decisions that would have refused something (a partial refusal counts once).
    pub would_deny_requests: u64,
}

impl ShadowTally {
    /// Counts one decision that would have refused `tokens` (nothing when 0).
    /// Saturating: a tally never wraps.
    pub fn record(&mut self, tokens: u64) {
        if tokens == 0 {
            return;
        }
        self.would_deny_tokens = self.would_deny_tokens.saturating_add(tokens);
        self.would_deny_requests = self.would_deny_requests.saturating_add(1);
    }

    /// Adds another tally into this one (saturating).
    pub fn add(&mut self, other: ShadowTally) {
        self.would_deny_tokens = self
            .would_deny_tokens
            .saturating_add(other.would_deny_tokens);
        self.would_deny_requests = self
            .would_deny_requests
            .saturating_add(other.would_deny_requests);
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.would_deny_tokens == 0 && self.would_deny_requests == 0
    }
}

/// What one decision hands out, and what of it the policy would have refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShadowVerdict {
    /// Tokens handed out.
    pub granted: u64,
    /// Of those, tokens the policy would have refused (0 unless shadow).
    pub would_deny: u64,
}

/// The decision for `asked` tokens of which the policy admits `fits`.
///
/// Laws (property-tested):
/// - not shadow: `granted = min(asked, fits)`, `would_deny = 0`;
/// - shadow: `granted = asked` and `granted − would_deny = min(asked, fits)`:
///   exactly the refused part is counted, and nothing is refused.
pub fn decide(asked: u64, fits: u64, shadow: bool) -> ShadowVerdict {
    let fits = fits.min(asked);
    if shadow {
        ShadowVerdict {
            granted: asked,
            would_deny: asked - fits,
        }
    } else {
        ShadowVerdict {
            granted: fits,
            would_deny: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_tally_counts_refusals_only() {
        let mut tally = ShadowTally::default();
        tally.record(0);
        assert!(tally.is_empty());
        tally.record(7);
        tally.record(u64::MAX);
        assert_eq!(tally.would_deny_tokens, u64::MAX);
        assert_eq!(tally.would_deny_requests, 2);
        let mut sum = ShadowTally::default();
        sum.add(tally);
        sum.add(tally);
        assert_eq!(sum.would_deny_requests, 4);
    }

    proptest! {
        #[test]
        fn shadow_hands_out_everything_and_counts_exactly_the_refused_part(
            asked in any::<u64>(),
            fits in any::<u64>(),
        ) {
            let enforced = decide(asked, fits, false);
            prop_assert_eq!(enforced.granted, asked.min(fits));
            prop_assert_eq!(enforced.would_deny, 0);
            let shadow = decide(asked, fits, true);
            prop_assert_eq!(shadow.granted, asked);
            prop_assert_eq!(shadow.granted - shadow.would_deny, enforced.granted);
        }
    }
}
