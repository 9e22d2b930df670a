//! Envoy's rate limit service (RLS v3) on escrow nodes, driven by a client
//! generated from Envoy's own protos (`envoy-types`): every field of the
//! answer, bad input, metrics, and two regions sharing one global budget
//! per descriptor — Σ OK ≤ L per window, with escrow nodes restarted and a
//! coordinator member stopped under load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as WireUnit, Code as WireCode,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use leasehold_node::escrow::rls::RlsConfig;
use leasehold_proto::v1 as pb;
use tonic::transport::Channel;

use crate::escrow::EscrowNode;
use crate::harness::Cluster;
use crate::metrics::{free_addr, get, sample};

const EDGE: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: generic_key
    value: free
    rate_limit: {unlimited: true}
  - key: generic_key
    value: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: generic_key
    value: tried
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: user
    value: vip
    detailed_metric: true
    rate_limit: {name: vip, unit: hour, requests_per_unit: 2}
  - key: plan
    value: gold
    rate_limit:
      unit: hour
      requests_per_unit: 100
      replaces: [{name: vip}]
";

/// Writes `yaml` to a file in `dir` and reads it as the node would.
fn rls_config(dir: &tempfile::TempDir, yaml: &str, headers: bool) -> Result<RlsConfig> {
    let path = dir.path().join("ratelimit.yaml");
    std::fs::write(&path, yaml)?;
    Ok(RlsConfig::load(&[path], headers)?)
}

/// Sets the policies the configuration stands for (`leasehold policy apply`).
async fn apply(cluster: &Cluster, config: &RlsConfig) -> Result<()> {
    let admin = cluster.client()?.admin();
    for domain in &config.domains {
        for policy in domain.policies() {
            admin.set_policy(pb::Policy::from(&policy)).await?;
        }
    }
    Ok(())
}

/// An escrow node of `region` serving RLS with `config`, leasing 4 at a time.
async fn start_rls_node(cluster: &Cluster, region: &str, config: &RlsConfig) -> Result<EscrowNode> {
    let config = config.clone();
    EscrowNode::start(cluster, region, move |c| {
        c.batch = 4;
        c.rls = Some(config.clone());
    })
    .await
}

