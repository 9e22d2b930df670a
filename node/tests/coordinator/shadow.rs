//! Shadow mode end to end: a shadow policy admits beyond L through an
//! escrow node and counts exactly the excess as would-deny at the
//! coordinator (GetWindow, Status); an escrow node that would deny (here:
//! coordinator unreachable, fail closed) admits and counts; turning shadow
//! off at runtime enforces again.

use std::time::Duration;

use anyhow::{ensure, Result};
use leasehold_proto::v1 as pb;

use crate::escrow::EscrowNode;
use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

fn check(key: &str) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.into(),
        tenant: String::new(),
        weight: 1,
        cost: 1,
    }
}

fn shadow(mut policy: pb::Policy, on: bool) -> pb::Policy {
    policy.shadow = on;
    policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_admits_beyond_the_limit_counts_the_excess_and_enforces_when_turned_off(
) -> Result<()> {
    const LIMIT: u64 = 10;
    const CHECKS: u64 = 25;
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let client = cluster.client()?;
    let policy = counter_policy("sh/", LIMIT, LONG_WINDOW_MS);
    client
        .admin()
        .set_policy(shadow(policy.clone(), true))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| {
        c.batch = 1;
        c.policy_refresh_ms = 50;
    })
    .await?;
    let mut rpc = node.rpc().await?;
    for i in 0..CHECKS {
        let answer = rpc.check(check("sh/k")).await?.into_inner();
        let allowed = answer.decision.map(|d| d.allowed);
        ensure!(allowed == Some(true), "check {i} allowed in shadow mode");
        ensure!(!answer.shadow_would_deny, "the coordinator granted it");
    }
    let window = client.get_window("sh/k").await?;
    ensure!(
        window.granted == CHECKS,
        "admitted beyond L: {}",
        window.granted
    );
    ensure!(
        window.would_deny_tokens == CHECKS - LIMIT && window.would_deny_requests == CHECKS - LIMIT,
        "exactly the excess is would-deny: {window:?}"
    );
    let status = cluster.status(1).await?;
    ensure!(
        status.shadow
            == vec![pb::ShadowTally {
                prefix: "sh/".into(),
                would_deny_tokens: CHECKS - LIMIT,
                would_deny_requests: CHECKS - LIMIT,
            }],
        "status counts per policy: {:?}",
        status.shadow
    );

    // Shadow off at runtime: the window is already past L, so the next
    // decisions are denials, and nothing more is counted as would-deny.
    client.admin().set_policy(shadow(policy, false)).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        let answer = rpc.check(check("sh/k")).await?.into_inner();
        let allowed = answer.decision.map(|d| d.allowed);
        ensure!(allowed == Some(false), "check {i} denied once enforced");
    }
    let window = client.get_window("sh/k").await?;
    ensure!(window.granted == CHECKS, "nothing granted once enforced");
    ensure!(window.would_deny_tokens == CHECKS - LIMIT);
    let escrow = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    ensure!(escrow.shadow_would_deny_requests == 0, "{escrow:?}");
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escrow_node_admits_what_it_would_deny_for_a_shadow_policy() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let policy = shadow(counter_policy("so/", 1_000, LONG_WINDOW_MS), true);
    cluster.client()?.admin().set_policy(policy).await?;
    let node = EscrowNode::start(&cluster, "eu", |c| {
        c.batch = 1;
        c.probe_interval_ms = 600_000;
    })
    .await?;
    let mut rpc = node.rpc().await?;
    let first = rpc.check(check("so/k")).await?.into_inner();
    ensure!(first.decision.is_some_and(|d| d.allowed) && !first.shadow_would_deny);
    // The coordinator goes away: fail closed would deny every check.
    cluster.stop(1).await?;
    for i in 0..5 {
        let answer = rpc.check(check("so/k")).await?.into_inner();
        ensure!(
            answer.decision.is_some_and(|d| d.allowed) && answer.shadow_would_deny,
            "check {i}: admitted and flagged as would-deny: {answer:?}"
        );
    }
    let acquired = rpc
        .acquire(pb::AcquireRequest {
            key: "so/k".into(),
            tenant: String::new(),
            weight: 1,
            tokens: 4,
            request_id: None,
        })
        .await?
        .into_inner();
    ensure!(
        acquired.granted == 4 && acquired.shadow_would_deny,
        "{acquired:?}"
    );
    ensure!(
        acquired.remaining_lifetime_ms > 0,
        "credits die with the local window"
    );
    let status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    ensure!(
        status.shadow_would_deny_requests == 6 && status.shadow_would_deny_tokens == 9,
        "{status:?}"
    );
    ensure!(!status.coordinator_reachable);
    node.stop().await;
    Ok(())
}
