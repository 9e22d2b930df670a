//! The Monitor service and `leasehold watch` against real members: a
//! stream sees grants appear (from a follower's applied state), a prefix
//! watch lists its keys, idle keys still get one update per window (for
//! longer than the request timeout), the
//! stream limit per caller holds and comes back, shutdown ends streams,
//! and the CLI prints a table (and JSON lines) with the numbers.
//! Authorization is in `tls::only_operators_and_members_may_watch`.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use leasehold_proto::refusal::{reason_of, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::monitor_client::MonitorClient;
use leasehold_proto::v1::watch_request::Target;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

async fn monitor(cluster: &Cluster, id: u64) -> Result<MonitorClient<Channel>> {
    Ok(MonitorClient::connect(format!("http://{}", cluster.addr(id))).await?)
}

async fn watch(
    cluster: &Cluster,
    id: u64,
    target: Target,
) -> Result<Streaming<pb::WatchUpdate>, tonic::Status> {
    let mut client = monitor(cluster, id)
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    Ok(client
        .watch(pb::WatchRequest {
            target: Some(target),
        })
        .await?
        .into_inner())
}

/// The next update, within a few seconds.
async fn next(stream: &mut Streaming<pb::WatchUpdate>) -> Result<pb::WatchUpdate> {
    tokio::time::timeout(Duration::from_secs(8), stream.message())
        .await
        .context("no update in time")??
        .context("the stream ended")
}

