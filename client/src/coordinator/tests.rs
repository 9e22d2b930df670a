//! Routing tests against scripted fake coordinators on loopback.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_proto::v1::coordinator_server::{Coordinator, CoordinatorServer};
use leasehold_proto::v1::*;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::*;
use crate::transport::{Dialer, TcpDialer};

/// What a fake node answers to its next lease.
#[derive(Clone)]
enum Script {
    Grant(u64),
    NotLeader {
        id: u64,
        addr: String,
    },
    Unavailable,
    Invalid,
    Hang,
    /// `SESSION_EXPIRED`: the node does not hold the request's session.
    SessionExpired,
}

#[derive(Clone, Default)]
struct FakeNode {
    script: Arc<Mutex<VecDeque<Script>>>,
    seen: Arc<Mutex<Vec<RequestId>>>,
}

#[tonic::async_trait]
impl Coordinator for FakeNode {
    async fn lease(
        &self,
        request: Request<LeaseRequest>,
    ) -> Result<Response<LeaseResponse>, Status> {
        let request = request.into_inner();
        self.seen
            .lock()
            .unwrap()
            .push(request.request_id.clone().unwrap());
        let step = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Script::Unavailable);
        match step {
            Script::Grant(granted) => Ok(Response::new(LeaseResponse {
                granted,
                ..Default::default()
            })),
            Script::NotLeader { id, addr } => {
                // Metadata only, no ErrorInfo: the client reads either.
                let mut status = Status::failed_precondition(format!(
                    "not the leader; leader is {id} at {addr}"
                ));
                LeaderHint::new(Some(id), Some(addr)).attach(&mut status);
                Err(status)
            }
            Script::Unavailable => Err(Status::unavailable("no quorum")),
            Script::Invalid => Err(Status::invalid_argument("tokens must be > 0")),
            Script::SessionExpired => Err(leasehold_proto::refusal::refusal(
                leasehold_proto::refusal::Reason::SessionExpired,
                "the session expired",
            )),
            Script::Hang => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Err(Status::unavailable("late"))
            }
        }
    }
    /// Each item is answered by the next script step as if sent alone;
    /// `SessionExpired` refuses its item, any other step that is not a
    /// grant fails the whole call.
    async fn lease_batch(
        &self,
        request: Request<LeaseBatchRequest>,
    ) -> Result<Response<LeaseBatchResponse>, Status> {
        let mut results = Vec::new();
        for item in request.into_inner().items {
            let result = match self.lease(Request::new(item)).await {
                Ok(answer) => lease_item_result::Result::Granted(answer.into_inner()),
                Err(status)
                    if leasehold_proto::refusal::reason_of(&status)
                        == Some(leasehold_proto::refusal::Reason::SessionExpired) =>
                {
                    lease_item_result::Result::Refused(leasehold_proto::refusal::item_refusal(
                        &status,
                    ))
                }
                Err(status) => return Err(status),
            };
            results.push(LeaseItemResult {
                result: Some(result),
            });
        }
        Ok(Response::new(LeaseBatchResponse { results }))
    }

    async fn reconcile(
        &self,
        _: Request<ReconcileRequest>,
    ) -> Result<Response<ReconcileResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn pool_grant(
        &self,
        _: Request<PoolGrantRequest>,
    ) -> Result<Response<PoolGrantResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn pool_release(
        &self,
        _: Request<PoolReleaseRequest>,
    ) -> Result<Response<PoolReleaseResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
    async fn get_window(
        &self,
        _: Request<GetWindowRequest>,
    ) -> Result<Response<GetWindowResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn get_placement(
        &self,
        _: Request<leasehold_proto::v1::GetPlacementRequest>,
    ) -> Result<Response<leasehold_proto::v1::Placement>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

async fn spawn_fake(script: Vec<Script>) -> (String, FakeNode) {
    let node = FakeNode {
        script: Arc::new(Mutex::new(script.into())),
        ..Default::default()
    };
    let incoming = TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0))).unwrap();
    let addr = incoming.local_addr().unwrap().to_string();
    let service = CoordinatorServer::new(node.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    (addr, node)
}

fn fast_options() -> RetryOptions {
    RetryOptions {
        call_timeout: Duration::from_millis(300),
        total_timeout: Duration::from_secs(5),
        max_attempts: 6,
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(20),
    }
}

