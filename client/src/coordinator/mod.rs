//! Talking to the coordinator cluster (L3): [`CoordinatorClient`] for the
//! public API (lease, reconcile, pool grant, window reads) and [`AdminClient`]
//! for cluster and policy administration.
//!
//! The client tracks the leader: it starts with any configured endpoint,
//! follows `FAILED_PRECONDITION` leader hints (metadata
//! `leasehold-leader-id` / `leasehold-leader-addr`), remembers the leader
//! that answered, and on `UNAVAILABLE`, deadline or transport errors moves to
//! the next endpoint after a jittered exponential backoff. Every attempt has
//! its own deadline and the whole call a total budget. A retried call reuses
//! its [`RequestId`](leasehold_proto::v1::RequestId), so the coordinator
//! applies it at most once and returns the first response.
//!
//! On a sharded cluster (ADR 0025) each key's calls go to the leader of its
//! shard: the client keeps the placement (read with `GetPlacement` when a
//! member names a newer version in a refusal) and a leader per shard,
//! follows hints per shard, cuts a `LeaseBatch` by shard, and takes request
//! ids from sessions of the key's shard (each group keeps its own). A
//! cluster never sharded names no placement, and nothing of this costs a
//! call.
//!
//! Request ids come from a pool of client sessions, one request in flight
//! per session at a time (the coordinator keeps a bounded window of recent
//! responses per session, so a slow retry must never fall behind many newer
//! requests of its own session). Concurrent callers of one client each get a
//! session of their own; sessions are reused, so their number follows the
//! peak concurrency.
//!
//! # Layout
//! - `client` — [`CoordinatorClient`]: what it holds, how it is built, what
//!   it tells about itself (ids, sessions, node name, leader).
//! - `options` — [`RetryOptions`]: deadlines, retry budget, backoff.
//! - `routing` — which member a call goes to: the call's target and the
//!   routing cache (endpoints, a leader per shard, leader hints followed
//!   and forgotten, connections).
//! - `placement` — the placement of keys on shards as last read.
//! - `shard_routing` — where a key's calls go: its shard's leader, the
//!   placement read again when a member names a newer one.
//! - `rpc` — every unary RPC, named by its request.
//! - `call` — the one generic call every RPC goes through (a member per
//!   attempt, deadlines, refusals mapped, hints followed, retries), and the
//!   request ids of calls that change state (a pooled session's or the
//!   caller's).
//! - `session` — the pooled sessions of exactly-once retries.
//! - `window_calls` — lease, reconcile and window reads, thin wrappers.
//! - `pool` — the fair pool's calls: [`PoolGrantCall`], [`PoolReleaseCall`].
//! - `lease_batch` — [`CoordinatorClient::lease_batch`]: leases for many
//!   keys, cut by shard and into calls of [`ITEMS_PER_BATCH_CALL`] items.
//! - `admin` — [`AdminClient`].
//! - `error` — [`CoordinatorError`] and how a refusal maps to one.

mod admin;
mod call;
mod client;
mod error;
mod lease_batch;
mod options;
mod placement;
mod pool;
mod routing;
mod rpc;
mod session;
mod shard_routing;
mod window_calls;

pub use admin::AdminClient;
pub use client::CoordinatorClient;
pub use error::CoordinatorError;
pub use lease_batch::{LeaseItem, ITEMS_PER_BATCH_CALL};
/// The leader a member names when it refuses with `NOT_LEADER` (carried by
/// [`CoordinatorError::NotLeader`]).
pub use leasehold_proto::LeaderHint;
pub use options::RetryOptions;
pub use pool::{PoolGrantCall, PoolReleaseCall};

#[cfg(test)]
mod tests;
