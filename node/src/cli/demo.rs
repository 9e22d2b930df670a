//! `leasehold demo`: a local cluster, three regional escrow nodes and
//! in-process clients under a skewed multi-region, multi-tenant load, with a
//! per-window report: admitted vs L, utilisation, what a static partition
//! would have admitted, each tenant's share beside the flat weighted
//! max-min ideal, and coordinator operations per 1 000 admissions.
//!
//! Everything runs with mutual TLS on a throwaway CA (see
//! [`super::dev`]): escrow nodes present their region's certificate,
//! clients a service certificate of their region.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use leasehold_client::{
    EscrowSource, EscrowSourceOptions, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode,
};
use leasehold_core::ids::{ClientId, RegionId, TenantId};
use leasehold_core::policy::Policy;
use leasehold_core::water_fill::{water_fill, Claim};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::escrow_client::EscrowClient;
use tokio::sync::watch;

use super::dev::{dev_operator, dev_security, dev_service, prepare, DevArgs, DevCluster};
use super::error::CliError;
use crate::escrow::{serve_escrow, EscrowConfig};

/// Options of `leasehold demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Data directory of the demo cluster (default: a fresh temporary one, removed after).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Port of member 1 (members use three consecutive ports).
    #[arg(long, default_value_t = 7301)]
    pub base_port: u16,
    /// Port of the first escrow node (the escrow nodes use consecutive ports:
    /// six, and three more per extra node per region).
    #[arg(long, default_value_t = 7311)]
    pub escrow_base_port: u16,
    /// Windows measured per phase.
    #[arg(long, default_value_t = 3)]
    pub windows: u64,
    /// Window length in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub window_ms: u64,
    /// L per window.
    #[arg(long, default_value_t = 600)]
    pub limit: u64,
    /// Escrow nodes serving each region in the fair phase (1 to 4),
    /// active-active: each client goes through every node of its region,
    /// starting at a different one.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4))]
    pub escrow_nodes_per_region: u16,
}

const REGIONS: [&str; 3] = ["eu", "us", "ap"];

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0))
}

/// (window, label) → (attempted, admitted).
type Tally = Arc<Mutex<BTreeMap<(u64, String), (u64, u64)>>>;

fn tally(t: &Tally, window: u64, label: &str, admitted: bool) {
    let mut map = t.lock().unwrap_or_else(PoisonError::into_inner);
    let entry = map.entry((window, label.to_string())).or_default();
    entry.0 += 1;
    entry.1 += u64::from(admitted);
}

/// One client: `check` every `every` on `key` through the escrow nodes at
/// `addrs` (its region's, the first first; the next after a failure).
#[allow(clippy::too_many_arguments)]
fn spawn_client(
    certs: &Path,
    region: &str,
    addrs: &[String],
    key: &'static str,
    label: String,
    tenant: Option<(&str, u64)>,
    every: Duration,
    window_ms: u64,
    until_ms: u64,
    t: Tally,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    let failed = |e: &dyn std::fmt::Display| CliError::Failed(e.to_string());
    let source = EscrowSource::with_endpoints(
        addrs,
        dev_security(certs, &dev_service(region)?).dialer(),
        EscrowSourceOptions::default(),
    )
    .map_err(|e| failed(&e))?;
    let mode = Mode::Leased(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(4)));
    let mut config = LimiterConfig::new(
        mode,
        ClientId::new(format!("demo-{label}-{}", wall_ms())).map_err(|e| failed(&e))?,
    );
    if let Some((name, weight)) = tenant {
        config.tenant = Some(TenantId::new(name).map_err(|e| failed(&e))?);
        config.weight = weight;
    }
    let limiter = Limiter::new(source, config).map_err(|e| failed(&e))?;
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        while wall_ms() < until_ms {
            tick.tick().await;
            let asked_in = wall_ms() / window_ms * window_ms;
            // An admission counts in the window its credits were granted for
            // (its label); a denial in the window it was asked in.
            match limiter.check_labelled(key, 1).await {
                Ok(a) if a.decision.allowed => {
                    tally(&t, a.window_start_ms.unwrap_or(asked_in), &label, true)
                }
                _ => tally(&t, asked_in, &label, false),
            }
        }
    }))
}

