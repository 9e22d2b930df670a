//! What the in-process fleet tests share: a seeded generator, a delaying
//! network that may reorder messages, and the real coordinator state machine
//! driven through proposals the way a Raft leader would drive it.

#![allow(dead_code)]

use leasehold_core::coordinator::{
    Command, CoordinatorState, LeaseGrant, Outcome, PoolGrantOutcome, Proposal, ReconcileOutcome,
};
use leasehold_core::escrow::{CoordinatorGrant, Reconcile};
use leasehold_core::ids::{Key, RegionId};
use leasehold_core::policy::{OutagePolicy, Policy, PolicyKind};

/// A tiny seeded generator (xorshift64) so every run is reproducible by seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Messages in flight, each delivered at its own time; equal times keep
/// their sending order. Random delays reorder messages.
pub struct Network<M> {
    in_flight: Vec<(u64, u64, M)>,
    sent: u64,
}

impl<M> Default for Network<M> {
    fn default() -> Self {
        Network {
            in_flight: Vec::new(),
            sent: 0,
        }
    }
}

impl<M> Network<M> {
    pub fn send(&mut self, deliver_at: u64, message: M) {
        self.sent += 1;
        self.in_flight.push((deliver_at, self.sent, message));
    }

    /// Removes and returns every message due at `now`, in delivery order.
    pub fn due(&mut self, now: u64) -> Vec<M> {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].0 <= now {
                due.push(self.in_flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|(at, seq, _)| (*at, *seq));
        due.into_iter().map(|(_, _, m)| m).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }
}

/// The coordinator state machine of one key, driven by proposals stamped
/// with the coordinator's clock.
pub struct Coordinator {
    pub state: CoordinatorState,
    pub key: Key,
}

pub fn region(i: usize) -> RegionId {
    RegionId::new(format!("r{i}")).expect("valid region id")
}

impl Coordinator {
    pub fn new(limit: u64, window_ms: u64, kind: PolicyKind, stamp_ms: u64) -> Self {
        let mut state = CoordinatorState::default();
        let policy = Policy {
            prefix: "fleet/".into(),
            limit,
            window_ms,
            kind,
            outage: OutagePolicy::FailClosed,
            shadow: false,
        };
        let result = state.apply(&Proposal {
            stamp_ms,
            commands: vec![Command::SetPolicy(policy)],
        });
        assert_eq!(result.outcomes, vec![Outcome::PolicySet]);
        Coordinator {
            state,
            key: Key::new("fleet/key").expect("valid key"),
        }
    }

    fn apply(&mut self, stamp_ms: u64, command: Command) -> Outcome {
        let mut result = self.state.apply(&Proposal {
            stamp_ms,
            commands: vec![command],
        });
        assert_eq!(result.outcomes.len(), 1);
        result.outcomes.remove(0)
    }

    pub fn lease(&mut self, region_index: usize, tokens: u64, stamp_ms: u64) -> LeaseGrant {
        let command = Command::Lease {
            key: self.key.clone(),
            region: region(region_index),
            tokens,
            request_id: None,
            caller: leasehold_core::principal::Principal::Anonymous,
        };
        match self.apply(stamp_ms, command) {
            Outcome::Lease(grant) => grant,
            other => panic!("lease answered {other:?}"),
        }
    }

    pub fn reconcile(
        &mut self,
        region_index: usize,
        back: Reconcile,
        stamp_ms: u64,
    ) -> ReconcileOutcome {
        let command = Command::Reconcile {
            key: self.key.clone(),
            region: region(region_index),
            leftover: back.leftover,
            window_start_ms: back.window_start_ms,
            request_id: None,
            caller: leasehold_core::principal::Principal::Anonymous,
        };
        match self.apply(stamp_ms, command) {
            Outcome::Reconcile(outcome) => outcome,
            other => panic!("reconcile answered {other:?}"),
        }
    }

    pub fn pool_grant(
        &mut self,
        region_index: usize,
        region_weight: u64,
        want_total: u64,
        stamp_ms: u64,
    ) -> PoolGrantOutcome {
        let command = Command::PoolGrant {
            key: self.key.clone(),
            region: region(region_index),
            region_weight: region_weight.max(1),
            want_total,
            request_id: None,
            caller: leasehold_core::principal::Principal::Anonymous,
        };
        match self.apply(stamp_ms, command) {
            Outcome::PoolGrant(outcome) => outcome,
            other => panic!("pool grant answered {other:?}"),
        }
    }
}

/// What the escrow sees of a grant: the window and the relative lifetime.
pub fn as_escrow_grant(grant: &LeaseGrant) -> CoordinatorGrant {
    CoordinatorGrant {
        granted: grant.granted,
        window_start_ms: grant.window_start_ms,
        window_end_ms: grant.window_end_ms,
        remaining_lifetime_ms: grant.window_end_ms - grant.coordinator_now_ms,
    }
}