async fn rls_client(node: &EscrowNode) -> Result<RateLimitServiceClient<Channel>> {
    Ok(RateLimitServiceClient::connect(format!("http://{}", node.addr)).await?)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: hits,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> Result<RateLimitResponse> {
    Ok(client.should_rate_limit(request).await?.into_inner())
}

fn code(response: &RateLimitResponse, i: usize) -> WireCode {
    WireCode::try_from(response.statuses[i].code).unwrap_or(WireCode::Unknown)
}

fn overall(response: &RateLimitResponse) -> WireCode {
    WireCode::try_from(response.overall_code).unwrap_or(WireCode::Unknown)
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_field_is_answered_as_documented() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = rls_config(&dir, EDGE, true)?;
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    apply(&cluster, &config).await?;
    let metrics_addr = free_addr()?;
    let listen = metrics_addr.clone();
    let node = EscrowNode::start(&cluster, "eu", move |c| {
        c.batch = 2;
        c.rls = Some(config.clone());
        c.metrics_listen = Some(listen.clone());
    })
    .await?;
    let mut client = rls_client(&node).await?;
    let channel = Channel::from_shared(format!("http://{}", node.addr))?
        .connect()
        .await?;
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await?
        .into_inner();
    ensure!(
        health.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    // A per-value budget: 5 an hour for each address; hits_addend 0 is 1.
    for i in 0..5 {
        let answer = ask(
            &mut client,
            request("edge", vec![descriptor(&[("remote_address", "a")])], 0),
        )
        .await?;
        ensure!(overall(&answer) == WireCode::Ok, "hit {i}: {answer:?}");
        let status = &answer.statuses[0];
        let limit = status.current_limit.as_ref().context("a limit")?;
        ensure!(limit.requests_per_unit == 5 && limit.unit == WireUnit::Hour as i32);
        ensure!(
            status.limit_remaining < 5 - i,
            "remaining {status:?} after {i}"
        );
        let reset = status.duration_until_reset.context("a reset")?;
        ensure!(reset.seconds > 0 && reset.seconds <= 3_600, "{reset:?}");
        ensure!(
            header(&answer, "x-ratelimit-limit") == Some("5, 5;w=3600"),
            "{answer:?}"
        );
        ensure!(header(&answer, "x-ratelimit-remaining").is_some());
        ensure!(header(&answer, "x-ratelimit-reset").is_some());
    }
    let over = ask(
        &mut client,
        request("edge", vec![descriptor(&[("remote_address", "a")])], 1),
    )
    .await?;
    ensure!(overall(&over) == WireCode::OverLimit, "{over:?}");
    ensure!(over.statuses[0].limit_remaining == 0);
    ensure!(header(&over, "x-ratelimit-remaining") == Some("0"));
    // Another value has a budget of its own; more hits than the limit never fit.
    let other = ask(
        &mut client,
        request("edge", vec![descriptor(&[("remote_address", "b")])], 3),
    )
    .await?;
    ensure!(overall(&other) == WireCode::Ok, "{other:?}");
    let too_many = ask(
        &mut client,
        request("edge", vec![descriptor(&[("remote_address", "c")])], 6),
    )
    .await?;
    ensure!(overall(&too_many) == WireCode::OverLimit, "{too_many:?}");
    // A descriptor's own hits_addend replaces the request's: 2 + 1 of "b"'s 5 left...
    let mut own_hits = descriptor(&[("remote_address", "b")]);
    own_hits.hits_addend = Some(UInt64Value { value: 3 });
    let own = ask(&mut client, request("edge", vec![own_hits], 1)).await?;
    ensure!(overall(&own) == WireCode::OverLimit, "3 + 3 > 5: {own:?}");

    // One status per descriptor, in order; the overall code is OVER_LIMIT
    // when any is.
    let mixed = ask(
        &mut client,
        request(
            "edge",
            vec![
                descriptor(&[("generic_key", "free")]),
                descriptor(&[("generic_key", "closed")]),
                descriptor(&[("nobody", "x")]),
                descriptor(&[]),
            ],
            1,
        ),
    )
    .await?;
    ensure!(mixed.statuses.len() == 4, "{mixed:?}");
    ensure!(code(&mixed, 0) == WireCode::Ok && mixed.statuses[0].limit_remaining == u32::MAX);
    ensure!(mixed.statuses[0].current_limit.is_none());
    ensure!(
        code(&mixed, 1) == WireCode::OverLimit,
        "0 requests: {mixed:?}"
    );
    ensure!(
        mixed.statuses[1]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
            == Some(0)
    );
    ensure!(code(&mixed, 2) == WireCode::Ok && mixed.statuses[2].current_limit.is_none());
    ensure!(code(&mixed, 3) == WireCode::Ok && mixed.statuses[3].current_limit.is_none());
    ensure!(overall(&mixed) == WireCode::OverLimit);

    // Shadow mode: OK, whatever the count.
    for _ in 0..3 {
        let shadow = ask(
            &mut client,
            request("edge", vec![descriptor(&[("generic_key", "tried")])], 1),
        )
        .await?;
        ensure!(overall(&shadow) == WireCode::Ok, "{shadow:?}");
    }
    // `replaces`: with plan=gold in the same request, user=vip is not limited.
    for _ in 0..4 {
        let both = ask(
            &mut client,
            request(
                "edge",
                vec![
                    descriptor(&[("user", "vip")]),
                    descriptor(&[("plan", "gold")]),
                ],
                1,
            ),
        )
        .await?;
        ensure!(overall(&both) == WireCode::Ok, "{both:?}");
        ensure!(both.statuses[0].current_limit.is_none());
    }
    for expected in [WireCode::Ok, WireCode::Ok, WireCode::OverLimit] {
        let vip = ask(
            &mut client,
            request("edge", vec![descriptor(&[("user", "vip")])], 1),
        )
        .await?;
        ensure!(overall(&vip) == expected, "{vip:?}");
    }
    // A domain no file configures limits nothing; a limit override and
    // negative hits are answered without a limit.
    let unknown = ask(
        &mut client,
        request("elsewhere", vec![descriptor(&[("remote_address", "a")])], 1),
    )
    .await?;
    ensure!(overall(&unknown) == WireCode::Ok && unknown.statuses[0].current_limit.is_none());
    let mut negative = descriptor(&[("remote_address", "a")]);
    negative.is_negative_hits = true;
    let mut overridden = descriptor(&[("nobody", "y")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: WireUnit::Second as i32,
    });
    let ignored = ask(&mut client, request("edge", vec![negative, overridden], 1)).await?;
    ensure!(overall(&ignored) == WireCode::Ok, "{ignored:?}");

    // Bad input: the documented refusals, never a panic.
    for (bad, field) in [
        (
            request("", vec![descriptor(&[("remote_address", "a")])], 1),
            "domain",
        ),
        (request("edge", Vec::new(), 1), "descriptors"),
        (
            request("edge", vec![descriptor(&[("", "a")])], 1),
            "descriptors.entries.key",
        ),
        (
            request("edge", vec![descriptor(&[("k", "v")]); 65], 1),
            "descriptors",
        ),
    ] {
        let status = client
            .should_rate_limit(bad)
            .await
            .expect_err("bad input is refused");
        ensure!(status.code() == tonic::Code::InvalidArgument, "{status:?}");
        ensure!(
            leasehold_proto::refusal::detail(&status, leasehold_proto::refusal::FIELD).as_deref()
                == Some(field),
            "{field}: {status:?}"
        );
    }
    // The node still answers.
    let after = ask(
        &mut client,
        request("edge", vec![descriptor(&[("remote_address", "z")])], 1),
    )
    .await?;
    ensure!(overall(&after) == WireCode::Ok);

    let (_, text) = get(&metrics_addr, "/metrics").await?;
    let series = |s: &str| sample(&text, s).unwrap_or(-1.0);
    ensure!(
        series("leasehold_escrow_rls_requests_total{code=\"refused\"}") == 4.0,
        "{text}"
    );
    // A shadow_mode rule is a shadow policy: the cluster hands out what is
    // asked and counts what it would have denied (3 hits of a limit of 1).
    let status = cluster.status(1).await?;
    let tally = status
        .shadow
        .iter()
        .find(|t| t.prefix == "rls:edge/generic_key=tried/")
        .context("the shadow rule's tally")?;
    ensure!(tally.would_deny_tokens >= 2, "{tally:?}");
    ensure!(
        series("leasehold_escrow_rls_descriptors_total{domain=\"edge\",outcome=\"over_limit\"}")
            >= 5.0
    );
    ensure!(
        series("leasehold_escrow_rls_descriptors_total{domain=\"\",outcome=\"no_limit\"}") == 1.0
    );
    ensure!(
        series(
            "leasehold_escrow_rls_rule_descriptors_total{domain=\"edge\",rule=\"rls:edge/user=vip/\",outcome=\"over_limit\"}"
        ) == 1.0,
        "{text}"
    );
    ensure!(series("leasehold_escrow_rls_limit_overrides_ignored_total") == 1.0);
    // The refund of "a" gave back 1 of the 5 this caller was charged there.
    ensure!(series("leasehold_escrow_rls_hits_refunded_total") == 1.0);
    ensure!(series("leasehold_escrow_rls_negative_hits_ignored_total") == 0.0);
    node.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_its_policy_is_refused_and_headers_are_off_by_default() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = rls_config(&dir, EDGE, false)?;
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    // No `policy apply`: the cluster governs no rls: key.
    let node = EscrowNode::start(&cluster, "eu", move |c| c.rls = Some(config.clone())).await?;
    let mut client = rls_client(&node).await?;
    let refused = client
        .should_rate_limit(request(
            "edge",
            vec![descriptor(&[("remote_address", "a")])],
            1,
        ))
        .await
        .expect_err("no policy governs the key");
    ensure!(refused.code() == tonic::Code::NotFound, "{refused:?}");
    ensure!(
        leasehold_proto::refusal::reason_of(&refused)
            == Some(leasehold_proto::refusal::Reason::NoPolicy),
        "{refused:?}"
    );
    let unlimited = ask(
        &mut client,
        request("edge", vec![descriptor(&[("generic_key", "free")])], 1),
    )
    .await?;
    ensure!(overall(&unlimited) == WireCode::Ok);
    ensure!(unlimited.response_headers_to_add.is_empty());
    // A node without ratelimit files serves no RLS (and says so in health).
    let plain = EscrowNode::start(&cluster, "us", |_| {}).await?;
    let channel = Channel::from_shared(format!("http://{}", plain.addr))?
        .connect()
        .await?;
    let unknown = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect_err("not served");
    ensure!(unknown.code() == tonic::Code::NotFound, "{unknown:?}");
    let unserved = RateLimitServiceClient::new(channel)
        .should_rate_limit(request(
            "edge",
            vec![descriptor(&[("generic_key", "free")])],
            1,
        ))
        .await
        .expect_err("not served");
    ensure!(
        unserved.code() == tonic::Code::Unimplemented,
        "{unserved:?}"
    );
    plain.stop().await;
    node.stop().await;
    Ok(())
}

/// Two regions' escrow nodes (two for eu, serving at once) serve RLS for
/// one descriptor whose rule allows L = 60 an hour; eight callers per node
/// ask 25 times each, while the us node is stopped, then crashed, and each
/// time started afresh, and a coordinator member is stopped. The oracle sums every
/// OK per window (told by the answer's reset): ≤ L.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_behind_rls_never_admit_more_than_the_limit() -> Result<()> {
    const LIMIT: u64 = 60;
    let yaml = "domain: api\ndescriptors:\n  - key: tenant\n    value: acme\n    \
                rate_limit: {unit: hour, requests_per_unit: 60}\n";
    let dir = tempfile::tempdir()?;
    let config = rls_config(&dir, yaml, false)?;
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    apply(&cluster, &config).await?;
    let eu = start_rls_node(&cluster, "eu", &config).await?;
    // A second node of region eu, serving at the same time.
    let eu2 = start_rls_node(&cluster, "eu", &config).await?;
    let mut us = start_rls_node(&cluster, "us", &config).await?;

    // (window end, rounded to the hour) -> OKs, over every caller.
    let admitted: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let run_callers = |addr: String, admitted: Arc<Mutex<HashMap<u64, u64>>>| {
        tokio::spawn(async move {
            let Ok(mut client) = RateLimitServiceClient::connect(format!("http://{addr}")).await
            else {
                return 0u64;
            };
            let mut answered = 0;
            for _ in 0..25 {
                let asked = client
                    .should_rate_limit(request("api", vec![descriptor(&[("tenant", "acme")])], 1))
                    .await;
                let Ok(answer) = asked else {
                    continue; // a stopped node: the answer never came
                };
                let answer = answer.into_inner();
                answered += 1;
                if overall(&answer) == WireCode::Ok {
                    let reset = answer.statuses[0].duration_until_reset.unwrap_or_default();
                    let now = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_millis() as u64)
                        .unwrap_or(0);
                    let end = now + reset.seconds as u64 * 1_000;
                    let window = (end + 1_800_000) / 3_600_000;
                    *admitted.lock().expect("oracle").entry(window).or_default() += 1;
                }
            }
            answered
        })
    };
    let mut callers = Vec::new();
    for _ in 0..8 {
        callers.push(run_callers(eu.addr.clone(), admitted.clone()));
        callers.push(run_callers(eu2.addr.clone(), admitted.clone()));
        callers.push(run_callers(us.addr.clone(), admitted.clone()));
    }
    // Faults while they run: us loses its memory twice (a clean stop, then
    // a crash that hands nothing back); a member stops.
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        if round == 0 {
            us.stop().await;
        } else {
            us.crash().await;
        }
        us = start_rls_node(&cluster, "us", &config).await?;
        for _ in 0..4 {
            callers.push(run_callers(us.addr.clone(), admitted.clone()));
        }
        if round == 0 {
            let leader = cluster.leader().await?;
            let follower = (1..=3).find(|id| *id != leader).context("a follower")?;
            cluster.stop(follower).await?;
        }
    }
    let mut answered = 0;
    for caller in callers {
        answered += caller.await?;
    }
    let admitted = admitted.lock().expect("oracle").clone();
    let total: u64 = admitted.values().sum();
    for (window, count) in &admitted {
        ensure!(
            *count <= LIMIT,
            "window {window}: {count} OK answers > L = {LIMIT}"
        );
    }
    ensure!(answered >= 200, "only {answered} answers came back");
    ensure!(
        total >= LIMIT / 2,
        "only {total} of {LIMIT} admitted: {admitted:?}"
    );
    eu.stop().await;
    eu2.stop().await;
    us.stop().await;
    Ok(())
}

