//! The three axes of admission, their evaluation order, and what a caller
//! reads off a denial: the binding axis and the `Retry-After` header.
//!
//! Axes are evaluated concurrency → rate → cost (fastest fail first: the
//! in-process slot, then the in-process rate, then the possibly remote
//! budget), taking from none after the first denial (the gate then asks
//! the later in-process axes what they would decide, taking nothing, so
//! the wait covers them too). By the laws of
//! [`combine`](crate::decision::combine) the combined decision does not
//! depend on that order; only the work done does.
//!
//! Laws (property-tested below):
//! - **short-circuit agrees with the full reduction**: evaluating in order
//!   and stopping at the first denial allows exactly when
//!   `combine_all(all axes)` allows;
//! - **the binding axis** of a denial is its first denying axis in
//!   priority order, and is `None` exactly when the decision allows;
//! - **the dominant wait**: the combined `retry_after_ms` is the largest
//!   of the axes', and `Retry-After` is it rounded up to whole seconds
//!   (at least 1 on a denial) — never an understatement.

use crate::decision::{combine_all, Decision};

/// One admission axis, ordered by evaluation priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Axis {
    /// The in-flight ceiling (process-wide).
    Concurrency,
    /// Requests per period (per key).
    Rate,
    /// Cost units per window (per key; possibly the global budget).
    Cost,
}

impl Axis {
    /// Every axis, in evaluation (and binding-priority) order.
    pub const IN_ORDER: [Axis; 3] = [Axis::Concurrency, Axis::Rate, Axis::Cost];

    /// The axis's name as it appears in metrics and span fields.
    pub fn as_str(self) -> &'static str {
        match self {
            Axis::Concurrency => "concurrency",
            Axis::Rate => "rate",
            Axis::Cost => "cost",
        }
    }
}

impl std::fmt::Display for Axis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What each axis decided for one admission. An axis is `None` when it is
/// not configured or was short-circuited by an earlier denial, so the
/// first denying axis can be read off from absence alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AxisDecisions {
    /// The concurrency axis's decision.
    pub concurrency: Option<Decision>,
    /// The rate axis's decision.
    pub rate: Option<Decision>,
    /// The cost axis's decision.
    pub cost: Option<Decision>,
}

impl AxisDecisions {
    /// The decision recorded for `axis`.
    pub fn get(&self, axis: Axis) -> Option<Decision> {
        match axis {
            Axis::Concurrency => self.concurrency,
            Axis::Rate => self.rate,
            Axis::Cost => self.cost,
        }
    }

    /// Records `decision` for `axis`.
    pub fn set(&mut self, axis: Axis, decision: Decision) {
        match axis {
            Axis::Concurrency => self.concurrency = Some(decision),
            Axis::Rate => self.rate = Some(decision),
            Axis::Cost => self.cost = Some(decision),
        }
    }

    /// The recorded decisions combined (absent axes are the identity).
    pub fn combined(&self) -> Decision {
        combine_all(Axis::IN_ORDER.iter().filter_map(|&a| self.get(a)))
    }

    /// The binding axis: the first denying axis in priority order
    /// (concurrency → rate → cost); `None` when every recorded axis allows.
    pub fn binding_axis(&self) -> Option<Axis> {
        Axis::IN_ORDER
            .into_iter()
            .find(|&a| self.get(a).is_some_and(|d| !d.allowed))
    }
}

/// The `Retry-After` header value of a decision: whole seconds, rounded
/// up, at least 1 on a denial; `None` when the decision allows.
pub fn retry_after_secs(decision: &Decision) -> Option<u64> {
    (!decision.allowed).then(|| decision.retry_after_ms.div_ceil(1_000).max(1))
}

