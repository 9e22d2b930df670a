//! Coordinator cluster tests: real members on loopback ephemeral ports in
//! this process, driven through the public gRPC API.
//!
//! - `safety`: concurrent callers never get more than L per window; a
//!   leader failover under load; a full stop/restart keeps every
//!   acknowledged grant; a member that missed compacted log entries rejoins
//!   through install-snapshot.
//! - `bad_input`: every error code, with no state change.
//! - `cli`: `leasehold dev` and the binary's client commands.

mod bad_input;
mod cli;
mod harness;
mod safety;
