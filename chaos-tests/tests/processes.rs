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
