//! Shards on a member (ADR 0025): every Raft group past shard 0 that this
//! member hosts, and which group answers each key's call.
//!
//! - [`hosting`]: the shards the placement names this member a replica
//!   of — opening, forming, joining and stopping them on every pass
//!   ([`hosting::ShardHost`]) — over [`hosted`] (one hosted shard),
//!   [`leading`] (what the leader of a shard does: `BecomeShard`, policy
//!   sync, acquiring and releasing moves, following replica changes) and
//!   [`reclaim`] (a preferred replica taking its leadership back).
//! - [`routing`]: the `leasehold.v1.Coordinator` service, which works out
//!   each call's shard once and hands it to that group's plain
//!   [`CoordinatorApi`](super::api::CoordinatorApi), or refuses
//!   `NOT_OWNER` ([`routing::ShardRouting`]).
//!
//! The pure rules they follow live in `leasehold_core`: a key's slot and
//! the versioned placement in `leasehold_core::shard`, what a group serves
//! and how a move's parts are released and acquired in the state machine
//! in `leasehold_core::coordinator::sharding`. The dependency runs one way:
//! hosting → (leading, reclaim → hosted) and routing → the per-group APIs.

mod hosted;
pub mod hosting;
mod leading;
pub mod reclaim;
pub mod routing;
