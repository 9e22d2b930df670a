//! The simulated fleet: coordinator members running the real node code on
//! turmoil hosts with power-loss disks, client hosts running the real
//! client crate's leased [`Limiter`] against them, and (some scenarios)
//! [`hostile`] clients, all recording into one [`Recorder`]. Faults are
//! injected by the driver loop between steps.
//!
//! Reproducibility: turmoil's network and scheduling are seeded, every
//! client's request ids, jitter and batch sizes come from the seed, and
//! openraft's election timeouts are drawn from a generator seeded with it
//! ([`leasehold_raft_store::seed_election_rng`]; turmoil runs every host on
//! the driving thread).

mod clock;
pub mod hostile;
pub(crate) mod load;
mod membership;
mod net;
pub mod rls;
pub mod shards;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_client::coordinator::RetryOptions;
use leasehold_client::transport::Dialer;
use leasehold_node::{run_coordinator_with_shards, NodeConfig};
use leasehold_raft_store::{open_with_engine, PowerLossDisk, PowerLossOptions};

pub use crate::plan::{FleetShape, MembershipAction};
pub use clock::{sim_now_ms, SkewedClock, SIM_EPOCH_MS};
pub use load::Weakening;
pub use net::{incoming, SimDialer};

use crate::history::{History, Recorder};
use crate::plan::{Fault, Scenario};

/// The key every client spends from (the history's [`SHARED_KEY`](crate::history::SHARED_KEY)).
pub const KEY: &str = crate::history::SHARED_KEY;
/// Port of every coordinator member.
pub const PORT: u16 = 7100;
/// Port of every escrow node.
pub const ESCROW_PORT: u16 = 7200;

/// Escrow host name.
pub fn escrow_host(index: usize) -> String {
    format!("e{index}")
}

/// Member host name.
pub fn member_host(id: u64) -> String {
    format!("n{id}")
}

pub(crate) fn member_addr(id: u64) -> String {
    format!("{}:{PORT}", member_host(id))
}

fn member_config(id: u64) -> NodeConfig {
    NodeConfig {
        id,
        listen: format!("0.0.0.0:{PORT}"),
        data_dir: std::path::PathBuf::from(format!("/sim/{id}")),
        heartbeat_ms: 50,
        // Distinct ranges per member make elections converge quickly.
        election_timeout_min_ms: 300 + 60 * id,
        election_timeout_max_ms: 600 + 60 * id,
        proposal_timeout_ms: 1_500,
        read_timeout_ms: 1_500,
        admin_timeout_ms: 5_000,
        snapshot_every_entries: 200,
        logs_kept_after_snapshot: 20,
        tick_interval_ms: 500,
        ..NodeConfig::default()
    }
}

/// Retries for simulated clients: ride out elections, never hang.
pub fn sim_retry_options() -> RetryOptions {
    RetryOptions {
        call_timeout: Duration::from_millis(1_000),
        total_timeout: Duration::from_secs(3),
        max_attempts: 30,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
    }
}

/// What one run produced.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// The recorded history.
    pub history: History,
    /// The simulation's own error, if it failed (a host panicked, …).
    pub sim_error: Option<String>,
}

