//! Named scenarios (a fleet shape plus timed faults), running one across
//! seeds, and the report the runner prints.

use std::time::Duration;

use crate::history::History;
use crate::invariants::{check_all, hostile_probes_checked, max_ratio, utilisation, Violation};
use crate::sim::{self, Weakening, SIM_EPOCH_MS};

pub use crate::plan::{Fault, Scenario};
use crate::plan::{FleetShape, MembershipAction};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

/// Every scenario the suite knows.
pub fn all() -> Vec<Scenario> {
    let base = |name, faults| Scenario {
        name,
        shape: FleetShape::default(),
        faults,
        member_clock_offsets_ms: Vec::new(),
        member_clock_drift_ppm: Vec::new(),
        liveness_bound_ms: 5_000,
    };
    vec![
        base("healthy", vec![]),
        base(
            "leader_isolation",
            vec![(secs(3), Fault::Isolate(0)), (secs(6), Fault::HealAll)],
        ),
        base(
            "follower_isolation",
            vec![(secs(3), Fault::Isolate(3)), (secs(6), Fault::HealAll)],
        ),
        base(
            "leader_power_loss",
            vec![(secs(3), Fault::PowerLoss(0)), (secs(5), Fault::RestartAll)],
        ),
        base(
            "full_power_loss",
            vec![(secs(3), Fault::PowerLossAll), (secs(5), Fault::RestartAll)],
        ),
        base(
            "leader_one_way",
            vec![(secs(3), Fault::MuteOneWay(0)), (secs(6), Fault::HealAll)],
        ),
        base(
            "lossy_network",
            vec![(secs(3), Fault::Loss(5)), (secs(5), Fault::HealAll)],
        ),
        base(
            "leader_pause",
            vec![(
                secs(3),
                Fault::Pause {
                    member: 0,
                    for_ms: 2_000,
                },
            )],
        ),
        Scenario {
            member_clock_offsets_ms: vec![0, 250, 700],
            ..base(
                "clock_skew",
                vec![(secs(4), Fault::Isolate(0)), (secs(6), Fault::HealAll)],
            )
        },
        // Members' clocks run 3 % fast / 3 % slow; leadership moves.
        Scenario {
            member_clock_drift_ppm: vec![30_000, -30_000, 0],
            ..base(
                "clock_drift",
                vec![(secs(4), Fault::Isolate(0)), (secs(6), Fault::HealAll)],
            )
        },
        // Clients go through two regional escrow nodes.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                ..FleetShape::default()
            },
            ..base("escrow_healthy", vec![])
        },
        // Region 0's escrow node loses the cluster for 3 s, then heals.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                ..FleetShape::default()
            },
            ..base(
                "region_cut",
                vec![(secs(3), Fault::CutRegion(0)), (secs(6), Fault::HealAll)],
            )
        },
        // Escrow nodes ride out a leader power loss.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                ..FleetShape::default()
            },
            ..base(
                "escrow_leader_power_loss",
                vec![(secs(3), Fault::PowerLoss(0)), (secs(5), Fault::RestartAll)],
            )
        },
        // Escrow nodes front the key with a fair throttle (FAIR) while the
        // leader loses power: FAIR only removes admissions, Δ = 0 holds.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                fair_throttle: true,
                ..FleetShape::default()
            },
            ..base(
                "escrow_fair_throttle",
                vec![(secs(3), Fault::PowerLoss(0)), (secs(5), Fault::RestartAll)],
            )
        },
        // A `fair` key: two regions' escrow nodes share L through the
        // region fair pool while the leader loses power.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                fair: true,
                ..FleetShape::default()
            },
            ..base(
                "fair_pool_leader_power_loss",
                vec![(secs(3), Fault::PowerLoss(0)), (secs(5), Fault::RestartAll)],
            )
        },
        // A `fair` key; region 0 is cut off from the cluster and heals.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                fair: true,
                ..FleetShape::default()
            },
            ..base(
                "fair_pool_region_cut",
                vec![(secs(3), Fault::CutRegion(0)), (secs(6), Fault::HealAll)],
            )
        },
        // A `fair` key with the `fallback` outage policy: region 0 is cut off
        // and admits up to its fallback share per window; Σ stays within
        // L + regions × share, as the policy documents.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                fair: true,
                fallback_tokens_per_region: 20,
                ..FleetShape::default()
            },
            ..base(
                "fair_pool_region_cut_fallback",
                vec![(secs(3), Fault::CutRegion(0)), (secs(7), Fault::HealAll)],
            )
        },
        // A `fair` key; region 0 asks only early in each window and goes
        // quiet: its escrow node hands the unspent grant back (reclaim)
        // and region 1 takes it, while the leader loses power later on.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                fair: true,
                sparse_region_0: true,
                ..FleetShape::default()
            },
            ..base(
                "fair_pool_idle_region_reclaim",
                vec![(secs(6), Fault::PowerLoss(0)), (secs(8), Fault::RestartAll)],
            )
        },
        // A `fair` key; region 0 asks about a third of its share (a light
        // region beside a heavy one): its escrow node hands its margins
        // back late in each window, the heavy region looks for them, the
        // leader lapses the reserves in each window's last eighth — while
        // the leader loses power.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                fair: true,
                light_region_0: true,
                ..FleetShape::default()
            },
            ..base(
                "fair_pool_light_region_leader_power_loss",
                vec![(secs(4), Fault::PowerLoss(0)), (secs(6), Fault::RestartAll)],
            )
        },
        // The clients go quiet for longer than the coordinator keeps an
        // idle session (a minute) and come back: the coordinator has
        // forgotten every session of theirs, and must still admit them
        // at once — leasing directly, and behind escrow nodes of a `fair`
        // key (whose own sessions the coordinator forgot too).
        quiet_past_session_retention("clients_quiet_past_session_retention", 0),
        quiet_past_session_retention("fair_clients_quiet_past_session_retention", 2),
        // Demand below L: clients hold credits across every boundary.
        Scenario {
            shape: FleetShape {
                limit: 1_000,
                ..FleetShape::default()
            },
            ..base("light_load", vec![])
        },
        // Messages take up to 400 ms (heartbeats every 50 ms, elections
        // after 300–900 ms): leases and elections ride through slow links.
        base(
            "slow_network",
            vec![(secs(3), Fault::Delay(400)), (secs(6), Fault::HealAll)],
        ),
        // Five members; the leader and one follower are split from the
        // other three, which elect a new leader; the old one cannot commit.
        Scenario {
            shape: FleetShape {
                members: 5,
                ..FleetShape::default()
            },
            ..base(
                "five_member_split",
                vec![
                    (secs(3), Fault::SplitLeaderMinority),
                    (secs(6), Fault::HealAll),
                ],
            )
        },
        // Five members; the leader loses power, then a follower does too
        // while the first is still down (two of five down: quorum holds).
        Scenario {
            shape: FleetShape {
                members: 5,
                ..FleetShape::default()
            },
            ..base(
                "five_member_double_power_loss",
                vec![
                    (secs(3), Fault::PowerLoss(0)),
                    (secs(4), Fault::PowerLoss(2)),
                    (secs(6), Fault::RestartAll),
                ],
            )
        },
        // Three voters grow to five under load, then the leader is removed.
        Scenario {
            shape: FleetShape {
                spare_members: 2,
                ..FleetShape::default()
            },
            ..base(
                "membership_change",
                vec![
                    (secs(2), Fault::Membership(MembershipAction::JoinSpares)),
                    (secs(6), Fault::Membership(MembershipAction::RemoveVoter(0))),
                ],
            )
        },
        // The load's key moves to a new shard inside a long window (its
        // window, tombstone and floors move with it) while clients lease;
        // the window is spent after the move, so a move that forgot what
        // was granted would admit beyond L.
        shard_move("shard_move_mid_window", vec![]),
        // The same, then the meta group's leader (which may lead the new
        // shard too) loses power and every member restarts.
        shard_move(
            "shard_move_leader_power_loss",
            vec![(secs(4), Fault::PowerLoss(0)), (secs(6), Fault::RestartAll)],
        ),
        // What an operator does to a hot shard, mid-window while clients
        // lease and resend ids answered long before: split the key's shard
        // (the key moves with its window and its clients' sessions), drop
        // the new shard's leader from its replicas right after, and drop
        // its leader again later. Every resent id must be answered as it
        // first was, and the key served again within the bound after each
        // change.
        shard_operations(
            "shard_split_then_replicas",
            vec![
                (secs(2), Fault::Membership(MembershipAction::SplitKeyShard)),
                (
                    secs(2),
                    Fault::Membership(MembershipAction::DropKeyShardLeader),
                ),
                (
                    secs(7),
                    Fault::Membership(MembershipAction::DropKeyShardLeader),
                ),
            ],
        ),
        // The same split, and the leader of the new shard loses power while
        // its replicas change (the move and the change must still finish).
        shard_operations(
            "shard_split_replicas_power_loss",
            vec![
                (secs(2), Fault::Membership(MembershipAction::SplitKeyShard)),
                (
                    secs(4),
                    Fault::Membership(MembershipAction::DropKeyShardLeader),
                ),
                (secs(4), Fault::PowerLoss(0)),
                (secs(6), Fault::RestartAll),
            ],
        ),
        // The leader hands leadership off under load (admin step-down),
        // twice.
        base(
            "leader_step_down",
            vec![
                (secs(3), Fault::Membership(MembershipAction::StepDown)),
                (secs(7), Fault::Membership(MembershipAction::StepDown)),
            ],
        ),
        // Two hostile clients beside the honest ones, leasing from the
        // coordinator: ids reused with changed payloads and across
        // restarts, a session flood; the leader loses power mid-load.
        Scenario {
            shape: FleetShape {
                hostile_clients: 2,
                ..FleetShape::default()
            },
            ..base(
                "hostile_clients",
                vec![(secs(3), Fault::PowerLoss(0)), (secs(5), Fault::RestartAll)],
            )
        },
        // The same behind two regional escrow nodes, where the hostile
        // clients also give back far more than they hold (1 000 000 or
        // u64::MAX tokens) and keep acquiring; the leader loses power.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                hostile_clients: 2,
                ..FleetShape::default()
            },
            ..base(
                "hostile_escrow_clients",
                vec![(secs(3), Fault::PowerLoss(0)), (secs(5), Fault::RestartAll)],
            )
        },
        // Every member loses power and restarts inside one long window.
        Scenario {
            shape: FleetShape {
                limit: 20_000,
                window_ms: 10_000,
                ..FleetShape::default()
            },
            ..base(
                "power_loss_mid_window",
                vec![(secs(2), Fault::PowerLossAll), (secs(3), Fault::RestartAll)],
            )
        },
        // Escrow nodes lose their memory inside 10 s windows (L spent early
        // in each): node 0 crashes and restarts, node 1 drains (hands back
        // what it holds) and restarts, node 0 crashes again while the
        // leader loses power. Each new process holds nothing of the window.
        escrow_restarts("escrow_restarts_mid_window", false, false),
        escrow_restarts("fair_escrow_restarts_mid_window", true, false),
        // The same with nodes 0 and 1 serving region 0 together (node 2
        // region 2), active-active.
        escrow_restarts("fair_two_nodes_per_region_restarts", true, true),
        // Envoy's rate limit filter in front of every client: each request
        // is one ShouldRateLimit to its escrow node; the oracle sums the
        // fleet's OK answers per 1 s window.
        Scenario {
            shape: FleetShape {
                escrow_nodes: 2,
                rls: true,
                ..FleetShape::default()
            },
            ..base("rls_healthy", vec![])
        },
        // The same inside one-minute windows (L spent early in each) while
        // escrow nodes crash, drain and restart — two of them serving one
        // region — and the leader loses power.
        Scenario {
            shape: FleetShape {
                rls: true,
                window_ms: 60_000,
                ..escrow_restarts("", false, true).shape
            },
            ..escrow_restarts("rls_escrow_restarts", false, true)
        },
    ]
}

