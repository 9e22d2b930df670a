//! Regional escrow nodes against a real 3-member cluster on loopback.

use leasehold_core::predictive_sizer::SizerKind;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use leasehold_client::coordinator::{PoolGrantCall, PoolReleaseCall};
use leasehold_client::transport::{SystemClock, TcpDialer};
use leasehold_client::{
    EscrowSource, EscrowSourceOptions, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode,
};
use leasehold_core::ids::{ClientId, RegionId};
use leasehold_node::escrow::{run_escrow, EscrowConfig};
use leasehold_proto::refusal;
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::escrow_client::EscrowClient;
use tokio::sync::oneshot;
use tonic::Code;

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

pub(crate) struct EscrowNode {
    /// `host:port` it listens on.
    pub(crate) addr: String,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl EscrowNode {
    pub(crate) async fn start(
        cluster: &Cluster,
        region: &str,
        tweak: impl Fn(&mut EscrowConfig),
    ) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let coordinators = cluster.member_list().into_iter().map(|(_, a)| a).collect();
        let mut config = EscrowConfig::new(RegionId::new(region)?, addr.clone(), coordinators);
        tweak(&mut config);
        let (stop, stopped) = oneshot::channel::<()>();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = run_escrow(
                config,
                incoming,
                Arc::new(TcpDialer::default()),
                Arc::new(SystemClock),
                async {
                    let _ = stopped.await;
                },
            )
            .await;
        });
        Ok(EscrowNode {
            addr,
            stop: Some(stop),
            task,
        })
    }

    pub(crate) async fn rpc(&self) -> Result<EscrowClient<tonic::transport::Channel>> {
        Ok(EscrowClient::connect(format!("http://{}", self.addr)).await?)
    }

    /// Stops the node as a crash would: no credits handed back, its memory
    /// gone (the listener closes with the task).
    pub(crate) async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }
}

fn acquire(key: &str, tokens: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.into(),
        tenant: String::new(),
        weight: 1,
        tokens,
        request_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_escrow_nodes_never_admit_more_than_the_limit() -> Result<()> {
    two_regions_admit_at_most_the_limit(SizerKind::Fixed, SizerKind::Fixed).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escrow_nodes_with_learning_sizers_never_admit_more_than_the_limit() -> Result<()> {
    two_regions_admit_at_most_the_limit(SizerKind::Predictive, SizerKind::Eoq).await
}

/// Eight leased limiters, half behind each of two escrow nodes (region eu
/// sizing its leases with `eu_sizer`, us with `us_sizer`), 100 checks each
/// against L = 300: Σ admitted ≤ L, and at least half of L is admitted.
async fn two_regions_admit_at_most_the_limit(
    eu_sizer: SizerKind,
    us_sizer: SizerKind,
) -> Result<()> {
    const LIMIT: u64 = 300;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("esc/", LIMIT, LONG_WINDOW_MS))
        .await?;
    let eu = EscrowNode::start(&cluster, "eu", |c| {
        c.batch = 16;
        c.sizer = eu_sizer;
    })
    .await?;
    let us = EscrowNode::start(&cluster, "us", |c| {
        c.batch = 16;
        c.sizer = us_sizer;
    })
    .await?;

    let mut tasks = Vec::new();
    for i in 0..8 {
        let addr = if i % 2 == 0 {
            eu.addr.clone()
        } else {
            us.addr.clone()
        };
        tasks.push(tokio::spawn(async move {
            let source = EscrowSource::new(
                &addr,
                Arc::new(TcpDialer::default()),
                EscrowSourceOptions::default(),
            )?;
            let mode = Mode::Leased(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(4)));
            let limiter = Limiter::new(
                source,
                LimiterConfig::new(mode, ClientId::new(format!("l1-{i}"))?),
            )?;
            let mut admitted = 0u64;
            for _ in 0..100 {
                if limiter.check("esc/k", 1).await?.allowed {
                    admitted += 1;
                }
            }
            anyhow::Ok(admitted)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    ensure!(total <= LIMIT, "admitted {total} > limit {LIMIT}");
    ensure!(
        total >= LIMIT / 2,
        "admitted only {total} of {LIMIT} under 800 requests"
    );
    let window = cluster.client()?.get_window("esc/k").await?;
    ensure!(window.granted <= LIMIT);
    eu.stop().await;
    us.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_serves_what_it_holds_then_denies_and_probes_on_a_cadence() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("fc/", 10_000, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| {
        c.batch = 50;
        c.probe_interval_ms = 600_000;
    })
    .await?;
    let mut rpc = node.rpc().await?;
    let first = rpc.acquire(acquire("fc/k", 10)).await?.into_inner();
    ensure!(first.granted == 10 && first.remaining_lifetime_ms > 0);

    for id in 1..=3 {
        cluster.stop(id).await?;
    }
    let mut served = 0;
    for _ in 0..4 {
        served += rpc.acquire(acquire("fc/k", 10)).await?.into_inner().granted;
    }
    ensure!(
        served == 40,
        "the 40 held credits are served during the outage, got {served}"
    );
    let calls_before = rpc
        .status(pb::EscrowStatusRequest {})
        .await?
        .into_inner()
        .coordinator_calls;
    let mut denials = 0;
    for _ in 0..20 {
        let r = rpc.acquire(acquire("fc/k", 10)).await?.into_inner();
        ensure!(
            r.granted == 0 && r.retry_after_ms > 0,
            "denied with a retry hint: {r:?}"
        );
        denials += 1;
    }
    let status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    ensure!(denials == 20);
    ensure!(!status.coordinator_reachable);
    ensure!(
        status.coordinator_calls <= calls_before + 1,
        "probing on a cadence, not per request: {} calls after {}",
        status.coordinator_calls,
        calls_before
    );
    ensure!(status.outage_denials >= 19);
    node.stop().await;
    Ok(())
}

/// A leader change is not an outage: an escrow node's call rides through
/// the election within its deadline (`coordinator_timeout_ms`), so the
/// services behind it are neither denied nor told the coordinator is gone —
/// through a step-down and through the crash of the next leader, with a
/// lease small enough that the node asks the cluster every few answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_change_denies_nobody_behind_an_escrow_node() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("lc/", 1_000_000_000, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| {
        c.batch = 4;
        // The test's elections take up to two 600 ms timeouts.
        c.coordinator_timeout_ms = 3_000;
    })
    .await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let mut rpc = node.rpc().await?;
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut granted, mut denied) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match rpc.acquire(acquire("lc/k", 1)).await {
                    Ok(answer) if answer.get_ref().granted == 1 => granted += 1,
                    Ok(answer) => denied.push(format!("{:?}", answer.into_inner())),
                    Err(status) => denied.push(status.to_string()),
                }
            }
            (granted, denied)
        })
    };
    let status_of = |node: &EscrowNode| {
        let addr = node.addr.clone();
        async move {
            let mut rpc = EscrowClient::connect(format!("http://{addr}")).await?;
            anyhow::Ok(rpc.status(pb::EscrowStatusRequest {}).await?.into_inner())
        }
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = cluster.leader().await?;
    let second = cluster.client()?.admin().step_down(Some(first)).await?;
    ensure!(second != first, "leadership moved");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let calls_after_step_down = status_of(&node).await?.coordinator_calls;
    cluster.stop(second).await?;
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let calls_after_crash = status_of(&node).await?.coordinator_calls;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (granted, denied) = load.await?;
    let status = status_of(&node).await?;
    ensure!(
        denied.is_empty(),
        "nobody is denied for a leader change: {} denials, first {:?}",
        denied.len(),
        denied.first()
    );
    ensure!(
        status.coordinator_reachable && status.outage_denials == 0,
        "no outage declared: {status:?}"
    );
    ensure!(
        calls_after_crash > calls_after_step_down && granted > 0,
        "the node kept leasing after the crash: {calls_after_step_down} calls, then {calls_after_crash}"
    );
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_admits_at_most_its_share_per_window() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    let mut policy = counter_policy("fb/", 1_000, LONG_WINDOW_MS);
    policy.outage = pb::OutageMode::Fallback as i32;
    policy.fallback_tokens_per_region = 7;
    cluster.client()?.admin().set_policy(policy).await?;
    let node = EscrowNode::start(&cluster, "eu", |c| {
        c.batch = 1;
        c.probe_interval_ms = 600_000;
    })
    .await?;
    let mut rpc = node.rpc().await?;
    ensure!(rpc.acquire(acquire("fb/k", 1)).await?.into_inner().granted == 1);
    for id in 1..=3 {
        cluster.stop(id).await?;
    }
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += rpc.acquire(acquire("fb/k", 1)).await?.into_inner().granted;
    }
    ensure!(
        admitted == 7,
        "fallback share is 7 per window, admitted {admitted}"
    );
    let status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    ensure!(status.fallback_admissions == 7);
    node.stop().await;
    Ok(())
}

