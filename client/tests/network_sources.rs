//! The network credit sources against scripted gRPC servers on loopback:
//! wire conversions, retries with the same request id, error mapping.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_client::coordinator::{CoordinatorClient, RetryOptions};
use leasehold_client::transport::TcpDialer;
use leasehold_client::{
    AcquireRequest, ClientError, CoordinatorSource, CreditSource, EscrowSource,
    EscrowSourceOptions, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode,
};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId, TenantId};
use leasehold_proto::v1 as wire;
use leasehold_proto::v1::coordinator_server::{Coordinator, CoordinatorServer};
use leasehold_proto::v1::escrow_server::{Escrow, EscrowServer};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

#[derive(Clone, Default)]
struct FakeEscrow {
    /// Answers of the next acquires: `Err(())` = UNAVAILABLE.
    script: Arc<Mutex<VecDeque<Result<u64, ()>>>>,
    seen_ids: Arc<Mutex<Vec<wire::RequestId>>>,
    returned: Arc<Mutex<u64>>,
    return_ids: Arc<Mutex<Vec<wire::RequestId>>>,
}

#[tonic::async_trait]
impl Escrow for FakeEscrow {
    async fn acquire(
        &self,
        request: Request<wire::AcquireRequest>,
    ) -> Result<Response<wire::AcquireResponse>, Status> {
        let request = request.into_inner();
        self.seen_ids
            .lock()
            .expect("lock")
            .push(request.request_id.clone().unwrap_or_default());
        let step = self
            .script
            .lock()
            .expect("lock")
            .pop_front()
            .unwrap_or(Ok(request.tokens));
        match step {
            Err(()) => Err(Status::unavailable("coordinator unreachable")),
            Ok(granted) => Ok(Response::new(wire::AcquireResponse {
                granted: granted.min(request.tokens),
                limit: 100,
                window_start_ms: 60_000,
                window_end_ms: 120_000,
                remaining_lifetime_ms: 30_000,
                retry_after_ms: 0,
                coordinator_reachable: true,
                shadow_would_deny: false,
            })),
        }
    }

    async fn check(
        &self,
        request: Request<wire::CheckRequest>,
    ) -> Result<Response<wire::CheckResponse>, Status> {
        let cost = request.into_inner().cost;
        let allowed = cost <= 5;
        Ok(Response::new(wire::CheckResponse {
            decision: Some(wire::Decision {
                allowed,
                limit: 5,
                remaining: if allowed { 5 - cost } else { 5 },
                reset_at_ms: 120_000,
                retry_after_ms: if allowed { 0 } else { 250 },
            }),
            window_start_ms: 60_000,
            shadow_would_deny: false,
        }))
    }

    async fn r#return(
        &self,
        request: Request<wire::ReturnRequest>,
    ) -> Result<Response<wire::ReturnResponse>, Status> {
        let request = request.into_inner();
        let tokens = request.tokens;
        self.return_ids
            .lock()
            .expect("lock")
            .extend(request.request_id);
        *self.returned.lock().expect("lock") += tokens;
        Ok(Response::new(wire::ReturnResponse { accepted: tokens }))
    }

    async fn forecast(
        &self,
        _: Request<wire::ForecastRequest>,
    ) -> Result<Response<wire::ForecastResponse>, Status> {
        Ok(Response::new(wire::ForecastResponse { used: false }))
    }

    async fn status(
        &self,
        _: Request<wire::EscrowStatusRequest>,
    ) -> Result<Response<wire::EscrowStatusResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

#[derive(Clone, Default)]
struct FakeCoordinatorNode;

