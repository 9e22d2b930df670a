//! The `leasehold.v1` wire schema: generated messages, clients and servers
//! for the Coordinator, Admin, Raft, Escrow and Monitor services, plus the metadata
//! keys used for leader hints ([`LeaderHint`]), the catalogue of refusal reasons
//! ([`refusal`]), the conversions between wire messages and
//! `leasehold-core` types ([`convert`]) and the encoded descriptor set
//! served by gRPC reflection. Only schema, generated code and the wire's
//! shared vocabulary live here.
#![allow(missing_docs)]

pub mod convert;
pub mod leader_hint;
pub mod refusal;

pub use leader_hint::LeaderHint;

/// The encoded `FileDescriptorSet` of `leasehold.proto`, for gRPC
/// reflection (`grpcurl`, `grpc_cli`, Postman discover the services).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/leasehold_descriptor.bin"));

/// Generated code for package `leasehold.v1`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("leasehold.v1");
}

/// gRPC metadata key carrying the leader's node id on a not-leader error.
pub const LEADER_ID_METADATA: &str = "leasehold-leader-id";
/// gRPC metadata key carrying the leader's `host:port` on a not-leader error.
pub const LEADER_ADDR_METADATA: &str = "leasehold-leader-addr";
/// gRPC metadata key carrying a machine-readable reason: on every refusal
/// (the [`refusal::Reason`] also in its `ErrorInfo`) and on fair-throttle
/// denials ([`REASON_FAIR_THROTTLED`]), so callers need not parse messages.
pub const REASON_METADATA: &str = "leasehold-reason";
/// A regional escrow node's fair throttle refused the request before the
/// key's budget was consulted (a normal denial, `granted = 0` or
/// `allowed = false`, with `retry_after_ms`): the caller has been finding
/// the budget gone more than others. Back off; lighter callers still pass.
pub const REASON_FAIR_THROTTLED: &str = "FAIR_THROTTLED";
