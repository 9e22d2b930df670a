//! Group commit: commands from concurrent callers are batched into one
//! [`Proposal`] (one Raft entry), so a write costs one replication round and
//! one fsync per batch rather than per command, and throughput grows with
//! concurrency.
//!
//! A [`Batcher`] is a handle plus one task. Callers [`submit`](Batcher::submit)
//! a command into a bounded queue and await its [`Outcome`]. The task waits
//! for a free proposal slot (at most `max_inflight` proposals replicate at
//! once), then drains whatever has queued up (at most `max_batch` commands),
//! stamps it with the injected wall clock and proposes it. So a batch is
//! flushed as soon as a previous proposal finishes, and is never larger than
//! `max_batch`. A full queue is refused at once ([`ProposeError::Overloaded`])
//! rather than growing without bound.

use std::sync::Arc;

use futures::future::BoxFuture;
use leasehold_client::transport::WallClock;
use leasehold_core::coordinator::{Command, Outcome, Proposal, ProposalResult};
use leasehold_proto::LeaderHint;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tracing::Instrument;

use super::metrics::NodeMetrics;

/// Why a proposal did not produce outcomes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// This member is not the leader; `leader` names the one it believes
    /// in (empty when it knows none).
    #[error("not the leader")]
    NotLeader {
        /// The leader this member believes in.
        leader: LeaderHint,
    },
    /// The proposal was not committed before its deadline (no quorum?).
    /// It may still commit later; a retry with the same request id is safe.
    #[error("proposal not committed within {0} ms")]
    Timeout(u64),
    /// The member is shutting down or Raft stopped.
    #[error("raft unavailable: {0}")]
    Unavailable(String),
    /// The batch queue is full.
    #[error("too many requests queued at this member")]
    Overloaded,
}

/// Hands proposals to Raft and waits for their results; the Raft handle in
/// production, a fake in tests.
pub trait Proposer: Send + Sync + 'static {
    /// Proposes `proposal` and resolves once it is applied (or failed).
    fn propose(
        &self,
        proposal: Proposal,
    ) -> BoxFuture<'static, Result<ProposalResult, ProposeError>>;
}

/// Sizes of the batcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatcherOptions {
    /// Most commands per proposal.
    pub max_batch: usize,
    /// Capacity of the submission queue.
    pub queue_capacity: usize,
    /// Most proposals replicating at once.
    pub max_inflight: usize,
}

struct Pending {
    command: Command,
    reply: oneshot::Sender<Result<Outcome, ProposeError>>,
    /// The submitter's span: the batch's span is a child of the first
    /// submitter's and linked to every other one.
    span: tracing::Span,
}

/// The submitting side of the group-commit task. Cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    queue: mpsc::Sender<Pending>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field(
                "queued",
                &(self.queue.max_capacity() - self.queue.capacity()),
            )
            .finish()
    }
}

impl Batcher {
    /// Starts the batching task. It ends once `stop` turns true (or every
    /// handle is dropped) and every proposal it started has finished.
    pub fn spawn(
        proposer: Arc<dyn Proposer>,
        clock: Arc<dyn WallClock>,
        options: BatcherOptions,
        metrics: Arc<NodeMetrics>,
        stop: watch::Receiver<bool>,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, receiver) = mpsc::channel(options.queue_capacity.max(1));
        let task = tokio::spawn(run(receiver, proposer, clock, options, metrics, stop));
        (Self { queue }, task)
    }

    /// Queues `command` for the next proposal and waits for its outcome.
    pub async fn submit(&self, command: Command) -> Result<Outcome, ProposeError> {
        let (reply, outcome) = oneshot::channel();
        self.queue
            .try_send(Pending {
                command,
                reply,
                span: tracing::Span::current(),
            })
            .map_err(|e| match e {
                mpsc::error::TrySendError::Full(_) => ProposeError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => {
                    ProposeError::Unavailable("the member is shutting down".into())
                }
            })?;
        outcome.await.unwrap_or_else(|_| {
            Err(ProposeError::Unavailable(
                "the proposal was abandoned".into(),
            ))
        })
    }
}

async fn run(
    mut receiver: mpsc::Receiver<Pending>,
    proposer: Arc<dyn Proposer>,
    clock: Arc<dyn WallClock>,
    options: BatcherOptions,
    metrics: Arc<NodeMetrics>,
    mut stop: watch::Receiver<bool>,
) {
    let max_inflight = options.max_inflight.max(1);
    let slots = Arc::new(Semaphore::new(max_inflight));
    let max_batch = options.max_batch.max(1);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let first = tokio::select! {
            next = receiver.recv() => next,
            _ = stop.wait_for(|stopped| *stopped) => None,
        };
        let Some(first) = first else { break };
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match receiver.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let span = batch_span(&batch);
        let (commands, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        let proposal = Proposal {
            stamp_ms: clock.now_ms(),
            commands,
        };
        let proposer = proposer.clone();
        let metrics = metrics.clone();
        tokio::spawn(
            async move {
                let count = proposal.commands.len();
                let started = std::time::Instant::now();
                let result = proposer.propose(proposal).await;
                metrics.record_proposal(count, result.is_ok(), started.elapsed());
                deliver(result, replies, &metrics);
                drop(slot);
            }
            .instrument(span),
        );
    }
    receiver.close();
    while let Ok(pending) = receiver.try_recv() {
        let _ = pending.reply.send(Err(ProposeError::Unavailable(
            "the member is shutting down".into(),
        )));
    }
    // Wait for the proposals still replicating.
    let _ = slots.acquire_many(max_inflight as u32).await;
}