#[tonic::async_trait]
impl Coordinator for FakeCoordinatorNode {
    async fn lease(
        &self,
        request: Request<wire::LeaseRequest>,
    ) -> Result<Response<wire::LeaseResponse>, Status> {
        let request = request.into_inner();
        match request.key.as_str() {
            "fair-key" => Err(Status::failed_precondition("key is fair: use PoolGrant")),
            "unknown" => Err(Status::not_found("no policy matches key \"unknown\"")),
            _ => Ok(Response::new(wire::LeaseResponse {
                granted: request.tokens.min(3),
                limit: 3,
                window_start_ms: 0,
                window_end_ms: 1_000_000,
                coordinator_now_ms: 10,
                remaining_lifetime_ms: 999_990,
            })),
        }
    }
    async fn lease_batch(
        &self,
        _: Request<wire::LeaseBatchRequest>,
    ) -> Result<Response<wire::LeaseBatchResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn reconcile(
        &self,
        request: Request<wire::ReconcileRequest>,
    ) -> Result<Response<wire::ReconcileResponse>, Status> {
        Ok(Response::new(wire::ReconcileResponse {
            credited: request.into_inner().leftover,
            disposition: 1,
        }))
    }
    async fn pool_grant(
        &self,
        _: Request<wire::PoolGrantRequest>,
    ) -> Result<Response<wire::PoolGrantResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn pool_release(
        &self,
        _: Request<wire::PoolReleaseRequest>,
    ) -> Result<Response<wire::PoolReleaseResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_window(
        &self,
        _: Request<wire::GetWindowRequest>,
    ) -> Result<Response<wire::GetWindowResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn get_placement(
        &self,
        _: Request<wire::GetPlacementRequest>,
    ) -> Result<Response<wire::Placement>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

fn loopback() -> (TcpIncoming, String) {
    let incoming = TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind loopback");
    let addr = incoming.local_addr().expect("bound").to_string();
    (incoming, addr)
}

fn spawn_escrow(fake: FakeEscrow) -> String {
    let (incoming, addr) = loopback();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(EscrowServer::new(fake))
            .serve_with_incoming(incoming),
    );
    addr
}

fn escrow_source(addr: &str) -> EscrowSource {
    let options = EscrowSourceOptions::default()
        .with_rpc_timeout(Duration::from_millis(500))
        .with_max_attempts(3)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5));
    EscrowSource::new(addr, Arc::new(TcpDialer::default()), options).expect("valid address")
}

#[tokio::test]
async fn acquire_retries_with_the_same_request_id() {
    let fake = FakeEscrow::default();
    fake.script.lock().expect("lock").extend([Err(()), Ok(7)]);
    let source = escrow_source(&spawn_escrow(fake.clone()));
    let request = AcquireRequest {
        key: Key::new("k").expect("valid"),
        tenant: Some(TenantId::new("t1").expect("valid")),
        weight: 2,
        tokens: 10,
        request_id: RequestId {
            client: ClientId::new("me").expect("valid"),
            seq: 42,
        },
    };
    let grant = source
        .acquire(request)
        .await
        .expect("second attempt succeeds");
    assert_eq!(grant.granted, 7);
    assert_eq!(
        (
            grant.window_start_ms,
            grant.window_end_ms,
            grant.remaining_lifetime_ms
        ),
        (60_000, 120_000, 30_000)
    );
    let ids = fake.seen_ids.lock().expect("lock").clone();
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|id| id.client_id == "me" && id.seq == 42));
}

#[tokio::test]
async fn a_leased_limiter_runs_over_an_escrow_node() {
    let fake = FakeEscrow::default();
    let source = escrow_source(&spawn_escrow(fake.clone()));
    let options = LeaseOptions::default().with_sizing(LeaseSizing::Fixed(10));
    let l1 = Limiter::new(
        source,
        LimiterConfig::new(Mode::Leased(options), ClientId::new("svc").expect("valid")),
    )
    .expect("valid config");
    for _ in 0..4 {
        let a = l1.check_labelled("k", 1).await.expect("ok");
        assert!(a.decision.allowed);
        assert_eq!(a.window_start_ms, Some(60_000));
        assert_eq!(a.decision.reset_at_ms, 120_000);
    }
    assert_eq!(l1.stats().refills, 1);
    assert_eq!(l1.return_idle_credits(Duration::ZERO).await, Ok(6));
    assert_eq!(*fake.returned.lock().expect("lock"), 6);
    // The return names the holder of the credits: the limiter's incarnation.
    let acquired_as = fake.seen_ids.lock().expect("lock")[0].client_id.clone();
    let returns = fake.return_ids.lock().expect("lock").clone();
    assert_eq!(returns.len(), 1);
    assert_eq!(returns[0].client_id, acquired_as);
    assert_eq!(acquired_as, l1.client_id().as_str());
}