/// `policy apply` with a raised limit reaches the answers without a
/// restart: `current_limit` follows the cluster's policy, and a value's
/// budget is the new limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_changed_at_runtime_is_answered_without_a_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = rls_config(&dir, EDGE, false)?;
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    apply(&cluster, &config).await?;
    let node = EscrowNode::start(&cluster, "eu", move |c| {
        c.batch = 2;
        c.policy_refresh_ms = 100;
        c.rls = Some(config.clone());
    })
    .await?;
    let mut client = rls_client(&node).await?;
    let address = || request("edge", vec![descriptor(&[("remote_address", "r")])], 1);
    for _ in 0..5 {
        ensure!(overall(&ask(&mut client, address()).await?) == WireCode::Ok);
    }
    ensure!(overall(&ask(&mut client, address()).await?) == WireCode::OverLimit);
    let raised = leasehold_core::policy::Policy::counter("rls:edge/remote_address/", 8, 3_600_000);
    cluster
        .client()?
        .admin()
        .set_policy(pb::Policy::from(&raised))
        .await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A value whose window is not spent: the raised limit at once.
    let fresh = || request("edge", vec![descriptor(&[("remote_address", "s")])], 1);
    for hit in 0..8 {
        let answer = ask(&mut client, fresh()).await?;
        ensure!(
            overall(&answer) == WireCode::Ok,
            "hit {hit} of 8: {answer:?}"
        );
        let limit = answer.statuses[0]
            .current_limit
            .as_ref()
            .context("a limit")?;
        ensure!(limit.requests_per_unit == 8, "{limit:?}");
    }
    ensure!(overall(&ask(&mut client, fresh()).await?) == WireCode::OverLimit);
    // One the coordinator already called spent stays so until its window
    // ends (docs/envoy.md).
    ensure!(overall(&ask(&mut client, address()).await?) == WireCode::OverLimit);
    node.stop().await;
    Ok(())
}

