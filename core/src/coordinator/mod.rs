//! The L3 coordinator state machine: deterministic `apply(state, proposal)`.
//!
//! Raft orders [`Proposal`]s (one log entry each, possibly a batch of commands
//! from group commit); every replica applies them to a [`CoordinatorState`]
//! and reaches the same state and the same [`Outcome`]s.
//!
//! # Layout
//! - `command`: the replicated commands (the log payload).
//! - `outcome`: what each command did, and why one was refused.
//! - `state`: [`CoordinatorState`], `apply` and the read-only views.
//! - `windows`: per-key window records, the window creation rule, tombstones.
//! - `lease`, `reconcile`, `pool`, `policy_admin`: one file per command.
//! - `sessions`: exactly-once client sessions, bounded.
//! - `gc`: collection of dead windows and sessions.
//! - [`sharding`]: which keys a group serves, the placement, moves of slots.
//! - `moves`: what a move of slots carries on the log (its name, the
//!   placement change, its session and key parts), re-exported by
//!   [`sharding`].
//! - `slot_moves`: the sharding commands applied (placement changes,
//!   releases and acquisitions of moves, the ownership check).
//! - [`format_v2`]: the types as storage format 2 wrote them, and their upgrade.
//! - [`format_v3`]: the state as storage format 3 wrote it, and its upgrade.
//! - [`format_v6`]: the state as storage formats 4 to 6 wrote it (before a
//!   restore could seal windows), and its upgrade.
//! - [`format_v7`]: the state as storage format 7 wrote it (before
//!   shards), and its upgrade.

mod command;
pub mod format_v2;
pub mod format_v3;
pub mod format_v6;
pub mod format_v7;
pub mod format_v8;
mod gc;
mod lease;
mod moves;
mod outcome;
mod policy_admin;
mod pool;
mod reconcile;
mod region_uses;
mod sessions;
pub mod sharding;
mod slot_moves;
mod state;
mod windows;

pub use command::*;
pub use lease::MAX_REGIONS_PER_WINDOW;
pub use outcome::*;
pub use pool::{PoolView, NEXT_WINDOW_JOIN_SHARE};
pub use sessions::{
    MovedSession, Response, MAX_RESPONSES_PER_SESSION, MAX_SESSIONS, MAX_SESSIONS_PER_PRINCIPAL,
    SESSION_MIN_RETAIN_MS, SESSION_OPENING_SEQS,
};
pub use state::*;
pub use windows::seals as restore_seals;
pub use windows::{MovedFloors, MovedKey};