fn fair(mut policy: pb::Policy) -> pb::Policy {
    policy.kind = pb::PolicyKind::Fair as i32;
    policy
}

/// Acquires `tokens` one at a time, `times` times; returns what was admitted.
async fn admitted_over(
    rpc: &mut EscrowClient<tonic::transport::Channel>,
    key: &str,
    times: usize,
) -> Result<u64> {
    let mut admitted = 0;
    for _ in 0..times {
        let answer = rpc.acquire(acquire(key, 1)).await?.into_inner();
        ensure!(
            answer.granted > 0 || answer.retry_after_ms > 0,
            "a denial carries a retry hint: {answer:?}"
        );
        admitted += answer.granted;
    }
    Ok(admitted)
}

/// Fair keys follow their outage policy like counter keys: `fail_closed`
/// serves the pool grant it holds, then denies, probing the coordinator
/// once per probe interval (not per request), counting outage denials.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_key_fails_closed_and_probes_on_a_cadence() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(fair(counter_policy("ffc/", 10_000, LONG_WINDOW_MS)))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.probe_interval_ms = 600_000).await?;
    let mut rpc = node.rpc().await?;
    ensure!(rpc.acquire(acquire("ffc/k", 1)).await?.into_inner().granted == 1);
    for id in 1..=3 {
        cluster.stop(id).await?;
    }
    // Whatever the pool grant still covers is served, then denials.
    admitted_over(&mut rpc, "ffc/k", 5).await?;
    let calls_before = rpc
        .status(pb::EscrowStatusRequest {})
        .await?
        .into_inner()
        .coordinator_calls;
    let admitted = admitted_over(&mut rpc, "ffc/k", 30).await?;
    let status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    ensure!(
        admitted == 0,
        "fail closed: nothing admitted beyond the grant, got {admitted}"
    );
    ensure!(!status.coordinator_reachable);
    ensure!(
        status.coordinator_calls <= calls_before + 1,
        "probing on a cadence, not per request: {} calls after {calls_before}",
        status.coordinator_calls
    );
    ensure!(status.outage_denials >= 29, "{status:?}");
    ensure!(status.fallback_admissions == 0);
    node.stop().await;
    Ok(())
}

/// A fair key with the `fallback` outage policy admits at most its share
/// per window while the coordinator is unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_key_falls_back_to_at_most_its_share_per_window() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    let mut policy = fair(counter_policy("ffb/", 1_000, LONG_WINDOW_MS));
    policy.outage = pb::OutageMode::Fallback as i32;
    policy.fallback_tokens_per_region = 7;
    cluster.client()?.admin().set_policy(policy).await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.probe_interval_ms = 600_000).await?;
    let mut rpc = node.rpc().await?;
    ensure!(rpc.acquire(acquire("ffb/k", 1)).await?.into_inner().granted == 1);
    let held_before = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    ensure!(held_before.fallback_admissions == 0);
    for id in 1..=3 {
        cluster.stop(id).await?;
    }
    let admitted = admitted_over(&mut rpc, "ffb/k", 40).await?;
    let status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    ensure!(
        status.fallback_admissions == 7,
        "the fallback share is 7 per window: {status:?}"
    );
    ensure!(
        (7..40).contains(&admitted),
        "the pool grant's rest plus the share of 7, then denials: {admitted}"
    );
    ensure!(status.outage_denials >= 1);
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_keys_is_bounded_and_bad_input_is_refused() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("fl/", 1_000, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.max_keys = 4).await?;
    let mut rpc = node.rpc().await?;
    for i in 0..4 {
        ensure!(
            rpc.acquire(acquire(&format!("fl/{i}"), 1))
                .await?
                .into_inner()
                .granted
                == 1
        );
    }
    let refused = rpc
        .acquire(acquire("fl/overflow", 1))
        .await
        .expect_err("table is full");
    ensure!(refused.code() == Code::ResourceExhausted, "{refused:?}");
    ensure!(
        rpc.status(pb::EscrowStatusRequest {})
            .await?
            .into_inner()
            .active_keys
            == 4
    );

    let empty = rpc.acquire(acquire("", 1)).await.expect_err("empty key");
    ensure!(empty.code() == Code::InvalidArgument);
    let zero = rpc
        .acquire(acquire("fl/0", 0))
        .await
        .expect_err("zero tokens");
    ensure!(zero.code() == Code::InvalidArgument);
    let unknown = rpc.acquire(acquire("nopolicy/k", 1)).await;
    ensure!(
        matches!(unknown, Err(ref s) if s.code() == Code::NotFound || s.code() == Code::ResourceExhausted)
    );
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keys_are_evicted_and_their_slots_reused() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("id/", 1_000, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| {
        c.max_keys = 1;
        c.idle_evict_ms = 200;
    })
    .await?;
    let mut rpc = node.rpc().await?;
    ensure!(rpc.acquire(acquire("id/a", 1)).await?.into_inner().granted == 1);
    let mut status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    for _ in 0..50 {
        if status.evicted_keys >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
    }
    ensure!(
        status.evicted_keys == 1 && status.active_keys == 0,
        "{status:?}"
    );
    ensure!(rpc.acquire(acquire("id/b", 1)).await?.into_inner().granted == 1);
    node.stop().await;
    Ok(())
}