#[tokio::test]
async fn strict_checks_over_an_escrow_node() {
    let source = escrow_source(&spawn_escrow(FakeEscrow::default()));
    let l1 = Limiter::new(
        source,
        LimiterConfig::new(Mode::Strict, ClientId::new("svc").expect("valid")),
    )
    .expect("valid config");
    let a = l1.check_labelled("k", 2).await.expect("ok");
    assert!(a.decision.allowed && a.window_start_ms == Some(60_000) && a.decision.remaining == 3);
    let d = l1.check("k", 9).await.expect("ok");
    assert!(!d.allowed && d.retry_after_ms == 250);
}

#[tokio::test]
async fn an_unreachable_escrow_node_is_a_transient_error() {
    // Nothing listens on the port of a dropped listener.
    let (incoming, addr) = loopback();
    drop(incoming);
    let l1 = Limiter::new(
        escrow_source(&addr),
        LimiterConfig::new(Mode::Strict, ClientId::new("svc").expect("valid")),
    )
    .expect("valid config");
    let err = l1.check("k", 1).await.expect_err("no server");
    assert!(err.is_transient(), "{err:?}");
    assert!(matches!(
        EscrowSource::new(
            "no-port",
            Arc::new(TcpDialer::default()),
            EscrowSourceOptions::default()
        ),
        Err(ClientError::InvalidInput(_))
    ));
}

/// Two escrow nodes of one region, the first gone: a source over both is
/// served by the second under the same request id, and stays with it while
/// it answers.
#[tokio::test]
async fn a_source_over_a_regions_escrow_nodes_moves_on_when_one_is_gone() {
    let (gone, gone_addr) = loopback();
    drop(gone);
    let live = FakeEscrow::default();
    let live_addr = spawn_escrow(live.clone());
    let options = EscrowSourceOptions::default()
        .with_rpc_timeout(Duration::from_millis(500))
        .with_max_attempts(2)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5));
    let source = EscrowSource::with_endpoints(
        [gone_addr.as_str(), live_addr.as_str(), gone_addr.as_str()],
        Arc::new(TcpDialer::default()),
        options,
    )
    .expect("valid endpoints");
    assert_eq!(source.endpoints().len(), 2, "duplicates count once");
    let request = AcquireRequest {
        key: Key::new("k").expect("valid"),
        tenant: None,
        weight: 1,
        tokens: 5,
        request_id: RequestId {
            client: ClientId::new("me").expect("valid"),
            seq: 9,
        },
    };
    let grant = source
        .acquire(request)
        .await
        .expect("the second node serves");
    assert_eq!(grant.granted, 5);
    assert!(source
        .addr()
        .ends_with(live_addr.rsplit(':').next().unwrap_or_default()));
    let ids = live.seen_ids.lock().expect("lock").clone();
    assert_eq!(ids.len(), 1);
    assert_eq!((ids[0].client_id.as_str(), ids[0].seq), ("me", 9));
    // The node in use stays in use while it answers.
    let l1 = Limiter::new(
        source,
        LimiterConfig::new(Mode::Strict, ClientId::new("svc").expect("valid")),
    )
    .expect("valid config");
    for _ in 0..3 {
        assert!(l1.check("k", 1).await.expect("served").allowed);
    }
    assert!(matches!(
        EscrowSource::with_endpoints(
            Vec::<String>::new(),
            Arc::new(TcpDialer::default()),
            EscrowSourceOptions::default()
        ),
        Err(ClientError::InvalidInput(_))
    ));
}

fn coordinator_source() -> CoordinatorSource {
    let (incoming, addr) = loopback();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CoordinatorServer::new(FakeCoordinatorNode))
            .serve_with_incoming(incoming),
    );
    let options = RetryOptions {
        call_timeout: Duration::from_millis(500),
        total_timeout: Duration::from_secs(2),
        max_attempts: 3,
        backoff_base: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
    };
    let client = CoordinatorClient::with_options([addr], Arc::new(TcpDialer::default()), options)
        .expect("valid");
    CoordinatorSource::new(client, RegionId::new("eu").expect("valid"))
}