/// Runs `scenario` once with `seed`.
pub fn run(scenario: &Scenario, seed: u64, weakening: Weakening) -> RunOutcome {
    let shape = scenario.shape.clone();
    leasehold_raft_store::seed_election_rng(seed);
    let recorder = Recorder::new(shape.limit, shape.window_ms);
    if shape.rls {
        recorder.load_key(rls::RLS_KEY);
    }
    recorder.allow_outage_excess(
        shape.fallback_tokens_per_region * u64::try_from(shape.escrow_nodes.max(1)).unwrap_or(1),
    );
    let disks: Arc<Mutex<HashMap<u64, PowerLossDisk>>> = Arc::default();
    let shard_disks: ShardDisks = Arc::default();
    let leader = Arc::new(AtomicU64::new(0));
    let options = PowerLossOptions {
        acknowledge_before_durable: weakening == Weakening::AcknowledgeBeforeDurable,
    };

    let setup_time = shape.setup_time();
    let total = setup_time + shape.load + Duration::from_secs(3);
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .simulation_duration(total + Duration::from_secs(30))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(MAX_LATENCY)
        .tcp_capacity(4096)
        .build();

    for id in shape.member_ids() {
        let disk = disks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id)
            .or_insert_with(|| PowerLossDisk::with_options(options))
            .clone();
        let offset_ms = scenario.clock_offset_ms(id);
        let drift_ppm = scenario.clock_drift_ppm(id);
        let shard_disks = shard_disks.clone();
        sim.host(member_host(id), move || {
            let disk = disk.clone();
            let shard_stores = shard_store_opener(id, &shard_disks, options);
            async move {
                let stores = open_with_engine(disk.open_engine())?;
                let listener = incoming(PORT).await?;
                let dialer: Arc<dyn Dialer> = Arc::new(SimDialer);
                run_coordinator_with_shards(
                    member_config(id),
                    stores,
                    shard_stores,
                    listener,
                    dialer,
                    Arc::new(SkewedClock {
                        offset_ms,
                        drift_ppm,
                    }),
                    std::future::pending::<()>(),
                )
                .await?;
                Ok(())
            }
        });
    }

    let members: Vec<String> = shape.member_ids().map(member_addr).collect();
    let drains: EscrowDrains = Arc::default();
    for index in 0..shape.escrow_nodes {
        let members = members.clone();
        let fair_throttle = shape.fair_throttle;
        let pool_release_idle_ms = shape.pool_release_idle_ms;
        let rls = shape
            .rls
            .then(|| rls::node_config(shape.limit, shape.window_ms).map_err(|e| e.to_string()));
        let region_index = if shape.second_node_in_region_0 && index == 1 {
            0
        } else {
            index
        };
        // Each start of the host is a new process: its coordinator client
        // draws another client id (a seed of its own), and a drain stops it.
        let incarnations = Arc::new(AtomicU64::new(0));
        let drains = drains.clone();
        sim.host(escrow_host(index), move || {
            let members = members.clone();
            let rls = rls.clone();
            let incarnation = incarnations.fetch_add(1, Ordering::Relaxed);
            let (drain, drained) = tokio::sync::watch::channel(false);
            drains
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(index, drain);
            async move {
                let region = leasehold_core::ids::RegionId::new(format!("region-{region_index}"))?;
                let mut config = leasehold_node::escrow::EscrowConfig::new(
                    region,
                    format!("0.0.0.0:{ESCROW_PORT}"),
                    members,
                );
                // The node's name outlives its restarts (as a pod's does):
                // a restarted node replaces its weight, never adds to it.
                config.node_name = Some(escrow_host(index));
                config.probe_interval_ms = 500;
                config.policy_refresh_ms = 500;
                config.coordinator_timeout_ms = 1_000;
                config.pool_release_idle_ms = pool_release_idle_ms;
                // Seeded like everything else in the run, so a seed replays.
                config.coordinator_rng_seed = Some(
                    seed.wrapping_mul(7)
                        .wrapping_add(index as u64)
                        .wrapping_add(incarnation.wrapping_mul(1_000_003)),
                );
                if let Some(rls) = &rls {
                    config.rls = Some(rls.clone()?);
                }
                if fair_throttle {
                    let mut rule = leasehold_node::escrow::FairThrottleRule::new("chaos/");
                    // Rotate within the run, so rotation is exercised too.
                    rule.config.rotation_interval_ms = 2_000;
                    rule.idle_reserve = (index > 0).then_some(0);
                    config.fair_throttle = vec![rule];
                    config.fair_throttle_rng_seed = Some(seed.wrapping_add(index as u64));
                }
                let listener = incoming(ESCROW_PORT).await?;
                let mut drained = drained;
                leasehold_node::escrow::run_escrow(
                    config,
                    listener,
                    Arc::new(SimDialer),
                    Arc::new(SkewedClock {
                        offset_ms: 0,
                        drift_ppm: 0,
                    }),
                    async move {
                        let _ = drained.wait_for(|drain| *drain).await;
                    },
                )
                .await?;
                // Drained: the process ends (the host stays down until a
                // restart bounces it).
                std::future::pending::<()>().await;
                Ok(())
            }
        });
    }
    let quiet = Arc::new(AtomicBool::new(false));
    let ready = load::spawn_clients(
        &mut sim, &shape, &members, seed, &recorder, &leader, setup_time, weakening, &quiet,
    );
    let load_end_ms =
        SIM_EPOCH_MS + u64::try_from((setup_time + shape.load).as_millis()).unwrap_or(0);
    hostile::spawn_hostile_clients(
        &mut sim,
        &shape,
        &members,
        seed,
        &recorder,
        &ready,
        load_end_ms,
    );
    let actions = membership::ActionQueue::default();
    if scenario
        .faults
        .iter()
        .any(|(_, f)| matches!(f, Fault::Membership(_)))
    {
        let stop_at_ms =
            SIM_EPOCH_MS + u64::try_from((setup_time + shape.load).as_millis()).unwrap_or(0);
        membership::spawn_operator(
            &mut sim, &shape, seed, &actions, &recorder, &leader, stop_at_ms,
        );
    }

    let faults = Faults {
        scenario,
        recorder: &recorder,
        disks: &disks,
        shard_disks: &shard_disks,
        drains: &drains,
        leader: &leader,
        actions: &actions,
        quiet: &quiet,
    };
    let sim_error = drive(&mut sim, &faults, setup_time).err();
    drop(sim);
    leasehold_raft_store::unseed_election_rng();
    let history = recorder.snapshot();
    RunOutcome {
        history: History {
            coordinator_lag_ms: coordinator_lag_ms(scenario, &history),
            ..history
        },
        sim_error,
    }
}