/// The defect of ADR 0020, as an operator met it: a `fair` key (L = 100, a
/// long window) spent through an escrow node, whose key is then evicted as
/// idle three times, and a second node of the same region started beside
/// it, and the first node stopped and a new one started on its place. The
/// region's total in the pool stays 100; each new key state or process
/// holds nothing of it, so nothing more is admitted in the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_key_admits_at_most_l_across_evictions_second_nodes_and_restarts() -> Result<()> {
    const LIMIT: u64 = 100;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let mut policy = counter_policy("fh/", LIMIT, LONG_WINDOW_MS);
    policy.kind = pb::PolicyKind::Fair as i32;
    cluster.client()?.admin().set_policy(policy).await?;
    let ask = pb::AcquireRequest {
        key: "fh/k".into(),
        tenant: "t".into(),
        weight: 1,
        tokens: 1,
        request_id: None,
    };
    // Acquires one token at a time until one is refused; returns the count.
    async fn drain(
        rpc: &mut pb::escrow_client::EscrowClient<tonic::transport::Channel>,
        ask: &pb::AcquireRequest,
    ) -> Result<u64> {
        let mut admitted = 0;
        for _ in 0..3 * LIMIT {
            let granted = rpc.acquire(ask.clone()).await?.into_inner().granted;
            if granted == 0 {
                break;
            }
            admitted += granted;
        }
        Ok(admitted)
    }
    let first = EscrowNode::start(&cluster, "eu", |c| c.idle_evict_ms = 200).await?;
    let mut rpc = first.rpc().await?;
    let mut admitted = drain(&mut rpc, &ask).await?;
    ensure!(admitted == LIMIT, "the first node admitted {admitted}");
    for eviction in 1..=3 {
        let before = rpc
            .status(pb::EscrowStatusRequest {})
            .await?
            .into_inner()
            .evicted_keys;
        let mut status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
        for _ in 0..50 {
            if status.evicted_keys > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            status = rpc.status(pb::EscrowStatusRequest {}).await?.into_inner();
        }
        ensure!(
            status.evicted_keys > before,
            "eviction {eviction}: {status:?}"
        );
        admitted += drain(&mut rpc, &ask).await?;
        ensure!(
            admitted == LIMIT,
            "after eviction {eviction}: {admitted} admitted"
        );
    }
    let second = EscrowNode::start(&cluster, "eu", |_| {}).await?;
    admitted += drain(&mut second.rpc().await?, &ask).await?;
    ensure!(admitted == LIMIT, "with a second node: {admitted} admitted");
    first.stop().await;
    let restarted = EscrowNode::start(&cluster, "eu", |_| {}).await?;
    admitted += drain(&mut restarted.rpc().await?, &ask).await?;
    ensure!(admitted == LIMIT, "after a restart: {admitted} admitted");
    let window = cluster.client()?.get_window("fh/k").await?;
    ensure!(
        window.granted == LIMIT,
        "the pool granted {}",
        window.granted
    );
    second.stop().await;
    restarted.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_keys_share_the_limit_by_weight_across_regions() -> Result<()> {
    const LIMIT: u64 = 400;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let mut policy = counter_policy("fair/", LIMIT, LONG_WINDOW_MS);
    policy.kind = pb::PolicyKind::Fair as i32;
    cluster.client()?.admin().set_policy(policy).await?;
    let us = EscrowNode::start(&cluster, "us", |_| {}).await?;
    let eu = EscrowNode::start(&cluster, "eu", |_| {}).await?;
    let (mut us_rpc, mut eu_rpc) = (us.rpc().await?, eu.rpc().await?);
    let ask = |tenant: &str, weight: u64| pb::AcquireRequest {
        key: "fair/k".into(),
        tenant: tenant.into(),
        weight,
        tokens: 1,
        request_id: None,
    };
    let (mut big, mut small) = (0u64, 0u64);
    loop {
        let a = us_rpc.acquire(ask("big", 3)).await?.into_inner().granted;
        let b = eu_rpc.acquire(ask("small", 1)).await?.into_inner().granted;
        big += a;
        small += b;
        if a == 0 && b == 0 {
            break;
        }
    }
    ensure!(big + small <= LIMIT, "admitted {} > {LIMIT}", big + small);
    ensure!(
        big.abs_diff(300) <= 4 && small.abs_diff(100) <= 4,
        "3:1 weights gave {big} / {small}"
    );
    let window = cluster.client()?.get_window("fair/k").await?;
    ensure!(window.granted <= LIMIT);
    // The pool is asked for a batch beyond each need, and not again once a
    // region is at its ceiling: far fewer calls than admissions (asking per
    // admission took one call each, and one more per denial).
    let calls = escrow_status(&mut us_rpc).await?.coordinator_calls
        + escrow_status(&mut eu_rpc).await?.coordinator_calls;
    ensure!(
        calls * 4 <= big + small,
        "{calls} coordinator calls for {} admissions",
        big + small
    );
    us.stop().await;
    eu.stop().await;
    Ok(())
}

// ---- Δ never depends on client honesty: returns and request ids ----

fn acquire_as(key: &str, tokens: u64, client: &str, seq: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        request_id: Some(pb::RequestId {
            client_id: client.into(),
            seq,
        }),
        ..acquire(key, tokens)
    }
}

fn give_back_as(
    key: &str,
    tokens: u64,
    window_start_ms: u64,
    client: &str,
    seq: u64,
) -> pb::ReturnRequest {
    pb::ReturnRequest {
        key: key.into(),
        tenant: String::new(),
        tokens,
        window_start_ms,
        request_id: Some(pb::RequestId {
            client_id: client.into(),
            seq,
        }),
    }
}

/// Acquires one token at a time from every node in turn until none grants
/// any more; returns the tokens granted.
async fn drain(
    rpcs: &mut [EscrowClient<tonic::transport::Channel>],
    key: &str,
    client: &str,
) -> Result<u64> {
    let mut total = 0;
    let mut seq = 1_000;
    loop {
        let mut round = 0;
        for rpc in rpcs.iter_mut() {
            seq += 1;
            round += rpc
                .acquire(acquire_as(key, 1, client, seq))
                .await?
                .into_inner()
                .granted;
        }
        total += round;
        if round == 0 {
            return Ok(total);
        }
        ensure!(total <= 1_000, "draining never ends: {total} granted");
    }
}

