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

mod delay;
mod fleet;
pub mod hostile;
pub mod identities;
mod load;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use leasehold_client::coordinator::{AdminClient, CoordinatorClient};
use leasehold_core::policy::Policy;
use tonic::Code;

pub use delay::DelayProxy;
pub use fleet::Fleet;
pub use hostile::FloodCounts;

use crate::history::{History, Recorder};
use crate::invariants::{check_all, Violation};
use crate::sim::{shards, Weakening};

/// Wall-clock time, epoch ms.
pub fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The key every client spends from (the simulation's).
pub use crate::sim::KEY;

/// One fault inflicted on the processes. Member `0` means "the current leader".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessFault {
    /// `kill -9` a member.
    Kill(u64),
    /// `kill -9` every member at once.
    KillAll,
    /// `SIGSTOP` a member (it holds its sockets and answers nothing).
    Stop(u64),
    /// `SIGCONT` every stopped member.
    Continue,
    /// Start every killed member again on its own data directory.
    Restart,
    /// `kill -9` escrow node `n`.
    KillEscrow(usize),
    /// `SIGTERM` escrow node `n` (it hands back what it holds and exits).
    TermEscrow(usize),
    /// `SIGSTOP` escrow node `n` (it holds its sockets and answers nothing).
    StopEscrow(usize),
    /// `SIGCONT` every stopped escrow node.
    ContinueEscrows,
    /// Start every killed (or terminated) escrow node again: a new process
    /// with nothing in memory, same region and port.
    RestartEscrows,
    /// The leader hands its leadership off (`leasehold cluster step-down`).
    StepDown,
    /// Starts a new member told to join the founding members (on mutual
    /// TLS), not added yet.
    StartJoiner,
    /// Adds the started joiner: AddLearner, then a voter.
    AddJoiner,
    /// Removes member `n` (`0`: the leader) from the voters and kills it
    /// for good: its id is retired, its certificate still valid.
    Retire(u64),
    /// Forges Raft messages to every running member, the joiner included:
    /// from each retired member's certificate, from a stranger's, and from
    /// a member claiming another's id; at terms one ahead, beyond the
    /// step and at the edge of the type; over gRPC and framed (mutual TLS
    /// only). Each is recorded; the `hostile` invariant allows refusals.
    ForgeRaft,
    /// Until the load ends, keeps this many stalled TLS handshakes per
    /// member from 127.0.0.2 (mutual TLS only).
    StallHandshakes(usize),
    /// Until the load ends, a service of escrow node `n`'s region asks it
    /// for one token under a new holder each time (mutual TLS only).
    FloodHolders(usize),
    /// The shard serving the load's key is split, and the key's slot
    /// moved on to the new shard where the split left it behind
    /// ([`crate::plan::MembershipAction::SplitKeyShard`]); done once the
    /// key is served again, within the bound.
    SplitKeyShard,
    /// The replicas of the key's shard change so that its leader is none
    /// of them ([`crate::plan::MembershipAction::DropKeyShardLeader`]);
    /// done once a new replica leads it and the key is served again,
    /// within the bound.
    DropKeyShardLeader,
    /// A quorum lost for good: `kill -9` a follower (it falls behind), let
    /// the others grant on into a window it never hears of, `kill -9` them
    /// and wipe their data, then force the survivor into a new cluster
    /// (`leasehold force-new-cluster`) and start it.
    LoseQuorum,
}

/// A named schedule of faults against real processes.
#[derive(Debug, Clone)]
pub struct ProcessScenario {
    /// Name used on the command line.
    pub name: &'static str,
    /// Escrow nodes between some clients and the cluster: each one's region
    /// index (two nodes may serve one region).
    pub escrow_regions: Vec<usize>,
    /// A `fair` key (every client goes through an escrow node) instead of
    /// a `counter` key.
    pub fair: bool,
    /// The window's length, when the scenario sets it (the options'
    /// otherwise); liveness after the last heal is then judged over one
    /// window, as a spent window admits nothing until it ends.
    pub window_ms: Option<u64>,
    /// Faults, at times counted from the start of the load.
    pub faults: Vec<(Duration, ProcessFault)>,
    /// Every process and client on mutual TLS with its own certificate.
    pub tls: bool,
    /// Shard operations among the faults: at least four members (so a
    /// shard of three can drop its leader for the fourth), and clients
    /// resend old ids ([`ProcessOptions::resend_old_ids`]).
    pub shard_operations: bool,
}

