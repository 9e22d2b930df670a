//! When an escrow node enters and leaves a coordinator outage, as pure
//! logic: the node reports every coordinator call's outcome, and only a
//! change of reachability is a log line, the leaving one with how long the
//! outage lasted and what it cost (outage denials, fallback admissions).
//!
//! Laws (property-tested): changes alternate Entered, Left, Entered, …
//! starting with Entered (a node starts reachable); a Left reports the
//! time and counter growth since its Entered.

use leasehold_core::policy::OutagePolicy;

/// The node's counters at one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OutageCounters {
    /// When (monotonic ms).
    pub at_ms: u64,
    /// Denials for want of a reachable coordinator so far.
    pub outage_denials: u64,
    /// Tokens admitted from fallback shares so far.
    pub fallback_admissions: u64,
}

/// A change of the node's reachability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageChange {
    /// A call failed after the coordinator had answered.
    Entered,
    /// A call succeeded during an outage.
    Left {
        /// How long the outage lasted, ms.
        outage_ms: u64,
        /// Outage denials during it.
        outage_denials: u64,
        /// Fallback admissions during it.
        fallback_admissions: u64,
    },
}

/// Whether the node is in an outage, and its counters when it began.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutageTracker {
    entered: Option<OutageCounters>,
}

impl OutageTracker {
    /// One coordinator call's outcome; the change it makes, if any.
    pub fn observe(&mut self, reachable: bool, now: OutageCounters) -> Option<OutageChange> {
        match (self.entered, reachable) {
            (None, false) => {
                self.entered = Some(now);
                Some(OutageChange::Entered)
            }
            (Some(entered), true) => {
                self.entered = None;
                Some(OutageChange::Left {
                    outage_ms: now.at_ms.saturating_sub(entered.at_ms),
                    outage_denials: now.outage_denials.saturating_sub(entered.outage_denials),
                    fallback_admissions: now
                        .fallback_admissions
                        .saturating_sub(entered.fallback_admissions),
                })
            }
            _ => None,
        }
    }
}

/// An outage policy as operators write it (`policy set --outage`).
pub fn describe_outage(outage: OutagePolicy) -> String {
    match outage {
        OutagePolicy::FailClosed => "fail_closed".into(),
        OutagePolicy::Fallback { tokens_per_region } => {
            format!("fallback ({tokens_per_region} tokens per region per window)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn one_line_in_one_line_out_with_what_the_outage_cost() {
        let mut tracker = OutageTracker::default();
        let at = |at_ms, outage_denials, fallback_admissions| OutageCounters {
            at_ms,
            outage_denials,
            fallback_admissions,
        };
        assert_eq!(tracker.observe(true, at(0, 0, 0)), None);
        assert_eq!(
            tracker.observe(false, at(10, 1, 0)),
            Some(OutageChange::Entered)
        );
        for t in 11..100 {
            assert_eq!(tracker.observe(false, at(t, t, 5)), None);
        }
        assert_eq!(
            tracker.observe(true, at(1_010, 40, 7)),
            Some(OutageChange::Left {
                outage_ms: 1_000,
                outage_denials: 39,
                fallback_admissions: 7
            })
        );
        assert_eq!(describe_outage(OutagePolicy::FailClosed), "fail_closed");
        assert_eq!(
            describe_outage(OutagePolicy::Fallback {
                tokens_per_region: 5
            }),
            "fallback (5 tokens per region per window)"
        );
    }

    proptest! {
        #[test]
        fn changes_alternate_starting_with_entered(outcomes in prop::collection::vec(any::<bool>(), 0..200)) {
            let mut tracker = OutageTracker::default();
            let mut in_outage = false;
            for (t, reachable) in outcomes.into_iter().enumerate() {
                let now = OutageCounters { at_ms: t as u64, ..OutageCounters::default() };
                match tracker.observe(reachable, now) {
                    Some(OutageChange::Entered) => {
                        prop_assert!(!in_outage && !reachable);
                        in_outage = true;
                    }
                    Some(OutageChange::Left { .. }) => {
                        prop_assert!(in_outage && reachable);
                        in_outage = false;
                    }
                    None => prop_assert_eq!(in_outage, !reachable),
                }
            }
        }
    }
}
