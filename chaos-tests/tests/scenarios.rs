//! Every scenario on a fixed set of seeds keeps every promise; and the suite
//! does fail when a safety mechanism is deliberately broken.

use leasehold_chaos::history::History;
use leasehold_chaos::scenario::{self, replay_command, run_seeds, Scenario, ScenarioReport};
use leasehold_chaos::sim::{self, Weakening, SIM_EPOCH_MS};

const SEEDS: u64 = 2;
/// The shards of the fleet [`assert_holds`] runs its second seed on.
const SHARDS: u32 = 4;

fn assert_scenario_holds(name: &str) -> ScenarioReport {
    let scenario = scenario::by_name(name).expect("known scenario");
    assert_holds(&scenario)
}

/// Runs seed 1 on the fleet as `scenario` shapes it and seed 2 with its
/// keys spread over [`SHARDS`] shards (the load's key on the last, whose
/// leader the leader faults hit), and checks every promise on both.
fn assert_holds(scenario: &Scenario) -> ScenarioReport {
    let name = scenario.name;
    let sharded = scenario::with_shards(scenario.clone(), SHARDS);
    let mut report = ScenarioReport::new(name, 0);
    let mut problems = Vec::new();
    for (run, seed) in [(scenario, 1), (&sharded, 2)] {
        let one = run_seeds(run, 1, seed, Weakening::None);
        problems.extend(
            one.violations
                .iter()
                .map(|(seed, v)| {
                    format!(
                        "{}: {} (replay: {})",
                        v.invariant,
                        v.detail,
                        replay_command(run, *seed)
                    )
                })
                .chain(one.errors.iter().map(|(seed, e)| {
                    format!(
                        "simulation error {e} (replay: {})",
                        replay_command(run, *seed)
                    )
                })),
        );
        report.absorb(one);
    }
    assert!(problems.is_empty(), "{name}:\n{}", problems.join("\n"));
    assert!(report.admissions > 0, "{name}: no admission at all");
    if scenario.shape.escrow_nodes == 0 {
        assert!(
            report.duplicates_checked > 0,
            "{name}: no duplicated request to check exactly-once on"
        );
    }
    let bound = 1.0
        + scenario.shape.fallback_tokens_per_region as f64 * scenario.shape.escrow_nodes as f64
            / scenario.shape.limit as f64;
    assert!(
        report.max_ratio <= bound,
        "{name}: max ratio {} > {bound}",
        report.max_ratio
    );
    // With FAIR on, every simulated caller is heavy (demand ≫ L), so the
    // throttle deliberately holds them below L: no utilisation bound.
    if scenario.shape.limit <= 200 && !scenario.shape.fair_throttle {
        // Saturating load: the healthy stretch uses (nearly) all of L. A
        // sparse region leaves its reserve unused until its node releases
        // it, after `pool_release_idle_ms` of quiet, in every window.
        let floor = if scenario.shape.sparse_region_0 {
            0.8
        } else {
            0.9
        };
        assert!(
            report.utilisation >= floor,
            "{name}: utilisation {}",
            report.utilisation
        );
    }
    report
}

macro_rules! scenario_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                assert_scenario_holds(stringify!($name));
            }
        )*
    };
}

scenario_tests!(
    healthy,
    leader_isolation,
    follower_isolation,
    leader_one_way,
    lossy_network,
    leader_power_loss,
    full_power_loss,
    leader_pause,
    clock_skew,
    clock_drift,
    light_load,
    power_loss_mid_window,
    escrow_healthy,
    region_cut,
    escrow_leader_power_loss,
    escrow_fair_throttle,
    slow_network,
    five_member_split,
    five_member_double_power_loss,
    membership_change,
    leader_step_down,
    shard_move_mid_window,
    shard_move_leader_power_loss,
    shard_split_then_replicas,
    shard_split_replicas_power_loss,
    fair_pool_leader_power_loss,
    fair_pool_region_cut,
    rls_healthy,
    clients_quiet_past_session_retention,
    fair_clients_quiet_past_session_retention,
);

/// Tokens admitted per window start by the clients of escrow node `region`
/// (client `c` uses node `c % escrow_nodes`).
fn admitted_by_region(history: &History, escrow_nodes: usize, region: usize) -> Vec<(u64, u64)> {
    let mut per_window = std::collections::BTreeMap::new();
    for a in history
        .admissions
        .iter()
        .filter(|a| a.client % escrow_nodes == region)
    {
        *per_window.entry(a.window_start_ms).or_insert(0) += a.cost;
    }
    per_window.into_iter().collect()
}

