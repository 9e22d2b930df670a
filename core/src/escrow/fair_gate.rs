//! The fair-throttle gate in front of one escrow key: a
//! [`FairThrottleState`] (stochastic fair BLUE) consulted before the escrow
//! rules, fed what the rules answered.
//!
//! The gate is pure: time, the rotation seed and the random draw of each
//! decision come in as arguments (the key's actor draws them). Its resource
//! is the key's budget in the window: an admitted request the escrow served
//! is a [`Outcome::Success`], one the escrow had nothing for is an
//! [`Outcome::Exhausted`]. So callers that keep finding the budget gone are
//! throttled before it is gone, and callers that ask modestly keep getting
//! through.
//!
//! Laws (property-tested in `escrow::fair_gate::tests`):
//! - **Only removes admissions:** a throttled request never reaches the
//!   rules, so the gate can only turn a would-be admission into a denial;
//!   it never serves anything itself (Δ is unaffected).
//! - **Throttled requests learn nothing:** a throttled (or idle-admitted)
//!   request changes no cell.
//! - **Counted once:** every [`gate`](EscrowFairGate::gate) call adds one to
//!   exactly one of `passes`, `denials`, `idle_admissions`.
//! - **Idle capacity:** with an idle reserve `r`, a request the throttle
//!   would refuse still passes (unlearnt) while the key holds more than `r`
//!   unleased credits.

use crate::fair_throttle::{
    CallerId, FairThrottleConfig, FairThrottleError, FairThrottleState, Outcome,
};

/// What the gate says about one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GateVerdict {
    /// Run the escrow rules, then [`record`](EscrowFairGate::record) what they answered.
    Pass,
    /// Refused by the throttle with this probability; the rules are not run.
    Throttled {
        /// The caller's throttle probability that decided it.
        probability: f64,
    },
    /// The throttle would refuse it, but the key holds more than its idle
    /// reserve: run the rules and record nothing.
    IdleAdmit,
}

/// Counters of one gate (monotone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FairGateCounters {
    /// Requests the throttle let through to the rules.
    pub passes: u64,
    /// Requests the throttle refused.
    pub denials: u64,
    /// Requests the throttle would refuse that idle capacity let through.
    pub idle_admissions: u64,
    /// Passed requests the escrow served.
    pub successes: u64,
    /// Passed requests the escrow had nothing for.
    pub exhaustions: u64,
    /// Live/shadow rotations.
    pub rotations: u64,
}

/// One key's fair-throttle gate (see the module doc).
#[derive(Debug, Clone)]
pub struct EscrowFairGate {
    state: FairThrottleState,
    idle_reserve: Option<u64>,
    counters: FairGateCounters,
}

impl EscrowFairGate {
    /// A cold gate starting at `now_ms`; `idle_reserve`: pass throttled
    /// requests while more than this many unleased credits are held
    /// (`None`: never). Refuses an invalid `config`.
    pub fn new(
        config: FairThrottleConfig,
        idle_reserve: Option<u64>,
        now_ms: u64,
        live_seed: u32,
        shadow_seed: u32,
    ) -> Result<Self, FairThrottleError> {
        Ok(EscrowFairGate {
            state: FairThrottleState::new(config, now_ms, live_seed, shadow_seed)?,
            idle_reserve,
            counters: FairGateCounters::default(),
        })
    }

    /// The throttle state.
    pub fn state(&self) -> &FairThrottleState {
        &self.state
    }

    /// The counters so far.
    pub fn counters(&self) -> FairGateCounters {
        self.counters
    }

    /// The verdict for one request of `caller` at `now_ms`: rotates first
    /// if due (hashing the new shadow with `fresh_seed`), then decides with
    /// the uniform `draw`; `unleased` is what the key holds unleased now
    /// (only read with an idle reserve).
    pub fn gate(
        &mut self,
        caller: CallerId<'_>,
        now_ms: u64,
        fresh_seed: u32,
        draw: u64,
        unleased: u64,
    ) -> GateVerdict {
        if self.state.rotate_if_due(now_ms, fresh_seed) {
            self.counters.rotations += 1;
        }
        let verdict = self.state.decide(caller, now_ms, draw);
        if verdict.admit {
            self.counters.passes += 1;
            GateVerdict::Pass
        } else if self.idle_reserve.is_some_and(|reserve| unleased > reserve) {
            self.counters.idle_admissions += 1;
            GateVerdict::IdleAdmit
        } else {
            self.counters.denials += 1;
            GateVerdict::Throttled {
                probability: verdict.probability,
            }
        }
    }

