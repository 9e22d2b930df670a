//! Coalesced leases: callers (an escrow node's key actors, a
//! [`CoordinatorSource`](crate::CoordinatorSource)'s strict checks) ask for
//! leases through one queue, and whatever is queued when a call can go out
//! leaves as one `LeaseBatch` (one coordinator round trip and, usually, one
//! Raft proposal for many keys). A request that finds the coalescer idle —
//! no call out, nothing queued — is sent at once from the caller's own task
//! as a plain `Lease`, with no hand-off to another task (one lease at a
//! time costs what an uncoalesced lease costs).
//!
//! A batch that is not full leaves only while fewer than
//! [`MAX_CALLS_IN_FLIGHT`] calls are out; otherwise it waits, taking in
//! requests, until it is full or a call returns — so at light load requests
//! arriving meanwhile make the next batch bigger, with no timer. Full
//! batches ([`MAX_ITEMS`]) may go on up to [`MAX_FULL_CALLS_IN_FLIGHT`]
//! calls out, so a deep queue is not held to four calls' worth of leases.
//! Each request is answered with its own item's outcome, as the same
//! `Lease` alone would have been; a failure of the whole call (no leader,
//! unreachable) is every item's answer.
//!
//! A coordinator without `LeaseBatch` (an older member during a rolling
//! upgrade answers `UNIMPLEMENTED`) is served item by item from then on.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::coordinator::{CoordinatorClient, CoordinatorError, LeaseItem, ITEMS_PER_BATCH_CALL};
use leasehold_core::metrics::{Histogram, SIZE_BOUNDS};
use leasehold_proto::v1::LeaseResponse;
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};
use tracing::Instrument;

/// Most calls outstanding when a batch that is not full may leave.
pub const MAX_CALLS_IN_FLIGHT: usize = 4;
/// Most calls outstanding at all (the calls beyond [`MAX_CALLS_IN_FLIGHT`]
/// carry full batches).
pub const MAX_FULL_CALLS_IN_FLIGHT: usize = 16;
/// Most items in one call (a `LeaseBatch` of one session).
pub const MAX_ITEMS: usize = ITEMS_PER_BATCH_CALL;
/// Requests waiting for a call; beyond it actors wait to enqueue.
const QUEUE: usize = 4_096;

type Answer = Result<LeaseResponse, CoordinatorError>;

struct Pending {
    item: LeaseItem,
    reply: oneshot::Sender<Answer>,
    /// The asking actor's span: the call's span is a child of the first
    /// request's and follows from every other one.
    span: tracing::Span,
}

/// Counters of the coalescer, for `/metrics`.
#[derive(Debug)]
pub struct CoalescerStats {
    /// Calls sent (`LeaseBatch` and plain `Lease`).
    pub calls: AtomicU64,
    /// Of those, plain `Lease` calls sent at once by a caller that found
    /// the coalescer idle.
    pub direct_calls: AtomicU64,
    /// Items per call.
    pub items_per_call: Histogram,
}

impl Default for CoalescerStats {
    fn default() -> Self {
        Self {
            calls: AtomicU64::new(0),
            direct_calls: AtomicU64::new(0),
            items_per_call: Histogram::new(SIZE_BOUNDS),
        }
    }
}

/// The handle callers lease through. Cheap to clone.
#[derive(Clone)]
pub struct LeaseCoalescer {
    queue: mpsc::Sender<Pending>,
    stats: Arc<CoalescerStats>,
    client: CoordinatorClient,
    /// Calls outstanding, coalesced or sent directly.
    calls_out: Arc<AtomicUsize>,
}

/// One call counted in `calls_out` until dropped (a caller that gives up
/// mid-call still releases it).
struct CallOut(Arc<AtomicUsize>);

impl Drop for CallOut {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for LeaseCoalescer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseCoalescer").finish_non_exhaustive()
    }
}

