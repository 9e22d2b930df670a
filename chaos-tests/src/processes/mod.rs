//! The runner's second mode: the same invariants, checked against real
//! `leasehold` processes on loopback instead of the simulation.
//!
//! A run starts three coordinator members (`leasehold serve`, fsync on, each
//! on its own data directory) and, for some scenarios, regional escrow nodes
//! (`leasehold escrow`); forms the cluster and sets a counter policy; drives
//! concurrent load from leased [`Limiter`](leasehold_client::Limiter)s in
//! this process (some leasing from the cluster directly, some through escrow
//! nodes) while it `kill -9`s, `SIGSTOP`s / `SIGCONT`s and restarts
//! processes on a schedule; and records what the clients saw (every
//! admission with its window, every acknowledged grant, duplicate replies)
//! and what the cluster says (linearizable `GetWindow` reads). The checks of
//! [`crate::invariants`] then run on that [`History`].
//!
//! Time here is the host's wall clock, which every process shares. Timing is
//! real, so a seed fixes the clients' choices (batch sizes, request ids,
//! jitter) but not the interleaving: a run is evidence, not a replay.
//!
//! # Layout
//! - [`catalogue`](mod@catalogue): every process scenario and its faults.
//! - `fleet`: the processes themselves (start, kill, stop, restart).
//! - `faults`: a scenario's faults inflicted at their times.
//! - `load`: the clients' load and what they record.
//! - `delay`: a delaying TCP proxy in front of each member.
//! - [`hostile`]: hostile peers against mutual-TLS processes.
//! - [`identities`]: the certificates of a mutual-TLS run.

pub mod catalogue;
mod delay;
mod faults;
mod fleet;
pub mod hostile;
pub mod identities;
mod load;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use leasehold_client::coordinator::CoordinatorClient;
use leasehold_core::policy::Policy;
use tonic::Code;

pub use catalogue::{scenario_by_name, scenarios, ProcessFault, ProcessScenario};
pub use delay::DelayProxy;
pub use fleet::Fleet;
pub use hostile::FloodCounts;

use crate::history::{History, Recorder};
use crate::invariants::{check_all, Violation};
use crate::sim::Weakening;
use faults::inflict;

/// Wall-clock time, epoch ms.
pub fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The key every client spends from (the simulation's).
pub use crate::sim::KEY;

/// What every process run shares.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// The `leasehold` binary to run.
    pub binary: PathBuf,
    /// Coordinator members.
    pub members: u64,
    /// Client limiters in this process.
    pub clients: usize,
    /// L.
    pub limit: u64,
    /// Window length.
    pub window_ms: u64,
    /// How long the clients generate load.
    pub load: Duration,
    /// After the last heal, admissions must resume within this.
    pub liveness_bound_ms: u64,
    /// Slack between a limiter's decision and the moment it is recorded
    /// (both on the wall clock; the recording thread may be descheduled in
    /// between): an admission counts as past its window's end only beyond it.
    pub record_slack_ms: u64,
    /// A safety mechanism deliberately broken (client side only here).
    pub weakening: Weakening,
    /// Each client pauses a random time in this range (ms) after each
    /// admission; longer pauses mean lower demand.
    pub client_pause_ms: (u64, u64),
    /// One-way delay (ms) on every link into a coordinator member (0: none):
    /// each member is reached through a [`DelayProxy`], by the other
    /// members, the escrow nodes and the clients alike, so a round trip
    /// between regions or members is twice this.
    pub link_delay_ms: u64,
    /// Raft groups the keys are spread over at setup (1: never sharded),
    /// as in the simulation ([`crate::sim::shards::spread_changes`]): the
    /// load's key on the last shard. A fault on "the leader" hits the meta
    /// group's (shard 0's), which then serves none of the load's calls.
    pub shards: u32,
    /// Clients leasing from the cluster also resend old ids, as in the
    /// simulation ([`crate::plan::FleetShape::resend_old_ids`]).
    pub resend_old_ids: bool,
}

impl ProcessOptions {
    /// Defaults for `binary`.
    pub fn new(binary: PathBuf) -> Self {
        ProcessOptions {
            binary,
            members: 3,
            clients: 4,
            limit: 300,
            window_ms: 1_000,
            load: Duration::from_secs(12),
            liveness_bound_ms: 8_000,
            record_slack_ms: 100,
            weakening: Weakening::None,
            client_pause_ms: (1, 6),
            link_delay_ms: 0,
            shards: 1,
            resend_old_ids: false,
        }
    }
}

/// The `leasehold` binary next to the running executable (`target/<profile>/`),
/// or one directory up (test executables live in `target/<profile>/deps/`).
pub fn sibling_binary() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("leasehold"), dir.parent()?.join("leasehold")]
        .into_iter()
        .find(|p| p.is_file())
}