/// A changed ratelimit file is served without a restart; a change with a
/// problem is refused and the previous rules keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_ratelimit_file_is_served_without_a_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut config = rls_config(&dir, EDGE, false)?;
    config.reload_interval_ms = 50;
    let path = config.files[0].clone();
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    apply(&cluster, &config).await?;
    let metrics_addr = free_addr()?;
    let listen = metrics_addr.clone();
    let node = EscrowNode::start(&cluster, "eu", move |c| {
        c.rls = Some(config.clone());
        c.metrics_listen = Some(listen.clone());
    })
    .await?;
    let mut client = rls_client(&node).await?;
    let country = || request("edge", vec![descriptor(&[("country", "nz")])], 1);
    let answer = ask(&mut client, country()).await?;
    ensure!(
        answer.statuses[0].current_limit.is_none(),
        "no rule yet: {answer:?}"
    );

    // A new rule (its policy applied as an operator would).
    let with_country =
        format!("{EDGE}  - key: country\n    rate_limit: {{unit: hour, requests_per_unit: 2}}\n");
    std::fs::write(&path, &with_country)?;
    let reloaded = rls_config(&dir, &with_country, false)?;
    apply(&cluster, &reloaded).await?;
    let mut limited = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let answer = ask(&mut client, country()).await?;
        if let Some(limit) = answer.statuses[0].current_limit.clone() {
            limited = Some(limit);
            break;
        }
    }
    ensure!(
        limited.map(|l| l.requests_per_unit) == Some(2),
        "the new rule was not served"
    );
    // A broken change is refused; the rules before it keep answering.
    std::fs::write(
        &path,
        "domain: edge\ndescriptors:\n  - key: country\n    rate_limit: {unit: fortnight}\n",
    )?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = ask(&mut client, country()).await?;
    ensure!(
        answer.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
            == Some(2),
        "{answer:?}"
    );
    let (_, text) = get(&metrics_addr, "/metrics").await?;
    ensure!(
        sample(
            &text,
            "leasehold_escrow_rls_reloads_total{result=\"applied\"}"
        ) == Some(1.0),
        "{text}"
    );
    ensure!(
        sample(
            &text,
            "leasehold_escrow_rls_reloads_total{result=\"refused\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{text}"
    );
    node.stop().await;
    Ok(())
}