impl LeaseCoalescer {
    /// Starts the coalescing task over `client`; it ends when every handle
    /// is dropped.
    pub fn spawn(client: CoordinatorClient) -> Self {
        let (queue, receiver) = mpsc::channel(QUEUE);
        let stats = Arc::new(CoalescerStats::default());
        let calls_out = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(
            client.clone(),
            receiver,
            stats.clone(),
            calls_out.clone(),
        ));
        Self {
            queue,
            stats,
            client,
            calls_out,
        }
    }

    /// Leases `tokens` of `key` for `region`, coalesced with whatever other
    /// keys are asking at the same time.
    pub async fn lease(&self, key: &str, region: &str, tokens: u64) -> Answer {
        let idle = self.queue.capacity() == self.queue.max_capacity()
            && self
                .calls_out
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        if idle {
            let _out = CallOut(self.calls_out.clone());
            self.stats.calls.fetch_add(1, Ordering::Relaxed);
            self.stats.direct_calls.fetch_add(1, Ordering::Relaxed);
            self.stats.items_per_call.record(1);
            return self.client.lease(key, region, tokens).await;
        }
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            item: LeaseItem {
                key: key.to_string(),
                region: region.to_string(),
                tokens,
            },
            reply,
            span: tracing::Span::current(),
        };
        if self.queue.send(pending).await.is_err() {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }

    /// The coalescer's counters.
    pub fn stats(&self) -> &CoalescerStats {
        &self.stats
    }
}

fn stopped() -> CoordinatorError {
    CoordinatorError::Unavailable {
        addr: String::new(),
        reason: None,
        message: "the lease coalescer has stopped".into(),
    }
}

async fn run(
    client: CoordinatorClient,
    mut receiver: mpsc::Receiver<Pending>,
    stats: Arc<CoalescerStats>,
    calls_out: Arc<AtomicUsize>,
) {
    let slots = Arc::new(Semaphore::new(MAX_FULL_CALLS_IN_FLIGHT));
    let call_returned = Arc::new(Notify::new());
    let batch_unsupported = Arc::new(AtomicBool::new(false));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = receiver.recv().await else {
            return;
        };
        let mut batch = vec![first];
        take_queued(&mut receiver, &mut batch);
        // A batch that is not full waits for more requests or for a call
        // to return while MAX_CALLS_IN_FLIGHT are out.
        while batch.len() < MAX_ITEMS && calls_out.load(Ordering::Acquire) >= MAX_CALLS_IN_FLIGHT {
            tokio::select! {
                next = receiver.recv() => match next {
                    Some(next) => {
                        batch.push(next);
                        take_queued(&mut receiver, &mut batch);
                    }
                    None => break,
                },
                () = call_returned.notified() => {}
            }
        }
        calls_out.fetch_add(1, Ordering::AcqRel);
        let out = CallOut(calls_out.clone());
        let client = client.clone();
        let stats = stats.clone();
        let batch_unsupported = batch_unsupported.clone();
        let call_returned = call_returned.clone();
        let span = batch[0].span.clone();
        for other in &batch[1..] {
            span.follows_from(&other.span);
        }
        tokio::spawn(
            async move {
                call(&client, batch, &stats, &batch_unsupported).await;
                drop(out);
                drop(slot);
                call_returned.notify_one();
            }
            .instrument(span),
        );
    }
}