fn client(endpoints: &[&str]) -> CoordinatorClient {
    CoordinatorClient::with_options(
        endpoints.iter().copied(),
        Arc::new(TcpDialer::default()),
        fast_options(),
    )
    .unwrap()
}

#[tokio::test]
async fn follows_leader_hint_with_the_same_request_id() {
    let (leader_addr, leader) = spawn_fake(vec![Script::Grant(7), Script::Grant(3)]).await;
    let (follower_addr, follower) = spawn_fake(vec![Script::NotLeader {
        id: 2,
        addr: format!("http://{leader_addr}"),
    }])
    .await;
    let client = client(&[&follower_addr]);

    let first = client.lease("k", "eu", 7).await.unwrap();
    assert_eq!(first.granted, 7);
    assert_eq!(client.leader().as_deref(), Some(leader_addr.as_str()));
    let asked_follower = follower.seen.lock().unwrap().clone();
    let asked_leader = leader.seen.lock().unwrap().clone();
    assert_eq!(asked_follower.len(), 1);
    assert_eq!(
        asked_leader, asked_follower,
        "the redirected retry reuses the request id"
    );

    // The leader is remembered: the next call goes straight there.
    assert_eq!(client.lease("k", "eu", 3).await.unwrap().granted, 3);
    assert_eq!(follower.seen.lock().unwrap().len(), 1);
    let ids = leader.seen.lock().unwrap().clone();
    assert_ne!(
        ids[0].seq, ids[1].seq,
        "a new logical request gets a new sequence number"
    );
}

/// A batch follows a leader hint like a single lease: the whole call is
/// resent to the leader with the same request ids, one per item, and each
/// item gets its answer in order.
#[tokio::test]
async fn a_batch_follows_the_leader_hint_with_the_same_request_ids() {
    let (leader_addr, leader) =
        spawn_fake(vec![Script::Grant(5), Script::Grant(6), Script::Grant(7)]).await;
    let (follower_addr, follower) = spawn_fake(vec![Script::NotLeader {
        id: 2,
        addr: format!("http://{leader_addr}"),
    }])
    .await;
    let client = client(&[&follower_addr]);
    let items: Vec<LeaseItem> = (0..3)
        .map(|n| LeaseItem {
            key: format!("k{n}"),
            region: "eu".into(),
            tokens: 9,
        })
        .collect();
    let answers = client.lease_batch(&items).await.unwrap();
    let granted: Vec<u64> = answers.into_iter().map(|a| a.unwrap().granted).collect();
    assert_eq!(granted, [5, 6, 7]);
    let asked_leader = leader.seen.lock().unwrap().clone();
    assert_eq!(asked_leader.len(), 3);
    assert_eq!(
        follower.seen.lock().unwrap()[0],
        asked_leader[0],
        "the redirected call reuses the first item's request id"
    );
    let seqs: Vec<u64> = asked_leader.iter().map(|id| id.seq).collect();
    assert_eq!(seqs, [1, 2, 3], "one session, one seq per item, in order");
}