/// Over the healthy stretch (from 1 s into the load to the first fault):
/// the mean of region 1's admissions per window over what region 0 left
/// of L, and the mean of both regions' admissions over L.
fn busy_region_use(scenario: &Scenario, seed: u64) -> (f64, f64) {
    let history = sim::run(scenario, seed, Weakening::None).history;
    let load_start = SIM_EPOCH_MS + 3_000;
    let first_fault = load_start + scenario.faults[0].0.as_millis() as u64;
    let window_ms = scenario.shape.window_ms;
    let limit = scenario.shape.limit as f64;
    let quiet: std::collections::BTreeMap<u64, u64> =
        admitted_by_region(&history, scenario.shape.escrow_nodes, 0)
            .into_iter()
            .collect();
    let healthy: Vec<(f64, f64)> = admitted_by_region(&history, scenario.shape.escrow_nodes, 1)
        .into_iter()
        .filter(|(start, _)| *start >= load_start + 1_000 && start + window_ms <= first_fault)
        .map(|(start, busy)| {
            let quiet = quiet.get(&start).copied().unwrap_or(0) as f64;
            let busy = busy as f64;
            (busy / (limit - quiet).max(1.0), (busy + quiet) / limit)
        })
        .collect();
    assert!(healthy.len() >= 3, "only {} healthy windows", healthy.len());
    let n = healthy.len() as f64;
    (
        healthy.iter().map(|(left, _)| left).sum::<f64>() / n,
        healthy.iter().map(|(_, used)| used).sum::<f64>() / n,
    )
}

/// Region 0 joins each window's pool, takes a little and falls silent;
/// its escrow node hands the rest back, so region 1 (saturating) gets
/// what region 0 leaves of L and the window is used. With reclaim off,
/// the idle region's reserve strands part of it: the same run gets less.
#[test]
fn fair_pool_idle_region_reclaim() {
    let mut scenario = scenario::by_name("fair_pool_idle_region_reclaim").expect("known scenario");
    assert_holds(&scenario);
    // The effect is a point or two of L against a seed-to-seed spread of
    // about two: it shows over a dozen seeds, not two (where one run's
    // scheduling can hide it).
    const RECLAIM_SEEDS: u64 = 12;
    let mean = |scenario: &Scenario| {
        let runs: Vec<(f64, f64)> = (1..=RECLAIM_SEEDS)
            .map(|seed| busy_region_use(scenario, seed))
            .collect();
        let n = runs.len() as f64;
        (
            runs.iter().map(|(left, _)| left).sum::<f64>() / n,
            runs.iter().map(|(_, used)| used).sum::<f64>() / n,
        )
    };
    let (left_with, used_with) = mean(&scenario);
    scenario.shape.pool_release_idle_ms = 0;
    let (left_without, used_without) = mean(&scenario);
    eprintln!(
        "busy region's share of what the quiet one left: {left_with:.3} with reclaim, \
         {left_without:.3} without; windows used {used_with:.3} / {used_without:.3}"
    );
    // Without reclaim the busy region gets its guarantee, more once the
    // demand split weighs the quiet region by the little it asks, and the
    // reserve the quiet region does not use once the busy region's look
    // after the late check lapses it (a look every region at its ceiling
    // makes while it has not joined the next window ahead); the rest is
    // stranded. With reclaim the busy region takes more of it: over seeds
    // 1–12, 0.981 of what the quiet region left (windows used 0.985),
    // against 0.971 without (0.976).
    assert!(
        left_with >= 0.97 && used_with >= 0.97 && left_with - left_without >= 0.005,
        "busy region's share of what the quiet one left: {left_with:.3} with reclaim, \
         {left_without:.3} without; windows used {used_with:.3} / {used_without:.3}"
    );
}

/// Region 0 asks about a third of its share beside a saturating region 1:
/// before the leader loses power, region 1 takes what region 0 leaves of
/// L — region 0's node hands its margins back late in each window, region
/// 1's looks for them, the leader lapses the reserves in the last eighth —
/// and Σ ≤ L per window throughout.
#[test]
fn fair_pool_light_region_leader_power_loss() {
    let scenario =
        scenario::by_name("fair_pool_light_region_leader_power_loss").expect("known scenario");
    assert_holds(&scenario);
    let runs: Vec<(f64, f64)> = (1..=SEEDS)
        .map(|seed| busy_region_use(&scenario, seed))
        .collect();
    let n = runs.len() as f64;
    let left = runs.iter().map(|(left, _)| left).sum::<f64>() / n;
    let used = runs.iter().map(|(_, used)| used).sum::<f64>() / n;
    eprintln!("heavy region's share of what the light one left: {left:.3}; windows used {used:.3}");
    assert!(
        left >= 0.97 && used >= 0.97,
        "heavy region's share of what the light one left: {left:.3}; windows used {used:.3}"
    );
}

