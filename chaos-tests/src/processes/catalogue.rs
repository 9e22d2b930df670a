//! The process scenarios: what each inflicts on real `leasehold`
//! processes ([`ProcessFault`]) and when, with the options a scenario
//! changes ([`ProcessScenario::options`]).

use std::time::Duration;

use super::ProcessOptions;

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
