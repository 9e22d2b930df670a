//! `/metrics` of a member and of an escrow node, scraped over HTTP: the
//! numbers move with the traffic, and series are per policy prefix, so many
//! keys add none.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use leasehold_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::escrow::EscrowNode;
use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

pub(crate) fn free_addr() -> Result<String> {
    let port = leasehold_node::loopback_ports::reserve()?;
    Ok(format!("127.0.0.1:{port}"))
}

/// GET `path` on `addr`; (status line, body).
pub(crate) async fn get(addr: &str, path: &str) -> Result<(String, String)> {
    let mut last_error = None;
    for _ in 0..50 {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(mut stream) => {
                stream
                    .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
                    .await?;
                let mut response = String::new();
                stream.read_to_string(&mut response).await?;
                let (head, body) = response.split_once("\r\n\r\n").context("response head")?;
                let status = head.lines().next().unwrap_or_default().to_string();
                return Ok((status, body.to_string()));
            }
            Err(e) => last_error = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last_error.context("no attempt")?.into())
}

/// The value of the sample line starting with `series ` in `text`.
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.parse().ok())
}

fn series_count(text: &str) -> usize {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_exports_grants_per_prefix_and_many_keys_add_no_series() -> Result<()> {
    let metrics_addr = free_addr()?;
    let listen = metrics_addr.clone();
    let mut cluster =
        Cluster::start_initialised(1, move |c| c.metrics_listen = Some(listen.clone())).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("m/", 1_000_000, LONG_WINDOW_MS))
        .await?;
    client.lease("m/first", "eu", 3).await?;

    let (status, before) = get(&metrics_addr, "/metrics").await?;
    ensure!(status.contains("200"), "{status}");
    ensure!(
        sample(&before, "leasehold_coordinator_leases_total") == Some(1.0),
        "{before}"
    );
    ensure!(sample(&before, "leasehold_raft_is_leader") == Some(1.0));
    ensure!(sample(&before, "leasehold_policy_limit{prefix=\"m/\"}") == Some(1_000_000.0));
    ensure!(
        sample(
            &before,
            "leasehold_policy_window_granted_tokens{prefix=\"m/\"}"
        ) == Some(3.0)
    );

    for i in 0..200 {
        client.lease(&format!("m/key-{i}"), "eu", 2).await?;
    }
    let (_, after) = get(&metrics_addr, "/metrics").await?;
    ensure!(sample(&after, "leasehold_coordinator_leases_total") == Some(201.0));
    ensure!(
        sample(
            &after,
            "leasehold_policy_window_granted_tokens{prefix=\"m/\"}"
        ) == Some(403.0)
    );
    ensure!(sample(&after, "leasehold_policy_live_windows{prefix=\"m/\"}") == Some(201.0));
    // Latency and batch histograms: every committed proposal and every log
    // flush is counted, and +Inf holds them all.
    let commits = sample(&after, "leasehold_raft_commit_seconds_count").unwrap_or(0.0);
    ensure!(
        commits >= 1.0
            && sample(&after, "leasehold_raft_commit_seconds_bucket{le=\"+Inf\"}") == Some(commits),
        "{commits} commits"
    );
    let batched = sample(&after, "leasehold_raft_proposal_batch_size_sum").unwrap_or(0.0);
    ensure!(
        batched >= 201.0,
        "every lease went through a proposal: {batched}"
    );
    ensure!(sample(&after, "leasehold_raft_log_fsync_seconds_count").unwrap_or(0.0) >= commits);
    ensure!(sample(&after, "leasehold_raft_snapshot_bytes").is_some());
    ensure!(sample(&after, "leasehold_raft_snapshot_age_seconds").is_some_and(|age| age >= 0.0));
    ensure!(
        series_count(&after) == series_count(&before),
        "200 more keys changed the number of series: {} → {}",
        series_count(&before),
        series_count(&after)
    );
    let (status, _) = get(&metrics_addr, "/other").await?;
    ensure!(status.contains("404"), "{status}");
    cluster.stop_all().await
}

