//! Bad input gets the right gRPC code and `ErrorInfo` reason, never a
//! panic, and changes nothing. Every refusal here must carry a Leasehold
//! `ErrorInfo` whose reason goes with the status code.

use anyhow::{ensure, Result};
use leasehold_proto::refusal::{self, reason_of, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::admin_client::AdminClient as AdminRpc;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use leasehold_proto::LeaderHint;
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

async fn rpc(addr: &str) -> Result<(CoordinatorRpc<Channel>, AdminRpc<Channel>)> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    Ok((CoordinatorRpc::new(channel.clone()), AdminRpc::new(channel)))
}

fn lease(key: &str, region: &str, tokens: u64) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: key.into(),
        region: region.into(),
        tokens,
        request_id: None,
    }
}

/// The refusal's reason, checked against its code.
fn reason<T: std::fmt::Debug>(result: Result<tonic::Response<T>, tonic::Status>) -> Reason {
    match result {
        Ok(response) => panic!("expected an error, got {response:?}"),
        Err(status) => checked_reason(&status),
    }
}

fn checked_reason(status: &tonic::Status) -> Reason {
    let reason = reason_of(status).unwrap_or_else(|| panic!("no ErrorInfo reason: {status:?}"));
    assert_eq!(reason.code(), status.code(), "{status:?}");
    reason
}

