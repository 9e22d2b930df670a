//! `leasehold dev`: a ready coordinator cluster on loopback in one process.
//! Members listen on consecutive ports from `--base-port` and keep their data
//! under `--data-dir`, so a second run reuses the cluster. The first run
//! initialises it; every run makes sure the demo policy exists.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use leasehold_client::coordinator::AdminClient;
use leasehold_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::cluster::wait_for_leader;
use super::{shutdown_signal, CliError, ClientArgs};
use crate::cli::output::OutputFormat;
use crate::config::NodeConfig;
use crate::error::NodeError;

/// Prefix of the demo policy `dev` sets.
pub const DEMO_PREFIX: &str = "demo/";
/// Tokens per window of the demo policy.
pub const DEMO_LIMIT: u64 = 1_000;
/// Window of the demo policy.
pub const DEMO_WINDOW_MS: u64 = 60_000;

/// Options of `leasehold dev`.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Where the members keep their data (one sub-directory each).
    #[arg(long, default_value = ".leasehold-dev")]
    pub data_dir: PathBuf,
    /// Port of member 1; member N listens on base-port + N - 1.
    #[arg(long, default_value_t = 7101)]
    pub base_port: u16,
    /// Number of members (1 to 9).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=9))]
    pub nodes: u64,
    /// TOML member config applied to every member (its id, listen and
    /// data_dir are replaced), e.g. to try other timings or batch sizes.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Port of the first regional escrow node (region `eu`; `us` gets the
    /// next port). 0 starts no escrow nodes.
    #[arg(long, default_value_t = 7201)]
    pub escrow_base_port: u16,
}

/// Regions of the escrow nodes `dev` starts.
pub const DEV_REGIONS: [&str; 2] = ["eu", "us"];

/// The escrow nodes `dev` runs next to the cluster.
struct DevEscrowNodes {
    /// (region, address) of each node.
    nodes: Vec<(String, String)>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts the dev escrow nodes.
fn start_escrow_nodes(
    args: &DevArgs,
    members: &[(u64, String)],
) -> Result<DevEscrowNodes, CliError> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut nodes = Vec::new();
    let mut tasks = Vec::new();
    if args.escrow_base_port == 0 {
        return Ok(DevEscrowNodes { nodes, stop, tasks });
    }
    let coordinators: Vec<String> = members.iter().map(|(_, addr)| addr.clone()).collect();
    for (i, region) in DEV_REGIONS.iter().enumerate() {
        let port = args
            .escrow_base_port
            .saturating_add(u16::try_from(i).unwrap_or(0));
        let listen = format!("127.0.0.1:{port}");
        let region_id = leasehold_core::ids::RegionId::new(*region)
            .map_err(|e| CliError::Usage(e.to_string()))?;
        let config =
            crate::escrow::EscrowConfig::new(region_id, listen.clone(), coordinators.clone());
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = crate::escrow::serve_escrow(config, shutdown).await {
                tracing::error!(error = %e, "escrow node failed");
            }
        }));
        nodes.push((region.to_string(), listen));
    }
    Ok(DevEscrowNodes { nodes, stop, tasks })
}

/// A running in-process cluster.
pub struct DevCluster {
    /// `(id, host:port)` of each member.
    pub members: Vec<(u64, String)>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<(u64, Result<(), NodeError>)>,
}

impl DevCluster {
    /// Starts the members (they elect a leader once initialised).
    pub fn start(args: &DevArgs) -> Result<Self, CliError> {
        let base = match &args.config {
            Some(path) => NodeConfig::from_file(path)?,
            None => NodeConfig::default(),
        };
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut members = Vec::new();
        for id in 1..=args.nodes {
            let port = u16::try_from(u64::from(args.base_port) + id - 1).map_err(|_| {
                CliError::Usage("--base-port is too high for that many members".into())
            })?;
            let config = NodeConfig {
                id,
                listen: format!("127.0.0.1:{port}"),
                data_dir: args.data_dir.join(format!("node-{id}")),
                ..base.clone()
            };
            config.validate()?;
            members.push((id, config.listen.clone()));
            let mut stopped = stopped.clone();
            tasks.spawn(async move {
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                (id, crate::coordinator::serve(config, shutdown).await)
            });
        }
        Ok(Self {
            members,
            stop,
            tasks,
        })
    }

    /// An admin client for every member.
    pub fn admin(&self) -> Result<AdminClient, CliError> {
        let args = ClientArgs {
            endpoints: self.members.iter().map(|(_, addr)| addr.clone()).collect(),
            timeout_ms: 10_000,
            output: OutputFormat::Text,
        };
        Ok(args.client()?.admin())
    }