/// Escrow nodes that crash, drain and restart inside long windows (see
/// [`scenarios`]); `fair`: a `fair` key; `shared_region`: nodes 0 and 1
/// serve one region (three nodes then, else two).
fn escrow_restarts(name: &'static str, fair: bool, shared_region: bool) -> Scenario {
    Scenario {
        name,
        shape: FleetShape {
            escrow_nodes: if shared_region { 3 } else { 2 },
            second_node_in_region_0: shared_region,
            clients: 6,
            fair,
            window_ms: 10_000,
            ..FleetShape::default()
        },
        faults: vec![
            (secs(2), Fault::CrashEscrow(0)),
            (secs(3), Fault::RestartEscrow(0)),
            (secs(4), Fault::DrainEscrow(1)),
            (secs(5), Fault::RestartEscrow(1)),
            (secs(7), Fault::CrashEscrow(0)),
            (secs(7), Fault::PowerLoss(0)),
            (secs(8), Fault::RestartEscrow(0)),
            (secs(9), Fault::RestartAll),
        ],
        member_clock_offsets_ms: Vec::new(),
        member_clock_drift_ppm: Vec::new(),
        // A window spent before the faults admits nothing until it ends.
        liveness_bound_ms: 10_000,
    }
}

/// The clients busy for 30 s (every session of theirs well past its
/// opening seqs), quiet for longer than the coordinator's session
/// retention (`SESSION_MIN_RETAIN_MS`, a minute), then back for 8 s;
/// `escrow_nodes` > 0: behind that many escrow nodes of a `fair` key.
fn quiet_past_session_retention(name: &'static str, escrow_nodes: usize) -> Scenario {
    let quiet_ms = leasehold_core::coordinator::SESSION_MIN_RETAIN_MS + 5_000;
    Scenario {
        name,
        shape: FleetShape {
            escrow_nodes,
            fair: escrow_nodes > 0,
            load: secs(30 + 8) + Duration::from_millis(quiet_ms),
            ..FleetShape::default()
        },
        faults: vec![(secs(30), Fault::QuietClients { for_ms: quiet_ms })],
        member_clock_offsets_ms: Vec::new(),
        member_clock_drift_ppm: Vec::new(),
        liveness_bound_ms: 5_000,
    }
}

