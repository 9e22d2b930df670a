//! `leasehold dev`: a ready coordinator cluster on loopback in one process.
//! Members listen on consecutive ports from `--base-port` and keep their data
//! under `--data-dir`, so a second run reuses the cluster. The first run
//! initialises it; every run makes sure the demo policy exists.
//!
//! Everything runs with mutual TLS: each start mints a throwaway CA and
//! certificates (members, regions, an operator, a service per region) into
//! `<data-dir>/certs`, and the banner shows CLI calls passing them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leasehold_client::coordinator::{AdminClient, CoordinatorClient, RetryOptions};
use leasehold_client::transport::Dialer;
use leasehold_core::ids::RegionId;
use leasehold_core::policy::Policy;
use leasehold_core::principal::Principal;
use leasehold_proto::v1 as pb;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::cluster::wait_for_leader;
use super::error::CliError;
use super::signal::shutdown_signal;
use crate::certs::{files_for, mint, CertificateAuthority, MintPlan};
use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::escrow::rls::RlsConfig;
use crate::tls::Security;

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
    #[arg(long, default_value_t = 7100)]
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
    /// Serve Envoy's rate limit service (RLS v3) on the escrow nodes,
    /// matching this `envoyproxy/ratelimit` configuration file (repeat for
    /// more domains); `dev` also sets the policies its rules stand for.
    #[arg(long = "ratelimit-config", value_name = "FILE")]
    pub ratelimit_configs: Vec<PathBuf>,
    /// Add the draft RateLimit headers (`x-ratelimit-*`) to the RLS
    /// answers. Off by default: an Envoy that computes them itself
    /// (`enable_x_ratelimit_headers`) would send every header twice.
    #[arg(long, requires = "ratelimit_configs")]
    pub ratelimit_response_headers: bool,
}

/// Regions of the escrow nodes `dev` starts.
pub const DEV_REGIONS: [&str; 2] = ["eu", "us"];
/// Regions a dev cluster's CA issues region and service certificates for.
pub const CERT_REGIONS: [&str; 3] = ["eu", "us", "ap"];
/// The operator a dev cluster's CA issues a certificate for.
pub const DEV_OPERATOR: &str = "admin";
/// The service name of the per-region service certificates.
pub const DEV_SERVICE: &str = "app";