    /// Initialises the cluster unless its members already are, waits for a
    /// leader and makes sure the demo policy exists.
    pub async fn prepare(&self) -> Result<pb::StatusResponse, CliError> {
        prepare(&self.admin()?, &self.members).await
    }

    /// Waits until a member stops on its own (an error) or `signal` resolves.
    pub async fn run_until(
        &mut self,
        signal: impl std::future::Future<Output = ()>,
    ) -> Result<(), CliError> {
        tokio::select! {
            _ = signal => Ok(()),
            Some(joined) = self.tasks.join_next() => match joined {
                Ok((id, Err(e))) => Err(CliError::Failed(format!("member {id} stopped: {e}"))),
                Ok((id, Ok(()))) => Err(CliError::Failed(format!("member {id} stopped unexpectedly"))),
                Err(e) => Err(CliError::Failed(format!("a member panicked: {e}"))),
            },
        }
    }

    /// Stops every member and waits for them to release their data.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        while let Some(joined) = self.tasks.join_next().await {
            if let Ok((id, Err(e))) = joined {
                tracing::warn!(id, error = %e, "member stopped with an error");
            }
        }
    }
}

/// Initialises the cluster of `members` through `admin` unless it is
/// already, waits for a leader and makes sure the demo policy exists.
pub async fn prepare(
    admin: &AdminClient,
    members: &[(u64, String)],
) -> Result<pb::StatusResponse, CliError> {
    let status = admin.status().await?;
    if !status.initialized {
        match admin.init(members).await {
            Ok(()) | Err(leasehold_client::coordinator::CoordinatorError::AlreadyExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let status = wait_for_leader(admin, Duration::from_secs(20)).await?;
    let policies = admin.list_policies().await?;
    if !policies.iter().any(|p| p.prefix == DEMO_PREFIX) {
        admin
            .set_policy(pb::Policy {
                prefix: DEMO_PREFIX.to_string(),
                limit: DEMO_LIMIT,
                window_ms: DEMO_WINDOW_MS,
                kind: pb::PolicyKind::Counter as i32,
                outage: pb::OutageMode::FailClosed as i32,
                fallback_tokens_per_region: 0,
            })
            .await?;
    }
    Ok(status)
}

/// Runs `leasehold dev`.
pub async fn run(args: DevArgs) -> Result<(), CliError> {
    let mut cluster = DevCluster::start(&args)?;
    let admin = cluster.admin()?;
    let members = cluster.members.clone();
    let prepared = tokio::select! {
        prepared = prepare(&admin, &members) => prepared,
        failed = cluster.run_until(std::future::pending()) => failed.map(|_| pb::StatusResponse::default()),
    };
    let status = match prepared {
        Ok(status) => status,
        Err(e) => {
            cluster.stop().await;
            return Err(e);
        }
    };
    let escrow = start_escrow_nodes(&args, &cluster.members)?;
    print_banner(
        &args,
        &cluster.members,
        status.current_leader,
        &escrow.nodes,
    );
    let result = cluster.run_until(shutdown_signal()).await;
    println!("stopping…");
    let _ = escrow.stop.send(true);
    for task in escrow.tasks {
        let _ = task.await;
    }
    cluster.stop().await;
    result
}

fn print_banner(
    args: &DevArgs,
    members: &[(u64, String)],
    leader: Option<u64>,
    escrow_nodes: &[(String, String)],
) {
    let first = &members[0].1;
    let all = members
        .iter()
        .map(|(_, addr)| addr.as_str())
        .collect::<Vec<_>>()
        .join(",");
    println!(
        "Leasehold dev cluster is up: {} member(s), data in {}",
        members.len(),
        args.data_dir.display()
    );
    for (id, addr) in members {
        let role = if Some(*id) == leader {
            "  (leader)"
        } else {
            ""
        };
        println!("  member {id}  {addr}{role}");
    }
    for (region, addr) in escrow_nodes {
        println!("  escrow node (region {region})  {addr}");
    }
    println!(
        "Demo policy: prefix {DEMO_PREFIX:?}, {DEMO_LIMIT} tokens per {DEMO_WINDOW_MS} ms window."
    );
    println!();
    println!("Try:");
    println!("  leasehold lease --endpoint {first} --key demo/api --region eu --tokens 10");
    println!("  leasehold window --endpoint {first} --key demo/api");
    println!("  leasehold cluster status --endpoint {first}");
    println!("  leasehold policy list --endpoint {first}");
    println!("  leasehold bench --endpoint {all} --concurrency 16 --duration-secs 10");
    if let Some((_, addr)) = escrow_nodes.first() {
        println!(
            "  cargo run -p leasehold-client --example quickstart -- {addr} demo/api 50 leased"
        );
    }
    println!();
    println!("Press Ctrl-C to stop.");
}