/// A one-member cluster with a policy of 1 000 per window on `prefix`, and
/// an escrow node of region eu serving `/metrics` at the returned address.
async fn escrow_with_metrics(prefix: &str) -> Result<(Cluster, EscrowNode, String)> {
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy(prefix, 1_000, LONG_WINDOW_MS))
        .await?;
    let metrics_addr = free_addr()?;
    let listen = metrics_addr.clone();
    let node = EscrowNode::start(&cluster, "eu", move |c| {
        c.metrics_listen = Some(listen.clone());
    })
    .await?;
    Ok((cluster, node, metrics_addr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escrow_node_exports_coordinator_calls_and_tokens_served() -> Result<()> {
    let (mut cluster, node, metrics_addr) = escrow_with_metrics("e/").await?;
    let mut rpc = node.rpc().await?;
    for _ in 0..5 {
        rpc.acquire(pb::AcquireRequest {
            key: "e/k".into(),
            tenant: String::new(),
            weight: 1,
            tokens: 2,
            request_id: None,
        })
        .await?;
    }
    let (_, text) = get(&metrics_addr, "/metrics").await?;
    ensure!(
        sample(&text, "leasehold_escrow_info{region=\"eu\"}") == Some(1.0),
        "{text}"
    );
    ensure!(sample(&text, "leasehold_escrow_coordinator_reachable") == Some(1.0));
    ensure!(sample(&text, "leasehold_escrow_tokens_served_total") == Some(10.0));
    let calls = sample(&text, "leasehold_escrow_coordinator_calls_total").unwrap_or(0.0);
    ensure!(
        (1.0..5.0).contains(&calls),
        "refills are batched: {calls} calls for 5 acquires"
    );
    let round_trips =
        sample(&text, "leasehold_escrow_lease_round_trip_seconds_count").unwrap_or(0.0);
    ensure!(
        round_trips >= 1.0 && round_trips <= calls,
        "a round trip per answered lease: {round_trips} of {calls} calls"
    );
    // Use the window up until an acquire is denied: counted by reason.
    let mut denials = 0;
    for _ in 0..50 {
        let answer = rpc
            .acquire(pb::AcquireRequest {
                key: "e/k".into(),
                tenant: String::new(),
                weight: 1,
                tokens: 100,
                request_id: None,
            })
            .await?
            .into_inner();
        if answer.granted == 0 {
            denials += 1;
            break;
        }
    }
    ensure!(denials == 1, "the window of 1 000 ran out");
    let (_, text) = get(&metrics_addr, "/metrics").await?;
    ensure!(
        sample(
            &text,
            "leasehold_escrow_denials_total{reason=\"WINDOW_EXHAUSTED\"}"
        ) == Some(1.0),
        "{text}"
    );
    ensure!(
        sample(
            &text,
            "leasehold_escrow_denials_total{reason=\"COORDINATOR_UNREACHABLE\"}"
        ) == Some(0.0)
    );
    node.stop().await;
    cluster.stop_all().await
}

/// Every `leasehold_*` metric the Grafana dashboard queries, with the tier
/// that exports it (`leasehold_escrow_*` or the member's).
fn dashboard_metrics() -> Result<Vec<String>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana/leasehold-dashboard.json"
    );
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    let mut names = Vec::new();
    for panel in dashboard["panels"].as_array().context("panels")? {
        for target in panel["targets"].as_array().context("targets")? {
            let expr = target["expr"].as_str().context("expr")?;
            let mut rest = expr;
            while let Some(start) = rest.find("leasehold_") {
                let tail = &rest[start..];
                let end = tail
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(tail.len());
                names.push(tail[..end].to_string());
                rest = &tail[end..];
            }
        }
    }
    names.sort();
    names.dedup();
    ensure!(
        names.len() > 10,
        "the dashboard queries leasehold metrics: {names:?}"
    );
    Ok(names)
}