    /// Feeds what the rules answered a [`GateVerdict::Pass`]ed request:
    /// `true` when tokens were granted, `false` when the escrow had none.
    pub fn record(&mut self, caller: CallerId<'_>, served: bool, now_ms: u64) {
        let outcome = if served {
            self.counters.successes += 1;
            Outcome::Success
        } else {
            self.counters.exhaustions += 1;
            Outcome::Exhausted
        };
        self.state.record(caller, outcome, now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn caller(id: &[u8]) -> CallerId<'_> {
        CallerId::new(id).expect("non-empty")
    }

    fn gate(idle_reserve: Option<u64>) -> EscrowFairGate {
        EscrowFairGate::new(FairThrottleConfig::default(), idle_reserve, 0, 1, 2).expect("valid")
    }

    #[test]
    fn an_invalid_config_is_refused() {
        let config = FairThrottleConfig {
            levels: 0,
            ..FairThrottleConfig::default()
        };
        assert_eq!(
            EscrowFairGate::new(config, None, 0, 1, 2).err(),
            Some(FairThrottleError::ZeroLevels)
        );
    }

    #[test]
    fn a_caller_that_keeps_exhausting_is_throttled_and_a_light_one_is_not() {
        let mut g = gate(None);
        for _ in 0..25 {
            assert_eq!(
                g.gate(caller(b"heavy"), 0, 3, u64::MAX, 0),
                GateVerdict::Pass
            );
            g.record(caller(b"heavy"), false, 0);
        }
        // Probability 1: every draw is refused.
        assert!(matches!(
            g.gate(caller(b"heavy"), 0, 3, u64::MAX, 0),
            GateVerdict::Throttled { probability } if probability == 1.0
        ));
        assert_eq!(g.gate(caller(b"light"), 0, 3, 0, 0), GateVerdict::Pass);
        let c = g.counters();
        assert_eq!((c.passes, c.denials, c.exhaustions), (26, 1, 25));
    }

    #[test]
    fn idle_capacity_passes_a_throttled_request_above_the_reserve_only() {
        let mut g = gate(Some(10));
        for _ in 0..25 {
            g.gate(caller(b"heavy"), 0, 3, u64::MAX, 0);
            g.record(caller(b"heavy"), false, 0);
        }
        assert_eq!(
            g.gate(caller(b"heavy"), 0, 3, 0, 11),
            GateVerdict::IdleAdmit
        );
        assert!(matches!(
            g.gate(caller(b"heavy"), 0, 3, 0, 10),
            GateVerdict::Throttled { .. }
        ));
        assert_eq!(g.counters().idle_admissions, 1);
    }

    #[test]
    fn rotation_is_counted() {
        let mut g = gate(None);
        let interval = FairThrottleConfig::default().rotation_interval_ms;
        g.gate(caller(b"a"), interval, 9, 0, 0);
        assert_eq!(g.counters().rotations, 1);
        assert_eq!(g.state().rotations(), 1);
    }

    proptest! {
        /// Counted once, and throttled or idle-admitted requests learn nothing.
        #[test]
        fn every_gate_call_is_counted_once_and_only_passes_learn(
            steps in proptest::collection::vec((0u8..4, any::<u64>(), any::<bool>(), 0u64..20), 1..200),
        ) {
            let mut g = gate(Some(10));
            for (i, (who, draw, served, unleased)) in steps.iter().enumerate() {
                let id = [b'c', *who];
                let now = i as u64 * 10;
                let before = g.state().throttle_probability(caller(&id), now);
                let verdict = g.gate(caller(&id), now, 7, *draw, *unleased);
                match verdict {
                    GateVerdict::Pass => g.record(caller(&id), *served, now),
                    GateVerdict::Throttled { .. } | GateVerdict::IdleAdmit => {
                        prop_assert_eq!(g.state().throttle_probability(caller(&id), now), before);
                    }
                }
            }
            let c = g.counters();
            prop_assert_eq!(c.passes + c.denials + c.idle_admissions, steps.len() as u64);
            prop_assert_eq!(c.successes + c.exhaustions, c.passes);
        }
    }
}
