//! The `leasehold` node: a coordinator cluster member (L3), the regional
//! escrow node (L2), and the operator CLI, as a library the thin binary
//! calls.
//!
//! # Layout
//! - [`auth`]: who sent a request ([`auth::PeerInfo`], [`auth::caller`]).
//! - [`config`]: [`NodeConfig`] (TOML file + flags) and its validation.
//! - [`config_check`]: `leasehold config check`: member configs, escrow
//!   configs and policy files, every problem with file, field and line.
//! - [`policy_file`]: the policy table as a TOML file (`policy apply`).
//! - [`toml_file`]: the loader of those TOML files (errors with file,
//!   line, column and field) and the problems their checks find.
//! - [`coordinator`]: one coordinator member: [`run_coordinator`] with
//!   injected stores, listener, dialer, clock and shutdown; [`serve`] on
//!   real TCP; group commit, leader hints, the Coordinator / Admin / Raft /
//!   health services.
//! - [`cli`]: the `leasehold` command line, one file per command group.
//! - [`error`]: the node's error type, [`NodeError`].
//! - [`logging`]: `--log-format text|json`, colour only on a terminal,
//!   repeated lines suppressed with summaries, field values cut.
//! - [`telemetry`]: OpenTelemetry traces: OTLP export, W3C trace context
//!   extracted from each call, denial reasons on spans.
//! - [`loopback_ports`]: ports for clusters of processes started on one
//!   host by tests and local tools, below the ephemeral range.
//! - [`net`]: connection cap, first-byte deadline and gRPC server limits
//!   of every listener.
//! - [`connection_adapter`]: a connection whose reads are watched or
//!   changed and whose writes pass through (listeners, the CLI's probe).
//! - [`serving`]: the serve shell of members and escrow nodes: the TCP
//!   listener, plaintext or mutual TLS, and the gRPC server around a
//!   listener's own services (health, reflection, identity checks,
//!   refusal counts, shutdown).
//! - [`monitor`]: the read-only Monitor service (`leasehold watch`): live
//!   streams of key windows from a member's applied state.
//! - [`escrow`]: the regional escrow node (L2): one actor per key over the
//!   core's key machine, the Escrow service, Envoy's rate limit service.
//! - [`ratelimit_file`]: `envoyproxy/ratelimit` configuration files, read
//!   with every problem at its line.
//! - [`tls`] and [`certs`]: mutual TLS (files reloaded as they change) and
//!   `leasehold certs` (a CA and the certificates it signs).
//! - [`metrics_http`]: the plain-HTTP `/metrics` listener of members and
//!   escrow nodes, serving what each gives it to render and its readiness
//!   (it knows neither).
//! - [`reflection`]: gRPC server reflection of the services served.
//! - `scripts/failover-bench.sh`: kills the leader of a 3-process cluster
//!   under `leasehold bench` load; results in `docs/benchmarks.md`.
//!
//! # Running a member inside another program (or a simulation)
//! ```text
//! pub async fn run_coordinator<I, IO, IE>(
//!     config: NodeConfig,
//!     stores: (LogStore, StateMachineStore),      // leasehold_raft_store::open_data_dir / open_with_engine
//!     incoming: I,                                 // Stream<Item = Result<IO, IE>>, IO: AsyncRead + AsyncWrite + Connected
//!     dialer: Arc<dyn Dialer>,                     // leasehold_client::transport
//!     clock: Arc<dyn WallClock>,                   // leasehold_client::transport
//!     shutdown: impl Future<Output = ()> + Send,
//! ) -> Result<(), NodeError>
//! ```
//! It returns after `shutdown` once the server, batcher and Raft have
//! stopped, so the same data directory can be reopened at once.
#![deny(missing_docs)]

pub mod auth;
pub mod certs;
pub mod cli;
pub mod config;
pub mod config_check;
pub mod connection_adapter;
pub mod coordinator;
pub mod error;
pub mod escrow;
pub mod logging;
pub mod loopback_ports;
pub mod metrics_http;
pub mod monitor;
pub mod net;
pub mod policy_file;
pub mod ratelimit_file;
pub mod reflection;
pub mod serving;
pub mod telemetry;
pub mod tls;
pub mod toml_file;

pub use config::NodeConfig;
pub use coordinator::{run_coordinator, run_coordinator_with_shards, serve};
pub use error::NodeError;
