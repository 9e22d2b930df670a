//! Exactly-once against callers that reuse request ids: a restarted client
//! reusing its id on another request, and a flood of sessions trying to
//! make the coordinator forget another client's answers.

use anyhow::{ensure, Result};
use futures::stream::{self, StreamExt};
use leasehold_core::coordinator::MAX_SESSIONS;
use leasehold_proto::refusal::{reason_of, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::admin_client::AdminClient as AdminRpc;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

async fn rpc(addr: &str) -> Result<(CoordinatorRpc<Channel>, AdminRpc<Channel>)> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok((CoordinatorRpc::new(channel.clone()), AdminRpc::new(channel)))
}

fn lease(key: &str, tokens: u64, client: &str, seq: u64) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: key.into(),
        region: "eu".into(),
        tokens,
        request_id: Some(pb::RequestId {
            client_id: client.into(),
            seq,
        }),
    }
}

/// The reason in the refusal's `ErrorInfo` (a refusal without one fails
/// the comparisons below).
fn reason(status: &tonic::Status) -> Option<Reason> {
    reason_of(status)
}

/// Σ granted in `key`'s current window (a linearizable read).
pub(crate) async fn granted(api: &mut CoordinatorRpc<Channel>, key: &str) -> Result<u64> {
    Ok(api
        .get_window(pb::GetWindowRequest { key: key.into() })
        .await?
        .into_inner()
        .granted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_id_reused_for_another_request_is_refused_not_answered_with_old_grants(
) -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let (mut api, mut admin) = rpc(&cluster.addr(1)).await?;
    for prefix in ["a/", "b/"] {
        admin
            .set_policy(pb::SetPolicyRequest {
                policy: Some(counter_policy(prefix, 100, LONG_WINDOW_MS)),
            })
            .await?;
    }
    // The first incarnation of "svc" leases seq 1 and 2 on a/k.
    let first = api.lease(lease("a/k", 7, "svc", 1)).await?.into_inner();
    api.lease(lease("a/k", 4, "svc", 2)).await?;
    ensure!(first.granted == 7);

    // A restarted process reuses "svc" from seq 1: a retry of the same
    // request is still answered with its first outcome ...
    let replay = api.lease(lease("a/k", 7, "svc", 1)).await?.into_inner();
    ensure!(replay == first, "{replay:?} != {first:?}");
    // ... but the same ids on other requests are refused, not answered.
    for changed in [
        lease("b/k", 4, "svc", 2),
        lease("a/k", 5, "svc", 2),
        pb::LeaseRequest {
            region: "us".into(),
            ..lease("a/k", 4, "svc", 2)
        },
    ] {
        let status = api.lease(changed.clone()).await.unwrap_err();
        ensure!(
            status.code() == Code::AlreadyExists
                && reason(&status) == Some(Reason::RequestIdReused),
            "{changed:?}: {status:?}"
        );
    }
    ensure!(granted(&mut api, "b/k").await? == 0, "b/k got nothing");
    ensure!(granted(&mut api, "a/k").await? == 11, "a/k unchanged");
    let status = admin.status(pb::StatusRequest {}).await?.into_inner();
    ensure!(status.counters["rejected_session"] >= 3, "counted");
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_flood_is_refused_and_never_replays_another_clients_request() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let (mut api, mut admin) = rpc(&cluster.addr(1)).await?;
    admin
        .set_policy(pb::SetPolicyRequest {
            policy: Some(counter_policy("k", u64::from(u32::MAX), LONG_WINDOW_MS)),
        })
        .await?;
    let first = api.lease(lease("k", 7, "victim", 1)).await?.into_inner();

    // Open more sessions than the table holds, 64 at a time.
    let flood = MAX_SESSIONS + 100;
    let outcomes: Vec<Result<(), tonic::Status>> = stream::iter(0..flood)
        .map(|i| {
            let mut api = api.clone();
            async move {
                api.lease(lease("k", 1, &format!("flood-{i}"), 1))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    let refused = outcomes
        .iter()
        .filter(|r| {
            matches!(r, Err(s) if s.code() == Code::ResourceExhausted
                && reason(s) == Some(Reason::SessionsExhausted))
        })
        .count();
    let accepted = outcomes.iter().filter(|r| r.is_ok()).count();
    ensure!(
        accepted + refused == flood && accepted == MAX_SESSIONS - 1,
        "accepted {accepted}, refused {refused} of {flood}"
    );

    // The victim's retry is its first answer, executed once.
    let retry = api.lease(lease("k", 7, "victim", 1)).await?.into_inner();
    ensure!(retry == first, "{retry:?} != {first:?}");
    ensure!(granted(&mut api, "k").await? == 7 + accepted as u64);
    // A seq far past any opening seq of an unknown session is never executed.
    let status = api.lease(lease("k", 1, "gone", 1_000)).await.unwrap_err();
    ensure!(
        reason(&status) == Some(Reason::SessionExpired)
            || reason(&status) == Some(Reason::SessionsExhausted),
        "{status:?}"
    );
    cluster.stop_all().await
}
