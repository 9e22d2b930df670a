//! Shards on a member (ADR 0025): every Raft group past shard 0 that this
//! member hosts, and which group answers each key's call.
//!
//! - [`hosting`]: the shards the placement names this member a replica
//!   of — forming, leading, following replica changes, acquiring and
//!   releasing moves, taking leadership back ([`hosting::ShardHost`]).
//! - [`routing`]: the `leasehold.v1.Coordinator` service, which works out
//!   each call's shard once and hands it to that group's plain
//!   [`CoordinatorApi`](super::api::CoordinatorApi), or refuses
//!   `NOT_OWNER` ([`routing::ShardRouting`]).
//!
//! The pure rules they follow live in `leasehold_core`: a key's slot and
//! the versioned placement in `leasehold_core::shard`, what a group serves
//! and how a move's parts are released and acquired in the state machine
//! in `leasehold_core::coordinator::sharding`. The dependency runs one way:
//! hosting → routing → the per-group APIs.

pub mod hosting;
pub mod routing;