/// The span of one proposal: from handing the batch to Raft until it is
/// applied on the leader; child of its first command's submitter and
/// linked (`follows_from`) to the others.
fn batch_span(batch: &[Pending]) -> tracing::Span {
    let parent = batch.first().and_then(|p| p.span.id());
    let span = tracing::debug_span!(
        parent: parent,
        "raft.client_write",
        commands = batch.len(),
        raft.log_index = tracing::field::Empty
    );
    for pending in batch.iter().skip(1) {
        span.follows_from(&pending.span);
    }
    span
}

fn deliver(
    result: Result<ProposalResult, ProposeError>,
    replies: Vec<oneshot::Sender<Result<Outcome, ProposeError>>>,
    metrics: &NodeMetrics,
) {
    match result {
        Ok(result) if result.outcomes.len() == replies.len() => {
            for (reply, outcome) in replies.into_iter().zip(result.outcomes) {
                metrics.record_outcome(&outcome);
                let _ = reply.send(Ok(outcome));
            }
        }
        Ok(result) => {
            tracing::error!(
                outcomes = result.outcomes.len(),
                commands = replies.len(),
                "state machine returned a wrong number of outcomes"
            );
            for reply in replies {
                let _ = reply.send(Err(ProposeError::Unavailable(
                    "internal error: outcome count mismatch".into(),
                )));
            }
        }
        Err(error) => {
            for reply in replies {
                let _ = reply.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::coordinator::{CoordinatorState, ProposalResult};
    use leasehold_core::ids::{Key, RegionId};
    use leasehold_core::policy::{OutagePolicy, Policy, PolicyKind};
    use std::sync::Mutex;
    use std::time::Duration;

    /// Applies proposals to an in-memory state after a short delay, recording batch sizes.
    struct FakeRaft {
        state: Mutex<CoordinatorState>,
        batches: Mutex<Vec<usize>>,
        fail: bool,
    }

    impl Proposer for FakeRaft {
        fn propose(
            &self,
            proposal: Proposal,
        ) -> BoxFuture<'static, Result<ProposalResult, ProposeError>> {
            self.batches.lock().unwrap().push(proposal.commands.len());
            let result = self.state.lock().unwrap().apply(&proposal);
            let fail = self.fail;
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                if fail {
                    Err(ProposeError::NotLeader {
                        leader: LeaderHint::new(Some(2), Some("n2:7100".into())),
                    })
                } else {
                    Ok(result)
                }
            })
        }
    }

    struct FixedClock;
    impl WallClock for FixedClock {
        fn now_ms(&self) -> u64 {
            1_000
        }
    }

    fn lease(n: u64) -> Command {
        Command::Lease {
            key: Key::new("k").unwrap(),
            region: RegionId::new("eu").unwrap(),
            tokens: n,
            request_id: None,
            caller: leasehold_core::principal::Principal::Anonymous,
        }
    }

    fn start(
        fail: bool,
        max_batch: usize,
    ) -> (
        Batcher,
        Arc<FakeRaft>,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let raft = Arc::new(FakeRaft {
            state: Mutex::default(),
            batches: Mutex::default(),
            fail,
        });
        let policy = Policy {
            prefix: String::new(),
            limit: 100,
            window_ms: 60_000,
            kind: PolicyKind::Counter,
            outage: OutagePolicy::FailClosed,
            shadow: false,
        };
        raft.state.lock().unwrap().apply(&Proposal {
            stamp_ms: 0,
            commands: vec![Command::SetPolicy(policy)],
        });
        let (stop_tx, stop) = watch::channel(false);
        let options = BatcherOptions {
            max_batch,
            queue_capacity: 1024,
            max_inflight: 1,
        };
        let (batcher, task) = Batcher::spawn(
            raft.clone(),
            Arc::new(FixedClock),
            options,
            Arc::default(),
            stop,
        );
        (batcher, raft, stop_tx, task)
    }

    #[tokio::test]
    async fn concurrent_submissions_share_proposals_and_each_gets_its_own_outcome() {
        let (batcher, raft, _stop, _task) = start(false, 64);
        let calls: Vec<_> = (0..200)
            .map(|_| {
                let b = batcher.clone();
                tokio::spawn(async move { b.submit(lease(1)).await })
            })
            .collect();
        let mut granted = 0;
        for call in calls {
            match call.await.unwrap().unwrap() {
                Outcome::Lease(grant) => granted += grant.granted,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(granted, 100, "the limit holds across batches");
        let batches = raft.batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), 200);
        assert!(batches.len() < 200, "commands were batched: {batches:?}");
        assert!(
            batches.iter().all(|&size| size <= 64),
            "no batch exceeds the maximum: {batches:?}"
        );
    }

    #[tokio::test]
    async fn a_failed_proposal_fails_every_command_of_its_batch() {
        let (batcher, _raft, _stop, _task) = start(true, 8);
        let error = batcher.submit(lease(1)).await.unwrap_err();
        assert_eq!(
            error,
            ProposeError::NotLeader {
                leader: LeaderHint::new(Some(2), Some("n2:7100".into()))
            }
        );
    }

    #[tokio::test]
    async fn stop_ends_the_task_and_later_submissions_fail() {
        let (batcher, _raft, stop, task) = start(false, 8);
        stop.send(true).unwrap();
        task.await.unwrap();
        assert!(matches!(
            batcher.submit(lease(1)).await,
            Err(ProposeError::Unavailable(_))
        ));
    }
}