/// Mints a fresh CA and every dev identity into `dir`.
pub fn mint_dev_certificates(dir: &Path, members: u64) -> Result<(), CliError> {
    let failed = |e: crate::certs::CertError| CliError::Failed(format!("dev certificates: {e}"));
    let regions = CERT_REGIONS
        .iter()
        .map(|r| RegionId::new(*r).map_err(|e| CliError::Usage(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = MintPlan {
        members: (1..=members).collect(),
        services: regions
            .iter()
            .map(|r| (DEV_SERVICE.to_string(), r.clone()))
            .collect(),
        regions,
        operators: vec![DEV_OPERATOR.to_string()],
        server_names: vec!["127.0.0.1".into(), "localhost".into()],
    };
    let ca = CertificateAuthority::generate("Leasehold dev CA", 30).map_err(failed)?;
    mint(&ca, dir, &plan).map_err(failed)?;
    Ok(())
}

/// The security of `principal` with the certificates in `certs`.
pub fn dev_security(certs: &Path, principal: &Principal) -> Security {
    Security::MutualTls(files_for(certs, principal))
}

/// The operator principal of a dev cluster.
pub fn dev_operator() -> Principal {
    Principal::Operator(DEV_OPERATOR.to_string())
}

/// The service principal of `region` in a dev cluster.
pub fn dev_service(region: &str) -> Result<Principal, CliError> {
    Ok(Principal::Service {
        name: DEV_SERVICE.to_string(),
        region: RegionId::new(region).map_err(|e| CliError::Usage(e.to_string()))?,
    })
}

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
    certs: &Path,
    rls: Option<&RlsConfig>,
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
        let mut config = crate::escrow::EscrowConfig::new(
            region_id.clone(),
            listen.clone(),
            coordinators.clone(),
        );
        config.node_name = Some(crate::escrow::default_node_name(&listen));
        config.security = Some(dev_security(certs, &Principal::Region(region_id)));
        config.rls = rls.cloned();
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
    /// Where the cluster's CA and certificates are (see [`crate::certs`]).
    pub certs: PathBuf,
    /// Each member's stop signal, by id.
    stops: Vec<(u64, watch::Sender<bool>)>,
    tasks: JoinSet<(u64, Result<(), NodeError>)>,
}

impl DevCluster {
    /// Starts the members (they elect a leader once initialised).
    pub fn start(args: &DevArgs) -> Result<Self, CliError> {
        let base = match &args.config {
            Some(path) => NodeConfig::from_file(path)?,
            None => NodeConfig::default(),
        };
        let certs = args.data_dir.join("certs");
        mint_dev_certificates(&certs, args.nodes)?;
        let mut stops = Vec::new();
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
                tls_ca: Some(files_for(&certs, &Principal::Member(id)).ca),
                tls_cert: Some(files_for(&certs, &Principal::Member(id)).cert),
                tls_key: Some(files_for(&certs, &Principal::Member(id)).key),
                insecure: false,
                join_members: (1..=args.nodes).collect(),
                ..base.clone()
            };
            config.validate()?;
            members.push((id, config.listen.clone()));
            let (stop, mut stopped) = watch::channel(false);
            stops.push((id, stop));
            tasks.spawn(async move {
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                (id, crate::coordinator::serve(config, shutdown).await)
            });
        }
        Ok(Self {
            members,
            certs,
            stops,
            tasks,
        })
    }

    /// A dialer presenting `principal`'s certificate.
    pub fn dialer_for(&self, principal: &Principal) -> Arc<dyn Dialer> {
        dev_security(&self.certs, principal).dialer()
    }

    /// A client of every member, as `principal`.
    pub fn client_as(&self, principal: &Principal) -> Result<CoordinatorClient, CliError> {
        let endpoints: Vec<String> = self.members.iter().map(|(_, addr)| addr.clone()).collect();
        Ok(CoordinatorClient::with_options(
            &endpoints,
            self.dialer_for(principal),
            RetryOptions {
                total_timeout: Duration::from_secs(10),
                ..RetryOptions::default()
            },
        )?)
    }

    /// An admin client for every member, as the dev operator.
    pub fn admin(&self) -> Result<AdminClient, CliError> {
        Ok(self.client_as(&dev_operator())?.admin())
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

    /// Stops every member and waits for them to release their data: the
    /// leader first (when one is known), so that it does not replicate to
    /// followers that are already gone, then the others (they stop long
    /// before they would miss it and call an election).
    pub async fn stop(mut self) {
        let leader = match self.admin() {
            Ok(admin) => tokio::time::timeout(Duration::from_secs(1), admin.status())
                .await
                .ok()
                .and_then(Result::ok)
                .and_then(|status| status.current_leader),
            Err(_) => None,
        };
        if let Some((_, stop)) = self.stops.iter().find(|(id, _)| Some(*id) == leader) {
            let _ = stop.send(true);
            while let Some(joined) = self.tasks.join_next().await {
                let stopped = joined.as_ref().is_ok_and(|(id, _)| Some(*id) == leader);
                Self::report(joined);
                if stopped {
                    break;
                }
            }
        }
        for (_, stop) in &self.stops {
            let _ = stop.send(true);
        }
        while let Some(joined) = self.tasks.join_next().await {
            Self::report(joined);
        }
    }

    fn report(joined: Result<(u64, Result<(), NodeError>), tokio::task::JoinError>) {
        if let Ok((id, Err(e))) = joined {
            tracing::warn!(id, error = %e, "member stopped with an error");
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
            .set_policy(Policy::counter(DEMO_PREFIX, DEMO_LIMIT, DEMO_WINDOW_MS))
            .await?;
    }
    Ok(status)
}

/// Sets the policies `rls`'s rules stand for (`leasehold policy apply`).
async fn apply_ratelimit_policies(admin: &AdminClient, rls: &RlsConfig) -> Result<(), CliError> {
    for domain in &rls.domains {
        for policy in domain.policies() {
            admin.set_policy(policy).await?;
        }
    }
    Ok(())
}

/// Runs `leasehold dev`.
pub async fn run(args: DevArgs) -> Result<(), CliError> {
    let rls = if args.ratelimit_configs.is_empty() {
        None
    } else {
        Some(RlsConfig::load(
            &args.ratelimit_configs,
            args.ratelimit_response_headers,
        )?)
    };
    let mut cluster = DevCluster::start(&args)?;
    let admin = cluster.admin()?;
    let members = cluster.members.clone();
    let prepare_all = async {
        let status = prepare(&admin, &members).await?;
        if let Some(rls) = &rls {
            apply_ratelimit_policies(&admin, rls).await?;
        }
        Ok(status)
    };
    let prepared = tokio::select! {
        prepared = prepare_all => prepared,
        failed = cluster.run_until(std::future::pending()) => failed.map(|_| pb::StatusResponse::default()),
    };
    let status = match prepared {
        Ok(status) => status,
        Err(e) => {
            cluster.stop().await;
            return Err(e);
        }
    };
    let escrow = start_escrow_nodes(&args, &cluster.members, &cluster.certs, rls.as_ref())?;
    print_banner(
        &args,
        &cluster.members,
        &cluster.certs,
        status.current_leader,
        &escrow.nodes,
        rls.as_ref(),
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

/// How to reach the escrow nodes' rate limit service.
fn print_rls_banner(rls: &RlsConfig, certs: &Path, escrow_nodes: &[(String, String)]) {
    let domains: Vec<&str> = rls.domains.iter().map(|d| d.domain.as_str()).collect();
    println!();
    println!(
        "Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService) is served \
         by each escrow node, domains {domains:?}, policies set."
    );
    for (region, addr) in escrow_nodes {
        if let Ok(service) = dev_service(region) {
            let files = files_for(certs, &service);
            println!(
                "  region {region}: {addr}   Envoy's client certificate: {} (key {}), CA {}",
                files.cert.display(),
                files.key.display(),
                files.ca.display()
            );
        }
    }
    println!("  (docs/envoy.md: an envoy.yaml that rate-limits through these nodes)");
}

fn print_banner(
    args: &DevArgs,
    members: &[(u64, String)],
    certs: &Path,
    leader: Option<u64>,
    escrow_nodes: &[(String, String)],
    rls: Option<&RlsConfig>,
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
    let operator = files_for(certs, &dev_operator());
    let ca = operator.ca.display();
    let tls = |principal: &Principal| {
        let files = files_for(certs, principal);
        format!(
            "--ca {ca} --cert {} --cert-key {}",
            files.cert.display(),
            files.key.display()
        )
    };
    let as_operator = tls(&dev_operator());
    let eu = RegionId::new("eu").map(Principal::Region);
    let as_eu = eu.as_ref().map(tls).unwrap_or_default();
    println!(
        "Everything speaks mutual TLS; certificates (throwaway CA) in {}",
        certs.display()
    );
    println!();
    println!("Try (as operator {DEV_OPERATOR}, or as the escrow nodes of region eu for lease):");
    println!("  leasehold window --endpoint {first} --key demo/api {as_operator}");
    println!("  leasehold cluster status --endpoint {first} {as_operator}");
    println!("  leasehold policy list --endpoint {first} {as_operator}");
    println!("  leasehold lease --endpoint {first} --key demo/api --region eu --tokens 10 {as_eu}");
    println!("  leasehold bench --endpoint {all} --region eu --key demo/api --no-setup --concurrency 16 --duration-secs 10 {as_eu}");
    if let (Some((region, addr)), Ok(service)) = (
        escrow_nodes.first(),
        escrow_nodes
            .first()
            .map_or_else(|| dev_service("eu"), |(r, _)| dev_service(r)),
    ) {
        let files = files_for(certs, &service);
        println!(
            "  LEASEHOLD_CA={ca} LEASEHOLD_CERT={} LEASEHOLD_KEY={} \\\n    \
             cargo run -p leasehold-client --example quickstart -- {addr} demo/api 50 leased   # service {DEV_SERVICE}@{region}",
            files.cert.display(),
            files.key.display()
        );
    }
    if let Some(rls) = rls {
        print_rls_banner(rls, certs, escrow_nodes);
    }
    println!();
    println!("Press Ctrl-C to stop.");
}