/// Whether `text` has a `# TYPE` line for `name`, or `name` is a series
/// (`_bucket`, `_sum`, `_count`) of a histogram it exports.
fn exports(text: &str, name: &str) -> bool {
    let typed = |family: &str, kind: Option<&str>| {
        text.lines().any(|line| {
            let mut words = line.strip_prefix("# TYPE ").unwrap_or("").split(' ');
            words.next() == Some(family) && kind.is_none_or(|kind| words.next() == Some(kind))
        })
    };
    typed(name, None)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|family| typed(family, Some("histogram")))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported() -> Result<()> {
    let member_metrics = free_addr()?;
    let listen = member_metrics.clone();
    let mut cluster =
        Cluster::start_initialised(1, move |c| c.metrics_listen = Some(listen.clone())).await?;
    let escrow_metrics = free_addr()?;
    let listen = escrow_metrics.clone();
    let node = EscrowNode::start(&cluster, "eu", move |c| {
        c.metrics_listen = Some(listen.clone());
    })
    .await?;
    let (_, member) = get(&member_metrics, "/metrics").await?;
    let (_, escrow) = get(&escrow_metrics, "/metrics").await?;
    for name in dashboard_metrics()? {
        let text = if name.starts_with("leasehold_escrow_") {
            &escrow
        } else {
            &member
        };
        ensure!(
            exports(text, &name),
            "the dashboard queries {name}, which is not exported"
        );
    }
    node.stop().await;
    cluster.stop_all().await
}

/// Refills of many keys needed at once leave as few `LeaseBatch` calls:
/// every refill is an item of some call, and there are fewer calls than
/// refills; every key is still served as if alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refills_of_many_keys_at_once_are_coalesced_into_batches() -> Result<()> {
    let (mut cluster, node, metrics_addr) = escrow_with_metrics("co/").await?;
    let rpc = node.rpc().await?;
    let acquires = (0..200).map(|n| {
        let mut rpc = rpc.clone();
        tokio::spawn(async move {
            rpc.acquire(pb::AcquireRequest {
                key: format!("co/key-{n}"),
                tenant: String::new(),
                weight: 1,
                tokens: 3,
                request_id: None,
            })
            .await
            .map(|answer| answer.into_inner().granted)
        })
    });
    for answer in futures::future::join_all(acquires).await {
        ensure!(answer?? == 3, "every key is served");
    }
    let (_, text) = get(&metrics_addr, "/metrics").await?;
    let refills = sample(&text, "leasehold_escrow_lease_call_items_sum").unwrap_or(0.0);
    let calls = sample(&text, "leasehold_escrow_lease_calls_total").unwrap_or(0.0);
    ensure!(refills >= 200.0, "one refill per key at least: {refills}");
    ensure!(
        calls < refills,
        "{refills} refills went out in {calls} calls"
    );
    node.stop().await;
    cluster.stop_all().await
}

/// A member hosting shard 0 and a shard split from it exports the
/// placement version and, per shard, its leadership, slots and windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_exports_each_shard_it_hosts() -> Result<()> {
    use leasehold_core::shard::{slot_of, SLOTS};

    let metrics_addr = free_addr()?;
    let listen = metrics_addr.clone();
    let mut cluster =
        Cluster::start_initialised(1, move |c| c.metrics_listen = Some(listen.clone())).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("m/", 100, LONG_WINDOW_MS))
        .await?;
    let (status, before) = get(&metrics_addr, "/metrics").await?;
    ensure!(status.contains("200"), "{status}");
    ensure!(
        sample(&before, "leasehold_placement_version") == Some(0.0),
        "{before}"
    );
    ensure!(sample(&before, "leasehold_shard_owned_slots{shard=\"0\"}") == Some(16_384.0));
    client
        .admin()
        .change_placement(pb::ChangePlacementRequest {
            expected_version: 0,
            change: Some(pb::change_placement_request::Change::Split(
                pb::SplitShard {
                    shard: 0,
                    into: 1,
                    replicas: vec![1],
                },
            )),
        })
        .await?;
    let high = (0..)
        .map(|i| format!("m/{i}"))
        .find(|k| slot_of(k) >= SLOTS / 2)
        .context("a key")?;
    client.lease(&high, "eu", 3).await?;
    let (_, after) = get(&metrics_addr, "/metrics").await?;
    for (series, value) in [
        ("leasehold_placement_version", 1.0),
        ("leasehold_shard_owned_slots{shard=\"0\"}", 8_192.0),
        ("leasehold_shard_owned_slots{shard=\"1\"}", 8_192.0),
        ("leasehold_shard_is_leader{shard=\"1\"}", 1.0),
        ("leasehold_shard_live_windows{shard=\"1\"}", 1.0),
    ] {
        ensure!(sample(&after, series) == Some(value), "{series}: {after}");
    }
    cluster.stop_all().await
}
