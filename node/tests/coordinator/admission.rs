//! Unified admission against the real global budget: per region an
//! admission gate whose cost axis is a leased limiter on that region's
//! escrow node, with local concurrency and per-key rate. Σ cost admitted
//! stays ≤ L across regions while rate and concurrency bind locally.

use std::sync::Arc;

use anyhow::{ensure, Result};
use leasehold_client::admission::{AdmissionGate, AdmitRequest, Axis, CostAxis, InProcessLimit};
use leasehold_client::transport::TcpDialer;
use leasehold_client::{
    EscrowSource, EscrowSourceOptions, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode,
};
use leasehold_core::admission::concurrency::ConcurrencyParams;
use leasehold_core::ids::ClientId;

use crate::escrow::EscrowNode;
use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

fn region_gate(escrow_addr: &str, region: &str) -> Result<AdmissionGate> {
    let source = EscrowSource::new(
        escrow_addr,
        Arc::new(TcpDialer::default()),
        EscrowSourceOptions::default(),
    )?;
    let mode = Mode::Leased(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(8)));
    let limiter = Limiter::new(
        source,
        LimiterConfig::new(mode, ClientId::new(format!("gate-{region}"))?),
    )?;
    Ok(AdmissionGate::builder()
        .concurrency(ConcurrencyParams::aimd(2, 2))
        // 40 a minute per key: a tight loop meets it long before it refills.
        .rate(InProcessLimit::gcra(40, 60_000))
        .cost(CostAxis::Global(limiter))
        .build()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regions_share_the_global_cost_budget_while_rate_and_concurrency_bind_locally() -> Result<()>
{
    const LIMIT: u64 = 100;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let admin = cluster.client()?.admin();
    // `adm/`: a tight global budget; `free/`: one no test here can spend.
    admin
        .set_policy(counter_policy("adm/", LIMIT, LONG_WINDOW_MS))
        .await?;
    admin
        .set_policy(counter_policy("free/", 1_000_000, LONG_WINDOW_MS))
        .await?;
    let eu = EscrowNode::start(&cluster, "eu", |c| c.batch = 8).await?;
    let us = EscrowNode::start(&cluster, "us", |c| c.batch = 8).await?;

    let mut regions = Vec::new();
    for (region, addr) in [("eu", eu.addr.clone()), ("us", us.addr.clone())] {
        regions.push(tokio::spawn(async move {
            let gate = region_gate(&addr, region)?;
            // Concurrency binds locally: with both slots held, a third waits.
            let a = gate.admit(AdmitRequest::new("free/k", 1)).await?;
            let b = gate.admit(AdmitRequest::new("free/k", 1)).await?;
            ensure!(a.decision.allowed && b.decision.allowed);
            let third = gate.admit(AdmitRequest::new("free/k", 1)).await?;
            ensure!(third.binding_axis == Some(Axis::Concurrency));
            a.release.release(false);
            b.release.release(false);
            // Rate binds locally on a key with budget to spare: 40 a minute,
            // 2 already spent, so 22 of the next 60 are denied.
            for i in 0..60u64 {
                let outcome = gate.admit(AdmitRequest::new("free/k", i % 3 + 1)).await?;
                outcome.release.release(false);
            }
            let rate_denials = gate.denied_by_axis().rate;
            ensure!(rate_denials == 22, "{:?}", gate.denied_by_axis());
            // Cost binds globally: two regions × 40 rate-admitted requests
            // of cost 2 on average want 160 > L = 100.
            let mut admitted_cost = 0;
            for i in 0..60u64 {
                let cost = i % 3 + 1;
                let outcome = gate.admit(AdmitRequest::new("adm/k", cost)).await?;
                if outcome.decision.allowed {
                    admitted_cost += cost;
                }
                outcome.release.release(false);
            }
            anyhow::Ok((admitted_cost, gate.denied_by_axis()))
        }));
    }
    let mut total = 0;
    let mut cost_denials = 0;
    for region in regions {
        let (admitted_cost, denied) = region.await??;
        total += admitted_cost;
        cost_denials += denied.cost;
        ensure!(denied.concurrency == 1, "{denied:?}");
    }
    ensure!(total <= LIMIT, "admitted cost {total} > L = {LIMIT}");
    ensure!(total >= LIMIT / 2, "admitted cost only {total} of {LIMIT}");
    ensure!(cost_denials > 0, "the global budget never bound");
    let window = cluster.client()?.get_window("adm/k").await?;
    ensure!(window.granted <= LIMIT);
    eu.stop().await;
    us.stop().await;
    Ok(())
}

/// `AdmissionLayer` in front of an HTTP service in each of two regions,
/// the cost axis the global budget through each region's escrow node: the
/// service of every region together never sees more cost than L, every
/// other request is a `429` with a Retry-After, and the coordinator's
/// window agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_services_behind_the_admission_layer_share_one_global_budget() -> Result<()> {
    use std::convert::Infallible;

    use leasehold_client::admission::{AdmissionLayer, Admit};
    use tower::{service_fn, Layer, ServiceExt};

    const LIMIT: u64 = 60;
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let admin = cluster.client()?.admin();
    admin
        .set_policy(counter_policy("http/", LIMIT, LONG_WINDOW_MS))
        .await?;
    let eu = EscrowNode::start(&cluster, "eu", |c| c.batch = 8).await?;
    let us = EscrowNode::start(&cluster, "us", |c| c.batch = 8).await?;

    let mut regions = Vec::new();
    for (region, addr) in [("eu", eu.addr.clone()), ("us", us.addr.clone())] {
        regions.push(tokio::spawn(async move {
            let classify = |request: &http::Request<String>| {
                let cost = request
                    .headers()
                    .get("x-cost")?
                    .to_str()
                    .ok()?
                    .parse()
                    .ok()?;
                Some(Admit::new("http/tenant", cost))
            };
            let layer = AdmissionLayer::new(region_gate(&addr, region)?, classify);
            let service = layer.layer(service_fn(|request: http::Request<String>| async move {
                Ok::<_, Infallible>(http::Response::new(request.into_body()))
            }));
            let mut served_cost = 0u64;
            for i in 0..40u64 {
                let cost = i % 3 + 1;
                let request = http::Request::post("/work")
                    .header("x-cost", cost.to_string())
                    .body(format!("job {i}"))?;
                let response = service.clone().oneshot(request).await?;
                match response.status() {
                    http::StatusCode::OK => {
                        ensure!(response.body() == &format!("job {i}"));
                        served_cost += cost;
                    }
                    http::StatusCode::TOO_MANY_REQUESTS => {
                        let wait = response
                            .headers()
                            .get(http::header::RETRY_AFTER)
                            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
                        ensure!(wait.is_some_and(|w| w >= 1), "{response:?}");
                    }
                    other => anyhow::bail!("unexpected {other}: {}", response.body()),
                }
            }
            anyhow::Ok((served_cost, layer.stats()))
        }));
    }
    let mut total = 0;
    let mut denied = 0;
    for region in regions {
        let (served_cost, stats) = region.await??;
        total += served_cost;
        denied += stats.denied;
        ensure!(
            stats.unanswered_denied == 0 && stats.invalid == 0,
            "{stats:?}"
        );
    }
    ensure!(total <= LIMIT, "served cost {total} > L = {LIMIT}");
    ensure!(total >= LIMIT / 2, "served cost only {total} of {LIMIT}");
    ensure!(denied > 0, "the global budget never bound");
    let window = cluster.client()?.get_window("http/tenant").await?;
    ensure!(window.granted <= LIMIT);
    eu.stop().await;
    us.stop().await;
    Ok(())
}