/// A member that is not the leader.
async fn follower(cluster: &Cluster) -> Result<u64> {
    let leader = cluster.leader().await?;
    Ok(if leader == 1 { 2 } else { 1 })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_from_a_follower_sees_grants_appear() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("w/", 1_000, LONG_WINDOW_MS))
        .await?;
    let leader = cluster.leader().await?;
    let member = follower(&cluster).await?;
    let mut stream = watch(&cluster, member, Target::Key("w/k".into())).await?;
    let first = next(&mut stream).await?;
    ensure!(first.sequence == 1 && first.windows.len() == 1);
    ensure!(first.windows[0].granted == 0 && first.windows[0].limit == 1_000);
    ensure!(first.served_by == member && !first.is_leader && first.leader_id == leader);

    client.lease("w/k", "eu", 7).await?;
    client.lease("w/k", "us", 5).await?;
    let mut seen = first.clone();
    while seen.windows[0].granted < 12 {
        seen = next(&mut stream).await?;
    }
    let window = &seen.windows[0];
    ensure!(window.granted == 12, "{window:?}");
    let regions: Vec<(&str, u64)> = window
        .regions
        .iter()
        .map(|r| (r.region.as_str(), r.granted))
        .collect();
    ensure!(regions == [("eu", 7), ("us", 5)], "{regions:?}");
    ensure!(seen.applied_index >= first.applied_index);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_watch_lists_its_live_keys_and_an_idle_key_updates_every_window() -> Result<()> {
    const WINDOW_MS: u64 = 600;
    // The request timeout bounds a call until its answer starts; a watch
    // stream outlives it (4 windows of 600 ms > 1.5 s below).
    let cluster = Cluster::start_initialised(1, |c| {
        c.admin_timeout_ms = 1_500;
        c.install_snapshot_timeout_ms = 1_500;
        c.request_timeout_ms = 1_500;
    })
    .await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("p/", 100, LONG_WINDOW_MS))
        .await?;
    client
        .admin()
        .set_policy(counter_policy("q/", 100, WINDOW_MS))
        .await?;
    for (key, tokens) in [("p/a", 3), ("p/b", 4), ("q/c", 5)] {
        client.lease(key, "eu", tokens).await?;
    }
    let mut prefix = watch(&cluster, 1, Target::Prefix("p/".into())).await?;
    let update = next(&mut prefix).await?;
    let keys: Vec<(&str, u64)> = update
        .windows
        .iter()
        .map(|w| (w.key.as_str(), w.granted))
        .collect();
    ensure!(keys == [("p/a", 3), ("p/b", 4)], "{keys:?}");
    ensure!(update.matching_keys == 2 && !update.truncated);

    // Nothing happens to q/idle, yet each new window is an update.
    let mut idle = watch(&cluster, 1, Target::Key("q/idle".into())).await?;
    let mut starts = Vec::new();
    while starts.len() < 4 {
        let update = next(&mut idle).await?;
        let start = update.windows[0].window_start_ms;
        if starts.last() != Some(&start) {
            starts.push(start);
        }
    }
    ensure!(
        starts.windows(2).all(|w| w[1] > w[0]),
        "one update per window at least: {starts:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_caller_are_limited_and_come_back_when_closed() -> Result<()> {
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let mut open = Vec::new();
    for i in 0..leasehold_node::monitor::MAX_STREAMS_PER_CALLER {
        let mut stream = watch(&cluster, 1, Target::Key(format!("k{i}")))
            .await
            .map_err(|s| anyhow::anyhow!("stream {i}: {s}"))?;
        let first = next(&mut stream).await?;
        ensure!(
            first.windows[0].policy.is_none(),
            "a key without policy is shown without one"
        );
        open.push(stream);
    }
    let refused = watch(&cluster, 1, Target::Key("one-too-many".into()))
        .await
        .err()
        .context("a fifth stream of the same caller was served")?;
    ensure!(refused.code() == Code::ResourceExhausted, "{refused:?}");
    ensure!(
        reason_of(&refused) == Some(Reason::WatchStreamsExhausted),
        "{refused:?}"
    );
    let bad = watch(&cluster, 1, Target::Prefix("p".repeat(300)))
        .await
        .err()
        .context("an over-long prefix was served")?;
    ensure!(bad.code() == Code::InvalidArgument);

    drop(open.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match watch(&cluster, 1, Target::Key("again".into())).await {
            Ok(mut stream) => {
                next(&mut stream).await?;
                break;
            }
            Err(status) if status.code() == Code::ResourceExhausted => {
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "a closed stream's slot never came back"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => anyhow::bail!("unexpected refusal: {status}"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_a_member_ends_its_watch_streams() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let mut stream = watch(&cluster, 1, Target::Key("k".into())).await?;
    next(&mut stream).await?;
    tokio::time::timeout(Duration::from_secs(10), cluster.stop(1))
        .await
        .context("a watch stream held the member's shutdown open")??;
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .context("the stream did not end")?;
    ensure!(
        matches!(&end, Ok(None)) || matches!(&end, Err(s) if s.code() == Code::Unavailable),
        "{end:?}"
    );
    Ok(())
}

fn leasehold(args: &[&str]) -> Result<String> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args(args)
        .output()
        .context("run leasehold")?;
    ensure!(
        output.status.success(),
        "leasehold {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_a_table_and_json_lines_with_the_numbers() -> Result<()> {
    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let client = cluster.client()?;
    let mut policy = counter_policy("cli/", 40, LONG_WINDOW_MS);
    policy.shadow = true;
    client.admin().set_policy(policy).await?;
    client.lease("cli/k", "eu", 30).await?;
    client.lease("cli/k", "us", 25).await?;
    let addr = cluster.addr(1);

    let table = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            leasehold(&[
                "watch",
                "--key",
                "cli/k",
                "--once",
                "-e",
                "127.0.0.1:1",
                "-e",
                &addr,
            ])
        }
    })
    .await??;
    let row = table
        .lines()
        .find(|line| line.starts_with("cli/k"))
        .with_context(|| format!("no row for the key in {table}"))?;
    for cell in ["40", "55", "137.5%", "15 (1 req)"] {
        ensure!(row.contains(cell), "{cell} missing from {row:?}\n{table}");
    }
    ensure!(
        table.contains("KEY") && table.contains("WOULD-DENY"),
        "{table}"
    );
    ensure!(
        table
            .lines()
            .any(|l| l.trim_start().starts_with("us") && l.contains("25")),
        "{table}"
    );
    ensure!(!table.contains('\x1b'), "no screen clearing into a pipe");

    let json = tokio::task::spawn_blocking(move || {
        leasehold(&[
            "watch",
            "--prefix",
            "cli/",
            "--updates",
            "1",
            "--output",
            "json",
            "-e",
            &addr,
        ])
    })
    .await??;
    let lines: Vec<&str> = json.lines().collect();
    ensure!(lines.len() == 1, "one JSON line per update: {json}");
    let update: serde_json::Value = serde_json::from_str(lines[0])?;
    ensure!(update["windows"][0]["key"] == "cli/k");
    ensure!(update["windows"][0]["granted"] == 55);
    ensure!(update["windows"][0]["would_deny_tokens"] == 15);
    ensure!(update["served_by"] == 1 && update["is_leader"] == true);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escrow_node_shows_its_regions_grants_and_each_tenants_use() -> Result<()> {
    use crate::escrow::EscrowNode;

    let cluster = Cluster::start_initialised(1, |_| {}).await?;
    let admin = cluster.client()?.admin();
    let mut fair = counter_policy("f/", 100, LONG_WINDOW_MS);
    fair.kind = pb::PolicyKind::Fair as i32;
    admin.set_policy(fair).await?;
    admin
        .set_policy(counter_policy("c/", 100, LONG_WINDOW_MS))
        .await?;
    let node = EscrowNode::start(&cluster, "eu", |c| c.batch = 8).await?;
    let mut rpc = node.rpc().await?;
    let acquire = |key: &str, tenant: &str, weight: u64, tokens: u64| pb::AcquireRequest {
        key: key.into(),
        tenant: tenant.into(),
        weight,
        tokens,
        request_id: None,
    };
    for _ in 0..3 {
        rpc.acquire(acquire("f/k", "gold", 3, 10)).await?;
    }
    rpc.acquire(acquire("f/k", "free", 1, 10)).await?;
    ensure!(
        rpc.acquire(acquire("c/x", "", 1, 5))
            .await?
            .into_inner()
            .granted
            == 5
    );

    let mut client = MonitorClient::connect(format!("http://{}", node.addr)).await?;
    let mut stream = client
        .watch(pb::WatchRequest {
            target: Some(Target::Prefix(String::new())),
        })
        .await?
        .into_inner();
    let update = next(&mut stream).await?;
    ensure!(update.region == "eu" && update.served_by == 0, "{update:?}");
    let keys: Vec<&str> = update.windows.iter().map(|w| w.key.as_str()).collect();
    ensure!(keys == ["c/x", "f/k"], "{keys:?}");
    let counter = &update.windows[0];
    ensure!(
        counter.granted == 8 && counter.limit == 100,
        "one lease of 8: {counter:?}"
    );
    let fair = &update.windows[1];
    ensure!(
        fair.granted >= 40,
        "the pool grant covers what was admitted: {fair:?}"
    );
    ensure!(fair.regions[0].region == "eu" && fair.regions[0].pool_weight == 4);
    let tenants = update
        .tenants
        .iter()
        .find(|t| t.key == "f/k")
        .context("the fair key's tenants")?;
    let listed: Vec<(&str, u64, u64)> = tenants
        .tenants
        .iter()
        .map(|t| (t.tenant.as_str(), t.weight, t.admitted))
        .collect();
    ensure!(listed == [("free", 1, 10), ("gold", 3, 30)], "{listed:?}");
    ensure!(tenants.tenant_count == 2);
    drop(stream);
    node.stop().await;
    Ok(())
}