/// `ShouldRateLimit` sent with raw bytes: a header value that is not UTF-8
/// (which Envoy forwards as it came) is limited like any other value,
/// under a budget of its own, and never fails the call — a failed call
/// would let the request through an Envoy that fails open.
async fn ask_with_raw_value(channel: Channel, value: Vec<u8>) -> Result<RateLimitResponse> {
    use leasehold_node::escrow::rls_wire::{WireDescriptor, WireEntry, WireRequest};
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let request = WireRequest {
        domain: b"edge".to_vec(),
        descriptors: vec![WireDescriptor {
            entries: vec![WireEntry {
                key: b"remote_address".to_vec(),
                value,
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let codec: tonic_prost::ProstCodec<WireRequest, RateLimitResponse> = Default::default();
    let path = http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    Ok(grpc
        .unary(tonic::Request::new(request), path, codec)
        .await?
        .into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_is_not_utf8_is_limited_like_any_other() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = rls_config(&dir, EDGE, false)?;
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    apply(&cluster, &config).await?;
    let node = start_rls_node(&cluster, "eu", &config).await?;
    let channel = Channel::from_shared(format!("http://{}", node.addr))?
        .connect()
        .await?;
    let invalid = vec![b'1', 0xff, 0xfe, b'0'];
    // 5 an hour for each address: five pass, the sixth is over.
    for i in 0..5 {
        let answer = ask_with_raw_value(channel.clone(), invalid.clone()).await?;
        ensure!(overall(&answer) == WireCode::Ok, "hit {i}: {answer:?}");
        ensure!(answer.statuses[0].current_limit.is_some(), "{answer:?}");
    }
    let over = ask_with_raw_value(channel.clone(), invalid.clone()).await?;
    ensure!(overall(&over) == WireCode::OverLimit, "{over:?}");
    // Another invalid value has a budget of its own.
    let other = ask_with_raw_value(channel.clone(), vec![b'1', 0xfe, 0xff, b'0']).await?;
    ensure!(overall(&other) == WireCode::Ok, "{other:?}");
    drop(node);
    Ok(())
}

/// `week`, `month` and `year` rules: their policies have windows of 7, 30
/// and 365 days, and the answers name the unit and a reset within it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn week_month_and_year_rules_are_answered_in_their_windows() -> Result<()> {
    let yaml = "\
domain: long
descriptors:
  - key: tenant
    value: w
    rate_limit: {unit: week, requests_per_unit: 3}
  - key: tenant
    value: m
    rate_limit: {unit: month, requests_per_unit: 3}
  - key: tenant
    value: y
    rate_limit: {unit: year, requests_per_unit: 3}
";
    let dir = tempfile::tempdir()?;
    let config = rls_config(&dir, yaml, false)?;
    let windows: Vec<u64> = config.domains[0]
        .policies()
        .iter()
        .map(|p| p.window_ms)
        .collect();
    let day = 86_400_000;
    ensure!(
        windows.contains(&(7 * day))
            && windows.contains(&(30 * day))
            && windows.contains(&(365 * day)),
        "{windows:?}"
    );
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    apply(&cluster, &config).await?;
    let node = start_rls_node(&cluster, "eu", &config).await?;
    let mut client = rls_client(&node).await?;
    for (value, unit, days) in [
        ("w", WireUnit::Week, 7),
        ("m", WireUnit::Month, 30),
        ("y", WireUnit::Year, 365),
    ] {
        for _ in 0..3 {
            let answer = ask(
                &mut client,
                request("long", vec![descriptor(&[("tenant", value)])], 1),
            )
            .await?;
            ensure!(overall(&answer) == WireCode::Ok, "{answer:?}");
            let status = &answer.statuses[0];
            ensure!(
                status.current_limit.as_ref().map(|l| l.unit) == Some(unit as i32),
                "{answer:?}"
            );
            let reset = status.duration_until_reset.context("a reset")?;
            ensure!(
                reset.seconds > 0 && reset.seconds <= days * 86_400,
                "{reset:?}"
            );
        }
        let over = ask(
            &mut client,
            request("long", vec![descriptor(&[("tenant", value)])], 1),
        )
        .await?;
        ensure!(overall(&over) == WireCode::OverLimit, "{over:?}");
    }
    drop(node);
    Ok(())
}

/// A token budget as Envoy's AI gateway spends it: a check-only call at
/// request time (the descriptor's own `hits_addend` 0) spends nothing and
/// passes while the window has tokens; the stream-end charge spends the
/// tokens used, or what is left when fewer are — recorded, never beyond
/// the limit — and the next check finds the window spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_is_checked_for_free_and_charged_at_stream_end() -> Result<()> {
    let yaml = "\
domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000}
";
    let dir = tempfile::tempdir()?;
    let config = rls_config(&dir, yaml, false)?;
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    apply(&cluster, &config).await?;
    let metrics_addr = free_addr()?;
    let listen = metrics_addr.clone();
    let node = EscrowNode::start(&cluster, "eu", move |c| {
        c.batch = 100;
        c.rls = Some(config.clone());
        c.metrics_listen = Some(listen.clone());
    })
    .await?;
    let mut client = rls_client(&node).await?;
    let with_hits = |hits: u64| {
        let mut d = descriptor(&[("tenant", "acme")]);
        d.hits_addend = Some(UInt64Value { value: hits });
        request("ai", vec![d], 0)
    };
    // Many checks spend nothing.
    for _ in 0..50 {
        let check = ask(&mut client, with_hits(0)).await?;
        ensure!(overall(&check) == WireCode::Ok, "{check:?}");
    }
    // Two responses of 400 tokens are charged whole.
    for _ in 0..2 {
        let charged = ask(&mut client, with_hits(400)).await?;
        ensure!(overall(&charged) == WireCode::Ok, "{charged:?}");
    }
    // 200 left: a check still passes, a response of 350 spends the 200.
    ensure!(overall(&ask(&mut client, with_hits(0)).await?) == WireCode::Ok);
    let over = ask(&mut client, with_hits(350)).await?;
    ensure!(overall(&over) == WireCode::OverLimit, "{over:?}");
    // The window is spent: checks are over, and so is one more token.
    let check = ask(&mut client, with_hits(0)).await?;
    ensure!(overall(&check) == WireCode::OverLimit, "{check:?}");
    ensure!(overall(&ask(&mut client, with_hits(1)).await?) == WireCode::OverLimit);
    // A refund of 300 (a response charged 400 that used 100): at most what
    // this caller was charged comes back, and checks pass again.
    let mut refund = descriptor(&[("tenant", "acme")]);
    refund.hits_addend = Some(UInt64Value { value: 300 });
    refund.is_negative_hits = true;
    let refunded = ask(&mut client, request("ai", vec![refund.clone()], 0)).await?;
    ensure!(overall(&refunded) == WireCode::Ok, "{refunded:?}");
    ensure!(overall(&ask(&mut client, with_hits(0)).await?) == WireCode::Ok);
    ensure!(overall(&ask(&mut client, with_hits(300)).await?) == WireCode::Ok);
    ensure!(overall(&ask(&mut client, with_hits(1)).await?) == WireCode::OverLimit);
    // Refunds beyond what was charged give back nothing more than that:
    // 1 300 charged in all, 300 refunded; of 10 000 more offered, the
    // 1 000 still charged are taken.
    refund.hits_addend = Some(UInt64Value { value: 10_000 });
    ask(&mut client, request("ai", vec![refund], 0)).await?;
    // The cluster's window holds at most the limit: nothing was lost to
    // the checks, nothing charged beyond it.
    let window = cluster.client()?.get_window("rls:ai/tenant/|acme").await?;
    ensure!(window.granted <= 1_000, "{window:?}");
    let (_, body) = get(&metrics_addr, "/metrics").await?;
    let series = |name: &str| sample(&body, name).unwrap_or(-1.0);
    ensure!(
        series("leasehold_escrow_rls_check_only_descriptors_total") == 53.0,
        "{body}"
    );
    // 150 of the 350 and the two single tokens found nothing left.
    ensure!(
        series("leasehold_escrow_rls_hits_unpaid_total") == 152.0,
        "{body}"
    );
    // Refunded: 300, then the 1 300 charged less the 300 already back.
    ensure!(
        series("leasehold_escrow_rls_hits_refunded_total") == 1_300.0,
        "{body}"
    );
    ensure!(
        series("leasehold_escrow_rls_refund_hits_refused_total") == 9_000.0,
        "{body}"
    );
    drop(node);
    Ok(())
}
