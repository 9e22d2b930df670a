//! The `leasehold` command line: parsing ([`Cli`]) and dispatch ([`run`]),
//! one file per command group.
//!
//! - [`serve`]: run a coordinator member.
//! - [`dev`]: a ready 3-member cluster on loopback, in one process.
//! - [`cluster`]: `cluster init | status | add-learner | change-membership`.
//! - [`policy`]: `policy set | list | delete`.
//! - [`shard`]: `shard list | add | split | move | replicas | remove`.
//! - [`calls`]: `lease`, `reconcile`, `pool-grant`, `window`.
//! - [`watch`]: `watch --key K | --prefix P`, a live table of windows.
//! - [`escrow`](mod@escrow): run a regional escrow node.
//! - [`demo`]: a skewed multi-region, multi-tenant load with a per-window report.
//! - [`bench`](mod@bench): concurrent lease load with latency percentiles.
//! - [`fair_eval`]: the fair throttle's seeded fairness/utilisation evaluation.
//! - [`certs`]: `certs mint`, certificates for every identity.
//! - [`health`]: one gRPC health check of a member or escrow node (probes).
//! - [`config`](mod@config): `config check FILE...`, every problem of member
//!   configs, escrow configs and policy files.
//! - [`runtime`]: `--worker-threads`, the tokio workers of the process.
//! - [`output`]: `--output text|json` rendering.
//! - [`args`]: the options commands share (endpoints, transport, a
//!   server's TLS).
//! - [`error`]: why a command failed ([`CliError`]).
//! - [`signal`]: Ctrl-C and SIGTERM for the long-running commands.
//! - [`failure`]: what a failed command prints, and its exit code.
//! - [`diagnose`]: the cause of a call that failed at the connection or
//!   reached another service, found by probing the endpoints.
//!
//! Client commands share `--endpoint HOST:PORT` (repeatable or
//! comma-separated; `http://` accepted), `--output`, and how to connect:
//! `--ca/--cert/--cert-key` (or `LEASEHOLD_CA/LEASEHOLD_CERT/LEASEHOLD_KEY`) for
//! mutual TLS, or `--insecure` (`LEASEHOLD_INSECURE=true`) for a plaintext
//! cluster.

pub mod args;
pub mod bench;
pub mod calls;
pub mod certs;
pub mod cluster;
pub mod config;
pub mod demo;
pub mod dev;
pub mod diagnose;
pub mod error;
pub mod escrow;
pub mod failure;
pub mod fair_eval;
pub mod health;
pub mod output;
pub mod policy;
pub mod runtime;
pub mod serve;
pub mod shard;
pub mod signal;
pub mod snapshot;
pub mod watch;

use clap::{Parser, Subcommand};

pub use args::{ClientArgs, ServerTlsArgs, TransportArgs};
pub use error::CliError;
pub use signal::shutdown_signal;

/// `leasehold`: global admission coordinator — cluster member, escrow node and operator CLI.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// Log format and trace export (global: valid before or after the command).
    #[command(flatten)]
    pub log: crate::logging::LogArgs,
    /// The async runtime's worker threads (global).
    #[command(flatten)]
    pub runtime: runtime::RuntimeArgs,
}

