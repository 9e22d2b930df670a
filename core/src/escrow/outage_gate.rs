//! What an escrow does about its coordinator being unreachable, for one key,
//! sans IO — shared by counter keys ([`super::RegionEscrow`]) and fair keys
//! (the escrow node's weighted-fair path), so both follow the same rules:
//!
//! - after a failed call the coordinator counts as unreachable and is asked
//!   again one probe at a time, never per request: the first probe
//!   `probe_interval_ms / 16` after the failure, each next one twice as long
//!   after the one before, then once per `probe_interval_ms` — a coordinator
//!   back within a fraction of the interval (a leader elected) costs a
//!   fraction of it, a long outage one probe per interval; any answer ends
//!   the outage;
//! - while unreachable, `fail_closed` denies (counted as an outage denial),
//!   and `fallback` admits up to `tokens_per_region` per window of the
//!   caller's wall clock (the fallback share), then denies (counted).
//!
//! Times are the caller's monotonic milliseconds, except the fallback's
//! window, which is the caller's wall-clock window (the coordinator's is
//! unknown during an outage).

use super::types::Served;
use crate::policy::OutagePolicy;

/// The outage state of one key at one escrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutageGate {
    probe_interval_ms: u64,
    policy: OutagePolicy,
    unreachable_since: Option<u64>,
    next_probe_ms: u64,
    /// The wait before the next probe after a failure: doubles from
    /// [`first_probe_ms`](Self::first_probe_ms) to the interval.
    probe_step_ms: u64,
    /// (wall-clock window start, fallback tokens served in it).
    fallback_window: Option<(u64, u64)>,
    outage_denials: u64,
    fallback_tokens: u64,
}

impl OutageGate {
    /// A reachable coordinator, probed at most once per `probe_interval_ms`
    /// (≥ 1) once it has been unreachable for a while.
    pub fn new(probe_interval_ms: u64, policy: OutagePolicy) -> Self {
        Self {
            probe_interval_ms: probe_interval_ms.max(1),
            policy,
            unreachable_since: None,
            next_probe_ms: 0,
            probe_step_ms: 0,
            fallback_window: None,
            outage_denials: 0,
            fallback_tokens: 0,
        }
    }

    /// Changes the outage policy (a policy update from the coordinator).
    pub fn set_policy(&mut self, policy: OutagePolicy) {
        self.policy = policy;
    }

    /// The outage policy in force.
    pub fn policy(&self) -> OutagePolicy {
        self.policy
    }

    /// Whether a call to the coordinator may go out now: always while it is
    /// reachable, and once per probe interval while it is not.
    pub fn may_call(&self, now_ms: u64) -> bool {
        self.unreachable_since.is_none() || now_ms >= self.next_probe_ms
    }

    /// The wait before the first probe of an outage: a sixteenth of the
    /// interval (at least 1 ms).
    pub fn first_probe_ms(&self) -> u64 {
        (self.probe_interval_ms / 16).max(1)
    }

    /// A call failed (unreachable, timeout, no quorum): the coordinator is
    /// unreachable until an answer; the next probe is due a sixteenth of
    /// the interval after the failure that began the outage, twice as long
    /// after each failed probe, at most one interval.
    pub fn on_failure(&mut self, now_ms: u64) {
        if self.unreachable_since.is_none() {
            self.unreachable_since = Some(now_ms);
            self.probe_step_ms = self.first_probe_ms();
        } else {
            self.probe_step_ms = self
                .probe_step_ms
                .saturating_mul(2)
                .clamp(self.first_probe_ms(), self.probe_interval_ms);
        }
        self.next_probe_ms = now_ms.saturating_add(self.probe_step_ms);
    }

    /// The coordinator answered: the outage (if any) is over. What the
    /// fallback served in the current window stays counted: a coordinator
    /// that comes and goes within one window does not renew the share (the
    /// share bounds each window, however many outages it sees).
    pub fn on_answer(&mut self) {
        self.unreachable_since = None;
    }

    /// Whether the coordinator counts as unreachable.
    pub fn is_unreachable(&self) -> bool {
        self.unreachable_since.is_some()
    }

    /// While unreachable: `tokens` (or what is left of them) from the
    /// fallback share of the caller's wall-clock window containing
    /// `wall_now_ms`, with the lifetime left in that window; `None` — a
    /// counted outage denial — under `fail_closed` or once the share is
    /// spent. Always `None` (and nothing counted) while reachable.
    pub fn serve_at(&mut self, tokens: u64, wall_now_ms: u64, window_ms: u64) -> Option<Served> {
        let window_ms = window_ms.max(1);
        let start = wall_now_ms - wall_now_ms % window_ms;
        let mut served = self.serve(tokens, start, window_ms)?;
        served.remaining_lifetime_ms = start + window_ms - wall_now_ms;
        Some(served)
    }

    /// [`serve_at`](Self::serve_at) given the window's start; what it serves
    /// carries the whole window as its lifetime.
    pub fn serve(&mut self, tokens: u64, window_start_ms: u64, window_ms: u64) -> Option<Served> {
        if !self.is_unreachable() {
            return None;
        }
        let OutagePolicy::Fallback { tokens_per_region } = self.policy else {
            self.outage_denials += 1;
            return None;
        };
        let used = match self.fallback_window {
            Some((start, used)) if start == window_start_ms => used,
            _ => 0,
        };
        let granted = tokens.min(tokens_per_region.saturating_sub(used));
        if granted == 0 {
            self.outage_denials += 1;
            return None;
        }
        self.fallback_window = Some((window_start_ms, used + granted));
        self.fallback_tokens += granted;
        Some(Served {
            granted,
            window_start_ms,
            window_end_ms: window_start_ms + window_ms,
            remaining_lifetime_ms: window_ms,
            from_fallback: true,
            held_after: 0,
        })
    }