async fn escrow_status(
    rpc: &mut EscrowClient<tonic::transport::Channel>,
) -> Result<pb::EscrowStatusResponse> {
    Ok(rpc.status(pb::EscrowStatusRequest {}).await?.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_a_million_after_acquiring_one_takes_back_one_and_two_regions_admit_at_most_the_limit(
) -> Result<()> {
    const LIMIT: u64 = 100;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("inflate/", LIMIT, LONG_WINDOW_MS))
        .await?;
    let eu = EscrowNode::start(&cluster, "eu", |c| c.batch = 16).await?;
    let us = EscrowNode::start(&cluster, "us", |c| c.batch = 16).await?;
    let mut rpcs = [eu.rpc().await?, us.rpc().await?];

    let first = rpcs[0]
        .acquire(acquire_as("inflate/k", 1, "attacker", 1))
        .await?
        .into_inner();
    ensure!(first.granted == 1, "{first:?}");
    let back = rpcs[0]
        .r#return(give_back_as(
            "inflate/k",
            1_000_000,
            first.window_start_ms,
            "attacker",
            2,
        ))
        .await?
        .into_inner();
    ensure!(
        back.accepted <= 1,
        "accepted {} of a return of 1 000 000",
        back.accepted
    );

    let drained = drain(&mut rpcs, "inflate/k", "attacker").await?;
    let admitted = first.granted + drained - back.accepted;
    ensure!(
        admitted <= LIMIT,
        "two regions admitted {admitted} in one window of L = {LIMIT}"
    );
    let eu_status = escrow_status(&mut rpcs[0]).await?;
    ensure!(eu_status.returns_capped == 1, "{eu_status:?}");
    ensure!(
        eu_status.return_tokens_refused == 1_000_000 - back.accepted,
        "{eu_status:?}"
    );
    ensure!(cluster.client()?.get_window("inflate/k").await?.granted <= LIMIT);
    eu.stop().await;
    us.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_u64_max_never_wraps_and_takes_back_at_most_what_was_acquired() -> Result<()> {
    const LIMIT: u64 = 100;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("wrap/", LIMIT, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.batch = 16).await?;
    let mut rpcs = [node.rpc().await?];
    let first = rpcs[0]
        .acquire(acquire_as("wrap/k", 5, "attacker", 1))
        .await?
        .into_inner();
    ensure!(first.granted == 5, "{first:?}");
    let back = rpcs[0]
        .r#return(give_back_as(
            "wrap/k",
            u64::MAX,
            first.window_start_ms,
            "attacker",
            2,
        ))
        .await?
        .into_inner();
    ensure!(back.accepted <= 5, "accepted {} of u64::MAX", back.accepted);
    let drained = drain(&mut rpcs, "wrap/k", "attacker").await?;
    let admitted = first.granted + drained - back.accepted;
    ensure!(admitted <= LIMIT, "admitted {admitted} > L = {LIMIT}");
    let status = escrow_status(&mut rpcs[0]).await?;
    ensure!(
        status.return_tokens_refused == u64::MAX - back.accepted,
        "{status:?}"
    );
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_holder_cannot_return_the_first_holders_credits() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("steal/", 1_000, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.batch = 16).await?;
    let mut rpc = node.rpc().await?;
    let owner = rpc
        .acquire(acquire_as("steal/k", 10, "owner", 1))
        .await?
        .into_inner();
    ensure!(owner.granted == 10, "{owner:?}");
    let stolen = rpc
        .r#return(give_back_as(
            "steal/k",
            10,
            owner.window_start_ms,
            "thief",
            1,
        ))
        .await?
        .into_inner();
    ensure!(
        stolen.accepted == 0,
        "a stranger got back {}",
        stolen.accepted
    );
    // Credits acquired without a request id belong to nobody.
    let anonymous = rpc.acquire(acquire("steal/k", 3)).await?.into_inner();
    ensure!(anonymous.granted == 3);
    let unowned = rpc
        .r#return(give_back_as(
            "steal/k",
            13,
            owner.window_start_ms,
            "owner",
            2,
        ))
        .await?
        .into_inner();
    ensure!(
        unowned.accepted == 10,
        "the owner gets back its 10 and not the 3 acquired without an id: {}",
        unowned.accepted
    );
    let missing_id = rpc
        .r#return(pb::ReturnRequest {
            request_id: None,
            ..give_back_as("steal/k", 1, owner.window_start_ms, "owner", 3)
        })
        .await
        .expect_err("a Return without request id is refused");
    ensure!(missing_id.code() == Code::InvalidArgument, "{missing_id:?}");
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_gets_the_first_answer_and_is_served_once() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("retry/", 1_000, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.batch = 3).await?;
    let mut rpc = node.rpc().await?;
    let first = rpc
        .acquire(acquire_as("retry/k", 3, "svc", 7))
        .await?
        .into_inner();
    ensure!(first.granted == 3, "{first:?}");
    let retry = rpc
        .acquire(acquire_as("retry/k", 3, "svc", 7))
        .await?
        .into_inner();
    ensure!(
        retry == first,
        "the retry got {retry:?}, the first {first:?}"
    );
    let status = escrow_status(&mut rpc).await?;
    ensure!(status.tokens_served == 3, "{status:?}");
    ensure!(status.acquire_replays == 1, "{status:?}");
    ensure!(
        cluster.client()?.get_window("retry/k").await?.granted == 3,
        "one lease of 3, not two"
    );

    let changed = rpc
        .acquire(acquire_as("retry/k", 4, "svc", 7))
        .await
        .expect_err("the same id with another payload is refused");
    ensure!(changed.code() == Code::AlreadyExists, "{changed:?}");
    ensure!(
        changed
            .metadata()
            .get("leasehold-reason")
            .is_some_and(|r| r == "REQUEST_ID_REUSED"),
        "{changed:?}"
    );
    // A retried return is answered once too.
    let back = give_back_as("retry/k", 2, first.window_start_ms, "svc", 8);
    let returned = rpc.r#return(back.clone()).await?.into_inner();
    let returned_again = rpc.r#return(back).await?.into_inner();
    ensure!(returned.accepted == 2 && returned_again.accepted == 2);
    let status = escrow_status(&mut rpc).await?;
    ensure!(status.return_replays == 1, "{status:?}");
    ensure!(status.refused_request_ids == 1, "{status:?}");
    let left = rpc
        .r#return(give_back_as("retry/k", 5, first.window_start_ms, "svc", 9))
        .await?
        .into_inner();
    ensure!(
        left.accepted == 1,
        "3 acquired, 2 returned once: 1 left, got {}",
        left.accepted
    );
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_key_takes_no_returns_and_holders_are_bounded() -> Result<()> {
    const LIMIT: u64 = 40;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let mut policy = counter_policy("fairret/", LIMIT, LONG_WINDOW_MS);
    policy.kind = pb::PolicyKind::Fair as i32;
    cluster.client()?.admin().set_policy(policy).await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.holder_limits.max_holders = 2).await?;
    let mut rpcs = [node.rpc().await?];
    let first = rpcs[0]
        .acquire(acquire_as("fairret/k", 1, "a", 1))
        .await?
        .into_inner();
    ensure!(first.granted == 1, "{first:?}");
    let back = rpcs[0]
        .r#return(give_back_as(
            "fairret/k",
            1_000_000,
            first.window_start_ms,
            "a",
            2,
        ))
        .await?
        .into_inner();
    ensure!(back.accepted == 0, "a fair key took back {}", back.accepted);
    let drained = drain(&mut rpcs, "fairret/k", "b").await?;
    ensure!(
        first.granted + drained <= LIMIT,
        "admitted {} > L = {LIMIT}",
        first.granted + drained
    );
    let refused = rpcs[0]
        .acquire(acquire_as("fairret/k", 1, "c", 1))
        .await
        .expect_err("a third holder is beyond the bound");
    ensure!(refused.code() == Code::ResourceExhausted, "{refused:?}");
    ensure!(escrow_status(&mut rpcs[0]).await?.refused_holders_exhausted == 1);
    node.stop().await;
    Ok(())
}

// ---- Reclaim: an idle region's unspent pool grant goes to a busy one ----