/// 3 000 per 10 s window; 2 s into the load the load's key moves to a
/// new shard 1 on members 1, 2 and 3; then `faults`.
fn shard_move(name: &'static str, faults: Vec<(Duration, Fault)>) -> Scenario {
    let move_key = (
        secs(2),
        Fault::Membership(MembershipAction::MoveKeyToNewShard {
            shard: 1,
            replicas: [1, 2, 3],
        }),
    );
    Scenario {
        name,
        shape: FleetShape {
            limit: 3_000,
            resend_old_ids: true,
            window_ms: 10_000,
            ..FleetShape::default()
        },
        faults: std::iter::once(move_key).chain(faults).collect(),
        member_clock_offsets_ms: Vec::new(),
        member_clock_drift_ppm: Vec::new(),
        // A window spent soon after the move admits nothing until it ends.
        liveness_bound_ms: 10_000,
    }
}

/// 3 000 per 10 s window on four members (so a shard of three can drop
/// its leader for the fourth), clients resending old ids; then `faults`
/// (shard operations among them).
fn shard_operations(name: &'static str, faults: Vec<(Duration, Fault)>) -> Scenario {
    Scenario {
        name,
        shape: FleetShape {
            members: 4,
            limit: 3_000,
            window_ms: 10_000,
            resend_old_ids: true,
            ..FleetShape::default()
        },
        faults,
        member_clock_offsets_ms: Vec::new(),
        member_clock_drift_ppm: Vec::new(),
        // A window spent soon after a change admits nothing until it ends.
        liveness_bound_ms: 10_000,
    }
}

