//! The `leasehold.v1` wire schema: generated messages, clients and servers
//! for the Coordinator, Admin, Raft, Escrow and Monitor services, plus the metadata
//! keys used for leader hints. Only schema and generated code live here.
#![allow(missing_docs)]

/// Generated code for package `leasehold.v1`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("leasehold.v1");
}

/// gRPC metadata key carrying the leader's node id on a not-leader error.
pub const LEADER_ID_METADATA: &str = "leasehold-leader-id";
/// gRPC metadata key carrying the leader's `host:port` on a not-leader error.
pub const LEADER_ADDR_METADATA: &str = "leasehold-leader-addr";
/// gRPC metadata key carrying a machine-readable reason on some errors and
/// denials (the `REASON_*` values), so callers need not parse messages.
pub const REASON_METADATA: &str = "leasehold-reason";
/// The request id already named a different request (`ALREADY_EXISTS`).
pub const REASON_REQUEST_ID_REUSED: &str = "REQUEST_ID_REUSED";
/// The request id is older than its session remembers, or its session
/// expired: it is never executed again (`FAILED_PRECONDITION`).
pub const REASON_SESSION_EXPIRED: &str = "SESSION_EXPIRED";
/// The caller holds as many sessions as it may (`RESOURCE_EXHAUSTED`).
pub const REASON_SESSIONS_EXHAUSTED: &str = "SESSIONS_EXHAUSTED";
/// A regional escrow node's key tracks as many credit holders as it may
/// (`RESOURCE_EXHAUSTED`).
pub const REASON_HOLDERS_EXHAUSTED: &str = "HOLDERS_EXHAUSTED";
/// A regional escrow node's fair throttle refused the request before the
/// key's budget was consulted (a normal denial, `granted = 0` or
/// `allowed = false`, with `retry_after_ms`): the caller has been finding
/// the budget gone more than others. Back off; lighter callers still pass.
pub const REASON_FAIR_THROTTLED: &str = "FAIR_THROTTLED";
/// A server already serves as many watch streams as it may for this
/// caller, or in all (`RESOURCE_EXHAUSTED` on `Monitor.Watch`).
pub const REASON_WATCH_STREAMS_EXHAUSTED: &str = "WATCH_STREAMS_EXHAUSTED";