/// Admits one token at a time at `rpc` for `tenant` until a denial; returns
/// the tokens admitted and the last answer.
async fn admit_until_denied(
    rpc: &mut EscrowClient<tonic::transport::Channel>,
    key: &str,
    tenant: &str,
) -> Result<(u64, pb::AcquireResponse)> {
    let mut admitted = 0;
    loop {
        let answer = rpc
            .acquire(pb::AcquireRequest {
                key: key.into(),
                tenant: tenant.into(),
                weight: 1,
                tokens: 1,
                request_id: None,
            })
            .await?
            .into_inner();
        if answer.granted == 0 {
            return Ok((admitted, answer));
        }
        admitted += answer.granted;
        ensure!(admitted <= 10_000, "admitting never ends at {key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_region_gives_its_unspent_grant_back_to_a_busy_one() -> Result<()> {
    const LIMIT: u64 = 400;
    const QUIET_MS: u64 = 300;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(fair(counter_policy("reclaim/", LIMIT, LONG_WINDOW_MS)))
        .await?;
    let reclaiming = |config: &mut EscrowConfig| config.pool_release_idle_ms = QUIET_MS;
    let us = EscrowNode::start(&cluster, "us", reclaiming).await?;
    let eu = EscrowNode::start(&cluster, "eu", reclaiming).await?;
    let (mut us_rpc, mut eu_rpc) = (us.rpc().await?, eu.rpc().await?);
    // us takes a little, then goes quiet.
    let mut us_admitted = 0;
    for _ in 0..10 {
        us_admitted += us_rpc
            .acquire(acquire("reclaim/k", 1))
            .await?
            .into_inner()
            .granted;
    }
    ensure!(us_admitted == 10, "us admitted {us_admitted} of 10");
    // eu drains what the pool gives it while us still reserves its half
    // (or eu's ceiling hides nothing: us may already have released).
    let (first, _) = admit_until_denied(&mut eu_rpc, "reclaim/k", "default").await?;
    ensure!(
        first >= LIMIT / 2 - 16,
        "eu got only {first} with us active"
    );
    // us's idle key hands back what it did not admit.
    let mut released = 0;
    for _ in 0..100 {
        released = escrow_status(&mut us_rpc).await?.pool_tokens_released;
        if released > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(released > 0, "the idle region released nothing");
    // eu, at its ceiling, looks again after the quiet interval and gets it.
    let mut eu_admitted = first;
    for _ in 0..50 {
        let (more, denied) = admit_until_denied(&mut eu_rpc, "reclaim/k", "default").await?;
        eu_admitted += more;
        if us_admitted + eu_admitted >= LIMIT - 16 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(
            denied.retry_after_ms.clamp(50, 1_000),
        ))
        .await;
    }
    let window = cluster.client()?.get_window("reclaim/k").await?;
    ensure!(
        us_admitted + eu_admitted <= LIMIT && window.granted <= LIMIT,
        "admitted {us_admitted} + {eu_admitted}, granted {} > {LIMIT}",
        window.granted
    );
    ensure!(
        eu_admitted >= LIMIT - us_admitted - 16,
        "eu admitted {eu_admitted}: the idle region's reserve was not reclaimed (released {released})"
    );
    // A region that comes back rejoins the pool from what it kept.
    let back = us_rpc.acquire(acquire("reclaim/k", 1)).await?.into_inner();
    ensure!(
        back.limit == LIMIT,
        "a fair key answers its limit L, not a tenant's ceiling: {}",
        back.limit
    );
    ensure!(
        us_admitted + back.granted + eu_admitted <= LIMIT,
        "the returning region over-admitted"
    );
    us.stop().await;
    eu.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_hands_its_credits_back_before_it_returns() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let admin = cluster.client()?.admin();
    admin
        .set_policy(counter_policy("drain/", 1_000, LONG_WINDOW_MS))
        .await?;
    admin
        .set_policy(fair(counter_policy("drainf/", 1_000, LONG_WINDOW_MS)))
        .await?;
    // Idle keys never release here: only the shutdown hands anything back.
    let node = EscrowNode::start(&cluster, "us", |config| {
        config.batch = 100;
        config.pool_release_idle_ms = 600_000;
        config.idle_evict_ms = 600_000;
    })
    .await?;
    let mut rpc = node.rpc().await?;
    // One admission of the counter key, two of the fair key (its first
    // pool ask is for the need alone, the second for a batch).
    for key in ["drain/k", "drainf/k", "drainf/k"] {
        let got = rpc.acquire(acquire(key, 1)).await?.into_inner().granted;
        ensure!(got == 1, "{key}: admitted {got}");
    }
    let client = cluster.client()?;
    let before = client.get_window("drain/k").await?;
    ensure!(
        before.granted == 100,
        "counter key leased {}",
        before.granted
    );
    let fair_before = client.get_window("drainf/k").await?;
    ensure!(
        fair_before.granted >= 100,
        "fair key granted {}",
        fair_before.granted
    );
    node.stop().await;
    // When `stop` returns, the credits are back: nothing left to wait for.
    let after = client.get_window("drain/k").await?;
    ensure!(
        after.granted - after.returned == 1,
        "counter key: {} granted, {} returned after the stop",
        after.granted,
        after.returned
    );
    let fair_after = client.get_window("drainf/k").await?;
    ensure!(
        fair_after.granted == 2,
        "fair key: {} still granted after the stop (2 admitted)",
        fair_after.granted
    );
    Ok(())
}

// ---- Declared tenant weights are bounded ----

/// Asserts `result` is the refusal of an over-bound `weight`:
/// `INVALID_ARGUMENT`, reason `INVALID_FIELD`, field `weight`.
fn ensure_weight_refused<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
    what: &str,
) -> Result<()> {
    let status = match result {
        Ok(answer) => anyhow::bail!("{what}: expected a refusal, got {answer:?}"),
        Err(status) => status,
    };
    ensure!(status.code() == Code::InvalidArgument, "{what}: {status:?}");
    ensure!(
        refusal::reason_of(&status) == Some(refusal::Reason::InvalidField),
        "{what}: {status:?}"
    );
    ensure!(
        refusal::detail(&status, refusal::FIELD).as_deref() == Some("weight"),
        "{what}: {status:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_above_the_bound_is_refused_and_admits_nothing() -> Result<()> {
    const LIMIT: u64 = 100;
    const BOUND: u64 = 10;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let admin = cluster.client()?.admin();
    admin
        .set_policy(fair(counter_policy("weighed/", LIMIT, LONG_WINDOW_MS)))
        .await?;
    admin
        .set_policy(counter_policy("weighedc/", LIMIT, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "us", |config| {
        config.max_tenant_weight = BOUND;
    })
    .await?;
    let mut rpc = node.rpc().await?;
    let ask = |key: &str, weight: u64| pb::AcquireRequest {
        key: key.into(),
        tenant: "greedy".into(),
        weight,
        tokens: 1,
        request_id: Some(pb::RequestId {
            client_id: "greedy".into(),
            seq: weight,
        }),
    };
    let check = |key: &str, weight: u64| pb::CheckRequest {
        key: key.into(),
        tenant: "greedy".into(),
        weight,
        cost: 1,
    };
    // Above the bound: refused on a fair key and on a counter key alike,
    // by Acquire and by Check.
    for weight in [BOUND + 1, u64::MAX] {
        for key in ["weighed/k", "weighedc/k"] {
            ensure_weight_refused(
                rpc.acquire(ask(key, weight)).await,
                &format!("Acquire {key} weight {weight}"),
            )?;
            ensure_weight_refused(
                rpc.check(check(key, weight)).await,
                &format!("Check {key} weight {weight}"),
            )?;
        }
    }
    // Nothing was admitted, nor asked of the coordinator: no key actor
    // even started.
    let status = escrow_status(&mut rpc).await?;
    ensure!(
        status.active_keys == 0 && status.coordinator_calls == 0 && status.tokens_served == 0,
        "refused requests left traces: {status:?}"
    );
    // The bound itself, and 0 (which means 1), are accepted.
    for weight in [BOUND, 0] {
        let got = rpc.acquire(ask("weighed/k", weight)).await?.into_inner();
        ensure!(got.granted == 1, "weight {weight}: {got:?}");
        let checked = rpc.check(check("weighed/k", weight)).await?.into_inner();
        ensure!(
            checked.decision.is_some_and(|d| d.allowed),
            "weight {weight}: {checked:?}"
        );
    }
    let got = rpc.acquire(ask("weighedc/k", BOUND)).await?.into_inner();
    ensure!(got.granted == 1, "counter key at the bound: {got:?}");
    let window = cluster.client()?.get_window("weighed/k").await?;
    ensure!(
        window.granted >= 4 && window.granted <= LIMIT,
        "fair key granted {}",
        window.granted
    );
    node.stop().await;
    Ok(())
}

// ---- Demand split: a tenant active in two regions is not served twice ----

/// `beta` (weight 2) asks as much in `us` as in `eu`; `alpha` (weight 2)
/// only in `us`. With the demand split the regions weigh 2 + 1 and 1 (in
/// thousandths: 3000 and 1000); with `beta`'s full weight everywhere they
/// would weigh 4000 and 2000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_in_two_regions_weighs_its_share_of_its_demand_in_each() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(fair(counter_policy("split/", 1_000_000, 500)))
        .await?;
    let us = EscrowNode::start(&cluster, "us", |_| {}).await?;
    let eu = EscrowNode::start(&cluster, "eu", |_| {}).await?;
    let (mut us_rpc, mut eu_rpc) = (us.rpc().await?, eu.rpc().await?);
    let ask = |tenant: &str| pb::AcquireRequest {
        key: "split/k".into(),
        tenant: tenant.into(),
        weight: 2,
        tokens: 1,
        request_id: None,
    };
    let client = cluster.client()?;
    let started = std::time::Instant::now();
    let mut last = Vec::new();
    while started.elapsed() < Duration::from_secs(20) {
        for _ in 0..20 {
            us_rpc.acquire(ask("alpha")).await?;
            us_rpc.acquire(ask("beta")).await?;
            eu_rpc.acquire(ask("beta")).await?;
        }
        let window = client.get_window("split/k").await?;
        last = window
            .regions
            .iter()
            .map(|r| (r.region.clone(), r.pool_weight))
            .collect::<Vec<_>>();
        let weight = |name: &str| {
            window
                .regions
                .iter()
                .find(|r| r.region == name)
                .map_or(0, |r| r.pool_weight)
        };
        let (us_weight, eu_weight) = (weight("us"), weight("eu"));
        if eu_weight > 0 && us_weight.abs_diff(3 * eu_weight) * 20 <= us_weight {
            us.stop().await;
            eu.stop().await;
            return Ok(());
        }
    }
    anyhow::bail!("region weights never reached 3:1: last {last:?}")
}

/// The leader counts a demand report only for the window right before the
/// granted one: a report naming any other window (a hostile region pinning
/// far-future windows in the board, or a stale one) gets no totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demand_reports_count_only_for_the_window_before_the_grant() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(fair(counter_policy("report/", 1_000, LONG_WINDOW_MS)))
        .await?;
    let report = || {
        vec![pb::TenantDemand {
            tenant: "t".into(),
            demand: 5,
        }]
    };
    let grant = client
        .pool_grant(PoolGrantCall::new("report/k", "us", 1_000, 1))
        .await?;
    for wrong in [u64::MAX, grant.window_start_ms, 0] {
        let answer = client
            .pool_grant(PoolGrantCall::new("report/k", "us", 1_000, 1).reporting(wrong, report()))
            .await?;
        ensure!(
            answer.tenant_demands.is_empty(),
            "a report for window {wrong} was counted: {:?}",
            answer.tenant_demands
        );
    }
    let previous = grant.window_start_ms - LONG_WINDOW_MS;
    let answer = client
        .pool_grant(PoolGrantCall::new("report/k", "us", 1_000, 1).reporting(previous, report()))
        .await?;
    let totals: Vec<(String, u64)> = answer
        .tenant_demands
        .iter()
        .map(|d| (d.tenant.clone(), d.demand))
        .collect();
    ensure!(totals == [("t".to_string(), 5)], "totals {totals:?}");
    Ok(())
}

/// Early in a window the leader keeps room for the regions of the window
/// before that have not asked yet: a region asking for everything gets
/// its expected ceiling, and the answer says where it stands counting
/// them (`expected_*`) and not (`guarantee_total`, `ceiling_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_in_a_window_the_leader_keeps_room_for_the_regions_of_the_window_before() -> Result<()>
{
    const WINDOW_MS: u64 = 2_000;
    // Well inside a window (its first quarter is 500 ms long).
    let into_window = |at: u64| async move {
        let now = wall_ms();
        let wait = (now / WINDOW_MS * WINDOW_MS + WINDOW_MS + at).saturating_sub(now);
        tokio::time::sleep(Duration::from_millis(wait)).await;
    };
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(fair(counter_policy("expect/", 100, WINDOW_MS)))
        .await?;
    // A window where eu (weight 1) and us (weight 3) both ask: the leader
    // records them. Nothing recorded before it: no expected standing.
    into_window(50).await;
    let first = client
        .pool_grant(PoolGrantCall::new("expect/k", "eu", 1_000, 1))
        .await?;
    ensure!(
        first.expected_ceiling_total == 0 && first.expected_guarantee_total == 0,
        "nothing to expect in the key's first window: {first:?}"
    );
    client
        .pool_grant(PoolGrantCall::new("expect/k", "us", 3_000, 1))
        .await?;
    // The next window, within its first quarter: us asks for all of L.
    into_window(50).await;
    let us = client
        .pool_grant(PoolGrantCall::new("expect/k", "us", 3_000, 100))
        .await?;
    ensure!(
        us.window_start_ms == first.window_start_ms + WINDOW_MS,
        "{us:?}"
    );
    ensure!(
        us.granted_total == 75,
        "us must leave eu its guarantee (25 of 100): {us:?}"
    );
    ensure!(
        (us.expected_guarantee_total, us.expected_ceiling_total) == (75, 75),
        "{us:?}"
    );
    ensure!(
        (us.guarantee_total, us.ceiling_total) == (100, 100),
        "alone in the window so far: {us:?}"
    );
    let eu = client
        .pool_grant(PoolGrantCall::new("expect/k", "eu", 1_000, 100))
        .await?;
    ensure!(eu.granted_total == 25, "{eu:?}");
    ensure!(
        (eu.expected_guarantee_total, eu.expected_ceiling_total) == (25, 25),
        "everyone expected has asked: {eu:?}"
    );
    // Once the first quarter is over, nobody is expected any more: a
    // region that did not come leaves its share to the others.
    into_window(600).await;
    let us = client
        .pool_grant(PoolGrantCall::new("expect/k", "us", 3_000, 100))
        .await?;
    ensure!(us.granted_total == 100, "{us:?}");
    Ok(())
}

/// Late in a window the reserves no region holds lapse: in the window's
/// last eighth an ask beyond the ceiling first retires every other region
/// keeping all it holds, and takes everything no region holds (before the
/// last eighth it gets its ceiling). What regions hand back in a window's
/// last quarter, the next window's grants report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_in_a_window_the_reserves_no_region_holds_lapse() -> Result<()> {
    const WINDOW_MS: u64 = 4_000;
    let metrics_addr = crate::metrics::free_addr()?;
    let listen = metrics_addr.clone();
    let cluster =
        Cluster::start_initialised(1, move |c| c.metrics_listen = Some(listen.clone())).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(fair(counter_policy("lapse/", 100, WINDOW_MS)))
        .await?;
    let start = (wall_ms() / WINDOW_MS + 1) * WINDOW_MS;
    until(start + 50).await;
    // eu and ap (weight 1 each) hold 10 of their 33; us (weight 1) gets
    // its ceiling, 100 − 33 − 33.
    let eu = client
        .pool_grant(PoolGrantCall::new("lapse/k", "eu", 1_000, 10))
        .await?;
    client
        .pool_grant(PoolGrantCall::new("lapse/k", "ap", 1_000, 10))
        .await?;
    let us = client
        .pool_grant(PoolGrantCall::new("lapse/k", "us", 1_000, 100))
        .await?;
    ensure!(
        us.window_start_ms == start && us.granted_total == 34,
        "{us:?}"
    );
    // Half way: still its ceiling.
    until(start + WINDOW_MS / 2).await;
    let us = client
        .pool_grant(PoolGrantCall::new("lapse/k", "us", 1_000, 100))
        .await?;
    ensure!(
        us.granted_total == 34,
        "no lapse before the last eighth: {us:?}"
    );
    // In the last quarter eu hands back 5 of its 10.
    until(start + WINDOW_MS * 3 / 4 + 100).await;
    let released = client
        .pool_release_with_id(
            PoolReleaseCall::new("lapse/k", "eu", eu.granted_total, 5, start),
            client.next_request_id(),
        )
        .await?;
    ensure!(released.released == 5, "{released:?}");
    // In the last eighth us takes all that no region holds: ap retires
    // keeping its 10.
    until(start + WINDOW_MS * 7 / 8 + 100).await;
    let us = client
        .pool_grant(PoolGrantCall::new("lapse/k", "us", 1_000, 100))
        .await?;
    ensure!(us.granted_total == 85, "the reserves lapsed: {us:?}");
    let window = client.get_window("lapse/k").await?;
    let region = |name: &str| {
        window
            .regions
            .iter()
            .find(|r| r.region == name)
            .map(|r| (r.granted, r.pool_weight))
    };
    ensure!(
        region("ap") == Some((10, 0)) && region("eu") == Some((5, 0)),
        "ap retired keeping its total: {window:?}"
    );
    let (_, metrics) = crate::metrics::get(&metrics_addr, "/metrics").await?;
    ensure!(
        crate::metrics::sample(&metrics, "leasehold_coordinator_pool_reserves_lapsed_total")
            == Some(1.0),
        "one region retired by the lapse: {metrics}"
    );
    // The next window's grants report the late hand-back.
    until(start + WINDOW_MS + 50).await;
    let next = client
        .pool_grant(PoolGrantCall::new("lapse/k", "us", 1_000, 10))
        .await?;
    ensure!(
        next.window_start_ms == start + WINDOW_MS && next.late_released_before_total == 5,
        "{next:?}"
    );
    Ok(())
}

