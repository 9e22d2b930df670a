//! Background tasks of a member: health reporting and idle clock ticks.
//! Both end when the stop signal turns true.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::coordinator::Command;
use leasehold_raft_store::Raft;
use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use super::context::NodeContext;
use super::leader::LeaderView;

/// The health-checking name of the public coordinator service.
pub const COORDINATOR_SERVICE_NAME: &str = "leasehold.v1.Coordinator";

/// Reports `""` (the process) as serving while it runs, and
/// `leasehold.v1.Coordinator` as serving while a leader is known.
pub async fn report_health(raft: Raft, reporter: HealthReporter, mut stop: watch::Receiver<bool>) {
    reporter
        .set_service_status("", ServingStatus::Serving)
        .await;
    let mut metrics = raft.metrics();
    loop {
        let ready = ready_with(&metrics.borrow_and_update()).is_ok();
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        reporter
            .set_service_status(COORDINATOR_SERVICE_NAME, status)
            .await;
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    reporter
        .set_service_status(COORDINATOR_SERVICE_NAME, ServingStatus::NotServing)
        .await;
}

/// Whether a member with these Raft metrics is ready for callers: it
/// knows a leader (so it is initialised and not amid an election). The
/// gRPC health of `leasehold.v1.Coordinator` and the metrics port's
/// `/readyz` both answer from it.
fn ready_with(metrics: &leasehold_raft_store::RaftMetrics) -> Result<(), String> {
    match metrics.current_leader {
        Some(_) => Ok(()),
        None if metrics
            .membership_config
            .membership()
            .nodes()
            .next()
            .is_none() =>
        {
            Err(
                "not initialised (no membership yet: `leasehold cluster init`, or the \
                 cluster's first append has not reached this member)"
                    .into(),
            )
        }
        None => Err("no leader known (an election is in progress, or no quorum)".into()),
    }
}

/// [`ready_with`] of `raft`'s current metrics (`/readyz`).
pub fn readiness(raft: &Raft) -> Result<(), String> {
    ready_with(&raft.metrics().borrow())
}

/// While this member leads, proposes a [`Command::Tick`] every
/// `tick_interval_ms` so the state-machine clock advances and dead windows
/// and sessions are collected even when no requests arrive.
pub async fn tick_clock(node: Arc<NodeContext>, mut stop: watch::Receiver<bool>) {
    if node.config.tick_interval_ms == 0 {
        return;
    }
    let mut interval = tokio::time::interval(Duration::from_millis(node.config.tick_interval_ms));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        let stepping_down = node.stepping_down.load(Ordering::SeqCst);
        if LeaderView::of(&node.raft) == LeaderView::Me && !stepping_down {
            if let Err(error) = node.batcher.submit(Command::Tick).await {
                tracing::debug!(%error, "clock tick not committed");
            }
        }
    }
}