/// `scenario` on a fleet whose keys are spread over `shards` shards at
/// setup (see [`crate::sim::shards`]); the same scenario when `shards` is 1.
pub fn with_shards(mut scenario: Scenario, shards: u32) -> Scenario {
    scenario.shape.shards = shards.max(1);
    scenario
}

/// Looks a scenario up by name.
pub fn by_name(name: &str) -> Option<Scenario> {
    all().into_iter().find(|s| s.name == name)
}

/// The result of one scenario over a range of seeds.
#[derive(Debug, Clone, Default)]
pub struct ScenarioReport {
    /// Scenario name.
    pub name: String,
    /// Seeds run.
    pub seeds: u64,
    /// (Key, window)s with at least one admission, summed over seeds.
    pub windows_checked: u64,
    /// Admissions, summed over seeds.
    pub admissions: u64,
    /// Requests sent twice whose replies were compared (exactly-once).
    pub duplicates_checked: u64,
    /// Hostile requests (retries and reused ids) whose answers were
    /// checked against their id's first request.
    pub hostile_probes_checked: u64,
    /// Sessions hostile clients opened in their floods (flood requests
    /// answered: each names a fresh client id).
    pub sessions_flooded: u64,
    /// Hostile over-returns sent to escrow nodes.
    pub over_returns: u64,
    /// Largest Σ admitted / L over every window of every seed.
    pub max_ratio: f64,
    /// Mean utilisation of the healthy stretch before the first fault.
    pub utilisation: f64,
    /// Violations with the seed that produced them.
    pub violations: Vec<(u64, Violation)>,
    /// Simulation errors with their seed.
    pub errors: Vec<(u64, String)>,
}

