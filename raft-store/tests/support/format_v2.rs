//! The history behind the format-2 fixtures in `tests/fixtures/`: the
//! proposals a member applied before the state machine knew shadow mode.
//! Applying them again with the current code must give exactly the state
//! the fixtures decode to.

use leasehold_core::coordinator::{Command, Proposal};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
use leasehold_core::policy::{OutagePolicy, Policy, PolicyKind};
use leasehold_core::principal::Principal;

fn region(name: &str) -> RegionId {
    RegionId::new(name).expect("region")
}

fn key(name: &str) -> Key {
    Key::new(name).expect("key")
}

fn request(client: &str, seq: u64) -> Option<RequestId> {
    Some(RequestId {
        client: ClientId::new(client).expect("client id"),
        seq,
    })
}

fn lease(name: &str, at: &str, tokens: u64, request_id: Option<RequestId>) -> Command {
    Command::Lease {
        key: key(name),
        region: region(at),
        tokens,
        request_id,
        caller: Principal::Region(region(at)),
    }
}

fn pool_grant(name: &str, at: &str, region_weight: u64, want_total: u64) -> Command {
    Command::PoolGrant {
        key: key(name),
        region: region(at),
        region_weight,
        want_total,
        request_id: request(&format!("pool-{at}"), 1),
        caller: Principal::Region(region(at)),
    }
}

/// The policies of the history, as format 2 knew them (no shadow mode).
pub fn policies() -> [Policy; 3] {
    [
        Policy {
            prefix: "api/".into(),
            limit: 100,
            window_ms: 10_000,
            kind: PolicyKind::Counter,
            outage: OutagePolicy::FailClosed,
            shadow: false,
        },
        Policy {
            prefix: "fair/".into(),
            limit: 50,
            window_ms: 10_000,
            kind: PolicyKind::Fair,
            outage: OutagePolicy::Fallback {
                tokens_per_region: 5,
            },
            shadow: false,
        },
        Policy {
            prefix: "old/".into(),
            limit: 10,
            window_ms: 1_000,
            kind: PolicyKind::Counter,
            outage: OutagePolicy::FailClosed,
            shadow: false,
        },
    ]
}

/// Proposals touching every part of the state: policies, counter and fair
/// windows of two regions, sessions, a reconcile, a collected window and
/// its dropped tombstone, a growth floor, a delete.
pub fn proposals() -> Vec<Proposal> {
    let [api, fair, old] = policies();
    let mut longer_old = old.clone();
    longer_old.window_ms = 60_000;
    vec![
        Proposal {
            stamp_ms: 1_000,
            commands: vec![
                Command::SetPolicy(api),
                Command::SetPolicy(fair),
                Command::SetPolicy(old),
            ],
        },
        Proposal {
            stamp_ms: 1_500,
            commands: vec![
                lease("api/a", "eu", 30, request("checkout-1", 1)),
                lease("api/a", "us", 90, None),
                lease("old/x", "eu", 5, None),
            ],
        },
        Proposal {
            stamp_ms: 2_000,
            commands: vec![
                pool_grant("fair/f", "eu", 2, 40),
                pool_grant("fair/f", "us", 1, 40),
            ],
        },
        Proposal {
            stamp_ms: 2_500,
            commands: vec![Command::Reconcile {
                key: key("api/a"),
                region: region("eu"),
                leftover: 10,
                window_start_ms: 0,
                request_id: request("checkout-1", 2),
                caller: Principal::Region(region("eu")),
            }],
        },
        Proposal {
            stamp_ms: 5_000,
            commands: vec![Command::Tick],
        },
        Proposal {
            stamp_ms: 5_100,
            commands: vec![Command::SetPolicy(longer_old)],
        },
        Proposal {
            stamp_ms: 5_200,
            commands: vec![
                Command::DeletePolicy {
                    prefix: "nothing/".into(),
                },
                lease("old/y", "eu", 1, request("checkout-1", 3)),
                lease("api/b", "us", 7, None),
            ],
        },
    ]
}
