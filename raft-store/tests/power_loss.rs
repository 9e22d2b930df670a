//! Power loss on a simulated disk: what the store acknowledged survives a
//! crash, what it did not may vanish, and the weakened disk visibly breaks
//! that promise.

mod support;

use std::collections::BTreeMap;

use leasehold_raft_store::{
    open_with, open_with_engine, Entry, FlushMode, LogStore, PowerLossDisk, PowerLossOptions,
    StateMachineStore, Vote,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use proptest::prelude::*;
use support::{entries, log_id, proposal_entry};

fn open(disk: &PowerLossDisk) -> (LogStore, StateMachineStore) {
    open_with_engine(disk.open_engine()).expect("open the simulated disk")
}

#[tokio::test]
async fn acknowledged_appends_survive_a_crash_and_unflushed_writes_vanish() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (mut log, mut sm) = open(&disk);
    log.blocking_append(entries(1, 5)).await?;
    // Neither the committed hint nor applying (without a snapshot) flushes.
    log.save_committed(Some(log_id(1, 5))).await?;
    sm.apply(entries(1, 5)).await?;
    assert!(disk.volatile_writes() > 0);

    disk.crash();
    assert!(
        log.read_vote().await.is_err(),
        "handles from before the crash are fenced"
    );
    let (mut log, mut sm) = open(&disk);
    assert_eq!(log.try_get_log_entries(0..).await?, entries(1, 5));
    assert_eq!(log.read_committed().await?, None);
    assert_eq!(
        sm.applied_state().await?.0,
        None,
        "state machine rebuilds from the log"
    );
    Ok(())
}

#[tokio::test]
async fn a_built_snapshot_survives_a_crash() -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let (mut log, mut sm) = open(&disk);
    log.blocking_append(entries(1, 4)).await?;
    sm.apply(entries(1, 4)).await?;
    let built = sm.get_snapshot_builder().await.build_snapshot().await?;
    let state = sm.read(|state| state.clone());

    disk.crash();
    let (_log, mut sm) = open(&disk);
    let current = sm.get_current_snapshot().await?.expect("snapshot survived");
    assert_eq!(current.meta, built.meta);
    assert_eq!(sm.last_applied(), Some(log_id(1, 4)));
    assert_eq!(sm.read(|restored| restored.clone()), state);
    Ok(())
}

#[tokio::test]
async fn weakened_disk_loses_appends_whose_callback_already_fired() -> anyhow::Result<()> {
    let disk = PowerLossDisk::with_options(PowerLossOptions {
        acknowledge_before_durable: true,
    });
    let (mut log, _sm) = open(&disk);
    // `blocking_append` returns only after the LogFlushed callback fired.
    log.blocking_append(entries(1, 3)).await?;
    disk.crash();
    let (mut log, _sm) = open(&disk);
    assert_eq!(
        log.get_log_state().await?.last_log_id,
        None,
        "acknowledged entries were lost"
    );
    Ok(())
}

/// One acknowledged operation on the log store (or a crash).
#[derive(Debug, Clone)]
enum Operation {
    Append(u64),
    SaveVote,
    /// Truncate at a point chosen as a fraction (per mille) of the live log.
    Truncate(u64),
    /// Purge up to a point chosen as a fraction (per mille) of the live log.
    Purge(u64),
    Crash,
}

fn operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        4 => (1u64..4).prop_map(Operation::Append),
        1 => Just(Operation::SaveVote),
        1 => (0u64..1000).prop_map(Operation::Truncate),
        1 => (0u64..1000).prop_map(Operation::Purge),
        2 => Just(Operation::Crash),
    ]
}

/// What the store has acknowledged.
#[derive(Debug, Default)]
struct Acknowledged {
    log: BTreeMap<u64, Entry>,
    last_purged: Option<u64>,
    vote_term: Option<u64>,
}

impl Acknowledged {
    fn next_index(&self) -> u64 {
        self.log
            .keys()
            .next_back()
            .copied()
            .or(self.last_purged)
            .map_or(1, |last| last + 1)
    }
}

async fn assert_store_holds(log: &mut LogStore, acked: &Acknowledged) -> anyhow::Result<()> {
    let expected: Vec<Entry> = acked.log.values().cloned().collect();
    anyhow::ensure!(
        log.try_get_log_entries(0..).await? == expected,
        "log differs"
    );
    let state = log.get_log_state().await?;
    anyhow::ensure!(state.last_purged_log_id == acked.last_purged.map(|i| log_id(1, i)));
    let last = acked.log.keys().next_back().copied().or(acked.last_purged);
    anyhow::ensure!(state.last_log_id == last.map(|i| log_id(1, i)));
    anyhow::ensure!(log.read_vote().await? == acked.vote_term.map(|t| Vote::new(t, 1)));
    Ok(())
}

async fn run(operations: Vec<Operation>, flush_mode: FlushMode) -> anyhow::Result<()> {
    let disk = PowerLossDisk::new();
    let open = |disk: &PowerLossDisk| {
        open_with(disk.open_engine(), flush_mode).expect("open the simulated disk")
    };
    let (mut log, _sm) = open(&disk);
    let mut acked = Acknowledged::default();
    for operation in operations {
        match operation {
            Operation::Append(count) => {
                let first = acked.next_index();
                let batch: Vec<Entry> = (first..first + count)
                    .map(|i| proposal_entry(1, i))
                    .collect();
                log.blocking_append(batch.clone()).await?;
                acked
                    .log
                    .extend(batch.into_iter().map(|e| (e.log_id.index, e)));
            }
            Operation::SaveVote => {
                let term = acked.vote_term.map_or(1, |t| t + 1);
                log.save_vote(&Vote::new(term, 1)).await?;
                acked.vote_term = Some(term);
            }
            Operation::Truncate(per_mille) | Operation::Purge(per_mille)
                if !acked.log.is_empty() =>
            {
                let indexes: Vec<u64> = acked.log.keys().copied().collect();
                let at = indexes[(per_mille as usize * indexes.len()) / 1000];
                if matches!(operation, Operation::Truncate(_)) {
                    log.truncate(log_id(1, at)).await?;
                    acked.log.retain(|index, _| *index < at);
                } else {
                    log.purge(log_id(1, at)).await?;
                    acked.log.retain(|index, _| *index > at);
                    acked.last_purged = Some(at);
                }
            }
            Operation::Truncate(_) | Operation::Purge(_) => {}
            Operation::Crash => {
                disk.crash();
                (log, _) = open(&disk);
            }
        }
        assert_store_holds(&mut log, &acked).await?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// With a correct disk, nothing the log store acknowledged (append
    /// callback fired, vote/truncate/purge returned) is lost by any crash,
    /// whether appends are flushed inline or by the flusher thread.
    #[test]
    fn no_acknowledged_write_is_lost_by_a_crash(
        operations in prop::collection::vec(operation(), 1..30),
        flush_mode in prop_oneof![Just(FlushMode::Inline), Just(FlushMode::Background)],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        if let Err(error) = runtime.block_on(run(operations, flush_mode)) {
            return Err(TestCaseError::fail(format!("{error:#}")));
        }
    }
}
