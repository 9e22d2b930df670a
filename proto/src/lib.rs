//! The `leasehold.v1` wire schema: generated messages, clients and servers
//! for the Coordinator, Admin, Raft and Escrow services, plus the metadata
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
