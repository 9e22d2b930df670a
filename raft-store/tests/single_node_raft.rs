//! A real openraft member on the store: proposals, snapshot-driven log
//! compaction, then power loss and restart on the same simulated disk. Every
//! acknowledged proposal is still reflected after the restart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::coordinator::{Command, Proposal};
use leasehold_raft_store::{open_with_engine, LogStore, NodeId, PowerLossDisk, Raft, StateReader};
use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Config, SnapshotPolicy};

mod support;
use support::NoPeers;

const NODE: NodeId = 1;
const WAIT: Option<Duration> = Some(Duration::from_secs(10));

async fn start(disk: &PowerLossDisk) -> anyhow::Result<(Raft, StateReader, LogStore)> {
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(4),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..Default::default()
    }
    .validate()?;
    let (log_store, state_machine) = open_with_engine(disk.open_engine())?;
    let reader = state_machine.reader();
    let raft = Raft::new(
        NODE,
        Arc::new(config),
        NoPeers,
        log_store.clone(),
        state_machine,
    )
    .await?;
    Ok((raft, reader, log_store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_proposals_survive_power_loss_and_restart() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (raft, reader, _log) = start(&disk).await?;
    raft.initialize(BTreeMap::from([(NODE, BasicNode::default())]))
        .await?;
    raft.wait(WAIT).current_leader(NODE, "elected").await?;

    let mut last_acknowledged = None;
    for stamp_ms in 1..=10 {
        let proposal = Proposal {
            stamp_ms,
            commands: vec![Command::Tick],
        };
        let response = raft.client_write(proposal.into()).await?;
        assert_eq!(response.data.outcomes.len(), 1, "one outcome per command");
        last_acknowledged = Some(response.log_id);
    }
    let last_acknowledged = last_acknowledged.expect("ten proposals were written");
    raft.wait(WAIT)
        .metrics(
            |m| m.snapshot.is_some() && m.purged.is_some(),
            "snapshot built and log purged",
        )
        .await?;
    let state_before = reader.read(|state| state.clone());
    // The state-machine clock is the largest stamp applied (contract of `Proposal`).
    assert_eq!(state_before.now_ms(), 10);
    assert!(reader.last_applied() >= Some(last_acknowledged));

    disk.crash();
    let _ = raft.shutdown().await;

    let (raft, reader, mut log) = start(&disk).await?;
    assert!(
        log.get_log_state().await?.last_purged_log_id.is_some(),
        "compaction survived"
    );
    raft.wait(WAIT).current_leader(NODE, "re-elected").await?;
    raft.wait(WAIT)
        .applied_index_at_least(Some(last_acknowledged.index), "replayed")
        .await?;
    assert_eq!(reader.read(|state| state.clone()), state_before);
    raft.shutdown().await?;
    Ok(())
}
