//! The `leasehold` command line: parsing ([`Cli`]) and dispatch ([`run`]),
//! one file per command group.
//!
//! - [`serve`]: run a coordinator member.
//! - [`dev`]: a ready 3-member cluster on loopback, in one process.
//! - [`cluster`]: `cluster init | status | add-learner | change-membership`.
//! - [`policy`]: `policy set | list | delete`.
//! - [`calls`]: `lease`, `reconcile`, `pool-grant`, `window`.
//! - [`escrow`](mod@escrow): run a regional escrow node.
//! - [`demo`]: a skewed multi-region, multi-tenant load with a per-window report.
//! - [`bench`](mod@bench): concurrent lease load with latency percentiles.
//! - [`output`]: `--output text|json` rendering.
//!
//! Client commands share `--endpoint HOST:PORT` (repeatable or
//! comma-separated; `http://` accepted) and `--output`.

pub mod bench;
pub mod calls;
pub mod cluster;
pub mod demo;
pub mod dev;
pub mod escrow;
pub mod output;
pub mod policy;
pub mod serve;

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use leasehold_client::coordinator::{CoordinatorClient, CoordinatorError, RetryOptions};
use leasehold_client::transport::TcpDialer;

use crate::config::ConfigError;
use crate::error::NodeError;
use output::OutputFormat;

/// `leasehold`: global admission coordinator — cluster member, escrow node and operator CLI.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a coordinator cluster member.
    Serve(serve::ServeArgs),
    /// Run a ready 3-member cluster on loopback in this process (Ctrl-C stops it).
    Dev(dev::DevArgs),
    /// Form and inspect the coordinator cluster.
    Cluster(cluster::ClusterArgs),
    /// Manage the replicated policy table.
    Policy(policy::PolicyArgs),
    /// Lease tokens of a key's current window for a region.
    Lease(calls::LeaseArgs),
    /// Return unused tokens of a window.
    Reconcile(calls::ReconcileArgs),
    /// Raise a region's fair-pool grant of a `fair` key.
    PoolGrant(calls::PoolGrantArgs),
    /// Show a key's current window (linearizable).
    Window(calls::WindowArgs),
    /// Measure lease throughput and latency under concurrency.
    Bench(bench::BenchArgs),
    /// Run a regional escrow node (L2) serving one region's clients.
    Escrow(escrow::EscrowArgs),
    /// Run a local cluster with escrow nodes under a skewed load and report per window.
    Demo(demo::DemoArgs),
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A member failed to start or run.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A call to the cluster failed.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// The arguments do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// Any other failure, explained.
    #[error("{0}")]
    Failed(String),
}

/// Where a client command connects, and how it prints.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Coordinator member(s) as HOST:PORT (or http://HOST:PORT); repeat or comma-separate.
    #[arg(
        long = "endpoint",
        short = 'e',
        value_delimiter = ',',
        default_value = "127.0.0.1:7101",
        env = "LEASEHOLD_ENDPOINT"
    )]
    pub endpoints: Vec<String>,
    /// Total time budget of the call, retries included, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

impl ClientArgs {
    /// A coordinator client for these endpoints over TCP.
    pub fn client(&self) -> Result<CoordinatorClient, CliError> {
        let total = Duration::from_millis(self.timeout_ms.max(1));
        let options = RetryOptions {
            total_timeout: total,
            call_timeout: RetryOptions::default().call_timeout.min(total),
            ..RetryOptions::default()
        };
        Ok(CoordinatorClient::with_options(
            &self.endpoints,
            Arc::new(TcpDialer::default()),
            options,
        )?)
    }
}

/// Runs one parsed command to completion.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Dev(args) => dev::run(args).await,
        Command::Cluster(args) => cluster::run(args).await,
        Command::Policy(args) => policy::run(args).await,
        Command::Lease(args) => calls::lease(args).await,
        Command::Reconcile(args) => calls::reconcile(args).await,
        Command::PoolGrant(args) => calls::pool_grant(args).await,
        Command::Window(args) => calls::window(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Escrow(args) => escrow::run(args).await,
        Command::Demo(args) => demo::run(args).await,
    }
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn endpoints_accept_lists_and_urls() {
        let cli = Cli::try_parse_from([
            "leasehold",
            "window",
            "--key",
            "k",
            "-e",
            "http://a:1,b:2",
            "-e",
            "c:3",
        ])
        .unwrap();
        let Command::Window(args) = cli.command else {
            panic!("parsed the wrong command")
        };
        assert_eq!(args.client.endpoints, ["http://a:1", "b:2", "c:3"]);
        assert!(args.client.client().is_ok());
    }
}
