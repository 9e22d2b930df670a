//! Group commit: commands from concurrent callers are batched into one
//! [`Proposal`] (one Raft entry), so a write costs one replication round and
//! one fsync per batch rather than per command, and throughput grows with
//! concurrency.
//!
//! A [`Batcher`] is a handle plus one task. When the batcher is idle — a
//! free proposal slot, nothing queued, and the last proposal held a single
//! command (one lease at a time) — a lone command is proposed by its
//! submitter itself, sparing two task hand-offs each way; otherwise callers
//! [`submit`](Batcher::submit) a command — or [`submit_all`](Batcher::submit_all) a group of them, such as
//! the items of one `LeaseBatch` call — into a bounded queue and await the
//! [`Outcome`]s. The task waits for a free proposal slot (at most
//! `max_inflight` proposals replicate at once), then drains whatever has
//! queued up (at most `max_batch` commands; a group is never split, so one
//! that does not fit waits for the next proposal), stamps it with the
//! injected wall clock and proposes it. So a batch is flushed as soon as a
//! previous proposal finishes, and is never larger than `max_batch` — with
//! one exception: when at least `LINGER_FLOOR` commands are queued, but
//! fewer than the last proposal plus what arrived during its flight (the
//! last proposal's callers are on their way back, as in any closed loop,
//! which otherwise settles into two halves alternating in proposals), the
//! task waits for more, at most `LINGER_MAX`, so the halves merge and one
//! proposal's fixed cost (about ten messages and two flushes) serves both.
//! Two waits in a row that run out with fewer than half of them back (an
//! open loop: callers that do not come back) make the next 2, 4, … 64
//! proposals that would wait leave at once instead, so independent traffic
//! pays the wait on one proposal in 65 at most. One lease at a time and
//! light traffic never wait. A group costs one reply channel and one
//! wake-up however many commands it holds.
//! The queue is bounded in commands (a group counts every command it holds);
//! a submission that would pass the bound is refused at once
//! ([`ProposeError::Overloaded`]) rather than growing without bound.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use leasehold_client::transport::WallClock;
use leasehold_core::coordinator::{Command, Outcome, Proposal, ProposalResult};
use leasehold_proto::LeaderHint;
use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};
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
    /// Most commands queued and not yet in a proposal (a group counts
    /// every command it holds).
    pub queue_capacity: usize,
    /// Most proposals replicating at once.
    pub max_inflight: usize,
}

/// Fewest queued commands for which a proposal waits for the callers of the
/// last one (below it a proposal leaves at once: one lease at a time,
/// light traffic).
const LINGER_FLOOR: usize = 32;
/// Longest a proposal waits for the callers of the last one.
const LINGER_MAX: std::time::Duration = std::time::Duration::from_millis(1);
/// After this many waits in a row ran out, the back-off stops growing:
/// `2^LINGER_BACKOFF_STEPS` proposals leave without waiting.
const LINGER_BACKOFF_STEPS: u32 = 6;

/// Whether a proposal may wait for the callers of the last one: after two
/// waits in a row that ran out, the next proposals that would wait leave
/// at once, twice as many after each further miss in a row, up to 64.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct LingerBackoff {
    /// Waits in a row that ran out.
    misses: u32,
    /// Proposals that would wait still to leave at once.
    skip: u32,
}