/// Region 0 of a `fallback` key is cut off from the cluster: in the
/// windows wholly inside the cut (after the first, whose credits it may
/// still hold) it admits something, and never more than its share.
#[test]
fn fair_pool_region_cut_fallback() {
    let scenario = scenario::by_name("fair_pool_region_cut_fallback").expect("known scenario");
    assert_holds(&scenario);
    let history = sim::run(&scenario, 1, Weakening::None).history;
    let load_start =
        SIM_EPOCH_MS + u64::try_from(scenario.shape.setup_time().as_millis()).unwrap_or(0);
    let cut = load_start + scenario.faults[0].0.as_millis() as u64;
    let heal = load_start + scenario.faults[1].0.as_millis() as u64;
    let window_ms = scenario.shape.window_ms;
    let inside: Vec<(u64, u64)> = admitted_by_region(&history, scenario.shape.escrow_nodes, 0)
        .into_iter()
        .filter(|(start, _)| *start >= cut + window_ms && start + window_ms <= heal)
        .collect();
    let share = scenario.shape.fallback_tokens_per_region;
    assert!(!inside.is_empty(), "no window lies wholly inside the cut");
    for (start, admitted) in &inside {
        assert!(
            *admitted <= share,
            "window {start}: cut region admitted {admitted} > {share}"
        );
    }
    assert!(inside.iter().any(|(_, admitted)| *admitted > 0));
}

/// Hostile clients did every trick and were checked: reused ids got
/// answers to compare, sessions were flooded, and (behind escrow nodes)
/// over-returns were sent.
fn assert_hostile_tricks_were_played(name: &str, report: &ScenarioReport) {
    let scenario = scenario::by_name(name).expect("known scenario");
    assert!(
        report.hostile_probes_checked > 0,
        "{name}: no reused request id was answered to check"
    );
    assert!(report.sessions_flooded > 0, "{name}: no session flood");
    if scenario.shape.escrow_nodes > 0 {
        assert!(report.over_returns > 0, "{name}: no over-return sent");
    }
}

/// Request ids reused with changed payloads and across restarts, and a
/// session flood, against the coordinator through a leader power loss.
#[test]
fn hostile_clients() {
    let report = assert_scenario_holds("hostile_clients");
    assert_hostile_tricks_were_played("hostile_clients", &report);
}

/// Hostile clients behind escrow nodes give back 1 000 000 or `u64::MAX`
/// tokens after acquiring 1. This holds only once an escrow node caps a
/// Return at what the caller holds (DESIGN §7a); an escrow node that adds
/// whatever comes back to its balance fails it with `hostile` (accepted
/// more than held) and `delta` (Σ/L up to 8) violations.
#[test]
fn hostile_escrow_clients_over_returns_are_capped_at_what_was_held() {
    let report = assert_scenario_holds("hostile_escrow_clients");
    assert_hostile_tricks_were_played("hostile_escrow_clients", &report);
}

#[test]
fn every_scenario_has_a_test() {
    let tested = [
        "healthy",
        "leader_isolation",
        "follower_isolation",
        "leader_one_way",
        "lossy_network",
        "leader_power_loss",
        "full_power_loss",
        "leader_pause",
        "clock_skew",
        "clock_drift",
        "light_load",
        "power_loss_mid_window",
        "escrow_healthy",
        "region_cut",
        "escrow_leader_power_loss",
        "escrow_fair_throttle",
        "slow_network",
        "five_member_split",
        "five_member_double_power_loss",
        "membership_change",
        "leader_step_down",
        "shard_move_mid_window",
        "shard_move_leader_power_loss",
        "shard_split_then_replicas",
        "shard_split_replicas_power_loss",
        "fair_pool_leader_power_loss",
        "fair_pool_region_cut",
        "fair_pool_region_cut_fallback",
        "fair_pool_idle_region_reclaim",
        "fair_pool_light_region_leader_power_loss",
        "hostile_clients",
        "hostile_escrow_clients",
        "escrow_restarts_mid_window",
        "fair_escrow_restarts_mid_window",
        "fair_two_nodes_per_region_restarts",
        "rls_healthy",
        "rls_escrow_restarts",
        "clients_quiet_past_session_retention",
        "fair_clients_quiet_past_session_retention",
    ];
    for s in scenario::all() {
        assert!(tested.contains(&s.name), "scenario {} has no test", s.name);
    }
}