/// Moves what is queued into `batch`, up to [`MAX_ITEMS`].
fn take_queued(receiver: &mut mpsc::Receiver<Pending>, batch: &mut Vec<Pending>) {
    while batch.len() < MAX_ITEMS {
        match receiver.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
}

/// Sends one call for `batch` and answers each request.
async fn call(
    client: &CoordinatorClient,
    batch: Vec<Pending>,
    stats: &CoalescerStats,
    batch_unsupported: &AtomicBool,
) {
    stats.items_per_call.record(batch.len() as u64);
    if batch.len() == 1 || batch_unsupported.load(Ordering::Relaxed) {
        return lease_one_by_one(client, batch, stats).await;
    }
    stats.calls.fetch_add(1, Ordering::Relaxed);
    let items: Vec<LeaseItem> = batch.iter().map(|pending| pending.item.clone()).collect();
    match client.lease_batch(&items).await {
        Ok(answers) => {
            for (pending, answer) in batch.into_iter().zip(answers) {
                let _ = pending.reply.send(answer);
            }
        }
        Err(CoordinatorError::Rpc {
            code: tonic::Code::Unimplemented,
            ..
        }) => {
            tracing::warn!(
                "the coordinator does not serve LeaseBatch (an older member?): refilling key by key"
            );
            batch_unsupported.store(true, Ordering::Relaxed);
            lease_one_by_one(client, batch, stats).await;
        }
        Err(whole_call) => {
            for pending in batch {
                let _ = pending.reply.send(Err(whole_call.clone()));
            }
        }
    }
}

/// Answers each request with a plain `Lease` of its own.
async fn lease_one_by_one(client: &CoordinatorClient, batch: Vec<Pending>, stats: &CoalescerStats) {
    for pending in batch {
        stats.calls.fetch_add(1, Ordering::Relaxed);
        let item = &pending.item;
        let answer = client.lease(&item.key, &item.region, item.tokens).await;
        let _ = pending.reply.send(answer);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::coordinator::{CoordinatorClient, RetryOptions};
    use crate::transport::TcpDialer;
    use leasehold_proto::v1 as pb;
    use leasehold_proto::v1::coordinator_server::{Coordinator, CoordinatorServer};
    use tonic::{Request, Response, Status};

    use super::*;

    /// A coordinator that grants every lease in full, 5 ms per call (slow
    /// enough that concurrent callers queue), counting its calls and the
    /// most it had at once. `older`: one from before `LeaseBatch`, which
    /// answers batches `UNIMPLEMENTED`.
    #[derive(Clone, Default)]
    struct FakeCoordinator {
        older: bool,
        leases: Arc<AtomicU64>,
        batches: Arc<AtomicU64>,
        items: Arc<AtomicU64>,
        in_flight: Arc<AtomicUsize>,
        most_in_flight: Arc<AtomicUsize>,
    }

    impl FakeCoordinator {
        fn older() -> Self {
            Self {
                older: true,
                ..Self::default()
            }
        }

        async fn paced<T>(&self, items: u64, answer: T) -> T {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_flight.fetch_max(now, Ordering::SeqCst);
            self.items.fetch_add(items, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            answer
        }
    }

    fn full_grant(tokens: u64) -> pb::LeaseResponse {
        pb::LeaseResponse {
            granted: tokens,
            limit: 1 << 40,
            window_start_ms: 0,
            window_end_ms: 60_000,
            coordinator_now_ms: 1,
            remaining_lifetime_ms: 59_999,
        }
    }

    #[tonic::async_trait]
    impl Coordinator for FakeCoordinator {
        async fn lease(
            &self,
            request: Request<pb::LeaseRequest>,
        ) -> Result<Response<pb::LeaseResponse>, Status> {
            self.leases.fetch_add(1, Ordering::SeqCst);
            let grant = full_grant(request.into_inner().tokens);
            Ok(Response::new(self.paced(1, grant).await))
        }
        async fn lease_batch(
            &self,
            request: Request<pb::LeaseBatchRequest>,
        ) -> Result<Response<pb::LeaseBatchResponse>, Status> {
            self.batches.fetch_add(1, Ordering::SeqCst);
            if self.older {
                return Err(Status::unimplemented("unknown method LeaseBatch"));
            }
            let items = request.into_inner().items;
            let count = items.len() as u64;
            let results = items
                .into_iter()
                .map(|item| pb::LeaseItemResult {
                    result: Some(pb::lease_item_result::Result::Granted(full_grant(
                        item.tokens,
                    ))),
                })
                .collect();
            let answer = pb::LeaseBatchResponse { results };
            Ok(Response::new(self.paced(count, answer).await))
        }
        async fn reconcile(
            &self,
            _: Request<pb::ReconcileRequest>,
        ) -> Result<Response<pb::ReconcileResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn pool_grant(
            &self,
            _: Request<pb::PoolGrantRequest>,
        ) -> Result<Response<pb::PoolGrantResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn pool_release(
            &self,
            _: Request<pb::PoolReleaseRequest>,
        ) -> Result<Response<pb::PoolReleaseResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn get_window(
            &self,
            _: Request<pb::GetWindowRequest>,
        ) -> Result<Response<pb::GetWindowResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }

        async fn get_placement(
            &self,
            _: Request<pb::GetPlacementRequest>,
        ) -> Result<Response<pb::Placement>, Status> {
            Err(Status::unimplemented("fake"))
        }
    }

    async fn coalescer_over<C: Coordinator>(fake: C) -> LeaseCoalescer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CoordinatorServer::new(fake))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let client = CoordinatorClient::with_options(
            [addr.as_str()],
            Arc::new(TcpDialer::default()),
            RetryOptions::default(),
        )
        .unwrap();
        LeaseCoalescer::spawn(client)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deep_queue_goes_out_in_full_batches_beyond_four_calls() {
        let fake = FakeCoordinator::default();
        let coalescer = coalescer_over(fake.clone()).await;
        const LEASES: u64 = 2_048;
        let asks = (0..LEASES).map(|n| {
            let coalescer = coalescer.clone();
            tokio::spawn(async move { coalescer.lease(&format!("k{n}"), "eu", n + 1).await })
        });
        for (n, answer) in futures::future::join_all(asks)
            .await
            .into_iter()
            .enumerate()
        {
            let grant = answer.unwrap().expect("answered");
            assert_eq!(
                grant.granted,
                n as u64 + 1,
                "each lease gets its own answer"
            );
        }
        assert_eq!(
            fake.items.load(Ordering::SeqCst),
            LEASES,
            "each lease sent once"
        );
        let most = fake.most_in_flight.load(Ordering::SeqCst);
        assert!(
            most > MAX_CALLS_IN_FLIGHT + 1 && most <= MAX_FULL_CALLS_IN_FLIGHT + 1,
            "{most} calls at once"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_that_are_not_full_keep_to_four_calls() {
        let fake = FakeCoordinator::default();
        let coalescer = coalescer_over(fake.clone()).await;
        // 40 callers in a closed loop: no batch can fill (64), so at most
        // four calls are ever out, the direct one included.
        let callers = (0..40u64).map(|n| {
            let coalescer = coalescer.clone();
            tokio::spawn(async move {
                for round in 0..10u64 {
                    let grant = coalescer
                        .lease(&format!("k{n}"), "eu", round + 1)
                        .await
                        .expect("answered");
                    assert_eq!(grant.granted, round + 1);
                }
            })
        });
        for caller in futures::future::join_all(callers).await {
            caller.unwrap();
        }
        assert_eq!(fake.items.load(Ordering::SeqCst), 400);
        let most = fake.most_in_flight.load(Ordering::SeqCst);
        assert!(most <= MAX_CALLS_IN_FLIGHT, "{most} calls at once");
        let calls = coalescer.stats().calls.load(Ordering::Relaxed);
        assert!(calls < 200, "{calls} calls for 400 leases");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_lease_at_a_time_is_sent_by_its_caller_with_no_hand_off() {
        let fake = FakeCoordinator::older();
        let coalescer = coalescer_over(fake.clone()).await;
        for n in 1..=5u64 {
            let grant = coalescer.lease("k", "eu", n).await.expect("answered");
            assert_eq!(grant.granted, n);
        }
        let stats = coalescer.stats();
        assert_eq!(stats.direct_calls.load(Ordering::Relaxed), 5);
        assert_eq!(stats.calls.load(Ordering::Relaxed), 5);
        assert_eq!(fake.leases.load(Ordering::Relaxed), 5);
        assert_eq!(fake.batches.load(Ordering::Relaxed), 0);

        // A caller that gives up mid-call releases its call: the next lone
        // lease is sent directly again (not queued behind a call that will
        // never end).
        let gave_up =
            tokio::time::timeout(Duration::from_millis(1), coalescer.lease("k", "eu", 1)).await;
        assert!(gave_up.is_err(), "the fake takes 5 ms");
        coalescer.lease("k", "eu", 1).await.expect("answered");
        assert_eq!(stats.direct_calls.load(Ordering::Relaxed), 7);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_older_coordinator_is_served_lease_by_lease() {
        let fake = FakeCoordinator::older();
        let coalescer = coalescer_over(fake.clone()).await;
        let asks = (0..40u64).map(|n| {
            let coalescer = coalescer.clone();
            tokio::spawn(async move { coalescer.lease(&format!("k{n}"), "eu", n + 1).await })
        });
        for (n, answer) in futures::future::join_all(asks)
            .await
            .into_iter()
            .enumerate()
        {
            let grant = answer.unwrap().expect("every refill is answered");
            assert_eq!(grant.granted, n as u64 + 1, "each key gets its own answer");
        }
        assert_eq!(
            fake.leases.load(Ordering::Relaxed),
            40,
            "one lease per refill"
        );
        let batches = fake.batches.load(Ordering::Relaxed);
        assert!(
            batches as usize <= MAX_CALLS_IN_FLIGHT,
            "only the calls already out when the first UNIMPLEMENTED came back tried a batch: {batches}"
        );
        let calls = coalescer.stats().calls.load(Ordering::Relaxed);
        assert!(calls >= 40, "{calls} calls counted");
    }
}
