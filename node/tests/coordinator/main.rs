//! Coordinator cluster tests: real members on loopback ephemeral ports in
//! this process, driven through the public gRPC API.
//!
//! - `safety`: concurrent callers never get more than L per window; a
//!   leader failover under load; a full stop/restart keeps every
//!   acknowledged grant; a member that missed compacted log entries rejoins
//!   through install-snapshot.
//! - `bad_input`: every error code, with no state change.
//! - `cli`: `leasehold dev` and the binary's client commands.
//! - `escrow`: regional escrow nodes: Σ admitted ≤ L across regions, outage
//!   policies, bounded key table, idle eviction.

mod bad_input;
mod cli;
mod escrow;
mod harness;
mod safety;