/// Escrow nodes that lose their memory inside 10 s windows (crash, drain,
/// restart, with the leader's power loss), counter and fair keys, and two
/// nodes serving one region: Σ ≤ L per window over every process. (The
/// windows are spent before the faults, so there is no utilisation floor.)
fn assert_restarts_hold(name: &str) {
    let scenario = scenario::by_name(name).expect("known scenario");
    let report = run_seeds(&scenario, SEEDS, 1, Weakening::None);
    assert!(
        report.violations.is_empty() && report.errors.is_empty(),
        "{name}: {:?} {:?}",
        report.violations,
        report.errors
    );
    assert!(report.admissions > 0, "{name}: no admission at all");
    assert!(
        report.max_ratio <= 1.0,
        "{name}: max ratio {}",
        report.max_ratio
    );
    assert!(
        report.max_ratio >= 0.9,
        "{name}: the load spent only {} of L in a window: a double spend would not show",
        report.max_ratio
    );
}

#[test]
fn escrow_restarts_mid_window() {
    assert_restarts_hold("escrow_restarts_mid_window");
}

#[test]
fn fair_escrow_restarts_mid_window() {
    assert_restarts_hold("fair_escrow_restarts_mid_window");
}

#[test]
fn fair_two_nodes_per_region_restarts() {
    assert_restarts_hold("fair_two_nodes_per_region_restarts");
}

/// Envoy's filter behind every client: Σ OK answers ≤ L per one-minute
/// window across the fleet while escrow nodes crash, drain and restart.
#[test]
fn rls_escrow_restarts() {
    assert_restarts_hold("rls_escrow_restarts");
}

/// Bug found by the 100-seed run: a step-down abandoned by its caller (the
/// client's 1 s attempt deadline is shorter than the election) left the old
/// leader with heartbeats and its election timer off, and the next
/// step-down never completed. Node test:
/// `safety::a_step_down_abandoned_by_its_caller_still_completes`.
#[test]
fn regression_abandoned_step_down_wedged_the_member_seed_1071() {
    let scenario = scenario::by_name("leader_step_down").expect("known scenario");
    let report = run_seeds(&scenario, 1, 1071, Weakening::None);
    assert!(
        report.violations.is_empty() && report.errors.is_empty(),
        "{:?} {:?}",
        report.violations,
        report.errors
    );
    assert!(report.admissions > 0);
}

#[test]
fn credits_outliving_their_window_are_caught() {
    let scenario = scenario::by_name("light_load").expect("known scenario");
    let report = run_seeds(&scenario, 1, 1, Weakening::CreditsOutliveWindow);
    assert!(
        report
            .violations
            .iter()
            .any(|(_, v)| v.invariant == "credits_die_with_window"),
        "the suite missed credits spent after their window: {:?}",
        report.violations.first()
    );
}

#[test]
fn acknowledging_before_durable_is_caught() {
    let scenario = scenario::by_name("power_loss_mid_window").expect("known scenario");
    let report = run_seeds(&scenario, 4, 1, Weakening::AcknowledgeBeforeDurable);
    assert!(
        report
            .violations
            .iter()
            .any(|(_, v)| v.invariant == "no_forgotten_grant" || v.invariant == "delta"),
        "the suite missed grants lost by a disk that acknowledges before it is durable"
    );
}

/// A seed is a replay: network, clients and openraft's election timeouts
/// are all drawn from it, so two runs record the same history (until the
/// load ends; the control host's last reads after it are not compared).
#[test]
fn one_seed_replays_the_same_history() {
    for (name, seed) in [
        ("leader_isolation", 11),
        ("full_power_loss", 3),
        ("clock_drift", 5),
        ("membership_change", 2),
    ] {
        let scenario = scenario::by_name(name).expect("known scenario");
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let mut history =
                    leasehold_chaos::sim::run(&scenario, seed, Weakening::None).history;
                let end = history.load_end_ms;
                history.observations.retain(|o| o.read_at_ms < end);
                history
            })
            .collect();
        let (a, b) = (&runs[0], &runs[1]);
        assert!(!a.admissions.is_empty());
        let diverged = a
            .admissions
            .iter()
            .zip(&b.admissions)
            .position(|(x, y)| x != y);
        assert!(
            diverged.is_none() && a.admissions.len() == b.admissions.len(),
            "{name}: admissions diverge at {diverged:?} ({} vs {})",
            a.admissions.len(),
            b.admissions.len(),
        );
        let diverged = a
            .observations
            .iter()
            .zip(&b.observations)
            .position(|(x, y)| x != y);
        assert!(
            diverged.is_none(),
            "{name}: observations diverge at {diverged:?}: {:?}",
            diverged.map(|i| (a.observations[i], b.observations[i]))
        );
        assert!(a == b, "{name}: the histories differ");
    }
}