async fn coordinator_calls(certs: &Path, addrs: &[String]) -> u64 {
    let dialer = dev_security(certs, &dev_operator()).dialer();
    let mut total = 0;
    for addr in addrs {
        if let Ok(channel) = dialer.dial(addr).await {
            let mut rpc = EscrowClient::new(channel);
            if let Ok(status) = rpc.status(pb::EscrowStatusRequest {}).await {
                total += status.into_inner().coordinator_calls;
            }
        }
    }
    total
}

/// Reads the escrow nodes' coordinator calls once wall time reaches
/// `at_ms` (the first measured window): what the phase spent before steady
/// state (the first window of a new key has no history to size from).
fn calls_at(certs: &Path, escrow: &[String], at_ms: u64) -> tokio::task::JoinHandle<u64> {
    let (certs, escrow) = (certs.to_path_buf(), escrow.to_vec());
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(wall_ms()))).await;
        coordinator_calls(&certs, &escrow).await
    })
}

/// Prints the coordinator operations of a phase: over the whole phase, and
/// at steady state (from the first measured window on, against what was
/// admitted in the measured windows).
fn print_operations(
    calls_before: u64,
    calls_at_first: u64,
    calls_after: u64,
    admitted_all: u64,
    admitted_measured: u64,
) {
    let calls = calls_after - calls_before;
    println!(
        "coordinator operations: {calls} for {admitted_all} admissions = {:.1} per 1000 (measured windows: {admitted_measured} admitted)",
        calls as f64 * 1000.0 / admitted_all.max(1) as f64
    );
    let steady = calls_after.saturating_sub(calls_at_first);
    println!(
        "coordinator operations at steady state: {steady} for {admitted_measured} admissions = {:.1} per 1000",
        steady as f64 * 1000.0 / admitted_measured.max(1) as f64
    );
}

/// Waits for the start of the next window, then `windows` more; returns the
/// measured window starts.
fn measured_windows(start_ms: u64, window_ms: u64, windows: u64) -> Vec<u64> {
    let first = start_ms / window_ms * window_ms + window_ms;
    (0..windows).map(|i| first + i * window_ms).collect()
}