#[tokio::test]
async fn the_coordinator_backend_leases_and_rejects_fair_keys_clearly() {
    let source = Arc::new(coordinator_source());
    let options = LeaseOptions::default().with_sizing(LeaseSizing::Fixed(2));
    let l1 = Limiter::with_shared_source(
        source.clone(),
        LimiterConfig::new(
            Mode::Leased(options),
            ClientId::new("direct").expect("valid"),
        ),
    )
    .expect("valid config");
    let a = l1.check_labelled("plain", 1).await.expect("ok");
    assert!(a.decision.allowed && a.window_start_ms == Some(0));

    let fair = l1
        .check("fair-key", 1)
        .await
        .expect_err("fair keys need an escrow node");
    assert!(
        matches!(&fair, ClientError::Unsupported(m) if m.contains("fair")),
        "{fair:?}"
    );
    let unknown = l1.check("unknown", 1).await.expect_err("no policy");
    assert!(matches!(unknown, ClientError::NoPolicy(_)));

    let mut with_tenant = LimiterConfig::new(Mode::Strict, ClientId::new("t").expect("valid"));
    with_tenant.tenant = Some(TenantId::new("acme").expect("valid"));
    let l1 = Limiter::with_shared_source(source, with_tenant).expect("valid config");
    assert!(matches!(
        l1.check("plain", 1).await,
        Err(ClientError::Unsupported(_))
    ));
}

#[tokio::test]
async fn strict_checks_against_the_coordinator() {
    let l1 = Limiter::new(
        coordinator_source(),
        LimiterConfig::new(Mode::Strict, ClientId::new("s").expect("valid")),
    )
    .expect("valid config");
    let a = l1.check_labelled("plain", 3).await.expect("ok");
    assert!(a.decision.allowed && a.window_start_ms == Some(0));
    // The fake grants at most 3: a cost of 5 is denied and the partial
    // grant reconciled back.
    let d = l1.check("plain", 5).await.expect("ok");
    assert!(!d.allowed && d.retry_after_ms >= 1);
}

/// A coordinator that serves `LeaseBatch` too, slowly enough that
/// concurrent callers queue: grants `min(tokens, 3)` per item, counting
/// the calls of each kind.
#[derive(Clone, Default)]
struct BatchingCoordinator {
    leases: Arc<std::sync::atomic::AtomicU64>,
    batches: Arc<std::sync::atomic::AtomicU64>,
    batched_items: Arc<std::sync::atomic::AtomicU64>,
}

fn capped_grant(tokens: u64) -> wire::LeaseResponse {
    wire::LeaseResponse {
        granted: tokens.min(3),
        limit: 3,
        window_start_ms: 0,
        window_end_ms: 1_000_000,
        coordinator_now_ms: 10,
        remaining_lifetime_ms: 999_990,
    }
}

