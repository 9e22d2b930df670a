//! The `leasehold` node: a coordinator cluster member (L3), the regional
//! escrow node (L2), and the operator CLI, as a library the thin binary
//! calls.
//!
//! # Layout
//! - [`config`]: [`NodeConfig`] (TOML file + flags) and its validation.
//! - [`coordinator`]: one coordinator member: [`run_coordinator`] with
//!   injected stores, listener, dialer, clock and shutdown; [`serve`] on
//!   real TCP; group commit, leader hints, the Coordinator / Admin / Raft /
//!   health services.
//! - [`cli`]: the `leasehold` command line, one file per command group.
//! - [`error`]: the node's error type, [`NodeError`].
//! - `scripts/failover-bench.sh`: kills the leader of a 3-process cluster
//!   under `leasehold bench` load; results in `docs/benchmarks.md`.
//!
//! # Running a member inside another program (or a simulation)
//! ```text
//! pub async fn run_coordinator<I, IO, IE>(
//!     config: NodeConfig,
//!     stores: (LogStore, StateMachineStore),      // leasehold_raft_store::open_sled / open_with_engine
//!     incoming: I,                                 // Stream<Item = Result<IO, IE>>, IO: AsyncRead + AsyncWrite + Connected
//!     dialer: Arc<dyn Dialer>,                     // leasehold_client::transport
//!     clock: Arc<dyn WallClock>,                   // leasehold_client::transport
//!     shutdown: impl Future<Output = ()> + Send,
//! ) -> Result<(), NodeError>
//! ```
//! It returns after `shutdown` once the server, batcher and Raft have
//! stopped, so the same data directory can be reopened at once.
#![deny(missing_docs)]

pub mod cli;
pub mod config;
pub mod coordinator;
pub mod error;
pub mod escrow;

pub use config::NodeConfig;
pub use coordinator::{run_coordinator, serve};
pub use error::NodeError;