/// The command that replays one seed of one scenario.
pub fn replay_command(scenario: &Scenario, seed: u64) -> String {
    let shards = match scenario.shape.shards {
        0 | 1 => String::new(),
        n => format!(" --shards {n}"),
    };
    format!(
        "cargo run -p leasehold-chaos -- --scenario {}{shards} --seeds 1 --from-seed {seed}",
        scenario.name
    )
}

/// Checks one recorded run.
pub fn check(scenario: &Scenario, history: &History) -> Vec<Violation> {
    check_all(history, scenario.liveness_bound_ms)
}

impl ScenarioReport {
    /// An empty report of `seeds` runs of scenario `name`.
    pub fn new(name: &str, seeds: u64) -> Self {
        ScenarioReport {
            name: name.to_string(),
            seeds,
            ..ScenarioReport::default()
        }
    }

    /// Adds one run's history and violations; `healthy` is the stretch
    /// (epoch ms) whose utilisation is reported. Call [`finish`](Self::finish)
    /// after the last run.
    pub fn add_run(
        &mut self,
        seed: u64,
        history: &History,
        violations: Vec<Violation>,
        healthy: (u64, u64),
    ) {
        self.windows_checked += history.enforced_per_key_window().len() as u64;
        self.admissions += history.admissions.iter().map(|a| a.cost).sum::<u64>();
        self.max_ratio = self.max_ratio.max(max_ratio(history));
        self.duplicates_checked += history.replies.len() as u64 / 2;
        self.hostile_probes_checked += hostile_probes_checked(history);
        self.sessions_flooded += history
            .hostile_probes
            .iter()
            .filter(|p| {
                p.trick == crate::sim::hostile::FLOOD
                    && matches!(p.answer, crate::history::ProbeAnswer::Answered(_))
            })
            .count() as u64;
        self.over_returns += history.over_returns.len() as u64;
        self.utilisation += utilisation(history, healthy.0, healthy.1);
        self.violations
            .extend(violations.into_iter().map(|violation| (seed, violation)));
    }

    /// Adds a finished report of the same scenario (other seeds, or another
    /// fleet shape): sums, the largest ratio, and the mean utilisation
    /// over both reports' runs.
    pub fn absorb(&mut self, other: ScenarioReport) {
        let seeds = self.seeds + other.seeds;
        if seeds > 0 {
            self.utilisation = (self.utilisation * self.seeds as f64
                + other.utilisation * other.seeds as f64)
                / seeds as f64;
        }
        self.seeds = seeds;
        self.windows_checked += other.windows_checked;
        self.admissions += other.admissions;
        self.duplicates_checked += other.duplicates_checked;
        self.hostile_probes_checked += other.hostile_probes_checked;
        self.sessions_flooded += other.sessions_flooded;
        self.over_returns += other.over_returns;
        self.max_ratio = self.max_ratio.max(other.max_ratio);
        self.violations.extend(other.violations);
        self.errors.extend(other.errors);
    }

    /// Turns the summed utilisation into the mean over the runs.
    pub fn finish(&mut self) {
        self.utilisation = if self.seeds == 0 {
            0.0
        } else {
            self.utilisation / self.seeds as f64
        };
    }
}

/// Runs `scenario` for seeds `from_seed .. from_seed + seeds`.
pub fn run_seeds(
    scenario: &Scenario,
    seeds: u64,
    from_seed: u64,
    weakening: Weakening,
) -> ScenarioReport {
    let mut report = ScenarioReport::new(scenario.name, seeds);
    for seed in from_seed..from_seed + seeds {
        let outcome = sim::run(scenario, seed, weakening);
        let history = &outcome.history;
        // Healthy stretch: from 1 s into the load (setup done) to the first fault.
        let load_start =
            SIM_EPOCH_MS + u64::try_from(scenario.shape.setup_time().as_millis()).unwrap_or(0);
        let first_fault = scenario
            .faults
            .first()
            .map_or(history.load_end_ms, |(at, _)| {
                load_start + u64::try_from(at.as_millis()).unwrap_or(0)
            });
        report.add_run(
            seed,
            history,
            check(scenario, history),
            (load_start + 1_000, first_fault),
        );
        if let Some(error) = outcome.sim_error {
            report.errors.push((seed, error));
        }
    }
    report.finish();
    report
}