/// The power-loss disks of the shards past 0, by (member, shard).
type ShardDisks = Arc<Mutex<HashMap<(u64, u32), PowerLossDisk>>>;

/// Opens member `id`'s shard stores on its power-loss disks (one per
/// shard, kept across the member's restarts like its shard 0 disk).
fn shard_store_opener(
    id: u64,
    disks: &ShardDisks,
    options: PowerLossOptions,
) -> leasehold_node::coordinator::stores::ShardStoreOpener {
    let disks = disks.clone();
    Arc::new(move |shard| {
        let disk = disks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry((id, shard.0))
            .or_insert_with(|| PowerLossDisk::with_options(options))
            .clone();
        open_with_engine(disk.open_engine()).map_err(|e| leasehold_node::NodeError::Storage {
            path: std::path::PathBuf::from(format!("/sim/{id}/shards/{}", shard.0)),
            message: e.to_string(),
        })
    })
}

/// Per escrow node, the graceful stop of its running process.
type EscrowDrains = Arc<Mutex<HashMap<usize, tokio::sync::watch::Sender<bool>>>>;

/// Crashes member `id` and drops every write its disks (shard 0's and
/// every other shard's) had not flushed.
fn power_loss(
    sim: &mut turmoil::Sim<'_>,
    disks: &Mutex<HashMap<u64, PowerLossDisk>>,
    shard_disks: &ShardDisks,
    id: u64,
) {
    sim.crash(member_host(id));
    if let Some(disk) = disks
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&id)
    {
        disk.crash();
    }
    for ((member, _), disk) in shard_disks
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        if *member == id {
            disk.crash();
        }
    }
}

/// How far the slowest member's clock falls behind real time by the end of
/// the load (0 when no member's clock runs slow).
fn coordinator_lag_ms(scenario: &Scenario, history: &History) -> u64 {
    let run_ms = history.load_end_ms.saturating_sub(SIM_EPOCH_MS);
    scenario
        .shape
        .member_ids()
        .map(|id| scenario.clock_drift_ppm(id))
        .filter(|ppm| *ppm < 0)
        .map(|ppm| run_ms.saturating_mul(ppm.unsigned_abs()) / 1_000_000 + 1)
        .max()
        .unwrap_or(0)
}

/// What the driver needs to inject a scenario's faults.
struct Faults<'a> {
    scenario: &'a Scenario,
    shard_disks: &'a ShardDisks,
    recorder: &'a Recorder,
    disks: &'a Arc<Mutex<HashMap<u64, PowerLossDisk>>>,
    drains: &'a EscrowDrains,
    leader: &'a AtomicU64,
    actions: &'a membership::ActionQueue,
    /// Set while the honest clients are quiet (`QuietClients`).
    quiet: &'a AtomicBool,
}