impl LingerBackoff {
    /// Called for a proposal that would wait: whether it may.
    fn may_wait(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// Records how a wait ended: `came_back` when the callers did.
    fn record(&mut self, came_back: bool) {
        if came_back {
            *self = LingerBackoff::default();
        } else {
            // One miss alone is a closed loop's slow caller: back off from
            // the second in a row.
            self.misses = self.misses.saturating_add(1);
            if self.misses >= 2 {
                self.skip = 1 << (self.misses - 1).min(LINGER_BACKOFF_STEPS);
            }
        }
    }
}

/// One submission: a command, or a group that rides in one proposal.
struct Pending {
    /// At most `max_batch` commands.
    commands: Vec<Command>,
    /// Their outcomes, in order.
    reply: Reply,
    /// The submitter's span: the batch's span is a child of the first
    /// submitter's and linked to every other one.
    span: tracing::Span,
    /// The group's room in the queue, one permit per command; handed back
    /// when the group is taken into a proposal.
    _room: OwnedSemaphorePermit,
}

/// The submitting side of the group-commit task. Cheap to clone.
#[derive(Clone)]
pub struct Batcher {
    queue: mpsc::Sender<Pending>,
    /// Free room in the queue, in commands (`queue_capacity` in all).
    room: Arc<Semaphore>,
    /// `queue_capacity`: the room when nothing is queued.
    capacity: usize,
    /// Most commands per proposal (and so per submitted group).
    max_batch: usize,
    /// What the task and the idle fast path share.
    shared: Arc<Shared>,
}

/// What the batching task and a submitter proposing on its own share.
struct Shared {
    proposer: Arc<dyn Proposer>,
    clock: Arc<dyn WallClock>,
    metrics: Arc<NodeMetrics>,
    /// Proposal slots: at most `max_inflight` proposals replicate at once.
    slots: Arc<Semaphore>,
    /// Commands in the proposal started last (by the task or a submitter).
    last_proposal_commands: AtomicUsize,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("free_room", &self.room.available_permits())
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
        let capacity = options.queue_capacity.max(1);
        // Every submission holds at least one permit of `room`, so the
        // channel itself never fills before the room runs out.
        let (queue, receiver) = mpsc::channel(capacity);
        let room = Arc::new(Semaphore::new(capacity));
        let shared = Arc::new(Shared {
            proposer,
            clock,
            metrics,
            slots: Arc::new(Semaphore::new(options.max_inflight.max(1))),
            last_proposal_commands: AtomicUsize::new(0),
        });
        let task = tokio::spawn(run(receiver, shared.clone(), options, stop));
        let max_batch = options.max_batch.max(1);
        (
            Self {
                queue,
                room,
                capacity,
                max_batch,
                shared,
            },
            task,
        )
    }

    /// Queues `command` for the next proposal and waits for its outcome.
    pub async fn submit(&self, command: Command) -> Result<Outcome, ProposeError> {
        let mut outcomes = self.submit_group(vec![command]).await?;
        outcomes.pop().ok_or_else(|| {
            ProposeError::Unavailable("internal error: a command got no outcome".into())
        })
    }