/// One run against real processes.
#[derive(Debug, Clone)]
pub struct ProcessOutcome {
    /// What the clients and the cluster recorded.
    pub history: History,
    /// Wall-clock start of the load, epoch ms.
    pub load_start_ms: u64,
    /// Violations of the invariants.
    pub violations: Vec<Violation>,
}

async fn form_cluster(
    fleet: &Fleet,
    options: &ProcessOptions,
    fair: bool,
) -> Result<CoordinatorClient> {
    let dialer = fleet.dialer_as(&identities::operator());
    let client = CoordinatorClient::with_options(
        fleet.member_addrs(),
        dialer,
        fleet::runner_retry_options(),
    )?;
    let admin = client.admin();
    let ids: Vec<(u64, String)> = (1..).zip(fleet.member_addrs()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match admin.init(&ids).await {
            Ok(()) => break,
            Err(e) if e.code() == Code::AlreadyExists => break,
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(e).context("initialising the cluster")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let policy = if fair {
        Policy::fair("chaos/", options.limit, options.window_ms)
    } else {
        Policy::counter("chaos/", options.limit, options.window_ms)
    };
    loop {
        match admin.set_policy(policy.clone()).await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(e).context("setting the policy")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    if options.shards > 1 {
        spread_over_shards(&client, options).await?;
    }
    Ok(client)
}

/// Spreads the slots over `options.shards` shards (the load's key on the
/// last), each change made against the version read just before, and
/// waits until the key's shard serves the key.
async fn spread_over_shards(client: &CoordinatorClient, options: &ProcessOptions) -> Result<()> {
    let admin = client.admin();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let key_slot = u32::from(leasehold_core::shard::slot_of(KEY));
    for change in crate::sim::shards::spread_changes(options.shards, options.members, key_slot) {
        let in_time = || tokio::time::Instant::now() < deadline;
        if !crate::sim::shards::make_change(&admin, &change, in_time).await {
            anyhow::bail!("placement change {change:?} not made in 30 s");
        }
    }
    loop {
        match client.get_window(KEY).await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() > deadline => {
                return Err(e).context("the key's shard serving it")
            }
            Err(_) => {
                let _ = client.refresh_placement().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Runs `scenario` once against real processes.
pub async fn run(
    scenario: &ProcessScenario,
    options: &ProcessOptions,
    seed: u64,
) -> Result<ProcessOutcome> {
    let options = &scenario.options(options);
    let link_delay = Duration::from_millis(options.link_delay_ms);
    if scenario.tls
        && (options.clients > identities::DIRECT_CLIENTS
            || scenario
                .escrow_regions
                .iter()
                .any(|r| *r >= identities::ESCROW_REGIONS))
    {
        anyhow::bail!(
            "mutual-TLS runs have certificates for {} clients and {} escrow regions",
            identities::DIRECT_CLIENTS,
            identities::ESCROW_REGIONS
        );
    }
    let mut fleet =
        Fleet::start_members(&options.binary, options.members, link_delay, scenario.tls)?;
    let client = form_cluster(&fleet, options, scenario.fair)
        .await
        .with_context(|| format!("forming the cluster (logs in {})", fleet.dir().display()))?;
    let regions: Vec<String> = scenario
        .escrow_regions
        .iter()
        .map(|i| format!("region-{i}"))
        .collect();
    fleet.start_escrows(&regions, 16)?;

    let recorder = Recorder::new(options.limit, options.window_ms);
    let load_start_ms = wall_now_ms() + 500;
    let load_end_ms = load_start_ms + u64::try_from(options.load.as_millis()).unwrap_or(0);
    let admin = client.admin();
    let escrows: Vec<(String, usize)> = fleet
        .escrow_addrs()
        .into_iter()
        .zip(scenario.escrow_regions.iter().copied())
        .collect();
    let tasks = load::spawn(
        options,
        &fleet.member_addrs(),
        &escrows,
        scenario.fair,
        client,
        &recorder,
        seed,
        load_start_ms,
        load_end_ms,
        fleet.identities(),
    )?;

    let mut background = Vec::new();
    let faulted = inflict(
        &mut fleet,
        &admin,
        scenario,
        &recorder,
        (load_start_ms, load_end_ms),
        &mut background,
    )
    .await;
    let joined = load::join(tasks).await;
    for task in background {
        if let Ok(line) = task.await {
            recorder.fault(line);
        }
    }
    let alive = fleet.check_alive();
    drop(fleet);
    faulted?;
    joined?;
    alive?;
    recorder.load_ended(load_end_ms);

    let history = History {
        coordinator_lag_ms: options.record_slack_ms,
        ..recorder.snapshot()
    };
    let violations = check_all(&history, options.liveness_bound_ms);
    Ok(ProcessOutcome {
        history,
        load_start_ms,
        violations,
    })
}