impl Cli {
    /// Whether this command's default worker count is capped (ADR 0016):
    /// a coordinator member and the load generator.
    pub fn worker_default(&self) -> runtime::WorkerDefault {
        match self.command {
            Command::Serve(_) | Command::Bench(_) => runtime::WorkerDefault::Capped,
            _ => runtime::WorkerDefault::PerCore,
        }
    }
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
    /// Place keys on shards (Raft groups on the same members): list, add, split, move.
    Shard(shard::ShardArgs),
    /// Lease tokens of a key's current window for a region.
    Lease(calls::LeaseArgs),
    /// Return unused tokens of a window.
    Reconcile(calls::ReconcileArgs),
    /// Raise a region's fair-pool grant of a `fair` key.
    PoolGrant(calls::PoolGrantArgs),
    /// Show a key's current window (linearizable).
    Window(calls::WindowArgs),
    /// Follow a key's (or a prefix's) windows live: a table redrawn on every change and window.
    Watch(watch::WatchArgs),
    /// Measure lease throughput and latency under concurrency.
    Bench(bench::BenchArgs),
    /// Run a regional escrow node (L2) serving one region's clients.
    Escrow(Box<escrow::EscrowArgs>),
    /// Run a local cluster with escrow nodes under a skewed load and report per window.
    Demo(demo::DemoArgs),
    /// Simulate the fair throttle against first-come admission and print fairness and utilisation.
    FairEval(fair_eval::FairEvalArgs),
    /// Make certificates for members, regions, operators and services.
    Certs(certs::CertsArgs),
    /// Check a member's or escrow node's gRPC health (exit 0 only on SERVING).
    Health(health::HealthArgs),
    /// Check config and policy files without starting anything.
    Config(config::ConfigArgs),
    /// Back up the coordinator state, check a backup, restore a new cluster from one.
    Snapshot(snapshot::SnapshotArgs),
    /// UNSAFE: make a stopped survivor of a lost quorum the only voter of a new cluster.
    ForceNewCluster(snapshot::ForceNewClusterArgs),
}