fn code<T: std::fmt::Debug>(result: Result<tonic::Response<T>, tonic::Status>) -> Code {
    reason(result).code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_request_gets_its_code_and_changes_nothing() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let (mut api, mut admin) = rpc(&cluster.addr(1)).await?;
    admin
        .set_policy(pb::SetPolicyRequest {
            policy: Some(counter_policy("ok/", 100, LONG_WINDOW_MS)),
        })
        .await?;

    let long_key = "k".repeat(257);
    let long_region = "r".repeat(65);
    for request in [
        lease("", "eu", 1),
        lease(&long_key, "eu", 1),
        lease("ok/k", "", 1),
        lease("ok/k", &long_region, 1),
        lease("ok/k", "eu", 0),
    ] {
        ensure!(
            code(api.lease(request.clone()).await) == Code::InvalidArgument,
            "{request:?}"
        );
    }
    let empty_client = pb::LeaseRequest {
        request_id: Some(pb::RequestId {
            client_id: String::new(),
            seq: 1,
        }),
        ..lease("ok/k", "eu", 1)
    };
    ensure!(code(api.lease(empty_client).await) == Code::InvalidArgument);
    let no_policy = api.lease(lease("nopolicy/k", "eu", 1)).await.unwrap_err();
    ensure!(
        checked_reason(&no_policy) == Reason::NoPolicy,
        "{no_policy:?}"
    );
    ensure!(refusal::detail(&no_policy, refusal::KEY).as_deref() == Some("nopolicy/k"));
    let long = api.lease(lease(&long_key, "eu", 1)).await.unwrap_err();
    ensure!(checked_reason(&long) == Reason::InvalidField);
    ensure!(
        refusal::detail(&long, refusal::FIELD).as_deref() == Some("key"),
        "{long:?}"
    );
    let zero = api.lease(lease("ok/k", "eu", 0)).await.unwrap_err();
    ensure!(
        refusal::detail(&zero, refusal::FIELD).as_deref() == Some("tokens"),
        "{zero:?}"
    );
    ensure!(
        code(
            api.get_window(pb::GetWindowRequest {
                key: "nopolicy/k".into()
            })
            .await
        ) == Code::NotFound
    );
    let pool = pb::PoolGrantRequest {
        key: "ok/k".into(),
        region: "eu".into(),
        region_weight: 1,
        want_total: 5,
        request_id: None,
        ..Default::default()
    };
    ensure!(
        reason(api.pool_grant(pool.clone()).await) == Reason::WrongKeyKind,
        "pool grant on a counter key"
    );
    ensure!(
        code(
            api.pool_grant(pb::PoolGrantRequest {
                region_weight: 0,
                ..pool.clone()
            })
            .await
        ) == Code::InvalidArgument
    );
    // A demand report beyond its bounds names its field.
    let many = (0..65)
        .map(|i| pb::TenantDemand {
            tenant: format!("t{i}"),
            demand: 1,
        })
        .collect();
    let twice = vec![
        pb::TenantDemand {
            tenant: "t".into(),
            demand: 1,
        };
        2
    ];
    for tenant_demands in [many, twice] {
        let refused = api
            .pool_grant(pb::PoolGrantRequest {
                tenant_demands,
                ..pool.clone()
            })
            .await;
        ensure!(
            reason(refused) == Reason::InvalidField,
            "a bad demand report was not refused as INVALID_FIELD"
        );
    }
    // A holder or node name beyond 128 bytes names its field, on a grant
    // and a release.
    let long = "n".repeat(129);
    for field in ["holder", "node"] {
        let (mut grant, mut release) = (
            pool.clone(),
            pb::PoolReleaseRequest {
                key: "ok/k".into(),
                region: "eu".into(),
                from_total: 1,
                keep_total: 0,
                window_start_ms: 1,
                ..Default::default()
            },
        );
        if field == "holder" {
            (grant.holder, release.holder) = (long.clone(), long.clone());
        } else {
            (grant.node, release.node) = (long.clone(), long.clone());
        }
        for refused in [
            api.pool_grant(grant).await.unwrap_err(),
            api.pool_release(release).await.unwrap_err(),
        ] {
            ensure!(
                refusal::detail(&refused, refusal::FIELD).as_deref() == Some(field),
                "{field}: {refused:?}"
            );
        }
    }

    let bad_policies = [
        counter_policy("p/", 0, 1000),
        counter_policy("p/", 10, 0),
        pb::Policy {
            kind: 42,
            ..counter_policy("p/", 10, 1000)
        },
    ];
    for policy in bad_policies {
        ensure!(
            code(
                admin
                    .set_policy(pb::SetPolicyRequest {
                        policy: Some(policy)
                    })
                    .await
            ) == Code::InvalidArgument
        );
    }
    ensure!(
        code(
            admin
                .set_policy(pb::SetPolicyRequest { policy: None })
                .await
        ) == Code::InvalidArgument
    );
    ensure!(
        code(
            admin
                .delete_policy(pb::DeletePolicyRequest {
                    prefix: "x".repeat(300)
                })
                .await
        ) == Code::InvalidArgument
    );

    let member = |id: u64, addr: &str| pb::Member {
        id,
        addr: addr.into(),
    };
    let me = cluster.addr(1);
    for members in [
        vec![],
        vec![member(0, &me)],
        vec![member(1, "nope")],
        vec![member(1, &me), member(1, &me)],
        vec![member(2, "127.0.0.1:9")],
    ] {
        ensure!(
            code(
                admin
                    .init(pb::InitRequest {
                        members: members.clone()
                    })
                    .await
            ) == Code::InvalidArgument,
            "{members:?}"
        );
    }
    ensure!(
        code(
            admin
                .init(pb::InitRequest {
                    members: vec![member(1, &me)]
                })
                .await
        ) == Code::AlreadyExists
    );
    ensure!(
        code(
            admin
                .add_learner(pb::AddLearnerRequest { member: None })
                .await
        ) == Code::InvalidArgument
    );
    ensure!(
        code(
            admin
                .add_learner(pb::AddLearnerRequest {
                    member: Some(member(2, "bad"))
                })
                .await
        ) == Code::InvalidArgument
    );
    let change = |voter_ids: Vec<u64>| pb::ChangeMembershipRequest {
        voter_ids,
        retain: false,
    };
    ensure!(code(admin.change_membership(change(vec![])).await) == Code::InvalidArgument);
    ensure!(
        reason(admin.change_membership(change(vec![1, 7])).await) == Reason::MembershipRejected,
        "unknown learner"
    );
    ensure!(
        reason(admin.step_down(pb::StepDownRequest { leader_id: 0 }).await) == Reason::NoOtherVoter
    );
    let again = pb::InitRequest {
        members: vec![pb::Member {
            id: 1,
            addr: cluster.addr(1),
        }],
    };
    ensure!(reason(admin.init(again).await) == Reason::AlreadyInitialized);

    // Nothing above changed the state: no grants, one policy, one voter.
    let window = api
        .get_window(pb::GetWindowRequest { key: "ok/k".into() })
        .await?
        .into_inner();
    ensure!(window.granted == 0, "{window:?}");
    let policies = admin
        .list_policies(pb::ListPoliciesRequest {})
        .await?
        .into_inner()
        .policies;
    ensure!(policies.len() == 1 && policies[0].prefix == "ok/");
    let status = admin.status(pb::StatusRequest {}).await?.into_inner();
    ensure!(status.voters.len() == 1 && status.counters["rejected_invalid_argument"] >= 6);
    ensure!(
        api.lease(lease("ok/k", "eu", 3))
            .await?
            .into_inner()
            .granted
            == 3,
        "good input still works"
    );
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninitialised_member_is_unavailable_not_hanging() -> Result<()> {
    let mut cluster = Cluster::start(1, |_| {}).await?;
    let (mut api, mut admin) = rpc(&cluster.addr(1)).await?;
    let status = api.lease(lease("k", "eu", 1)).await.unwrap_err();
    ensure!(
        checked_reason(&status) == Reason::NotInitialized
            && status.message().contains("not initialised"),
        "{status:?}"
    );
    ensure!(
        code(
            api.get_window(pb::GetWindowRequest { key: "k".into() })
                .await
        ) == Code::Unavailable
    );
    let policy = Some(counter_policy("p/", 1, 1000));
    ensure!(code(admin.set_policy(pb::SetPolicyRequest { policy }).await) == Code::Unavailable);
    ensure!(
        !admin
            .status(pb::StatusRequest {})
            .await?
            .into_inner()
            .initialized
    );
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_answer_with_a_leader_hint() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    let leader = cluster.leader().await?;
    let follower = (1..=3).find(|id| *id != leader).unwrap_or(1);
    let (mut api, mut admin) = rpc(&cluster.addr(follower)).await?;
    for status in [
        api.lease(lease("k", "eu", 1)).await.unwrap_err(),
        api.get_window(pb::GetWindowRequest { key: "k".into() })
            .await
            .unwrap_err(),
        admin
            .list_policies(pb::ListPoliciesRequest {})
            .await
            .unwrap_err(),
        admin
            .set_policy(pb::SetPolicyRequest {
                policy: Some(counter_policy("p/", 1, 1000)),
            })
            .await
            .unwrap_err(),
        admin
            .step_down(pb::StepDownRequest { leader_id: 0 })
            .await
            .unwrap_err(),
    ] {
        ensure!(checked_reason(&status) == Reason::NotLeader, "{status:?}");
        let addr = cluster.addr(leader);
        let hint = LeaderHint::new(Some(leader), Some(addr.clone()));
        // Both places the proto documents: ErrorInfo and trailing metadata.
        ensure!(LeaderHint::from_error_info(&status) == hint, "{status:?}");
        ensure!(
            LeaderHint::from_metadata(status.metadata()) == hint,
            "{status:?}"
        );
        ensure!(status.message().contains(&addr));
    }
    // Bad input is refused before leadership matters.
    ensure!(code(api.lease(lease("k", "eu", 0)).await) == Code::InvalidArgument);

    // grpc.health.v1: the process serves, and so does the coordinator service once a leader is known.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addr(follower)))?
            .connect()
            .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "leasehold.v1.Coordinator"] {
        let request = tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        };
        let status = health.check(request).await?.into_inner().status;
        ensure!(
            status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}: {status}"
        );
    }
    cluster.stop_all().await
}
