//! Coordinator cluster tests: real members on loopback ephemeral ports in
//! this process, driven through the public gRPC API.
//!
//! - `safety`: concurrent callers never get more than L per window; a
//!   leader failover under load; a full stop/restart keeps every
//!   acknowledged grant; a member that missed compacted log entries rejoins
//!   through install-snapshot.
//! - `backup`: the disaster drills: a backup saved under load restored
//!   into a new cluster; a survivor of a lost quorum forced into a new
//!   cluster; both grown back, Σ ≤ L per window across old and new.
//! - `bad_input`: every error code, with no state change.
//! - `hostile_bytes`: arbitrary bytes and field values on every method.
//! - `exactly_once`: request ids reused for other requests, session floods.
//! - `framed_raft`: the members' framed Raft transport fed hostile frames;
//!   a gRPC-only listener told apart at the preface.
//! - `lease_batch`: `LeaseBatch` items answered as alone, exactly-once per item.
//! - `cli`: `leasehold dev` and the binary's client commands.
//! - `cli_errors`: what the binary says, the same on every run, when TLS
//!   or the service on the port cannot work: certificates either side does
//!   not trust, TLS on one side only, an escrow node's port.
//! - `membership`: a membership change names the members that do not
//!   hold it yet when the leader answers.
//! - `health`: `leasehold health` before and after `cluster init`.
//! - `config_check`: `leasehold config check` over good and broken files,
//!   `leasehold policy apply`.
//! - `admission`: admission gates whose cost axis is the global budget
//!   through escrow nodes: Σ cost ≤ L, rate and concurrency bind locally.
//! - `escrow`: regional escrow nodes: Σ admitted ≤ L across regions, outage
//!   policies, bounded key table, idle eviction.
//! - `escrow_fair`: a key fronted by a fair throttle: light callers get
//!   through while a heavy one is throttled; bad settings are refused.
//! - `shadow`: shadow-mode policies admit beyond L, count exactly the
//!   excess as would-deny (coordinator and escrow), enforce when turned off.
//! - `limits`: resource attacks are refused: idle connections, the
//!   connection cap, oversized messages, the advertised stream cap.
//! - `metrics`: `/metrics` of a member and an escrow node, scraped over HTTP.
//! - `rls`: Envoy's rate limit service on escrow nodes, from a client
//!   generated from Envoy's protos: every answer field, bad input, metrics,
//!   Σ OK ≤ L across two regions with escrow restarts.
//! - `logs`: the binary's log lines: JSON objects with `--log-format
//!   json`, no ANSI escape off a terminal, the "waiting for cluster init" line.
//! - `traces`: one trace from the client crate through an escrow node to
//!   the coordinator's Raft proposal; denial reasons on spans.
//! - `watch`: the Monitor service's streams (grants appear, prefixes,
//!   one update per window, stream limits, shutdown) and `leasehold watch`.
//! - `shards`: a split shard serves its keys with their windows on its
//!   replicas; `NOT_OWNER` elsewhere; batches across shards; leader loss.
//! - `tls`: mutual TLS and authorization: unauthenticated and foreign-CA
//!   clients, per-identity permissions, forged Raft messages, certificate
//!   rotation.

mod admission;
mod backup;
mod bad_input;
mod cli;
mod cli_errors;
mod config_check;
mod escrow;
mod escrow_fair;
mod exactly_once;
mod framed_raft;
mod harness;
mod health;
mod hostile_bytes;
mod lease_batch;
mod limits;
mod logs;
mod membership;
mod metrics;
mod rls;
mod safety;
mod shadow;
mod shards;
mod tls;
mod traces;
mod watch;