/// Evaluates axes in order, stopping at the first denial; `decide` is
/// called once per axis reached. The reference semantics of the client's
/// admission gate, written once so it can be property-tested.
pub fn evaluate_in_order(mut decide: impl FnMut(Axis) -> Option<Decision>) -> AxisDecisions {
    let mut decisions = AxisDecisions::default();
    for axis in Axis::IN_ORDER {
        if let Some(d) = decide(axis) {
            decisions.set(axis, d);
            if !d.allowed {
                break;
            }
        }
    }
    decisions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::combine;
    use proptest::prelude::*;

    /// A well-formed decision: `retry_after_ms == 0` exactly when allowed.
    fn decision() -> impl Strategy<Value = Decision> {
        (
            any::<bool>(),
            0u64..1_000,
            0u64..1_000,
            0u64..100_000,
            1u64..100_000,
        )
            .prop_map(|(allowed, limit, remaining, reset_at_ms, retry)| Decision {
                allowed,
                limit,
                remaining: remaining.min(limit),
                reset_at_ms,
                retry_after_ms: if allowed { 0 } else { retry },
            })
    }

    fn axis_inputs() -> impl Strategy<Value = [Option<Decision>; 3]> {
        [
            proptest::option::of(decision()),
            proptest::option::of(decision()),
            proptest::option::of(decision()),
        ]
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        let mut d = Decision::ALLOW_FULL;
        assert_eq!(retry_after_secs(&d), None);
        d.allowed = false;
        for (ms, secs) in [
            (0, 1),
            (1, 1),
            (999, 1),
            (1_000, 1),
            (1_001, 2),
            (59_999, 60),
        ] {
            d.retry_after_ms = ms;
            assert_eq!(retry_after_secs(&d), Some(secs), "{ms} ms");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn short_circuit_agrees_with_the_full_reduction(inputs in axis_inputs()) {
            let mut asked = Vec::new();
            let seen = evaluate_in_order(|a| { asked.push(a); inputs[a as usize] });
            let full = combine_all(inputs.iter().flatten().copied());
            prop_assert_eq!(seen.combined().allowed, full.allowed);
            // Nothing after the first denial is asked.
            if let Some(binding) = seen.binding_axis() {
                prop_assert!(asked.iter().all(|&a| a <= binding));
                prop_assert!(seen.get(binding).is_some_and(|d| !d.allowed));
            }
        }

        #[test]
        fn the_binding_axis_is_the_first_denial_in_priority_order(inputs in axis_inputs()) {
            let mut all = AxisDecisions::default();
            for a in Axis::IN_ORDER {
                if let Some(d) = inputs[a as usize] { all.set(a, d); }
            }
            let binding = all.binding_axis();
            prop_assert_eq!(binding.is_none(), all.combined().allowed);
            if let Some(b) = binding {
                for a in Axis::IN_ORDER.into_iter().filter(|&a| a < b) {
                    prop_assert!(all.get(a).is_none_or(|d| d.allowed));
                }
                // The binding axis found by the short-circuit is the same.
                let seen = evaluate_in_order(|a| inputs[a as usize]);
                prop_assert_eq!(seen.binding_axis(), Some(b));
            }
        }

        #[test]
        fn retry_after_is_the_dominant_wait(inputs in axis_inputs()) {
            let full = combine_all(inputs.iter().flatten().copied());
            let longest = inputs.iter().flatten().map(|d| d.retry_after_ms).max().unwrap_or(0);
            prop_assert_eq!(full.retry_after_ms, longest);
            if let Some(secs) = retry_after_secs(&full) {
                prop_assert!(secs * 1_000 >= longest);
                prop_assert!(secs >= 1);
            }
            // Combining well-formed decisions stays well-formed.
            prop_assert_eq!(full.allowed, full.retry_after_ms == 0);
        }

        #[test]
        fn any_single_denial_is_absorbing(d in decision(), others in axis_inputs()) {
            prop_assume!(!d.allowed);
            let all = others.iter().flatten().fold(d, |acc, &x| combine(acc, x));
            prop_assert!(!all.allowed);
            prop_assert!(all.retry_after_ms >= d.retry_after_ms);
        }
    }
}