async fn counter_phase(
    certs: &Path,
    args: &DemoArgs,
    escrow: &[String],
    key: &'static str,
    title: &str,
) -> Result<(), CliError> {
    let t: Tally = Arc::default();
    let start = wall_ms();
    let windows = measured_windows(start, args.window_ms, args.windows);
    let until = windows.last().copied().unwrap_or(start) + args.window_ms;
    let calls_before = coordinator_calls(certs, escrow).await;
    let calls_at_first = calls_at(certs, escrow, windows.first().copied().unwrap_or(start));
    // Skewed demand: eu is hot, us and ap nearly idle.
    let plan: [(usize, usize, u64); 3] = [(0, 4, 8), (1, 1, 33), (2, 1, 100)];
    let mut tasks = Vec::new();
    for (region, workers, every_ms) in plan {
        for w in 0..workers {
            let label = REGIONS[region].to_string();
            tasks.push(spawn_client(
                certs,
                REGIONS[region],
                std::slice::from_ref(&escrow[region]),
                key,
                label,
                None,
                Duration::from_millis(every_ms + w as u64),
                args.window_ms,
                until,
                t.clone(),
            )?);
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    let calls_after = coordinator_calls(certs, escrow).await;
    let calls_at_first = calls_at_first.await.unwrap_or(calls_before);
    let map = t.lock().unwrap_or_else(PoisonError::into_inner).clone();
    println!(
        "\n== {title}: key {key}, L = {} per {} ms, 3 regions, skewed demand ==",
        args.limit, args.window_ms
    );
    println!(
        "{:<16} {:>9} {:>8} {:>20} {:>20} {:>20} {:>10}",
        "window", "admitted", "util", "eu adm/demand", "us adm/demand", "ap adm/demand", "static"
    );
    let region_ids: Vec<RegionId> = REGIONS
        .iter()
        .filter_map(|r| RegionId::new(*r).ok())
        .collect();
    let split = leasehold_client::static_partition::split(args.limit, &region_ids)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let shares: Vec<u64> = REGIONS
        .iter()
        .map(|r| {
            split
                .iter()
                .find(|(id, _)| id.as_str() == *r)
                .map_or(0, |(_, share)| *share)
        })
        .collect();
    let mut admitted_total = 0;
    for w in &windows {
        let row: Vec<(u64, u64)> = REGIONS
            .iter()
            .map(|r| map.get(&(*w, r.to_string())).copied().unwrap_or((0, 0)))
            .collect();
        let admitted: u64 = row.iter().map(|(_, a)| a).sum();
        admitted_total += admitted;
        let static_admitted: u64 = row
            .iter()
            .zip(&shares)
            .map(|((d, _), s)| (*d).min(*s))
            .sum();
        let cell = |(d, a): (u64, u64)| format!("{a}/{d}");
        println!(
            "{:<16} {:>9} {:>7.1}% {:>20} {:>20} {:>20} {:>10}",
            w,
            format!("{admitted}/{}", args.limit),
            admitted as f64 * 100.0 / args.limit as f64,
            cell(row[0]),
            cell(row[1]),
            cell(row[2]),
            static_admitted
        );
    }
    let admitted_all: u64 = map.values().map(|(_, a)| a).sum();
    print_operations(
        calls_before,
        calls_at_first,
        calls_after,
        admitted_all,
        admitted_total,
    );
    Ok(())
}

/// Region `region`'s escrow nodes in `escrow` (node sets of one node per
/// region, one after another), starting at set `turn`.
fn nodes_of(escrow: &[String], region: usize, turn: usize) -> Vec<String> {
    let mut nodes: Vec<String> = escrow
        .iter()
        .skip(region)
        .step_by(REGIONS.len())
        .cloned()
        .collect();
    let len = nodes.len().max(1);
    nodes.rotate_left(turn % len);
    nodes
}

async fn fair_phase(certs: &Path, args: &DemoArgs, escrow: &[String]) -> Result<(), CliError> {
    let t: Tally = Arc::default();
    let start = wall_ms();
    // Four windows of warm-up: the demand split weighs a tenant by the
    // settled window two back, which a cold key does not have yet, and a
    // region splits a window by the totals it knew when it joined it (the
    // ones its join a window earlier brought).
    let windows = measured_windows(start + 3 * args.window_ms, args.window_ms, args.windows);
    let until = windows.last().copied().unwrap_or(start) + args.window_ms;
    let calls_before = coordinator_calls(certs, escrow).await;
    let calls_at_first = calls_at(certs, escrow, windows.first().copied().unwrap_or(start));
    // (region, tenant, weight declared there): beta declares its whole
    // weight 2 in eu and in ap; the escrow nodes split it by where its
    // demand is (the previous window's, summed by the leader).
    let tenants: [(usize, &str, u64); 4] = [
        (0, "alpha", 3),
        (0, "beta", 2),
        (1, "gamma", 2),
        (2, "beta", 2),
    ];
    let global: [(&str, u64); 3] = [("alpha", 3), ("beta", 2), ("gamma", 2)];
    let mut tasks = Vec::new();
    for (region, tenant, weight) in tenants {
        for turn in 0..3 {
            let label = tenant.to_string();
            tasks.push(spawn_client(
                certs,
                REGIONS[region],
                &nodes_of(escrow, region, turn),
                "demo-fair/chat",
                label,
                Some((tenant, weight)),
                Duration::from_millis(2),
                args.window_ms,
                until,
                t.clone(),
            )?);
        }
    }
    for task in tasks {
        let _ = task.await;
    }
    let calls_after = coordinator_calls(certs, escrow).await;
    let calls_at_first = calls_at_first.await.unwrap_or(calls_before);
    let map = t.lock().unwrap_or_else(PoisonError::into_inner).clone();
    println!("\n== fair key demo-fair/chat: L = {}, tenants alpha(w3, eu), beta(w2 in eu and ap, split by demand), gamma(w2, us); {} escrow node(s) per region ==", args.limit, args.escrow_nodes_per_region);
    println!(
        "{:<16} {:>9} {:>18} {:>18} {:>18} {:>10}",
        "window", "admitted", "alpha got/ideal", "beta got/ideal", "gamma got/ideal", "max dev"
    );
    let mut admitted_measured = 0;
    for w in &windows {
        let got: Vec<(u64, u64)> = global
            .iter()
            .map(|(name, _)| map.get(&(*w, name.to_string())).copied().unwrap_or((0, 0)))
            .collect();
        let claims: Vec<Claim> = global
            .iter()
            .zip(&got)
            .map(|((_, weight), (d, _))| Claim {
                weight: *weight,
                demand: *d,
            })
            .collect();
        let ideal = water_fill(args.limit, &claims);
        let admitted: u64 = got.iter().map(|(_, a)| a).sum();
        admitted_measured += admitted;
        let dev = got
            .iter()
            .zip(&ideal)
            .map(|((_, a), i)| a.abs_diff(*i))
            .max()
            .unwrap_or(0);
        let cell = |i: usize| format!("{}/{}", got[i].1, ideal[i]);
        println!(
            "{:<16} {:>9} {:>18} {:>18} {:>18} {:>9.1}%",
            w,
            format!("{admitted}/{}", args.limit),
            cell(0),
            cell(1),
            cell(2),
            dev as f64 * 100.0 / args.limit as f64
        );
    }
    let admitted_all: u64 = map.values().map(|(_, a)| a).sum();
    print_operations(
        calls_before,
        calls_at_first,
        calls_after,
        admitted_all,
        admitted_measured,
    );
    Ok(())
}

fn start_escrow(
    certs: &Path,
    args: &DemoArgs,
    members: &[(u64, String)],
    eoq: bool,
    port_offset: u16,
    stopped: &watch::Receiver<bool>,
) -> Result<(Vec<String>, Vec<tokio::task::JoinHandle<()>>), CliError> {
    let coordinators: Vec<String> = members.iter().map(|(_, a)| a.clone()).collect();
    let mut addrs = Vec::new();
    let mut tasks = Vec::new();
    for (i, region) in REGIONS.iter().enumerate() {
        let port = args
            .escrow_base_port
            .saturating_add(port_offset)
            .saturating_add(u16::try_from(i).unwrap_or(0));
        let listen = format!("127.0.0.1:{port}");
        let region = RegionId::new(*region).map_err(|e| CliError::Usage(e.to_string()))?;
        let mut config = EscrowConfig::new(region.clone(), listen.clone(), coordinators.clone());
        config.node_name = Some(crate::escrow::default_node_name(&listen));
        if eoq {
            config.sizer = leasehold_core::predictive_sizer::SizerKind::Eoq;
        }
        config.security = Some(dev_security(
            certs,
            &leasehold_core::principal::Principal::Region(region),
        ));
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            if let Err(e) = serve_escrow(config, shutdown).await {
                tracing::error!(error = %e, "demo escrow node failed");
            }
        }));
        addrs.push(listen);
    }
    Ok((addrs, tasks))
}