impl Command {
    /// The connection and output options of a command that talks to the
    /// coordinator (`None` for the others).
    pub fn client_args(&self) -> Option<&ClientArgs> {
        match self {
            Command::Cluster(args) => Some(match &args.command {
                cluster::ClusterCommand::Init(a) => &a.client,
                cluster::ClusterCommand::Status(a) => &a.client,
                cluster::ClusterCommand::AddLearner(a) => &a.client,
                cluster::ClusterCommand::ChangeMembership(a) => &a.client,
                cluster::ClusterCommand::StepDown(a) => &a.client,
            }),
            Command::Policy(args) => Some(match &args.command {
                policy::PolicyCommand::Set(a) => &a.client,
                policy::PolicyCommand::List(a) => &a.client,
                policy::PolicyCommand::Delete(a) => &a.client,
                policy::PolicyCommand::Apply(a) => &a.client,
            }),
            Command::Shard(args) => Some(args.command.client()),
            Command::Lease(a) => Some(&a.client),
            Command::Reconcile(a) => Some(&a.client),
            Command::PoolGrant(a) => Some(&a.client),
            Command::Window(a) => Some(&a.client),
            Command::Bench(a) => Some(&a.client),
            Command::Snapshot(args) => match &args.command {
                snapshot::SnapshotCommand::Save(a) => Some(&a.client),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Runs one parsed command to completion. When a client command's call
/// fails at the connection or reaches another service, its endpoints are
/// probed and the cause found replaces the error ([`diagnose`]); a call
/// still running after [`diagnose::EARLY_PROBE_AFTER`] is probed meanwhile,
/// and a setup that cannot work (certificates, TLS on one side only) ends
/// it with the cause at once.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let Some(client) = cli.command.client_args().cloned() else {
        return dispatch(cli).await;
    };
    let call = dispatch(cli);
    tokio::pin!(call);
    let result = tokio::select! {
        result = &mut call => result,
        () = tokio::time::sleep(diagnose::EARLY_PROBE_AFTER) => {
            let early = diagnose::early(&client);
            tokio::pin!(early);
            tokio::select! {
                result = &mut call => result,
                Some(diagnosis) = &mut early => Err(CliError::Diagnosed(diagnosis)),
            }
        }
    };
    match result {
        Err(CliError::Coordinator(error)) => Err(diagnose::explain(error, &client).await),
        result => result,
    }
}

async fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Dev(args) => dev::run(args).await,
        Command::Cluster(args) => cluster::run(args).await,
        Command::Policy(args) => policy::run(args).await,
        Command::Shard(args) => shard::run(args).await,
        Command::Lease(args) => calls::lease(args).await,
        Command::Reconcile(args) => calls::reconcile(args).await,
        Command::PoolGrant(args) => calls::pool_grant(args).await,
        Command::Window(args) => calls::window(args).await,
        Command::Watch(args) => watch::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Escrow(args) => escrow::run(*args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::FairEval(args) => fair_eval::run(args),
        Command::Certs(args) => certs::run(args),
        Command::Health(args) => health::run(args).await,
        Command::Config(args) => config::run(args),
        Command::Snapshot(args) => snapshot::run(args).await,
        Command::ForceNewCluster(args) => snapshot::force_new_cluster(args).await,
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
    fn escrow_nodes_select_their_lease_sizer() {
        use leasehold_core::predictive_sizer::SizerKind;
        let sizer = |extra: &[&str]| {
            let mut argv = vec![
                "leasehold",
                "escrow",
                "--insecure",
                "--region",
                "eu",
                "--coordinator",
                "127.0.0.1:1",
            ];
            argv.extend_from_slice(extra);
            let Command::Escrow(args) = Cli::try_parse_from(argv)
                .map_err(|e| e.to_string())?
                .command
            else {
                panic!("parsed the wrong command")
            };
            args.config().map(|c| c.sizer).map_err(|e| e.to_string())
        };
        assert_eq!(sizer(&[]), Ok(SizerKind::Fixed));
        assert_eq!(sizer(&["--sizer", "eoq"]), Ok(SizerKind::Eoq));
        assert_eq!(sizer(&["--eoq"]), Ok(SizerKind::Eoq));
        assert_eq!(sizer(&["--sizer", "predictive"]), Ok(SizerKind::Predictive));
        assert!(sizer(&["--sizer", "psychic"]).is_err());
        assert!(sizer(&["--sizer", "fixed", "--eoq"]).is_err());
    }

    #[test]
    fn an_escrow_node_reads_its_config_file_and_the_tls_flags_replace_its_tls() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("escrow.toml");
        std::fs::write(
            &file,
            "region = \"us\"\ncoordinators = [\"n1:7100\"]\nbatch = 3\n\
             tls_ca = \"/ca.pem\"\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n",
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let parse = |extra: &[&str]| {
            let mut argv = vec!["leasehold", "escrow", "--config", file];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv).map(|cli| match cli.command {
                Command::Escrow(args) => args,
                _ => panic!("parsed the wrong command"),
            })
        };
        let config = parse(&[]).unwrap().config().unwrap();
        assert_eq!((config.region.as_str(), config.batch), ("us", 3));
        assert!(matches!(
            config.security,
            Some(crate::tls::Security::MutualTls(_))
        ));
        let insecure = parse(&["--insecure"]).unwrap().config().unwrap();
        assert_eq!(insecure.security, Some(crate::tls::Security::Insecure));
        assert!(
            parse(&["--region", "eu"]).is_err(),
            "a file replaces the other flags"
        );
        assert!(parse(&["--batch", "4"]).is_err());
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
            "--insecure",
        ])
        .unwrap();
        let Command::Window(args) = cli.command else {
            panic!("parsed the wrong command")
        };
        assert_eq!(args.client.endpoints, ["http://a:1", "b:2", "c:3"]);
        assert!(args.client.client().is_ok());
    }

    #[test]
    fn client_commands_need_credentials_or_insecure() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["leasehold", "window", "--key", "k"];
            argv.extend_from_slice(extra);
            let Command::Window(args) = Cli::try_parse_from(argv).unwrap().command else {
                panic!("parsed the wrong command")
            };
            args.client.transport
        };
        let error = parse(&[]).dialer().unwrap_err().to_string();
        assert!(
            error.contains("--ca") && error.contains("--insecure"),
            "{error}"
        );
        assert!(parse(&["--ca", "a", "--cert", "b", "--cert-key", "c"])
            .dialer()
            .is_ok());
        assert!(parse(&["--ca", "a"]).dialer().is_err());
        assert!(
            parse(&["--ca", "a", "--cert", "b", "--tls-key", "c", "--insecure"])
                .dialer()
                .is_err()
        );
    }
}