/// The partitions and link settings in force, so `HealAll` undoes them.
#[derive(Default)]
struct Damage {
    isolated: Option<u64>,
    cut_regions: Vec<usize>,
    muted: Option<u64>,
    split: Option<(Vec<u64>, Vec<u64>)>,
    lossy: bool,
    delayed: bool,
}

/// Normal per-message latency bound (see the builder in [`run`]).
const MAX_LATENCY: Duration = Duration::from_millis(15);

/// Steps the simulation, injecting the scenario's faults at their times.
fn drive(
    sim: &mut turmoil::Sim<'_>,
    faults: &Faults<'_>,
    setup_time: Duration,
) -> Result<(), String> {
    let mut pending: Vec<(Duration, Fault)> = faults
        .scenario
        .faults
        .iter()
        .map(|(at, f)| (setup_time + *at, f.clone()))
        .collect();
    pending.sort_by_key(|(at, _)| *at);
    let mut next = 0;
    let mut damage = Damage::default();
    loop {
        let elapsed = sim.elapsed();
        while next < pending.len() && elapsed >= pending[next].0 {
            let fault = pending[next].1.clone();
            next += 1;
            if let Some(resume_after) = inject(sim, faults, &mut damage, elapsed, fault) {
                pending.push(resume_after);
                pending[next..].sort_by_key(|(at, _)| *at);
            }
        }
        match sim.step() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Injects one fault; returns a follow-up fault to schedule, if any.
fn inject(
    sim: &mut turmoil::Sim<'_>,
    faults: &Faults<'_>,
    damage: &mut Damage,
    elapsed: Duration,
    fault: Fault,
) -> Option<(Duration, Fault)> {
    let shape = &faults.scenario.shape;
    let recorder = faults.recorder;
    let now_ms = SIM_EPOCH_MS + u64::try_from(elapsed.as_millis()).unwrap_or(0);
    let target = |pick: u64| {
        if pick == 0 {
            faults.leader.load(Ordering::SeqCst).max(1)
        } else {
            pick
        }
    };
    let others = |id: u64| {
        shape
            .member_ids()
            .filter(move |m| *m != id)
            .map(member_host)
    };
    match fault {
        Fault::Isolate(pick) => {
            let id = target(pick);
            damage.isolated = Some(id);
            for other in others(id) {
                sim.partition(member_host(id), other.as_str());
            }
            for c in 0..shape.clients {
                sim.partition(member_host(id), load::client_host(c));
            }
            recorder.fault(format!("{now_ms}: isolate n{id}"));
        }
        Fault::SplitLeaderMinority => {
            let leader = target(0);
            let minority_size = usize::try_from((shape.members.max(1) - 1) / 2)
                .unwrap_or(1)
                .max(1);
            let mut minority = vec![leader];
            minority.extend(
                shape
                    .member_ids()
                    .filter(|m| *m != leader)
                    .take(minority_size - 1),
            );
            let majority: Vec<u64> = shape
                .member_ids()
                .filter(|m| !minority.contains(m))
                .collect();
            for a in &minority {
                for b in &majority {
                    sim.partition(member_host(*a), member_host(*b));
                }
            }
            recorder.fault(format!(
                "{now_ms}: split members {minority:?} (with the leader) | {majority:?}"
            ));
            damage.split = Some((minority, majority));
        }
        Fault::CrashEscrow(index) => {
            sim.crash(escrow_host(index));
            recorder.fault(format!("{now_ms}: escrow node {index} crashes"));
        }
        Fault::DrainEscrow(index) => {
            if let Some(drain) = faults
                .drains
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&index)
            {
                let _ = drain.send(true);
            }
            recorder.fault(format!("{now_ms}: escrow node {index} drains and stops"));
        }
        Fault::RestartEscrow(index) => {
            sim.bounce(escrow_host(index));
            recorder.fault(format!(
                "{now_ms}: escrow node {index} restarts (a new process)"
            ));
            recorder.healed(now_ms);
        }
        Fault::CutRegion(index) => {
            for id in shape.member_ids() {
                sim.partition(escrow_host(index), member_host(id));
            }
            damage.cut_regions.push(index);
            recorder.fault(format!("{now_ms}: cut region {index} off from the cluster"));
        }
        Fault::MuteOneWay(pick) => {
            let id = target(pick);
            damage.muted = Some(id);
            for other in others(id) {
                sim.partition_oneway(member_host(id), other.as_str());
            }
            recorder.fault(format!("{now_ms}: n{id} can hear but not speak to members"));
        }
        Fault::Loss(per_mille) => {
            sim.set_fail_rate(f64::from(per_mille) / 1_000.0);
            damage.lossy = true;
            recorder.fault(format!(
                "{now_ms}: every link drops {per_mille}‰ of messages"
            ));
        }
        Fault::Delay(max_ms) => {
            sim.set_max_message_latency(Duration::from_millis(max_ms));
            damage.delayed = true;
            recorder.fault(format!("{now_ms}: every message delayed up to {max_ms} ms"));
        }
        Fault::HealAll => {
            heal(sim, shape, damage);
            recorder.fault(format!("{now_ms}: heal"));
            recorder.healed(now_ms);
        }
        Fault::PowerLoss(pick) => {
            let id = target(pick);
            power_loss(sim, faults.disks, faults.shard_disks, id);
            recorder.fault(format!("{now_ms}: power loss on n{id}"));
        }
        Fault::PowerLossAll => {
            for id in shape.member_ids() {
                power_loss(sim, faults.disks, faults.shard_disks, id);
            }
            recorder.fault(format!("{now_ms}: power loss on every member"));
        }
        Fault::RestartAll => {
            for id in shape.member_ids() {
                if !sim.is_host_running(member_host(id)) {
                    sim.bounce(member_host(id));
                }
            }
            recorder.fault(format!("{now_ms}: restart stopped members"));
            recorder.healed(now_ms);
        }
        Fault::Pause { member, for_ms } => {
            let id = target(member);
            for other in others(id) {
                sim.hold(member_host(id), other.as_str());
            }
            recorder.fault(format!("{now_ms}: pause n{id} for {for_ms} ms"));
            return Some((elapsed + Duration::from_millis(for_ms), Fault::Resume(id)));
        }
        Fault::Resume(id) => {
            for other in others(id) {
                sim.release(member_host(id), other.as_str());
            }
            recorder.fault(format!("{now_ms}: resume n{id}"));
            recorder.healed(now_ms);
        }
        Fault::QuietClients { for_ms } => {
            faults.quiet.store(true, Ordering::SeqCst);
            recorder.fault(format!("{now_ms}: clients quiet for {for_ms} ms"));
            return Some((elapsed + Duration::from_millis(for_ms), Fault::ClientsBack));
        }
        Fault::ClientsBack => {
            faults.quiet.store(false, Ordering::SeqCst);
            recorder.fault(format!("{now_ms}: clients back"));
            recorder.healed(now_ms);
        }
        Fault::Membership(action) => {
            recorder.fault(format!("{now_ms}: start {action:?}"));
            faults
                .actions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push_back(action);
        }
    }
    None
}

/// Undoes every partition and link setting recorded in `damage`.
fn heal(sim: &mut turmoil::Sim<'_>, shape: &FleetShape, damage: &mut Damage) {
    if std::mem::take(&mut damage.lossy) {
        sim.set_fail_rate(0.0);
    }
    if std::mem::take(&mut damage.delayed) {
        sim.set_max_message_latency(MAX_LATENCY);
    }
    if let Some(id) = damage.muted.take() {
        for other in shape.member_ids().filter(|m| *m != id) {
            sim.repair_oneway(member_host(id), member_host(other));
        }
    }
    for index in damage.cut_regions.drain(..) {
        for id in shape.member_ids() {
            sim.repair(escrow_host(index), member_host(id));
        }
    }
    if let Some((minority, majority)) = damage.split.take() {
        for a in &minority {
            for b in &majority {
                sim.repair(member_host(*a), member_host(*b));
            }
        }
    }
    if let Some(id) = damage.isolated.take() {
        for other in shape.member_ids().filter(|m| *m != id) {
            sim.repair(member_host(id), member_host(other));
        }
        for c in 0..shape.clients {
            sim.repair(member_host(id), load::client_host(c));
        }
    }
}
