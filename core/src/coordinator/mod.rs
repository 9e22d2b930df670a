//! The L3 coordinator state machine: deterministic `apply(state, proposal)`.
//!
//! Raft orders [`Proposal`]s (one log entry each, possibly a batch of commands
//! from group commit); every replica applies them to a [`CoordinatorState`]
//! and reaches the same state and the same [`Outcome`]s.

mod command;
mod state;

pub use command::*;
pub use state::*;