    /// Milliseconds until the next probe may go out (at least 1) while
    /// unreachable; `None` while reachable.
    pub fn retry_after_ms(&self, now_ms: u64) -> Option<u64> {
        self.is_unreachable()
            .then(|| self.next_probe_ms.saturating_sub(now_ms).max(1))
    }

    /// Requests denied for the outage, since the gate was made.
    pub fn outage_denials(&self) -> u64 {
        self.outage_denials
    }

    /// Tokens admitted from fallback shares, since the gate was made.
    pub fn fallback_tokens(&self) -> u64 {
        self.fallback_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Step {
        Fail,
        Answer,
        Serve(u64),
        Wait(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Fail),
            Just(Step::Answer),
            (1u64..40).prop_map(Step::Serve),
            (0u64..700).prop_map(Step::Wait),
        ]
    }

    proptest! {
        /// Whatever happens: per wall-clock window the fallback serves at
        /// most its share (nothing under fail_closed), only while the
        /// coordinator is unreachable; during an outage probes go out one at
        /// a time, the first a sixteenth of the interval after the failure,
        /// each wait twice the one before up to the interval (at most four
        /// more probes than one per interval); counters add up.
        #[test]
        fn fallback_is_bounded_per_window_and_probes_keep_their_cadence(
            steps in proptest::collection::vec(step(), 1..200),
            share in 0u64..60,
            fallback in any::<bool>(),
        ) {
            let policy = if fallback {
                OutagePolicy::Fallback { tokens_per_region: share }
            } else {
                OutagePolicy::FailClosed
            };
            let (probe, window_ms) = (250, 1_000);
            let mut gate = OutageGate::new(probe, policy);
            let mut now = 10_000u64;
            let mut served_per_window = std::collections::BTreeMap::<u64, u64>::new();
            // The model of the probe cadence: (outage began, probes since,
            // last failure, wait after it).
            let mut outage: Option<(u64, u64, u64, u64)> = None;
            let (mut denials, mut served_total) = (0, 0);
            for step in steps {
                match step {
                    Step::Fail => {
                        if gate.may_call(now) {
                            if let Some((_, _, last, wait)) = outage {
                                prop_assert!(now >= last + wait, "a probe went out early");
                            }
                            gate.on_failure(now);
                            outage = Some(match outage {
                                None => (now, 0, now, probe / 16),
                                Some((began, probes, _, wait)) => {
                                    (began, probes + 1, now, (wait * 2).min(probe))
                                }
                            });
                            let (began, probes, _, _) = outage.expect("just set");
                            prop_assert!(
                                probes <= 4 + (now - began) / probe,
                                "{} probes in an outage of {} ms",
                                probes,
                                now - began
                            );
                        } else {
                            let (_, _, last, wait) = outage.expect("unreachable after a failure");
                            prop_assert!(now < last + wait, "a probe was due but refused");
                        }
                    }
                    Step::Answer => {
                        if gate.may_call(now) {
                            gate.on_answer();
                            outage = None;
                        }
                    }
                    Step::Serve(tokens) => {
                        let unreachable = gate.is_unreachable();
                        match gate.serve_at(tokens, now, window_ms) {
                            Some(served) => {
                                prop_assert!(unreachable && fallback);
                                prop_assert!(served.granted >= 1 && served.granted <= tokens);
                                prop_assert!(served.window_start_ms <= now && now < served.window_end_ms);
                                prop_assert_eq!(served.window_end_ms - now, served.remaining_lifetime_ms);
                                *served_per_window.entry(served.window_start_ms).or_default() += served.granted;
                                served_total += served.granted;
                            }
                            None if unreachable => denials += 1,
                            None => {}
                        }
                    }
                    Step::Wait(ms) => now += ms,
                }
            }
            for (window, served) in &served_per_window {
                prop_assert!(*served <= share, "window {}: {} > {}", window, served, share);
            }
            prop_assert_eq!(gate.outage_denials(), denials);
            prop_assert_eq!(gate.fallback_tokens(), served_total);
        }
    }

    /// Regression (found by the property above): a coordinator that came
    /// back and went away again within one window renewed the fallback
    /// share, so a flapping link admitted a share per outage.
    #[test]
    fn the_share_bounds_a_window_however_many_outages_it_sees() {
        let mut gate = OutageGate::new(
            100,
            OutagePolicy::Fallback {
                tokens_per_region: 5,
            },
        );
        assert!(gate.serve(3, 0, 1_000).is_none(), "nothing while reachable");
        gate.on_failure(10);
        assert!(
            !gate.may_call(15) && gate.may_call(16),
            "first probe 100 / 16 ms later"
        );
        assert_eq!(gate.retry_after_ms(12), Some(4));
        gate.on_failure(16);
        assert!(
            !gate.may_call(27) && gate.may_call(28),
            "then twice as long"
        );
        assert_eq!(gate.serve(4, 0, 1_000).map(|s| s.granted), Some(4));
        gate.on_answer();
        assert_eq!(gate.retry_after_ms(200), None);
        gate.on_failure(300);
        assert_eq!(gate.serve(4, 0, 1_000).map(|s| s.granted), Some(1));
        assert!(gate.serve(1, 0, 1_000).is_none());
        assert_eq!(
            gate.serve(5, 1_000, 1_000).map(|s| s.granted),
            Some(5),
            "a new window, a new share"
        );
        assert_eq!((gate.outage_denials(), gate.fallback_tokens()), (1, 10));
    }
}