impl ProcessScenario {
    /// The options of a run of this scenario under `options`.
    pub fn options(&self, options: &ProcessOptions) -> ProcessOptions {
        let mut options = options.clone();
        if let Some(window_ms) = self.window_ms {
            options.window_ms = window_ms;
            options.liveness_bound_ms = options.liveness_bound_ms.max(window_ms);
        }
        if self.shard_operations {
            options.members = options.members.max(4);
            options.resend_old_ids = true;
        }
        options
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// Every process scenario.
pub fn scenarios() -> Vec<ProcessScenario> {
    use ProcessFault::*;
    let plain = |name, faults| ProcessScenario {
        name,
        escrow_regions: Vec::new(),
        fair: false,
        window_ms: None,
        faults,
        tls: false,
        shard_operations: false,
    };
    // Fair keys under escrow nodes that lose their memory inside a window
    // much longer than a restart: the demand spends L early in the window,
    // so a node that spent its region's grant twice shows at once.
    let fair = |name, escrow_regions, faults| ProcessScenario {
        name,
        escrow_regions,
        fair: true,
        window_ms: Some(30_000),
        faults,
        tls: false,
        shard_operations: false,
    };
    vec![
        plain("healthy", vec![]),
        plain(
            "leader_kill9",
            vec![(secs(3.0), Kill(0)), (secs(5.0), Restart)],
        ),
        plain(
            "leader_stop",
            vec![(secs(3.0), Stop(0)), (secs(6.0), Continue)],
        ),
        plain(
            "all_kill9",
            vec![(secs(3.0), KillAll), (secs(4.0), Restart)],
        ),
        plain(
            "rolling_restart",
            vec![
                (secs(3.0), Kill(1)),
                (secs(4.0), Restart),
                (secs(5.5), Kill(2)),
                (secs(6.5), Restart),
                (secs(8.0), Kill(3)),
                (secs(9.0), Restart),
            ],
        ),
        plain(
            "leader_step_down",
            vec![(secs(3.0), StepDown), (secs(7.0), StepDown)],
        ),
        // What an operator does to a hot shard while clients lease and
        // resend old ids: split the key's shard, drop the new shard's
        // leader from its replicas right after, and again later.
        ProcessScenario {
            shard_operations: true,
            ..plain(
                "shard_split_then_replicas",
                vec![
                    (secs(2.0), SplitKeyShard),
                    (secs(2.0), DropKeyShardLeader),
                    (secs(5.5), DropKeyShardLeader),
                ],
            )
        },
        ProcessScenario {
            name: "escrow_kill9",
            escrow_regions: vec![0, 1],
            fair: false,
            window_ms: None,
            faults: vec![
                (secs(3.0), KillEscrow(0)),
                (secs(4.0), Kill(0)),
                (secs(5.0), RestartEscrows),
                (secs(6.0), Restart),
            ],
            tls: false,
            shard_operations: false,
        },
        // Hostile peers on mutual TLS, interleaved with the usual faults:
        // stalled handshakes and a holder flood all along; forged Raft
        // messages at a joining member and at the cluster before and after
        // a member is retired (then from its certificate too), at a member
        // restarting after a leader kill; a step-down at the end.
        ProcessScenario {
            name: "hostile_peers",
            escrow_regions: vec![0, 1],
            fair: false,
            window_ms: None,
            faults: vec![
                (secs(0.5), StallHandshakes(48)),
                (secs(0.5), FloodHolders(0)),
                (secs(1.0), StartJoiner),
                (secs(1.5), ForgeRaft),
                (secs(2.0), AddJoiner),
                (secs(3.0), Retire(2)),
                (secs(3.5), ForgeRaft),
                (secs(4.5), Kill(0)),
                (secs(5.5), Restart),
                // At once: the restarted member is still loading its log.
                (secs(5.5), ForgeRaft),
                (secs(6.0), StepDown),
            ],
            tls: true,
            shard_operations: false,
        },
        // A quorum lost for good under load, the unsafe recovery and the
        // cluster grown back (docs/operations.md, "Losing a quorum for
        // good"): Δ = 0 across the old cluster and the new one (run with
        // a load of 18 s: the seal costs up to two 4 s windows).
        ProcessScenario {
            name: "force_new_cluster",
            escrow_regions: vec![0, 1],
            fair: false,
            // Long enough for the survivor to serve again inside the window
            // the lost members were last granting in.
            window_ms: Some(4_000),
            faults: vec![
                (secs(2.0), LoseQuorum),
                (secs(12.0), StartJoiner),
                (secs(12.5), AddJoiner),
            ],
            tls: false,
            shard_operations: false,
        },
        fair(
            "fair_escrow_kill9",
            vec![0, 1],
            vec![(secs(3.0), KillEscrow(0)), (secs(4.0), RestartEscrows)],
        ),
        fair(
            "fair_escrow_sigterm",
            vec![0, 1],
            vec![(secs(3.0), TermEscrow(0)), (secs(4.0), RestartEscrows)],
        ),
        fair(
            "fair_escrow_sigstop",
            vec![0, 1],
            vec![(secs(3.0), StopEscrow(0)), (secs(6.0), ContinueEscrows)],
        ),
        fair(
            "fair_two_escrows_per_region",
            vec![0, 0, 1],
            vec![
                (secs(2.0), KillEscrow(0)),
                (secs(3.0), RestartEscrows),
                (secs(4.0), TermEscrow(1)),
                (secs(5.0), RestartEscrows),
                (secs(6.0), StopEscrow(2)),
                (secs(7.0), KillEscrow(0)),
                (secs(8.0), ContinueEscrows),
                (secs(8.5), RestartEscrows),
            ],
        ),
        // Three regions, no fault, 10 s windows: what a fair key uses of L
        // and how evenly (run with --link-delay-ms 50 for 100 ms between
        // regions and members).
        ProcessScenario {
            name: "fair_healthy",
            escrow_regions: vec![0, 1, 2],
            fair: true,
            window_ms: Some(10_000),
            faults: vec![],
            tls: false,
            shard_operations: false,
        },
        // Two nodes serve region 0; one dies for good under load: its
        // callers move on to the other (run with demand under L to see
        // admissions go on: chaos-tests/tests/processes.rs).
        fair(
            "fair_region_failover",
            vec![0, 0, 1],
            vec![(secs(3.0), KillEscrow(0))],
        ),
        fair(
            "fair_escrow_and_leader_kill9",
            vec![0, 1],
            vec![
                (secs(3.0), KillEscrow(0)),
                (secs(3.0), Kill(0)),
                (secs(4.5), RestartEscrows),
                (secs(5.0), Restart),
            ],
        ),
    ]
}

/// Looks a process scenario up by name.
pub fn scenario_by_name(name: &str) -> Option<ProcessScenario> {
    scenarios().into_iter().find(|s| s.name == name)
}

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

async fn sleep_until_ms(at_ms: u64) {
    let now = wall_now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

/// Member `pick`, or the current leader for `0` (asked for up to 5 s).
async fn resolve(fleet: &Fleet, pick: u64) -> Option<u64> {
    if pick != 0 {
        return Some(pick);
    }
    // An election after an earlier fault may take a few seconds on a
    // loaded machine (processes, not a simulation): wait up to 5 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if let Some(leader) = fleet.leader().await {
            return Some(leader);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Replaces the voters by `voters`, as an operator would: again while the
/// previous change is still committing (refused `FAILED_PRECONDITION`),
/// for up to five seconds; then, as docs/security.md says, waits until
/// each member the leader named as not holding the change yet shows it in
/// its log (`cluster status` on it), for up to five seconds more.
async fn change_membership(fleet: &Fleet, admin: &AdminClient, voters: &[u64]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match admin.change_membership(voters, false).await {
            Ok(change) => {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                for id in change.lagging_member_ids {
                    loop {
                        let status = fleet.status_of(id).await;
                        if status.is_some_and(|s| s.last_log_index >= change.log_index) {
                            break;
                        }
                        anyhow::ensure!(
                            tokio::time::Instant::now() < deadline,
                            "member {id} did not receive membership change {} within 5 s",
                            change.log_index
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                return Ok(());
            }
            Err(e)
                if e.code() == Code::FailedPrecondition
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A client of every member, as the operator.
fn operator(fleet: &Fleet) -> Result<CoordinatorClient> {
    Ok(CoordinatorClient::with_options(
        fleet.member_addrs(),
        fleet.dialer_as(&identities::operator()),
        fleet::runner_retry_options(),
    )?)
}

/// The admin API of member `id` alone, as the operator.
fn member_admin(fleet: &Fleet, id: u64) -> Result<AdminClient> {
    let addr = fleet
        .member_addr(id)
        .with_context(|| format!("no address for member {id}"))?;
    Ok(CoordinatorClient::with_options(
        vec![addr],
        fleet.dialer_as(&identities::operator()),
        fleet::runner_retry_options(),
    )?
    .admin())
}

/// Records a shard change made at `since_ms`: healed when `served` (the
/// key served again within the bound), else an unfinished action.
fn shard_change_done(recorder: &Recorder, since_ms: u64, what: &str, served: bool) {
    let done = wall_now_ms();
    if served {
        recorder.fault(format!(
            "{since_ms}: {what}; served again after {} ms",
            done - since_ms
        ));
        recorder.healed(done);
    } else {
        recorder.unfinished(format!(
            "{what}: the key not served again within {} ms",
            shards::SHARD_CHANGE_BOUND_MS
        ));
    }
}

/// A fault that runs in the background until the load ends; it answers
/// a line for the fault log.
type Background = tokio::task::JoinHandle<String>;

/// Applies the scenario's faults at their times; faults that last until
/// the load ends leave their tasks in `background`.
async fn inflict(
    fleet: &mut Fleet,
    admin: &AdminClient,
    scenario: &ProcessScenario,
    recorder: &Recorder,
    (load_start_ms, load_end_ms): (u64, u64),
    background: &mut Vec<Background>,
) -> Result<()> {
    let mut joiner: Option<(u64, String)> = None;
    for (at, fault) in &scenario.faults {
        sleep_until_ms(load_start_ms + u64::try_from(at.as_millis()).unwrap_or(0)).await;
        fleet.check_alive()?;
        let now = wall_now_ms();
        match fault {
            ProcessFault::Kill(p) => {
                let id = resolve(fleet, *p).await.context("no leader to kill")?;
                fleet.kill_member(id)?;
                recorder.fault(format!("{now}: kill -9 member {id}"));
            }
            ProcessFault::KillAll => {
                for id in fleet.responsive_members() {
                    fleet.kill_member(id)?;
                }
                recorder.fault(format!("{now}: kill -9 every member"));
            }
            ProcessFault::Stop(p) => {
                let id = resolve(fleet, *p).await.context("no leader to stop")?;
                fleet.stop_member(id)?;
                recorder.fault(format!("{now}: SIGSTOP member {id}"));
            }
            ProcessFault::Continue => {
                fleet.continue_members()?;
                recorder.fault(format!("{now}: SIGCONT"));
                recorder.healed(now);
            }
            ProcessFault::Restart => {
                fleet.restart_members()?;
                recorder.fault(format!("{now}: restart killed members"));
                recorder.healed(now);
            }
            ProcessFault::KillEscrow(index) => {
                fleet.kill_escrow(*index)?;
                recorder.fault(format!("{now}: kill -9 escrow node {index}"));
            }
            ProcessFault::TermEscrow(index) => {
                fleet.terminate_escrow(*index).await?;
                recorder.fault(format!("{now}: SIGTERM escrow node {index}"));
            }
            ProcessFault::StopEscrow(index) => {
                fleet.stop_escrow(*index)?;
                recorder.fault(format!("{now}: SIGSTOP escrow node {index}"));
            }
            ProcessFault::ContinueEscrows => {
                fleet.continue_escrows()?;
                recorder.fault(format!("{now}: SIGCONT escrow nodes"));
                recorder.healed(now);
            }
            ProcessFault::RestartEscrows => {
                fleet.restart_escrows()?;
                recorder.fault(format!("{now}: restart escrow nodes"));
                recorder.healed(now);
            }
            ProcessFault::StepDown => {
                let old = resolve(fleet, 0).await.context("no leader to step down")?;
                let new = admin
                    .step_down(Some(old))
                    .await
                    .with_context(|| format!("member {old} stepping down"))?;
                let done = wall_now_ms();
                recorder.fault(format!(
                    "{now}: member {old} steps down; {new} leads from {done}"
                ));
                recorder.healed(done);
            }
            ProcessFault::StartJoiner => {
                let (id, addr) = fleet.start_joiner()?;
                recorder.fault(format!("{now}: member {id} starts, told to join"));
                joiner = Some((id, addr));
            }
            ProcessFault::AddJoiner => {
                let (id, addr) = joiner.clone().context("no joiner started")?;
                admin
                    .add_learner(id, &addr)
                    .await
                    .with_context(|| format!("adding member {id}"))?;
                let voters: Vec<u64> = fleet
                    .member_ids()
                    .into_iter()
                    .filter(|m| !fleet.retired_members().contains(m))
                    .collect();
                change_membership(fleet, admin, &voters)
                    .await
                    .with_context(|| format!("making member {id} a voter"))?;
                recorder.fault(format!("{now}: member {id} joins: voters {voters:?}"));
            }
            ProcessFault::Retire(p) => {
                let id = resolve(fleet, *p).await.context("no leader to retire")?;
                let voters: Vec<u64> = fleet
                    .member_ids()
                    .into_iter()
                    .filter(|m| *m != id && !fleet.retired_members().contains(m))
                    .collect();
                change_membership(fleet, admin, &voters)
                    .await
                    .with_context(|| format!("retiring member {id}"))?;
                fleet.retire_member(id)?;
                recorder.fault(format!("{now}: member {id} retired: voters {voters:?}"));
            }
            ProcessFault::SplitKeyShard => {
                let in_time = || wall_now_ms() < load_end_ms;
                let members = fleet.member_ids().len() as u64;
                let made = shards::split_key_shard(admin, members, in_time).await;
                anyhow::ensure!(made, "the split of the key's shard was not made");
                let served =
                    shards::key_served_within_bound(&operator(fleet)?, now, wall_now_ms).await;
                shard_change_done(recorder, now, "split of the key's shard", served);
            }
            ProcessFault::DropKeyShardLeader => {
                let in_time = || wall_now_ms() < load_end_ms;
                let members = fleet.member_ids();
                let members_admin = members
                    .iter()
                    .map(|id| member_admin(fleet, *id))
                    .collect::<Result<Vec<_>>>()?;
                let made = shards::drop_key_shard_leader(
                    admin,
                    &members_admin,
                    members.len() as u64,
                    in_time,
                )
                .await
                .context("the replica change was not made")?;
                recorder.fault(format!("{now}: {made:?}"));
                let served =
                    shards::new_replicas_lead_within_bound(&members_admin, &made, now, wall_now_ms)
                        .await
                        && shards::key_served_within_bound(&operator(fleet)?, now, wall_now_ms)
                            .await;
                shard_change_done(recorder, now, "replica change dropping the leader", served);
            }
            ProcessFault::LoseQuorum => {
                let leader = resolve(fleet, 0).await.context("no leader")?;
                let survivor = fleet
                    .responsive_members()
                    .into_iter()
                    .find(|id| *id != leader)
                    .context("no follower to survive")?;
                fleet.kill_member(survivor)?;
                recorder.fault(format!("{now}: kill -9 member {survivor}: it falls behind"));
                // The others grant on into a window it never hears of;
                // the survivor is back within that window.
                let window_ms = recorder.window_ms().max(1);
                sleep_until_ms((wall_now_ms() / window_ms + 1) * window_ms + 300).await;
                let lost: Vec<u64> = fleet
                    .responsive_members()
                    .into_iter()
                    .filter(|id| *id != survivor)
                    .collect();
                let restored_at_ms = fleet.force_new_cluster(survivor, &lost, 200)?;
                let done = wall_now_ms();
                recorder.forced_new_cluster(restored_at_ms.saturating_add(window_ms));
                recorder.fault(format!(
                    "{done}: members {lost:?} lost with their data; member {survivor} forced into a new cluster, windows sealed as of {restored_at_ms}"
                ));
                recorder.healed(done);
            }
            ProcessFault::ForgeRaft => {
                let identities = fleet.identities().context("ForgeRaft needs mutual TLS")?;
                let mut forgers: Vec<hostile::Forger> = fleet
                    .retired_members()
                    .into_iter()
                    .map(|id| hostile::Forger {
                        certificate: id,
                        claims: id,
                        kind: "retired",
                    })
                    .collect();
                forgers.push(hostile::Forger {
                    certificate: identities::STRANGER,
                    claims: identities::STRANGER,
                    kind: "stranger",
                });
                let running = fleet.responsive_members();
                if let [first, second, ..] = running[..] {
                    forgers.push(hostile::Forger {
                        certificate: second,
                        claims: first,
                        kind: "impostor",
                    });
                }
                let targets: Vec<String> = running
                    .iter()
                    .filter_map(|id| fleet.member_addr(*id))
                    .collect();
                let sent =
                    hostile::forge_raft_messages(identities, &targets, &forgers, recorder).await;
                recorder.fault(format!(
                    "{now}: {sent} forged Raft messages to members {running:?} from {:?}",
                    forgers
                        .iter()
                        .map(|f| (f.kind, f.certificate))
                        .collect::<Vec<_>>()
                ));
            }
            ProcessFault::StallHandshakes(per_member) => {
                let targets = fleet.member_addrs();
                let stalled = hostile::stall_handshakes(targets, *per_member, load_end_ms);
                let per_member = *per_member;
                background.push(tokio::spawn(async move {
                    let opened = stalled.await.unwrap_or(0);
                    format!(
                        "{now}..{load_end_ms}: {per_member} stalled handshakes per member from 127.0.0.2 ({opened} connections opened)"
                    )
                }));
                recorder.fault(format!("{now}: stalling handshakes"));
            }
            ProcessFault::FloodHolders(index) => {
                let addr = fleet
                    .escrow_addrs()
                    .get(*index)
                    .cloned()
                    .with_context(|| format!("no escrow node {index}"))?;
                let region = scenario.escrow_regions[*index];
                let flooder =
                    identities::service(identities::FLOOD_SERVICE, &format!("region-{region}"))?;
                let flood = hostile::flood_holders(
                    fleet.dialer_as(&flooder),
                    addr,
                    KEY,
                    *index,
                    load_end_ms,
                    recorder.clone(),
                );
                let index = *index;
                background.push(tokio::spawn(async move {
                    let counts = flood.await.unwrap_or_default();
                    format!(
                        "{now}..{load_end_ms}: holder flood at escrow node {index}: {} acquires, {} tokens granted, {} refused RESOURCE_EXHAUSTED",
                        counts.sent, counts.granted, counts.refused_exhausted
                    )
                }));
                recorder.fault(format!("{now}: flooding escrow node {index} with holders"));
            }
        }
    }
    Ok(())
}
