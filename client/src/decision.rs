//! Decisions as the limiter returns them: core's [`Decision`] plus the
//! label of the window an admission was spent from.
//!
//! # The combine algebra
//! Decisions of independent limits (say a per-user and a per-organisation
//! budget) combine with [`combine`]: `allowed` is AND, `limit` and
//! `remaining` are the minimum (the binding ceiling), `reset_at_ms` and
//! `retry_after_ms` the maximum (never understate a wait). The neutral
//! element is [`Decision::ALLOW_FULL`]; `combine` is associative,
//! commutative and idempotent (property-tested in `leasehold-core`), so any number of
//! decisions reduce in any order with the same result.

pub use leasehold_core::decision::{combine, Decision};

/// An allow spending credits of the window `[.., reset_at_ms)`.
pub(crate) fn allowed(limit: u64, remaining: u64, reset_at_ms: u64) -> Decision {
    Decision {
        allowed: true,
        limit,
        remaining,
        reset_at_ms,
        retry_after_ms: 0,
    }
}

/// A denial; `retry_after_ms` is raised to at least 1.
pub(crate) fn denied(
    limit: u64,
    remaining: u64,
    reset_at_ms: u64,
    retry_after_ms: u64,
) -> Decision {
    Decision {
        allowed: false,
        limit,
        remaining,
        reset_at_ms,
        retry_after_ms: retry_after_ms.max(1),
    }
}

/// Makes a backend's decision well-formed: `retry_after_ms == 0` iff allowed.
pub(crate) fn well_formed(d: Decision) -> Decision {
    if d.allowed {
        allowed(d.limit, d.remaining, d.reset_at_ms)
    } else {
        denied(d.limit, d.remaining, d.reset_at_ms, d.retry_after_ms)
    }
}

/// A decision and, when it admitted, the window the admission is labelled
/// with (DESIGN §1: every admission is labelled by the window whose credits
/// it spent). The chaos suite's oracle sums admissions per label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The decision.
    pub decision: Decision,
    /// Start of the window the admission spent credits of (coordinator
    /// epoch ms); `Some` exactly when `decision.allowed`.
    pub window_start_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decision() -> impl Strategy<Value = Decision> {
        (
            any::<bool>(),
            0u64..1_000,
            0u64..1_000,
            0u64..10_000,
            1u64..5_000,
        )
            .prop_map(|(allowed, limit, remaining, reset_at_ms, retry)| Decision {
                allowed,
                limit,
                remaining: remaining.min(limit),
                reset_at_ms,
                retry_after_ms: if allowed { 0 } else { retry },
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn combining_well_formed_decisions_stays_well_formed(a in decision(), b in decision()) {
            // The algebra's laws are property-tested in leasehold-core.
            let ab = combine(a, b);
            prop_assert_eq!(ab.allowed, ab.retry_after_ms == 0);
        }
    }
}