/// A region's pool call late in a window carries its join of the next
/// window (`join_next`): before the window's last quarter the join is
/// refused and the call still answered; in it, the leader proposes the join
/// with the call and answers the grant in the next window — capped at the
/// region's share among the regions of this window, which it expects
/// there too — the next window starts with those totals, and a resend under
/// the same ids changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_pool_call_joins_the_next_window_ahead() -> Result<()> {
    use leasehold_proto::v1::NextWindowJoin;
    const WINDOW_MS: u64 = 4_000;
    let metrics_addr = crate::metrics::free_addr()?;
    let listen = metrics_addr.clone();
    let cluster =
        Cluster::start_initialised(1, move |c| c.metrics_listen = Some(listen.clone())).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(fair(counter_policy("ahead/", 100, WINDOW_MS)))
        .await?;
    let start = (wall_ms() / WINDOW_MS + 1) * WINDOW_MS;
    let next = start + WINDOW_MS;
    let join = |want_total: u64, request_id| NextWindowJoin {
        window_start_ms: next,
        region_weight: 1_000,
        want_total,
        request_id: Some(request_id),
        retire: false,
        tenant_demands: Vec::new(),
        want_more: 0,
    };
    until(start + 50).await;
    let eu = client
        .pool_grant(PoolGrantCall::new("ahead/k", "eu", 1_000, 40))
        .await?;
    ensure!(eu.granted_total == 40, "{eu:?}");
    // Half way: too early to join the next window; the grant is answered.
    until(start + WINDOW_MS / 2).await;
    let early = client
        .pool_grant(
            PoolGrantCall::new("ahead/k", "us", 1_000, 10)
                .joining_next(Some(join(50, client.next_request_id()))),
        )
        .await?;
    ensure!(
        early.granted_total == 10
            && early.next_window.is_none()
            && early.next_window_refused.contains("last 1/4"),
        "{early:?}"
    );
    // In the last quarter eu hands back 10 and joins the next window for
    // 60: 50, its share beside us, expected there.
    until(start + WINDOW_MS * 3 / 4 + 100).await;
    let (release_id, join_id) = (client.next_request_id(), client.next_request_id());
    let released = client
        .pool_release_with_id(
            PoolReleaseCall::new("ahead/k", "eu", 40, 30, start)
                .joining_next(Some(join(60, join_id.clone()))),
            release_id.clone(),
        )
        .await?;
    let eu_next = released.next_window.clone().unwrap_or_default();
    ensure!(
        released.released == 10
            && eu_next.window_start_ms == next
            && eu_next.window_end_ms == next + WINDOW_MS
            && eu_next.granted_total == 50
            && eu_next.expected_ceiling_total == 50
            && eu_next.late_released_before_total == 10,
        "{released:?}"
    );
    // us, of equal weight, joins with a grant that asks nothing more here,
    // and finds the other 50.
    let us = client
        .pool_grant(
            PoolGrantCall::new("ahead/k", "us", 1_000, 10)
                .joining_next(Some(join(80, client.next_request_id()))),
        )
        .await?;
    let us_next = us.next_window.clone().unwrap_or_default();
    ensure!(
        us.granted_total == 10 && us_next.granted_total == 50 && us_next.ceiling_total == 50,
        "{us:?}"
    );
    // A resend of the release with its join changes nothing: the same
    // answers (the standing hints move with the pool, as they may).
    let answered = |r: &pb::PoolReleaseResponse| {
        let joined = r.next_window.as_ref();
        (
            (
                r.disposition,
                r.released,
                r.granted_total,
                r.window_start_ms,
            ),
            joined.map(|n| (n.granted_total, n.window_start_ms, n.window_end_ms)),
        )
    };
    let resent = client
        .pool_release_with_id(
            PoolReleaseCall::new("ahead/k", "eu", 40, 30, start)
                .joining_next(Some(join(60, join_id))),
            release_id,
        )
        .await?;
    ensure!(
        answered(&resent) == answered(&released),
        "{resent:?} != {released:?}"
    );
    // The next window starts with both totals.
    until(next + 50).await;
    let window = client.get_window("ahead/k").await?;
    ensure!(
        window.window_start_ms == next && window.granted == 100,
        "{window:?}"
    );
    let (_, metrics) = crate::metrics::get(&metrics_addr, "/metrics").await?;
    ensure!(
        crate::metrics::sample(&metrics, "leasehold_coordinator_pool_joins_ahead_total")
            == Some(3.0),
        "three joins ahead answered with a grant (the resend's replay too): {metrics}"
    );
    Ok(())
}