#[tonic::async_trait]
impl Coordinator for BatchingCoordinator {
    async fn lease(
        &self,
        request: Request<wire::LeaseRequest>,
    ) -> Result<Response<wire::LeaseResponse>, Status> {
        use std::sync::atomic::Ordering;
        self.leases.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(Response::new(capped_grant(request.into_inner().tokens)))
    }
    async fn lease_batch(
        &self,
        request: Request<wire::LeaseBatchRequest>,
    ) -> Result<Response<wire::LeaseBatchResponse>, Status> {
        use std::sync::atomic::Ordering;
        let items = request.into_inner().items;
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_items
            .fetch_add(items.len() as u64, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
        let results = items
            .into_iter()
            .map(|item| wire::LeaseItemResult {
                result: Some(wire::lease_item_result::Result::Granted(capped_grant(
                    item.tokens,
                ))),
            })
            .collect();
        Ok(Response::new(wire::LeaseBatchResponse { results }))
    }
    async fn reconcile(
        &self,
        request: Request<wire::ReconcileRequest>,
    ) -> Result<Response<wire::ReconcileResponse>, Status> {
        FakeCoordinatorNode.reconcile(request).await
    }
    async fn pool_grant(
        &self,
        request: Request<wire::PoolGrantRequest>,
    ) -> Result<Response<wire::PoolGrantResponse>, Status> {
        FakeCoordinatorNode.pool_grant(request).await
    }
    async fn pool_release(
        &self,
        request: Request<wire::PoolReleaseRequest>,
    ) -> Result<Response<wire::PoolReleaseResponse>, Status> {
        FakeCoordinatorNode.pool_release(request).await
    }
    async fn get_window(
        &self,
        request: Request<wire::GetWindowRequest>,
    ) -> Result<Response<wire::GetWindowResponse>, Status> {
        FakeCoordinatorNode.get_window(request).await
    }

    async fn get_placement(
        &self,
        request: Request<wire::GetPlacementRequest>,
    ) -> Result<Response<wire::Placement>, Status> {
        FakeCoordinatorNode.get_placement(request).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_strict_checks_leave_together_and_each_gets_its_own_answer() {
    use std::sync::atomic::Ordering;
    let (incoming, addr) = loopback();
    let fake = BatchingCoordinator::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CoordinatorServer::new(fake.clone()))
            .serve_with_incoming(incoming),
    );
    let client = CoordinatorClient::with_options(
        [addr],
        Arc::new(TcpDialer::default()),
        RetryOptions::default(),
    )
    .expect("valid");
    let source = CoordinatorSource::new(client, RegionId::new("eu").expect("valid"));
    let l1 = Arc::new(
        Limiter::new(
            source.clone(),
            LimiterConfig::new(Mode::Strict, ClientId::new("s").expect("valid")),
        )
        .expect("valid config"),
    );
    const CHECKS: u64 = 200;
    let checks = (0..CHECKS).map(|n| {
        let l1 = l1.clone();
        // Costs 1..=5 over keys k0..k49: the fake grants at most 3, so a
        // cost above 3 must be denied (and its partial grant handed back).
        let cost = n % 5 + 1;
        tokio::spawn(async move { (cost, l1.check(&format!("k{}", n % 50), cost).await) })
    });
    for joined in futures::future::join_all(checks).await {
        let (cost, decision) = joined.expect("task");
        let decision = decision.expect("every check is answered");
        assert_eq!(decision.allowed, cost <= 3, "cost {cost}: {decision:?}");
    }
    let (calls, sent) = source.strict_check_calls();
    assert_eq!(sent, CHECKS, "every check went through the coalescer");
    let leases = fake.leases.load(Ordering::Relaxed);
    let batches = fake.batches.load(Ordering::Relaxed);
    assert_eq!(
        calls,
        leases + batches,
        "the source counts what the server saw"
    );
    assert_eq!(
        leases + fake.batched_items.load(Ordering::Relaxed),
        CHECKS,
        "each check is one item exactly once"
    );
    assert!(
        calls <= CHECKS / 4,
        "{calls} calls for {CHECKS} concurrent checks ({leases} single, {batches} batches)"
    );
}

/// A source that moved off its first node (failing) goes back to it once
/// `return_after` has passed and it answers again — a restarted node gets
/// its callers back — and moves on again while it still fails.
#[tokio::test]
async fn a_source_returns_to_its_first_node_once_it_answers_again() {
    let first = FakeEscrow::default();
    // Down for its first two calls.
    first
        .script
        .lock()
        .expect("lock")
        .extend([Err(()), Err(())]);
    let first_addr = spawn_escrow(first.clone());
    let second = FakeEscrow::default();
    let second_addr = spawn_escrow(second.clone());
    let options = EscrowSourceOptions::default()
        .with_rpc_timeout(Duration::from_millis(500))
        .with_max_attempts(2)
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
        .with_return_after(Duration::from_millis(100));
    let source = EscrowSource::with_endpoints(
        [first_addr.as_str(), second_addr.as_str()],
        Arc::new(TcpDialer::default()),
        options,
    )
    .expect("valid endpoints");
    let request = |seq| AcquireRequest {
        key: Key::new("k").expect("valid"),
        tenant: None,
        weight: 1,
        tokens: 1,
        request_id: RequestId {
            client: ClientId::new("me").expect("valid"),
            seq,
        },
    };
    source
        .acquire(request(1))
        .await
        .expect("the second node serves");
    assert_eq!(source.addr(), source.endpoints()[1]);
    // Before the wait is over it stays on the second node.
    source.acquire(request(2)).await.expect("served");
    assert_eq!(second.seen_ids.lock().expect("lock").len(), 2);
    // Still failing after the wait: the source tries it, then moves on.
    tokio::time::sleep(Duration::from_millis(150)).await;
    source
        .acquire(request(3))
        .await
        .expect("served by the second again");
    assert_eq!(source.addr(), source.endpoints()[1]);
    assert_eq!(first.seen_ids.lock().expect("lock").len(), 2);
    // Answering again: the next acquisition after the wait goes back.
    tokio::time::sleep(Duration::from_millis(150)).await;
    source
        .acquire(request(4))
        .await
        .expect("served by the first");
    assert_eq!(source.addr(), source.endpoints()[0]);
    assert_eq!(first.seen_ids.lock().expect("lock").len(), 3);
    assert_eq!(second.seen_ids.lock().expect("lock").len(), 3);
}
