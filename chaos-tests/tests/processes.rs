//! The runner's process mode against the real `leasehold` binary built by
//! this workspace: faults on real processes, the same invariants.

use std::time::Duration;

use leasehold_chaos::processes::{self, ProcessOptions, ProcessOutcome};
use leasehold_chaos::sim::Weakening;

fn options() -> ProcessOptions {
    let binary = processes::sibling_binary()
        .expect("the leasehold binary next to the test executable (cargo build -p leasehold-node)");
    let mut options = ProcessOptions::new(binary);
    options.load = Duration::from_secs(9);
    options
}

async fn run(name: &str, options: &ProcessOptions) -> ProcessOutcome {
    let scenario = processes::scenario_by_name(name).expect("scenario");
    processes::run(&scenario, options, 7)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

fn assert_held(name: &str, outcome: &ProcessOutcome, faults: usize) {
    let history = &outcome.history;
    assert!(
        outcome.violations.is_empty(),
        "{name}: {:?}\nfaults: {:?}",
        outcome.violations,
        history.faults
    );
    assert_eq!(history.faults.len(), faults, "{name}: {:?}", history.faults);
    assert!(history.healed_at_ms.is_some());
    // Load ran on both sides of the faults, and the cluster was read.
    let windows = history.admitted_per_window();
    assert!(windows.len() >= 6, "{name}: only {} windows", windows.len());
    assert!(!history.observations.is_empty());
    assert!(!history.acked_grants.is_empty());
    let healed = history.healed_at_ms.unwrap_or(0);
    assert!(history.admissions.iter().any(|a| a.at_ms > healed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill9_and_restart_keep_every_invariant() {
    let outcome = run("leader_kill9", &options()).await;
    assert_held("leader_kill9", &outcome, 2);
}

/// The same faults with the keys spread over four shards (the load's key
/// on shard 3): the meta group's leader is killed while the key's shard
/// (whose first leader is another member) serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill9_with_four_shards_keeps_every_invariant() {
    let mut options = options();
    options.shards = 4;
    let outcome = run("leader_kill9", &options).await;
    assert_held("leader_kill9", &outcome, 2);
}

/// An operator's shard changes against real processes (four members):
/// the key's shard split, its new leader dropped from its replicas right
/// after and again later, while clients resend ids answered long before;
/// every change is served again within the bound and every resent id is
/// answered as it first was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_splits_and_replica_changes_keep_every_invariant() {
    let outcome = run("shard_split_then_replicas", &options()).await;
    // The split and two replica changes, each logged when made and when
    // served again (the replica changes also log the change made).
    assert_held("shard_split_then_replicas", &outcome, 5);
    assert!(
        outcome.history.replies.len() > 2,
        "resent ids were compared: {}",
        outcome.history.replies.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escrow_node_and_leader_kill9_keep_every_invariant() {
    let outcome = run("escrow_kill9", &options()).await;
    assert_held("escrow_kill9", &outcome, 4);
}

/// Credits that outlive their window, against real processes, are caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_outliving_their_window_are_caught_against_real_processes() {
    let mut options = options();
    options.load = Duration::from_secs(5);
    // Demand well under L: clients still hold credits at each boundary.
    options.limit = 20_000;
    options.client_pause_ms = (20, 40);
    options.weakening = Weakening::CreditsOutliveWindow;
    let outcome = run("healthy", &options).await;
    assert!(
        outcome
            .violations
            .iter()
            .any(|v| v.invariant == "credits_die_with_window"),
        "{:?}",
        outcome.violations
    );
}

/// A `fair` key (L = 200 in a 30 s window, demand far above it) under
/// escrow nodes that lose their memory inside the window: `kill -9`,
/// `SIGTERM`, `SIGSTOP` / `SIGCONT`, two nodes serving one region, and an
/// escrow node killed with the leader. Σ admitted ≤ L over every process,
/// though each new process would find its region's grant in the pool.
async fn fair_scenario(name: &str, faults: usize) {
    fair_scenario_with(name, faults, 0).await;
}

/// [`fair_scenario`] with `link_delay_ms` each way into every member.
async fn fair_scenario_with(name: &str, faults: usize, link_delay_ms: u64) {
    let mut options = options();
    options.limit = 200;
    options.load = Duration::from_secs(10);
    options.link_delay_ms = link_delay_ms;
    let outcome = run(name, &options).await;
    let history = &outcome.history;
    assert!(
        outcome.violations.is_empty(),
        "{name}: {:?}\nfaults: {:?}",
        outcome.violations,
        history.faults
    );
    assert_eq!(history.faults.len(), faults, "{name}: {:?}", history.faults);
    let windows = history.admitted_per_window();
    let spent = windows.values().copied().max().unwrap_or(0);
    assert!(
        spent >= options.limit / 2,
        "{name}: the load spent only {spent} of a window ({windows:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_key_escrow_kill9_inside_a_window_admits_at_most_l() {
    fair_scenario("fair_escrow_kill9", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_key_escrow_sigterm_inside_a_window_admits_at_most_l() {
    fair_scenario("fair_escrow_sigterm", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_key_escrow_sigstop_inside_a_window_admits_at_most_l() {
    fair_scenario("fair_escrow_sigstop", 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_key_two_escrow_nodes_per_region_that_fail_admit_at_most_l() {
    fair_scenario("fair_two_escrows_per_region", 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_key_escrow_and_leader_kill9_admit_at_most_l() {
    fair_scenario("fair_escrow_and_leader_kill9", 4).await;
}

/// Region 0 is served by two escrow nodes and one of them is killed for
/// good under load below L: the region's callers (clients 0, 2, 4, each
/// over both nodes) keep being admitted through the other, and the longest
/// pause of their admissions around the kill stays short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_two_escrow_nodes_of_a_region_keeps_its_callers_admitted() {
    let mut options = options();
    options.limit = 50_000;
    options.clients = 6;
    options.client_pause_ms = (5, 15);
    options.load = Duration::from_secs(8);
    let outcome = run("fair_region_failover", &options).await;
    let history = &outcome.history;
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    let killed_at: u64 = history.faults[0]
        .split(':')
        .next()
        .and_then(|at| at.parse().ok())
        .expect("the fault's time");
    // Each of region 0's callers, whichever node it started on.
    let mut longest = 0;
    for client in [0, 2, 4] {
        let mut at: Vec<u64> = history
            .admissions
            .iter()
            .filter(|a| a.client == client)
            .map(|a| a.at_ms)
            .collect();
        at.sort_unstable();
        let after = at.iter().filter(|t| **t > killed_at + 500).count();
        assert!(
            after > 20,
            "client {client} admitted only {after} after the kill"
        );
        let gap = at
            .windows(2)
            .filter(|pair| pair[1] > killed_at.saturating_sub(1_000))
            .map(|pair| pair[1] - pair[0])
            .max()
            .unwrap_or(u64::MAX);
        assert!(gap < 3_000, "client {client} paused {gap} ms");
        longest = longest.max(gap);
    }
    println!("longest pause of a region-0 caller around the kill: {longest} ms");
}

/// The same with 100 ms of round trip between every region and the
/// cluster and between the members (a delaying proxy in front of each
/// member): the late-window hand-backs and joins ahead run at real
/// distances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_key_escrow_kill9_at_100_ms_between_regions_admits_at_most_l() {
    fair_scenario_with("fair_escrow_kill9", 2, 50).await;
}

/// Hostile peers on mutual TLS, interleaved with a membership change, a
/// leader kill and a step-down (the `hostile_peers` scenario): every
/// forged Raft message — from a retired member's certificate, a
/// stranger's, an impostor's, at a joining member too, at any term — is
/// refused; stalled handshakes from another address and a holder flood at
/// an escrow node hold up no legitimate client; Σ admitted per window
/// (the flooder's grants included) stays ≤ L and admissions resume after
/// every fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers_among_the_usual_faults_keep_every_invariant() {
    use leasehold_chaos::history::PeerAnswer;
    let outcome = run("hostile_peers", &options()).await;
    let history = &outcome.history;
    assert!(
        outcome.violations.is_empty(),
        "{:?}\nfaults: {:?}",
        outcome.violations,
        history.faults
    );
    // Three rounds of forgeries reached running members and were refused
    // (the retired member's among them), none accepted.
    let refused = |kind: &str| {
        history
            .peer_probes
            .iter()
            .filter(|p| p.from.contains(kind))
            .filter(|p| {
                matches!(
                    p.answer,
                    PeerAnswer::Refused { .. } | PeerAnswer::ConnectionRefused
                )
            })
            .count()
    };
    for kind in ["retired", "stranger", "impostor"] {
        assert!(
            refused(kind) > 0,
            "no {kind} forgery was answered: {:?}",
            history.faults
        );
    }
    assert!(history.peer_probes.iter().any(|p| p.answer
        == PeerAnswer::Refused {
            code: "PermissionDenied".into(),
            reason: "MEMBER_RETIRED".into()
        }));
    // The flood ran into its bound, and its grants count in Δ.
    let flood = history
        .faults
        .iter()
        .find(|f| f.contains("holder flood"))
        .expect("the flood's report");
    let refused_flood: u64 = flood
        .split(", ")
        .find_map(|part| part.strip_suffix(" refused RESOURCE_EXHAUSTED"))
        .and_then(|n| n.parse().ok())
        .expect("refusal count");
    assert!(refused_flood > 0, "{flood}");
    // The legitimate clients were admitted on both sides of the faults
    // (liveness after the last heal is the `liveness` invariant's).
    let legitimate = |a: &&leasehold_chaos::history::Admission| {
        a.client < leasehold_chaos::history::HOSTILE_CLIENT_BASE
    };
    let first_fault = outcome.load_start_ms + 500;
    assert!(history
        .admissions
        .iter()
        .filter(legitimate)
        .any(|a| a.at_ms < first_fault));
    let restarted = outcome.load_start_ms + 5_500;
    assert!(history
        .admissions
        .iter()
        .filter(legitimate)
        .any(|a| a.at_ms > restarted));
}

/// A quorum lost for good under load (docs/operations.md, "Losing a quorum
/// for good"): a follower falls behind, the two others grant on into a
/// window it never hears of and are lost with their data; the survivor is
/// forced into a new cluster by the binary, serves again and grows back
/// with a new member. Σ admitted per window across the old cluster and
/// the new one stays ≤ L (the seal), admissions resume after it, and the
/// new member joins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_lost_for_good_is_recovered_by_force_keeping_every_invariant() {
    let mut options = options();
    options.load = Duration::from_secs(18);
    let outcome = run("force_new_cluster", &options).await;
    let history = &outcome.history;
    assert!(
        outcome.violations.is_empty(),
        "{:?}\nfaults: {:?}",
        outcome.violations,
        history.faults
    );
    let sealed = history
        .forgotten_before_ms
        .expect("the survivor was forced into a new cluster");
    assert!(
        history
            .admissions
            .iter()
            .any(|a| a.window_start_ms >= sealed),
        "no admission after the seal: {:?}",
        history.faults
    );
    assert!(
        history.faults.iter().any(|f| f.contains("joins: voters")),
        "{:?}",
        history.faults
    );
}
