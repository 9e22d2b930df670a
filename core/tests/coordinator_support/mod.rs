//! Builders shared by the coordinator integration tests.
#![allow(dead_code)]

pub mod history_gen;
pub mod history_model;

use leasehold_core::coordinator::{Command, CoordinatorState, Outcome, Proposal};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
use leasehold_core::policy::{OutagePolicy, Policy, PolicyKind};

pub fn key(s: &str) -> Key {
    Key::new(s).expect("valid key")
}

pub fn region(s: &str) -> RegionId {
    RegionId::new(s).expect("valid region")
}

pub fn request(client: &str, seq: u64) -> RequestId {
    RequestId {
        client: ClientId::new(client).expect("valid client"),
        seq,
    }
}

pub fn policy(prefix: &str, limit: u64, window_ms: u64, kind: PolicyKind) -> Policy {
    Policy {
        prefix: prefix.to_string(),
        limit,
        window_ms,
        kind,
        outage: OutagePolicy::FailClosed,
        shadow: false,
    }
}

pub fn counter(prefix: &str, limit: u64, window_ms: u64) -> Command {
    Command::SetPolicy(policy(prefix, limit, window_ms, PolicyKind::Counter))
}

pub fn fair(prefix: &str, limit: u64, window_ms: u64) -> Command {
    Command::SetPolicy(policy(prefix, limit, window_ms, PolicyKind::Fair))
}

pub fn lease(k: &str, r: &str, tokens: u64) -> Command {
    Command::Lease {
        key: key(k),
        region: region(r),
        tokens,
        request_id: None,
        caller: leasehold_core::principal::Principal::Anonymous,
    }
}

pub fn reconcile(k: &str, r: &str, leftover: u64, window_start_ms: u64) -> Command {
    Command::Reconcile {
        key: key(k),
        region: region(r),
        leftover,
        window_start_ms,
        request_id: None,
        caller: leasehold_core::principal::Principal::Anonymous,
    }
}

pub fn pool(k: &str, r: &str, region_weight: u64, want_total: u64) -> Command {
    Command::PoolGrant {
        key: key(k),
        region: region(r),
        region_weight,
        want_total,
        request_id: None,
        caller: leasehold_core::principal::Principal::Anonymous,
    }
}

/// Applies one single-command proposal stamped `stamp_ms`.
pub fn run(state: &mut CoordinatorState, stamp_ms: u64, command: Command) -> Outcome {
    let mut result = state.apply(&Proposal {
        stamp_ms,
        commands: vec![command],
    });
    assert_eq!(result.outcomes.len(), 1, "one outcome per command");
    result.outcomes.remove(0)
}

/// The granted amount of a lease outcome; panics on anything else.
pub fn granted(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::Lease(grant) => grant.granted,
        other => panic!("expected a lease grant, got {other:?}"),
    }
}