/// Runs `leasehold demo`.
pub async fn run(args: DemoArgs) -> Result<(), CliError> {
    let (data_dir, temporary) = match &args.data_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!(
                "leasehold-demo-{}-{}",
                std::process::id(),
                wall_ms()
            )),
            true,
        ),
    };
    let dev = DevArgs {
        data_dir: data_dir.clone(),
        base_port: args.base_port,
        nodes: 3,
        config: None,
        escrow_base_port: 0,
        ratelimit_configs: Vec::new(),
        ratelimit_response_headers: false,
    };
    let cluster = DevCluster::start(&dev)?;
    let result = async {
        let admin = cluster.admin()?;
        prepare(&admin, &cluster.members).await?;
        for policy in [
            Policy::counter("demo-counter/", args.limit, args.window_ms),
            Policy::fair("demo-fair/", args.limit, args.window_ms),
        ] {
            admin.set_policy(policy).await?;
        }
        println!("Leasehold demo: 3 coordinator members on ports {}-{}, escrow nodes eu/us/ap; data in {}", args.base_port, args.base_port + 2, data_dir.display());
        let (stop, stopped) = watch::channel(false);
        let (fixed, mut tasks) = start_escrow(&cluster.certs, &args, &cluster.members, false, 0, &stopped)?;
        let (eoq, more) = start_escrow(&cluster.certs, &args, &cluster.members, true, 3, &stopped)?;
        tasks.extend(more);
        // More nodes per region for the fair phase: sets of one node per
        // region, on the ports after the EOQ set.
        let mut fair_nodes = fixed.clone();
        for set in 1..args.escrow_nodes_per_region {
            let (addrs, more) = start_escrow(&cluster.certs, &args, &cluster.members, false, 3 + 3 * set, &stopped)?;
            fair_nodes.extend(addrs);
            tasks.extend(more);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        counter_phase(&cluster.certs, &args, &fixed, "demo-counter/api", "counter key, escrow batch 16").await?;
        counter_phase(&cluster.certs, &args, &eoq, "demo-counter/eoq", "counter key, escrow EOQ sizer").await?;
        fair_phase(&cluster.certs, &args, &fair_nodes).await?;
        let _ = stop.send(true);
        for task in tasks {
            let _ = task.await;
        }
        Ok::<(), CliError>(())
    }
    .await;
    cluster.stop().await;
    if temporary {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    result
}