/// The wall clock, in ms since the epoch (the coordinator's window clock).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A join ahead reports the live window's demand (`join_next.tenant_demands`):
/// the leader counts it as the region's report of that window — a region
/// joining at the next window's start hears it in that window's totals —
/// and answers the join with the settled totals of the window before. A
/// malformed report refuses the call (INVALID_FIELD `join_next`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_ahead_reports_its_window_and_hears_the_settled_totals() -> Result<()> {
    use leasehold_proto::v1::{NextWindowJoin, TenantDemand};
    const WINDOW_MS: u64 = 2_000;
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(fair(counter_policy("report/", 100, WINDOW_MS)))
        .await?;
    let demand = |n: u64| {
        vec![TenantDemand {
            tenant: "beta".into(),
            demand: n,
        }]
    };
    let totals = |d: &[TenantDemand]| {
        d.iter()
            .map(|d| (d.tenant.clone(), d.demand))
            .collect::<Vec<_>>()
    };
    let first = (wall_ms() / WINDOW_MS + 1) * WINDOW_MS;
    let (second, third) = (first + WINDOW_MS, first + 2 * WINDOW_MS);
    // In the second window eu and ap report the first: beta asked 30 and 10.
    until(second + 50).await;
    let pool = "report/k";
    client
        .pool_grant(PoolGrantCall::new(pool, "eu", 1_000, 10).reporting(first, demand(30)))
        .await?;
    client
        .pool_grant(PoolGrantCall::new(pool, "ap", 1_000, 10).reporting(first, demand(10)))
        .await?;
    // In its last quarter ap joins the third window ahead, reporting the
    // second (20 so far, projected): it hears the first's settled 40.
    until(third - WINDOW_MS / 8).await;
    let join = |report: Vec<TenantDemand>| NextWindowJoin {
        window_start_ms: third,
        region_weight: 1_000,
        want_total: 20,
        request_id: Some(client.next_request_id()),
        retire: false,
        tenant_demands: report,
        want_more: 0,
    };
    let twice = [demand(1), demand(2)].concat();
    let refused = client
        .pool_grant(
            PoolGrantCall::new(pool, "ap", 1_000, 10)
                .reporting(first, demand(10))
                .joining_next(Some(join(twice))),
        )
        .await;
    match refused {
        Err(e) => ensure!(e.to_string().contains("join_next"), "{e}"),
        Ok(answer) => anyhow::bail!("a report naming beta twice was taken: {answer:?}"),
    }
    let ap = client
        .pool_grant(
            PoolGrantCall::new(pool, "ap", 1_000, 10)
                .reporting(first, demand(10))
                .joining_next(Some(join(demand(20)))),
        )
        .await?;
    let joined = ap.next_window.clone().unwrap_or_default();
    ensure!(joined.window_start_ms == third, "{ap:?}");
    ensure!(
        totals(&joined.tenant_demands) == [("beta".to_string(), 20)],
        "{ap:?}"
    );
    ensure!(
        totals(&joined.settled_tenant_demands) == [("beta".to_string(), 40)],
        "{ap:?}"
    );
    // eu joins the third window at its start, reporting the second: beta's
    // total counts ap's report made with its join.
    until(third + 50).await;
    let eu = client
        .pool_grant(PoolGrantCall::new(pool, "eu", 1_000, 10).reporting(second, demand(60)))
        .await?;
    ensure!(
        totals(&eu.tenant_demands) == [("beta".to_string(), 80)],
        "{eu:?}"
    );
    ensure!(
        totals(&eu.settled_tenant_demands) == [("beta".to_string(), 40)],
        "{eu:?}"
    );
    Ok(())
}

