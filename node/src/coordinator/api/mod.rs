//! One group's side of the public coordinator API
//! (`leasehold.v1.Coordinator`): lease, reconcile and pool grant go
//! through group commit at the group's leader; `GetWindow` is a
//! linearizable read.
//!
//! Every call validates its input first (`INVALID_ARGUMENT`, nothing
//! proposed), then checks leadership (`FAILED_PRECONDITION` with a leader
//! hint, or `UNAVAILABLE`), then proposes and maps the state machine's
//! outcome (`NOT_FOUND` without a policy, `FAILED_PRECONDITION` on a kind
//! mismatch).
//!
//! Lease, Reconcile and PoolGrant act for the request's region: only that
//! region's certificate may send them (`PERMISSION_DENIED` otherwise; see
//! [`crate::auth`]).
//!
//! A [`CoordinatorApi`] answers for its own group alone, as plain async
//! methods over the decoded message and its [`Caller`]; which group a
//! key's call goes to is settled before the call reaches one, by the
//! router the member serves (`ShardRouting`). Shard 0 and each hosted
//! shard have an API of their own, over their group, with their own pool
//! desk.
//!
//! One file per RPC: [`lease`], [`reconcile`], [`pool`] (`PoolGrant` and
//! `PoolRelease`, which share the pool desk), [`get_window`] and
//! [`lease_batch`], each adding its methods to the one group's API of
//! [`group`] ([`CoordinatorApi`], with what they share: who the caller is,
//! the region check, proposing a write).

mod get_window;
mod group;
mod lease;
mod lease_batch;
mod pool;
mod reconcile;

pub use group::{Caller, CoordinatorApi};