#[tokio::test]
async fn a_leader_hint_that_does_not_resolve_fails_fast_with_a_hint() {
    let unresolvable = "leasehold-2.invalid:7100";
    let script = || {
        (0..20)
            .map(|_| Script::NotLeader {
                id: 2,
                addr: unresolvable.to_string(),
            })
            .collect::<Vec<_>>()
    };
    let (first, _) = spawn_fake(script()).await;
    let (second, _) = spawn_fake(script()).await;
    let client = CoordinatorClient::with_options(
        [first.as_str(), second.as_str()],
        Arc::new(TcpDialer::default()),
        RetryOptions {
            max_attempts: 50,
            total_timeout: Duration::from_secs(20),
            ..fast_options()
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    let error = client.lease("k", "eu", 1).await.unwrap_err();
    match &error {
        CoordinatorError::LeaderUnresolvable { leader_addr, .. } => {
            assert_eq!(leader_addr, unresolvable)
        }
        other => panic!("expected LeaderUnresolvable, got {other:?}"),
    }
    assert!(!error.is_retryable());
    assert!(
        error.to_string().contains("pass every member's endpoint"),
        "{error}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "failed after {:?}, not fast",
        started.elapsed()
    );
}

#[tokio::test]
async fn retries_unavailable_and_moves_to_the_next_endpoint() {
    let (a_addr, a) = spawn_fake(vec![Script::Unavailable]).await;
    let (b_addr, b) = spawn_fake(vec![Script::Grant(5)]).await;
    let client = client(&[&a_addr, &b_addr]);
    assert_eq!(client.lease("k", "eu", 5).await.unwrap().granted, 5);
    assert_eq!(a.seen.lock().unwrap()[0], b.seen.lock().unwrap()[0]);
}

#[tokio::test]
async fn a_hung_node_times_out_and_the_call_moves_on() {
    let (a_addr, _a) = spawn_fake(vec![Script::Hang]).await;
    let (b_addr, _b) = spawn_fake(vec![Script::Grant(1)]).await;
    let client = client(&[&a_addr, &b_addr]);
    assert_eq!(client.lease("k", "eu", 1).await.unwrap().granted, 1);
}

#[tokio::test]
async fn invalid_argument_is_terminal() {
    let (a_addr, a) = spawn_fake(vec![Script::Invalid, Script::Grant(1)]).await;
    let client = client(&[&a_addr]);
    let error = client.lease("k", "eu", 0).await.unwrap_err();
    assert!(
        matches!(error, CoordinatorError::InvalidArgument(_)),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    assert_eq!(
        a.seen.lock().unwrap().len(),
        1,
        "no retry after a terminal error"
    );
}

#[tokio::test]
async fn unreachable_cluster_gives_a_retryable_error_within_the_budget() {
    // Port 1 on loopback refuses connections.
    let client = client(&["127.0.0.1:1"]);
    let error = client.lease("k", "eu", 1).await.unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
}

#[test]
fn empty_or_malformed_endpoint_lists_are_rejected() {
    let dialer: Arc<dyn Dialer> = Arc::new(TcpDialer::default());
    assert_eq!(
        CoordinatorClient::new(Vec::<String>::new(), dialer.clone()).unwrap_err(),
        CoordinatorError::NoEndpoints
    );
    assert!(matches!(
        CoordinatorClient::new(["nope"], dialer).unwrap_err(),
        CoordinatorError::Address(_)
    ));
}

#[tokio::test]
async fn concurrent_calls_use_distinct_sessions_with_in_order_sequences() {
    let script = vec![Script::Grant(1); 64];
    let (addr, node) = spawn_fake(script).await;
    let client = client(&[&addr]);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move {
                for _ in 0..8 {
                    client.lease("k", "eu", 1).await.unwrap();
                }
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
    let seen = node.seen.lock().unwrap().clone();
    assert!(
        client.sessions_opened() <= 8,
        "sessions follow peak concurrency"
    );
    let mut by_session: std::collections::HashMap<String, Vec<u64>> = Default::default();
    for id in seen {
        by_session.entry(id.client_id).or_default().push(id.seq);
    }
    for (session, seqs) in by_session {
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "{session}: one request at a time, in order: {seqs:?}"
        );
    }
}

#[test]
fn a_seed_fixes_the_client_id() {
    let dialer: Arc<dyn Dialer> = Arc::new(TcpDialer::default());
    let a = CoordinatorClient::with_seed(["n:1"], dialer.clone(), fast_options(), 7).unwrap();
    let b = CoordinatorClient::with_seed(["n:1"], dialer.clone(), fast_options(), 7).unwrap();
    let c = CoordinatorClient::with_seed(["n:1"], dialer, fast_options(), 8).unwrap();
    assert_eq!(a.client_id(), b.client_id());
    assert_ne!(a.client_id(), c.client_id());
    assert_eq!(a.next_request_id(), b.next_request_id());
}

fn ids(node: &FakeNode) -> Vec<(String, u64)> {
    node.seen
        .lock()
        .unwrap()
        .iter()
        .map(|id| (id.client_id.clone(), id.seq))
        .collect()
}

/// A session the coordinator no longer holds (idle for a minute, or never
/// opened) is retired: the refused lease goes again at seq 1 of a new
/// session, and the next lease uses the new one, never the retired one.
#[tokio::test]
async fn a_forgotten_session_is_retired_and_the_lease_goes_again_in_a_new_one() {
    let (addr, node) = spawn_fake(vec![
        Script::Grant(1),
        Script::SessionExpired,
        Script::Grant(2),
        Script::Grant(3),
    ])
    .await;
    let client = client(&[&addr]);
    let id = client.client_id().to_string();
    let granted: Vec<u64> = [
        client.lease("k", "eu", 1).await.unwrap().granted,
        client.lease("k", "eu", 2).await.unwrap().granted,
        client.lease("k", "eu", 3).await.unwrap().granted,
    ]
    .into();
    assert_eq!(granted, [1, 2, 3]);
    assert_eq!(
        ids(&node),
        [
            (format!("{id}-s0"), 1),
            (format!("{id}-s0"), 2),
            (format!("{id}-s1"), 1),
            (format!("{id}-s1"), 2),
        ]
    );
    assert_eq!(client.sessions_renewed(), 1);
}

/// In a batch only the items refused `SESSION_EXPIRED` go again, in a new
/// session; every item keeps its place in the answer.
#[tokio::test]
async fn a_batch_sends_the_items_of_a_forgotten_session_again_in_a_new_one() {
    let (addr, node) = spawn_fake(vec![
        Script::Grant(5),
        Script::SessionExpired,
        Script::Grant(7),
        Script::Grant(6),
    ])
    .await;
    let client = client(&[&addr]);
    let id = client.client_id().to_string();
    let items: Vec<LeaseItem> = (0..3)
        .map(|n| LeaseItem {
            key: format!("k{n}"),
            region: "eu".into(),
            tokens: 9,
        })
        .collect();
    let granted: Vec<u64> = client
        .lease_batch(&items)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.unwrap().granted)
        .collect();
    assert_eq!(granted, [5, 6, 7]);
    assert_eq!(
        ids(&node),
        [
            (format!("{id}-s0"), 1),
            (format!("{id}-s0"), 2),
            (format!("{id}-s0"), 3),
            (format!("{id}-s1"), 1),
        ]
    );
}

/// A caller-managed id refused `SESSION_EXPIRED` is the caller's to judge
/// (it may have been executed long ago), so it is not sent again; the
/// client's own session is renamed, so the next ids open a session.
#[tokio::test]
async fn a_forgotten_own_session_is_renamed_for_the_next_ids() {
    let (addr, node) = spawn_fake(vec![Script::SessionExpired, Script::Grant(4)]).await;
    let client = client(&[&addr]);
    let id = client.client_id().to_string();
    let refused = client
        .lease_with_id("k", "eu", 4, client.next_request_id())
        .await
        .unwrap_err();
    assert!(refused.is_session_expired(), "{refused:?}");
    let next = client.next_request_id();
    assert_eq!(
        (next.client_id.as_str(), next.seq),
        (format!("{id}-r1").as_str(), 1)
    );
    assert_eq!(
        client
            .lease_with_id("k", "eu", 4, next)
            .await
            .unwrap()
            .granted,
        4
    );
    assert_eq!(ids(&node), [(id.clone(), 1), (format!("{id}-r1"), 1)]);
}

/// A limiter's session the coordinator forgot is renamed by the source
/// from the refused seq on: the request goes again as seq 1 of the new
/// name, later ids follow it, and a resend of an id maps to the same id
/// (so the coordinator answers it from its session: exactly-once).
#[tokio::test]
async fn a_coordinator_source_renames_a_forgotten_limiter_session() {
    use crate::source::{AcquireRequest, CreditSource};
    use leasehold_core::ids::{ClientId, Key, RegionId};
    let (addr, node) = spawn_fake(vec![
        Script::SessionExpired,
        Script::Grant(1),
        Script::Grant(2),
        Script::Grant(1),
    ])
    .await;
    let source = crate::CoordinatorSource::new(client(&[&addr]), RegionId::new("eu").unwrap());
    let acquire = |seq| AcquireRequest {
        key: Key::new("k").unwrap(),
        tenant: None,
        weight: 1,
        tokens: 1,
        request_id: leasehold_core::ids::RequestId {
            client: ClientId::new("lim").unwrap(),
            seq,
        },
    };
    assert_eq!(source.acquire(acquire(70)).await.unwrap().granted, 1);
    assert_eq!(source.acquire(acquire(71)).await.unwrap().granted, 2);
    assert_eq!(source.acquire(acquire(70)).await.unwrap().granted, 1);
    assert_eq!(
        ids(&node),
        [
            ("lim".into(), 70),
            ("lim-r1".into(), 1),
            ("lim-r1".into(), 2),
            ("lim-r1".into(), 1),
        ]
    );
}