    /// Queues `commands` and waits for their outcomes, in order. Up to
    /// `max_batch` of them ride in one proposal; more are cut into groups of
    /// that size, submitted together. Any group's failure fails the call.
    pub async fn submit_all(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ProposeError> {
        if commands.len() <= self.max_batch {
            return self.submit_group(commands).await;
        }
        let groups = commands
            .chunks(self.max_batch)
            .map(|group| self.submit_group(group.to_vec()));
        let mut outcomes = Vec::with_capacity(commands.len());
        for group in futures::future::join_all(groups).await {
            outcomes.extend(group?);
        }
        Ok(outcomes)
    }

    /// Queues one group of at most `max_batch` commands.
    async fn submit_group(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, ProposeError> {
        if commands.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(slot) = self.idle_slot(commands.len()) {
            return self.propose_alone(commands, slot).await;
        }
        let room = u32::try_from(commands.len())
            .ok()
            .and_then(|count| Arc::clone(&self.room).try_acquire_many_owned(count).ok())
            .ok_or(ProposeError::Overloaded)?;
        let (reply, outcome) = oneshot::channel();
        self.queue
            .try_send(Pending {
                commands,
                reply,
                span: tracing::Span::current(),
                _room: room,
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

impl Batcher {
    /// A proposal slot for a lone command when the batcher is idle — a
    /// free slot, nothing queued, and the last proposal held one command
    /// (one lease at a time) — so its submitter proposes it on its own
    /// instead of through the task: two task hand-offs fewer each way. In
    /// a closed loop of many callers the last proposal held many, and the
    /// first caller back queues for the batch as before.
    fn idle_slot(&self, commands: usize) -> Option<OwnedSemaphorePermit> {
        if commands != 1
            || self.shared.last_proposal_commands.load(Ordering::Relaxed) > 1
            || self.room.available_permits() < self.capacity
            || self.queue.is_closed()
        {
            return None;
        }
        self.shared.slots.clone().try_acquire_owned().ok()
    }

    /// Proposes `commands` from the submitter's own task, holding `slot`.
    /// A submitter dropped meanwhile drops the proposal's answer (the entry
    /// may still commit, as for a caller that hangs up) and frees the slot.
    async fn propose_alone(
        &self,
        commands: Vec<Command>,
        slot: OwnedSemaphorePermit,
    ) -> Result<Vec<Outcome>, ProposeError> {
        let shared = &self.shared;
        let count = commands.len();
        shared
            .last_proposal_commands
            .store(count, Ordering::Relaxed);
        let span = tracing::debug_span!(
            "raft.client_write",
            commands = count,
            raft.log_index = tracing::field::Empty
        );
        let proposal = Proposal {
            stamp_ms: shared.clock.now_ms(),
            commands,
        };
        let started = std::time::Instant::now();
        let result = shared.proposer.propose(proposal).instrument(span).await;
        drop(slot);
        shared
            .metrics
            .record_proposal(count, result.is_ok(), started.elapsed());
        split_outcomes(result, &[count], &shared.metrics)
            .pop()
            .unwrap_or_else(|| {
                Err(ProposeError::Unavailable(
                    "internal error: a proposal got no outcome".into(),
                ))
            })
    }
}

async fn run(
    mut receiver: mpsc::Receiver<Pending>,
    shared: Arc<Shared>,
    options: BatcherOptions,
    mut stop: watch::Receiver<bool>,
) {
    let max_inflight = options.max_inflight.max(1);
    let slots = shared.slots.clone();
    let max_batch = options.max_batch.max(1);
    // A group drained from the queue that did not fit in the last proposal.
    let mut carried: Option<Pending> = None;
    // Commands in the last proposal taken: its callers are expected back.
    let mut last_proposed = 0usize;
    let mut backoff = LingerBackoff::default();
    loop {
        // The first submission, then a free slot: the slot is not held
        // while the queue is empty, so an idle batcher leaves it to a lone
        // submitter proposing on its own (`Batcher::idle_slot`).
        let mut found_queue_empty = false;
        let first = match carried.take() {
            Some(pending) => Some(pending),
            None => match receiver.try_recv() {
                Ok(pending) => Some(pending),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    found_queue_empty = true;
                    tokio::select! {
                        next = receiver.recv() => next,
                        _ = stop.wait_for(|stopped| *stopped) => None,
                    }
                }
            },
        };
        let Some(first) = first else { break };
        // Whether the queue was empty when the slot came free (nothing
        // arrived while the last proposal was in flight): the submission
        // was waited for, and the slot was free when it came.
        let (slot, waited) = match slots.clone().try_acquire_owned() {
            Ok(slot) => (slot, found_queue_empty),
            Err(_) => match slots.clone().acquire_owned().await {
                Ok(slot) => (slot, false),
                Err(_) => {
                    carried = Some(first);
                    break;
                }
            },
        };
        let mut count = first.commands.len();
        let mut batch = vec![first];
        carried = drain(&mut receiver, &mut count, &mut batch, max_batch);
        // Closed loops settle into two halves alternating in proposals:
        // while one half commits, the other queues. When the queue holds a
        // real batch but fewer commands than the last proposal plus what
        // arrived during its flight, the callers of the last proposal are
        // on their way back: wait for them, briefly, so the halves merge
        // and one proposal's fixed cost serves both.
        let expected = if waited {
            last_proposed
        } else {
            last_proposed.saturating_add(count)
        }
        .min(max_batch);
        if count >= LINGER_FLOOR && count < expected && carried.is_none() && backoff.may_wait() {
            let deadline = tokio::time::Instant::now() + LINGER_MAX;
            let before = count;
            while count < expected && carried.is_none() {
                let next = tokio::select! {
                    next = receiver.recv() => next,
                    _ = tokio::time::sleep_until(deadline) => None,
                };
                let Some(next) = next else { break };
                carried = take(next, &mut count, &mut batch, max_batch)
                    .or_else(|| drain(&mut receiver, &mut count, &mut batch, max_batch));
            }
            // The callers came back if at least half of those expected did
            // (a closed loop's return spreads over its callers' round trips;
            // independent arrivals fill a small part of the gap in 1 ms).
            backoff.record(carried.is_some() || 2 * (count - before) >= expected - before);
        }
        last_proposed = count;
        shared
            .last_proposal_commands
            .store(count, Ordering::Relaxed);
        let span = batch_span(&batch);
        let mut commands = Vec::with_capacity(count);
        let mut replies = Vec::with_capacity(batch.len());
        for pending in batch {
            replies.push((pending.reply, pending.commands.len()));
            commands.extend(pending.commands);
        }
        let proposal = Proposal {
            stamp_ms: shared.clock.now_ms(),
            commands,
        };
        let proposer = shared.proposer.clone();
        let metrics = shared.metrics.clone();
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
    while let Some(pending) = carried.take().or_else(|| receiver.try_recv().ok()) {
        let _ = pending.reply.send(Err(ProposeError::Unavailable(
            "the member is shutting down".into(),
        )));
    }
    // Wait for the proposals still replicating.
    let _ = slots.acquire_many(max_inflight as u32).await;
}

/// Adds `next` to `batch` if it fits in `max_batch` commands; hands it
/// back otherwise (it waits for the next proposal).
fn take(
    next: Pending,
    count: &mut usize,
    batch: &mut Vec<Pending>,
    max_batch: usize,
) -> Option<Pending> {
    if *count + next.commands.len() <= max_batch {
        *count += next.commands.len();
        batch.push(next);
        None
    } else {
        Some(next)
    }
}

/// Takes what is queued into `batch` without waiting, up to `max_batch`
/// commands; hands back the first group that does not fit.
fn drain(
    receiver: &mut mpsc::Receiver<Pending>,
    count: &mut usize,
    batch: &mut Vec<Pending>,
    max_batch: usize,
) -> Option<Pending> {
    while *count < max_batch {
        let Ok(next) = receiver.try_recv() else { break };
        if let Some(unfit) = take(next, count, batch, max_batch) {
            return Some(unfit);
        }
    }
    None
}

/// The span of one proposal: from handing the batch to Raft until it is
/// applied on the leader; child of its first command's submitter and
/// linked (`follows_from`) to the others.
fn batch_span(batch: &[Pending]) -> tracing::Span {
    let parent = batch.first().and_then(|p| p.span.id());
    let span = tracing::debug_span!(
        parent: parent,
        "raft.client_write",
        commands = batch.iter().map(|p| p.commands.len()).sum::<usize>(),
        raft.log_index = tracing::field::Empty
    );
    for pending in batch.iter().skip(1) {
        span.follows_from(&pending.span);
    }
    span
}

/// Where a submission's outcomes go.
type Reply = oneshot::Sender<Result<Vec<Outcome>, ProposeError>>;

/// Hands each submission its outcomes: `replies` holds each one's reply
/// channel and command count, in proposal order.
fn deliver(
    result: Result<ProposalResult, ProposeError>,
    replies: Vec<(Reply, usize)>,
    metrics: &NodeMetrics,
) {
    let counts: Vec<usize> = replies.iter().map(|(_, count)| *count).collect();
    let groups = split_outcomes(result, &counts, metrics);
    for ((reply, _), group) in replies.into_iter().zip(groups) {
        let _ = reply.send(group);
    }
}

/// Cuts a proposal's outcomes into its submissions' groups of `counts`
/// commands, in proposal order (counting each outcome in `metrics`), or
/// gives every group the proposal's error.
fn split_outcomes(
    result: Result<ProposalResult, ProposeError>,
    counts: &[usize],
    metrics: &NodeMetrics,
) -> Vec<Result<Vec<Outcome>, ProposeError>> {
    let commands: usize = counts.iter().sum();
    match result {
        Ok(result) if result.outcomes.len() == commands => {
            let mut outcomes = result.outcomes.into_iter();
            counts
                .iter()
                .map(|count| {
                    let group: Vec<Outcome> = outcomes.by_ref().take(*count).collect();
                    group
                        .iter()
                        .for_each(|outcome| metrics.record_outcome(outcome));
                    Ok(group)
                })
                .collect()
        }
        Ok(result) => {
            tracing::error!(
                outcomes = result.outcomes.len(),
                commands,
                "state machine returned a wrong number of outcomes"
            );
            counts
                .iter()
                .map(|_| {
                    Err(ProposeError::Unavailable(
                        "internal error: outcome count mismatch".into(),
                    ))
                })
                .collect()
        }
        Err(error) => counts.iter().map(|_| Err(error.clone())).collect(),
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
        /// When each proposal was handed over.
        starts: Mutex<Vec<tokio::time::Instant>>,
        fail: bool,
    }

    impl Proposer for FakeRaft {
        fn propose(
            &self,
            proposal: Proposal,
        ) -> BoxFuture<'static, Result<ProposalResult, ProposeError>> {
            self.batches.lock().unwrap().push(proposal.commands.len());
            self.starts
                .lock()
                .unwrap()
                .push(tokio::time::Instant::now());
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

    type Started = (
        Batcher,
        Arc<FakeRaft>,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    );

    fn start(fail: bool, max_batch: usize) -> Started {
        start_with_queue(fail, max_batch, 1024)
    }

    fn start_with_queue(fail: bool, max_batch: usize, queue_capacity: usize) -> Started {
        let raft = Arc::new(FakeRaft {
            state: Mutex::default(),
            batches: Mutex::default(),
            starts: Mutex::default(),
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
            queue_capacity,
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
    async fn a_lone_command_on_an_idle_batcher_is_proposed_by_its_submitter() {
        let (batcher, raft, _stop, _task) = start(false, 64);
        // The batching task has not run yet (one thread, nothing yielded).
        let mut call = Box::pin(batcher.submit(lease(1)));
        assert!(futures::poll!(&mut call).is_pending());
        assert_eq!(
            raft.batches.lock().unwrap().clone(),
            vec![1],
            "proposed from the submitter's own poll"
        );
        assert!(matches!(call.await, Ok(Outcome::Lease(_))));
        // After a proposal of many, a lone command queues for the task.
        batcher
            .submit_all((0..40).map(|_| lease(1)).collect())
            .await
            .unwrap();
        let mut call = Box::pin(batcher.submit(lease(1)));
        assert!(futures::poll!(&mut call).is_pending());
        assert_eq!(raft.batches.lock().unwrap().clone(), vec![1, 40]);
        call.await.unwrap();
        assert_eq!(raft.batches.lock().unwrap().clone(), vec![1, 40, 1]);
        // The slot is free again: the next lone command goes on its own.
        let mut call = Box::pin(batcher.submit(lease(1)));
        assert!(futures::poll!(&mut call).is_pending());
        assert_eq!(raft.batches.lock().unwrap().len(), 4);
        call.await.unwrap();
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
    async fn groups_ride_whole_in_one_proposal_and_get_their_outcomes_in_order() {
        let (batcher, raft, _stop, _task) = start(false, 10);
        // Groups of 7 and singles, all at once: 7 + 7 never fit in 10, so
        // the second group waits for the next proposal rather than splitting.
        let groups: Vec<_> = (0..6)
            .map(|g| {
                let b = batcher.clone();
                tokio::spawn(async move {
                    if g % 2 == 0 {
                        b.submit_all((1..=7).map(lease).collect()).await
                    } else {
                        b.submit(lease(1)).await.map(|outcome| vec![outcome])
                    }
                })
            })
            .collect();
        let mut granted = 0;
        for (g, group) in groups.into_iter().enumerate() {
            let outcomes = group.await.unwrap().unwrap();
            assert_eq!(outcomes.len(), if g % 2 == 0 { 7 } else { 1 });
            for (i, outcome) in outcomes.iter().enumerate() {
                let Outcome::Lease(grant) = outcome else {
                    panic!("unexpected {outcome:?}")
                };
                // Each outcome answers its own command: item i asked i + 1.
                let asked = if g % 2 == 0 { i as u64 + 1 } else { 1 };
                assert!(grant.granted <= asked, "{grant:?} answers another command");
                granted += grant.granted;
            }
        }
        assert_eq!(
            granted,
            3 * 28 + 3,
            "below the limit every ask is granted whole"
        );
        let batches = raft.batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), 3 * 7 + 3);
        assert!(batches.iter().all(|&size| size <= 10), "{batches:?}");
    }

    #[tokio::test]
    async fn a_group_larger_than_a_proposal_is_cut_and_answered_in_order() {
        let (batcher, raft, _stop, _task) = start(false, 4);
        let outcomes = batcher
            .submit_all((1..=10).map(lease).collect())
            .await
            .unwrap();
        let granted: Vec<u64> = outcomes
            .iter()
            .map(|outcome| match outcome {
                Outcome::Lease(grant) => grant.granted,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        // 1 + 2 + … + 10 = 55 ≤ 100: each item gets exactly what it asked.
        assert_eq!(granted, (1..=10).collect::<Vec<u64>>());
        let batches = raft.batches.lock().unwrap().clone();
        assert!(batches.iter().all(|&size| size <= 4), "{batches:?}");
        assert_eq!(batches.iter().sum::<usize>(), 10);
        assert!(batcher.submit_all(Vec::new()).await.unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_bounds_commands_not_submissions() {
        let (batcher, _raft, _stop, _task) = start_with_queue(false, 10, 10);
        let submit = |count: u64| {
            let b = batcher.clone();
            tokio::spawn(async move { b.submit_all((1..=count).map(|_| lease(1)).collect()).await })
        };
        // The first group goes straight into a proposal (replicating for
        // 5 ms); the second, of 8, waits in the queue behind it.
        // Lets every runnable task run; time stands still (it is paused and
        // this task stays runnable), so the first proposal stays in flight.
        let settle = || async {
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
        };
        let first = submit(10);
        settle().await;
        let second = submit(8);
        settle().await;
        // 8 + 3 commands would pass the bound of 10: refused at once, as one
        // group, although the queue holds a single submission.
        assert_eq!(
            batcher.submit_all((0..3).map(|_| lease(1)).collect()).await,
            Err(ProposeError::Overloaded)
        );
        // 8 + 2 fit.
        let third = submit(2);
        for (call, count) in [(first, 10), (second, 8), (third, 2)] {
            assert_eq!(call.await.unwrap().unwrap().len(), count);
        }
        // Everything was proposed: the room is whole again.
        assert_eq!(batcher.room.available_permits(), 10);
    }

    /// Submits a group of `count` leases and hands back the call.
    fn submit_group(
        batcher: &Batcher,
        count: u64,
    ) -> tokio::task::JoinHandle<Result<Vec<Outcome>, ProposeError>> {
        let b = batcher.clone();
        tokio::spawn(async move { b.submit_all((0..count).map(|_| lease(1)).collect()).await })
    }

    /// Lets every runnable task run; paused time stands still meanwhile.
    async fn settle() {
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_two_halves_of_a_closed_loop_merge_into_one_proposal() {
        let (batcher, raft, _stop, _task) = start(false, 1024);
        // Half A replicates while half B queues behind it.
        let a = submit_group(&batcher, 40);
        settle().await;
        let b = submit_group(&batcher, 40);
        settle().await;
        a.await.unwrap().unwrap();
        // A's caller sends again at once: B waits for it instead of
        // leaving alone.
        let a_again = submit_group(&batcher, 40);
        assert_eq!(b.await.unwrap().unwrap().len(), 40);
        assert_eq!(a_again.await.unwrap().unwrap().len(), 40);
        assert_eq!(*raft.batches.lock().unwrap(), vec![40, 80]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_proposal_waits_for_the_last_ones_callers_at_most_briefly() {
        let (batcher, raft, _stop, _task) = start(false, 1024);
        let started = tokio::time::Instant::now();
        let a = submit_group(&batcher, 40);
        settle().await;
        let b = submit_group(&batcher, 40);
        settle().await;
        a.await.unwrap().unwrap();
        // Nobody comes back: B leaves after the longest wait.
        b.await.unwrap().unwrap();
        assert_eq!(*raft.batches.lock().unwrap(), vec![40, 40]);
        let replicating = Duration::from_millis(10);
        assert_eq!(started.elapsed(), replicating + LINGER_MAX);
    }

    #[tokio::test(start_paused = true)]
    async fn small_proposals_never_wait() {
        let (batcher, raft, _stop, _task) = start(false, 1024);
        let started = tokio::time::Instant::now();
        for _ in 0..3 {
            batcher.submit(lease(1)).await.unwrap();
        }
        // One lease at a time: three proposals of 5 ms, back to back.
        assert_eq!(started.elapsed(), Duration::from_millis(15));
        // Below the floor, a queue of a few behind a larger proposal does
        // not wait for its callers either.
        let a = submit_group(&batcher, 40);
        settle().await;
        let b = submit_group(&batcher, LINGER_FLOOR as u64 - 1);
        settle().await;
        a.await.unwrap().unwrap();
        let before_b = tokio::time::Instant::now();
        b.await.unwrap().unwrap();
        assert_eq!(before_b.elapsed(), Duration::from_millis(5));
        assert_eq!(
            *raft.batches.lock().unwrap(),
            vec![1, 1, 1, 40, LINGER_FLOOR - 1]
        );
    }

    /// Callers that never come back (an open loop: a group of 40 every
    /// 2 ms, whatever the replies): a proposal that waited in vain makes
    /// the next ones leave at once, so few of the proposals wait.
    #[tokio::test(start_paused = true)]
    async fn an_open_loop_pays_the_wait_on_few_proposals() {
        let (batcher, raft, _stop, _task) = start(false, 1024);
        let mut calls = Vec::new();
        for _ in 0..150 {
            calls.push(submit_group(&batcher, 40));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for call in calls {
            call.await.unwrap().unwrap();
        }
        // With one proposal in flight, a proposal that did not wait starts
        // when the one before it is applied (5 ms later).
        let starts = raft.starts.lock().unwrap();
        let waited = starts
            .windows(2)
            .filter(|pair| pair[1] - pair[0] > Duration::from_millis(5))
            .count();
        assert!(starts.len() > 40, "{} proposals", starts.len());
        assert!(
            (1..=6).contains(&waited),
            "{waited} of {} proposals waited",
            starts.len()
        );
    }

    #[test]
    fn each_miss_in_a_row_doubles_the_proposals_that_leave_at_once() {
        let mut backoff = LingerBackoff::default();
        let mut waits = Vec::new();
        for _ in 0..300 {
            if backoff.may_wait() {
                waits.push(true);
                backoff.record(false);
            } else {
                waits.push(false);
            }
        }
        // Two waits, then skips of 2, 4, 8, 16, 32, then 64 each time.
        let at: Vec<usize> = (0..waits.len()).filter(|&i| waits[i]).collect();
        assert_eq!(at, vec![0, 1, 4, 9, 18, 35, 68, 133, 198, 263]);
        // A wait that fills resets it.
        backoff.record(true);
        assert!(backoff.may_wait());
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
