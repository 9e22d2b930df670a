//! The history behind the format-3 fixtures in `tests/fixtures/`: the
//! proposals a member applied before the state machine kept a key's next
//! pool window beside its live one (format 4). Every command here existed
//! in format 3, with the same layout, so the history is written with the
//! current types; applying it again with the current code must give
//! exactly the state the fixtures decode to.

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

fn pool_grant(name: &str, at: &str, region_weight: u64, want_total: u64, seq: u64) -> Command {
    Command::PoolGrant {
        key: key(name),
        region: region(at),
        region_weight,
        want_total,
        request_id: request(&format!("pool-{at}"), seq),
        caller: Principal::Region(region(at)),
    }
}

/// The policies of the history: a counter, a fair and a shadow fair one.
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
            limit: 60,
            window_ms: 1_000,
            kind: PolicyKind::Fair,
            outage: OutagePolicy::Fallback {
                tokens_per_region: 5,
            },
            shadow: false,
        },
        Policy {
            prefix: "trial/".into(),
            limit: 10,
            window_ms: 1_000,
            kind: PolicyKind::Fair,
            outage: OutagePolicy::FailClosed,
            shadow: true,
        },
    ]
}

/// Proposals touching every part of the format-3 state: policies (one in
/// shadow mode), counter and fair windows of two regions, sessions, a
/// reconcile, a region retired from a pool (a release), would-deny
/// tallies, a collected window.
pub fn proposals() -> Vec<Proposal> {
    let [api, fair, trial] = policies();
    vec![
        Proposal {
            stamp_ms: 1_000,
            commands: vec![
                Command::SetPolicy(api),
                Command::SetPolicy(fair),
                Command::SetPolicy(trial),
            ],
        },
        Proposal {
            stamp_ms: 1_500,
            commands: vec![
                lease("api/a", "eu", 30, request("checkout-1", 1)),
                lease("api/a", "us", 90, None),
                pool_grant("fair/f", "eu", 2, 50, 1),
                pool_grant("fair/f", "us", 1, 50, 1),
                pool_grant("trial/t", "eu", 1, 25, 2),
            ],
        },
        Proposal {
            stamp_ms: 1_700,
            commands: vec![
                Command::PoolRelease {
                    key: key("fair/f"),
                    region: region("eu"),
                    from_total: 50,
                    keep_total: 35,
                    window_start_ms: 1_000,
                    request_id: request("pool-eu", 3),
                    caller: Principal::Region(region("eu")),
                },
                Command::Reconcile {
                    key: key("api/a"),
                    region: region("eu"),
                    leftover: 10,
                    window_start_ms: 0,
                    request_id: request("checkout-1", 2),
                    caller: Principal::Region(region("eu")),
                },
            ],
        },
        Proposal {
            stamp_ms: 2_100,
            commands: vec![Command::Tick, pool_grant("fair/f", "us", 1, 20, 4)],
        },
    ]
}
