//! One admission decision and the algebra that combines decisions of
//! independent limits (a per-user and a per-organisation budget, say).
//!
//! Laws (property-tested below): with `⊕ = combine` and `1 = ALLOW_FULL`,
//! - identity: `d ⊕ 1 = d`;
//! - associativity: `(a ⊕ b) ⊕ c = a ⊕ (b ⊕ c)`;
//! - commutativity: `a ⊕ b = b ⊕ a`;
//! - idempotency: `d ⊕ d = d`.
//!
//! So any number of decisions reduce in any order to the same result.

use serde::{Deserialize, Serialize};

/// One admission decision. Integers throughout; producers keep
/// `retry_after_ms == 0` exactly when `allowed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The effective ceiling.
    pub limit: u64,
    /// Units left before the next rejection.
    pub remaining: u64,
    /// When the window resets, epoch ms.
    pub reset_at_ms: u64,
    /// How long to wait before retrying; 0 when allowed.
    pub retry_after_ms: u64,
}

impl Decision {
    /// The neutral element of [`combine`]: allows everything, binds nothing.
    pub const ALLOW_FULL: Decision = Decision {
        allowed: true,
        limit: u64::MAX,
        remaining: u64::MAX,
        reset_at_ms: 0,
        retry_after_ms: 0,
    };

    /// Another name for [`Decision::ALLOW_FULL`]: the identity of [`combine`].
    pub const ALLOW_ALL: Decision = Decision::ALLOW_FULL;

    /// `combine(self, other)`.
    pub fn combine(self, other: Decision) -> Decision {
        combine(self, other)
    }
}

/// Combines the decisions of two independent limits: allowed only if both
/// are; the binding (smaller) limit and remaining; the later reset and the
/// longer wait (never understate a wait).
pub fn combine(a: Decision, b: Decision) -> Decision {
    Decision {
        allowed: a.allowed && b.allowed,
        limit: a.limit.min(b.limit),
        remaining: a.remaining.min(b.remaining),
        reset_at_ms: a.reset_at_ms.max(b.reset_at_ms),
        retry_after_ms: a.retry_after_ms.max(b.retry_after_ms),
    }
}

/// Combines any number of decisions; the empty set gives
/// [`Decision::ALLOW_FULL`]. By the laws above the order does not matter.
pub fn combine_all<I: IntoIterator<Item = Decision>>(decisions: I) -> Decision {
    decisions.into_iter().fold(Decision::ALLOW_FULL, combine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decision() -> impl Strategy<Value = Decision> {
        (
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(|(allowed, limit, remaining, reset_at_ms, retry_after_ms)| {
                Decision {
                    allowed,
                    limit,
                    remaining,
                    reset_at_ms,
                    retry_after_ms,
                }
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn allow_full_is_the_identity(d in decision()) {
            prop_assert_eq!(combine(d, Decision::ALLOW_FULL), d);
            prop_assert_eq!(combine(Decision::ALLOW_FULL, d), d);
            prop_assert_eq!(combine(Decision::ALLOW_ALL, d), d);
        }
        #[test]
        fn combine_is_associative(a in decision(), b in decision(), c in decision()) {
            prop_assert_eq!(combine(combine(a, b), c), combine(a, combine(b, c)));
        }
        #[test]
        fn combine_is_commutative(a in decision(), b in decision()) {
            prop_assert_eq!(combine(a, b), combine(b, a));
        }
        #[test]
        fn combine_is_idempotent(d in decision()) {
            prop_assert_eq!(combine(d, d), d);
        }
        #[test]
        fn combine_all_ignores_order(mut ds in proptest::collection::vec(decision(), 0..8), rotate in 0usize..8) {
            let forward = combine_all(ds.clone());
            if !ds.is_empty() {
                let by = rotate % ds.len();
                ds.rotate_left(by);
            }
            ds.reverse();
            prop_assert_eq!(combine_all(ds), forward);
        }
        #[test]
        fn a_denial_always_wins(a in decision(), b in decision()) {
            prop_assume!(!a.allowed);
            prop_assert!(!combine(a, b).allowed);
        }
    }
}