/// Sleeps until the wall clock reads `at_ms`.
async fn until(at_ms: u64) {
    tokio::time::sleep(Duration::from_millis(at_ms.saturating_sub(wall_ms()))).await;
}

/// Through the API: two clients (two holders) of eu each declaring weight
/// 1 000 against us declaring 2 000 — eu weighs their sum and is served
/// half of L, not a third; and a holder asking by `want_more` after the
/// other added to eu's total is granted what it asked for on top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_of_two_holders_weighs_their_sum_and_asks_by_more() -> Result<()> {
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let (first, second) = (cluster.client()?, cluster.client()?);
    ensure!(first.client_id() != second.client_id());
    first
        .admin()
        .set_policy(fair(counter_policy("holders/", 100, LONG_WINDOW_MS)))
        .await?;
    first
        .pool_grant(PoolGrantCall::new("holders/k", "us", 2_000, 1))
        .await?;
    first
        .pool_grant(PoolGrantCall::new("holders/k", "eu", 1_000, 100))
        .await?;
    let eu = second
        .pool_grant(PoolGrantCall::new("holders/k", "eu", 1_000, 100))
        .await?;
    ensure!(eu.granted_total == 50, "eu weighs 2 000: {eu:?}");
    // At eu's share, 5 more by want_more are not granted: the rule caps
    // the raised total as any other.
    let more = first
        .pool_grant(PoolGrantCall::new("holders/k", "eu", 1_000, 10).asking_more(5))
        .await?;
    ensure!(
        more.granted_increment == 0 && more.granted_total == 50,
        "at the ceiling: {more:?}"
    );
    // Below the share: the first holder knows eu's total as 10 (its last
    // answer) and asks for 15 in all, or 5 more; the second has raised
    // eu's total to 20 meanwhile. By want_more it gets its 5 on top.
    let fresh = cluster.client()?;
    fresh
        .admin()
        .set_policy(fair(counter_policy("more/", 100, LONG_WINDOW_MS)))
        .await?;
    first
        .pool_grant(PoolGrantCall::new("more/k", "eu", 1_000, 10))
        .await?;
    second
        .pool_grant(PoolGrantCall::new("more/k", "eu", 1_000, 20))
        .await?;
    let asked = first
        .pool_grant(PoolGrantCall::new("more/k", "eu", 1_000, 15).asking_more(5))
        .await?;
    ensure!(
        (asked.granted_total, asked.granted_increment) == (25, 5),
        "want_more on top of what the other holder added: {asked:?}"
    );
    Ok(())
}

/// `Escrow/Forecast`: a node leasing with the predictive sizer takes a
/// forecast and leases more for a key forecast to be busy than for one
/// without a forecast; a node with a fixed batch says it does not use
/// forecasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forecast_sizes_the_predictive_nodes_leases() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("fc/", 1_000_000, LONG_WINDOW_MS))
        .await?;
    let predictive = EscrowNode::start(&cluster, "eu", |c| c.sizer = SizerKind::Predictive).await?;
    let fixed = EscrowNode::start(&cluster, "us", |c| c.batch = 8).await?;
    let mut rpc = predictive.rpc().await?;
    let used = rpc
        .forecast(pb::ForecastRequest {
            key: "fc/busy".into(),
            demand: 500_000,
        })
        .await?
        .into_inner()
        .used;
    ensure!(used, "the predictive node takes forecasts");
    for key in ["fc/busy", "fc/quiet"] {
        let answer = rpc.acquire(acquire(key, 1)).await?.into_inner();
        ensure!(answer.granted == 1, "{answer:?}");
    }
    let client = cluster.client()?;
    let busy = client.get_window("fc/busy").await?.granted;
    let quiet = client.get_window("fc/quiet").await?.granted;
    ensure!(
        busy > quiet,
        "leased {busy} for the busy key, {quiet} for the quiet one"
    );
    let refused = rpc
        .forecast(pb::ForecastRequest {
            key: String::new(),
            demand: 1,
        })
        .await;
    ensure!(
        refused.is_err_and(|s| s.code() == tonic::Code::InvalidArgument),
        "an empty key is refused"
    );
    let used = fixed
        .rpc()
        .await?
        .forecast(pb::ForecastRequest {
            key: "fc/busy".into(),
            demand: 500_000,
        })
        .await?
        .into_inner()
        .used;
    ensure!(!used, "a fixed batch takes no forecasts");
    predictive.stop().await;
    fixed.stop().await;
    Ok(())
}
