//! The operator surface: `leasehold dev`'s cluster comes up initialised with
//! the demo policy and is reused on a second start, and the `leasehold`
//! binary's client commands work against a cluster, in text and JSON.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use leasehold_node::cli::dev::{prepare, DevArgs, DevCluster, DEMO_PREFIX};

use crate::harness::Cluster;

fn free_base_port() -> Result<u16> {
    free_port_range(3)
}

fn free_port_range(len: u16) -> Result<u16> {
    Ok(leasehold_node::loopback_ports::reserve_run(len)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_cluster_initialises_once_and_is_reused() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let args = DevArgs {
        data_dir: dir.path().to_path_buf(),
        base_port: free_base_port()?,
        nodes: 3,
        config: None,
        escrow_base_port: 0,
        ratelimit_configs: Vec::new(),
        ratelimit_response_headers: false,
    };

    let first = DevCluster::start(&args)?;
    let status = prepare(&first.admin()?, &first.members).await?;
    ensure!(status.initialized && status.current_leader.is_some());
    let eu =
        leasehold_core::principal::Principal::Region(leasehold_core::ids::RegionId::new("eu")?);
    let grant = first.client_as(&eu)?.lease("demo/api", "eu", 10).await?;
    ensure!(grant.granted == 10);
    first.stop().await;

    let second = DevCluster::start(&args)?;
    let admin = second.admin()?;
    let status = admin.status().await?;
    ensure!(
        status.initialized,
        "the second run reuses the data: {status:?}"
    );
    prepare(&admin, &second.members).await?;
    let policies = admin.list_policies().await?;
    ensure!(policies.iter().filter(|p| p.prefix == DEMO_PREFIX).count() == 1);
    let window = admin.client().get_window("demo/api").await?;
    ensure!(
        window.granted >= 10,
        "the first run's grant is still counted: {window:?}"
    );
    second.stop().await;
    Ok(())
}

fn leasehold(args: &[&str]) -> Result<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
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
async fn the_binary_drives_a_cluster() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let endpoint = format!("http://{}", cluster.addr(1));
    let e = endpoint.as_str();
    let out = tokio::task::spawn_blocking({
        let e = e.to_string();
        move || -> Result<Vec<String>> {
            let e = e.as_str();
            Ok(vec![
                leasehold(&[
                    "policy",
                    "set",
                    "-e",
                    e,
                    "--prefix",
                    "cli/",
                    "--limit",
                    "5",
                    "--window-ms",
                    "3600000",
                ])?,
                leasehold(&[
                    "lease", "-e", e, "--key", "cli/k", "--region", "eu", "--tokens", "3",
                    "--output", "json",
                ])?,
                leasehold(&[
                    "lease", "-e", e, "--key", "cli/k", "--region", "us", "--tokens", "3",
                ])?,
                leasehold(&["window", "-e", e, "--key", "cli/k", "--output", "json"])?,
                leasehold(&["policy", "list", "-e", e, "--output", "json"])?,
                leasehold(&["cluster", "status", "-e", e, "--output", "json"])?,
            ])
        }
    })
    .await??;
    let first: serde_json::Value = serde_json::from_str(&out[1])?;
    ensure!(first["granted"] == 3, "{first}");
    ensure!(
        out[2].contains("granted 2 of 3"),
        "a partial grant reads as such: {}",
        out[2]
    );
    let window: serde_json::Value = serde_json::from_str(&out[3])?;
    ensure!(
        window["granted"] == 5 && window["regions"].as_array().map(Vec::len) == Some(2),
        "{window}"
    );
    let policies: serde_json::Value = serde_json::from_str(&out[4])?;
    ensure!(policies["policies"][0]["prefix"] == "cli/");
    let status: serde_json::Value = serde_json::from_str(&out[5])?;
    ensure!(
        status["state"] == "Leader" && status["counters"]["leases"] == 2,
        "{status}"
    );

    let failed = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args([
            "lease", "-e", e, "--key", "none/k", "--region", "eu", "--tokens", "1",
        ])
        .output()?;
    ensure!(!failed.status.success());
    ensure!(String::from_utf8_lossy(&failed.stderr).contains("no policy"));

    // A lone member has no one to hand leadership to: refused at once.
    let lone = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args(["cluster", "step-down", "-e", e, "--leader", "1"])
        .output()?;
    ensure!(!lone.status.success());
    ensure!(
        String::from_utf8_lossy(&lone.stderr).contains("no other voter"),
        "{}",
        String::from_utf8_lossy(&lone.stderr)
    );
    ensure!(cluster.leader().await? == 1);
    cluster.stop_all().await
}

#[test]
fn demo_reports_utilisation_static_partition_and_fairness() -> Result<()> {
    let members = free_base_port()?;
    // Two sets of three escrow nodes (fixed batch and EOQ).
    let escrow = free_port_range(6)?;
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args([
            "demo",
            "--windows",
            "1",
            "--window-ms",
            "1500",
            "--limit",
            "300",
        ])
        .args([
            "--base-port",
            &members.to_string(),
            "--escrow-base-port",
            &escrow.to_string(),
        ])
        .env("RUST_LOG", "error")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        "counter key, escrow batch 16",
        "escrow EOQ sizer",
        "per 1000",
        "fair key demo-fair/chat",
        "max dev",
    ] {
        ensure!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    // Every reported window admitted at most L.
    for line in stdout.lines() {
        if let Some(cell) = line.split_whitespace().nth(1) {
            if let Some((admitted, limit)) = cell.split_once('/') {
                if let (Ok(a), Ok(l)) = (admitted.parse::<u64>(), limit.parse::<u64>()) {
                    if l == 300 {
                        ensure!(a <= l, "window over the limit: {line}");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Runs the binary and returns (exit code, stdout, stderr).
fn leasehold_status(args: Vec<String>) -> Result<(i32, String, String)> {
    let output = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args(&args)
        .output()
        .context("run leasehold")?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_that_change_nothing_fail_and_say_why_in_text_and_json() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let e = cluster.addr(1);
    let runs = tokio::task::spawn_blocking({
        let e = e.clone();
        move || -> Result<Vec<(i32, String, String)>> {
            let e = e.as_str();
            let same_member = format!("1={e}");
            [
                argv(&["policy", "delete", "-e", e, "--prefix", "missing/"]),
                argv(&[
                    "policy",
                    "delete",
                    "-e",
                    e,
                    "--prefix",
                    "missing/",
                    "--if-exists",
                ]),
                argv(&[
                    "policy", "delete", "-e", e, "--prefix", "missing/", "--output", "json",
                ]),
                argv(&["cluster", "init", "-e", e, "--member", &same_member]),
                argv(&[
                    "cluster",
                    "init",
                    "-e",
                    e,
                    "--member",
                    &same_member,
                    "--member",
                    "2=127.0.0.1:1",
                ]),
                argv(&[
                    "cluster",
                    "init",
                    "-e",
                    e,
                    "--member",
                    &same_member,
                    "--member",
                    "2=127.0.0.1:1",
                    "--output",
                    "json",
                ]),
            ]
            .into_iter()
            .map(leasehold_status)
            .collect()
        }
    })
    .await??;

    let (code, _, stderr) = &runs[0];
    ensure!(
        *code == 1,
        "delete of a missing prefix exits 1, got {code}: {stderr}"
    );
    ensure!(stderr.contains("no policy has the prefix"), "{stderr}");
    let (code, _, stderr) = &runs[1];
    ensure!(*code == 0, "--if-exists makes it a success: {stderr}");
    let (code, stdout, _) = &runs[2];
    let json: serde_json::Value = serde_json::from_str(stdout.trim())
        .with_context(|| format!("JSON error on stdout: {stdout:?}"))?;
    ensure!(*code == 1 && json["error"]["code"] == "not_found", "{json}");
    let (code, stdout, stderr) = &runs[3];
    ensure!(
        *code == 0,
        "init with the same members is idempotent: {stdout}{stderr}"
    );
    let (code, _, stderr) = &runs[4];
    ensure!(
        *code == 1,
        "init with other members exits 1, got {code}: {stderr}"
    );
    ensure!(
        stderr.contains("already initialised with members"),
        "{stderr}"
    );
    let (code, stdout, _) = &runs[5];
    let json: serde_json::Value = serde_json::from_str(stdout.trim())?;
    ensure!(*code == 1 && json["error"]["code"] == "conflict", "{json}");
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coordinator_command_sent_to_another_service_says_so() -> Result<()> {
    // A gRPC server that serves only health, as an escrow node's port would
    // answer a Coordinator call.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let (code, stdout, stderr) = tokio::task::spawn_blocking(move || {
        leasehold_status(argv(&["window", "-e", &addr, "--key", "k"]))
    })
    .await??;
    server.abort();
    ensure!(
        code == 2,
        "wrong service is a usage error, got {code}: {stdout}{stderr}"
    );
    ensure!(stderr.contains("not a coordinator member"), "{stderr}");
    ensure!(stderr.contains("hint:"), "{stderr}");
    Ok(())
}

/// `pool-grant` calls in one window of a `fair` key of L = 1 000: r2
/// asks twice with weight 2, r1 once with weight 1. Returns (r1's grant,
/// whether all three calls fell in one window). `nodes` are the `--node`
/// each r2 call names (`None`: the default, `cli@<host>`).
fn r1_grant_after_r2_asked_twice(
    e: &str,
    key: &str,
    nodes: [Option<&str>; 2],
) -> Result<(u64, bool)> {
    let grant =
        |region: &str, weight: &str, want: &str, node: Option<&str>| -> Result<serde_json::Value> {
            let mut args = vec![
                "pool-grant",
                "-e",
                e,
                "--key",
                key,
                "--region",
                region,
                "--weight",
                weight,
                "--want",
                want,
                "--output",
                "json",
            ];
            if let Some(node) = node {
                args.extend(["--node", node]);
            }
            Ok(serde_json::from_str(&leasehold(&args)?)?)
        };
    let first = grant("r2", "2", "327", nodes[0])?;
    let second = grant("r2", "2", "359", nodes[1])?;
    let r1 = grant("r1", "1", "252", None)?;
    let one_window = first["window_start_ms"] == second["window_start_ms"]
        && second["window_start_ms"] == r1["window_start_ms"];
    Ok((r1["granted_total"].as_u64().unwrap_or(0), one_window))
}

/// Sleeps, when needed, until at least 20 s are left of the current
/// minute: the calls that follow then fall in one window, before its last
/// eighth, where the pool lapses every reserve (ADR 0018) and a region
/// may take what its weight would leave to the others.
fn well_before_a_minutes_last_eighth() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let into = now % 60_000;
    if into > 40_000 {
        std::thread::sleep(std::time::Duration::from_millis(60_000 - into + 200));
    }
}

/// A second `pool-grant` by the same caller replaces its declared weight
/// instead of adding to it: r2 weighs 2, not 4, so r1 (weight 1) gets the
/// 252 it asks for under its fair ceiling of 1 000 − ⅔ · 1 000; two
/// different nodes of r2 do weigh 2 + 2, and r1's ceiling is then 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_asking_again_weighs_what_it_declares_not_the_sum_of_its_calls() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let endpoint = format!("http://{}", cluster.addr(1));
    tokio::task::spawn_blocking(move || -> Result<()> {
        let e = endpoint.as_str();
        leasehold(&[
            "policy",
            "set",
            "-e",
            e,
            "--prefix",
            "pool:",
            "--limit",
            "1000",
            "--window-ms",
            "60000",
            "--kind",
            "fair",
        ])?;
        well_before_a_minutes_last_eighth();
        let (granted, one_window) = r1_grant_after_r2_asked_twice(e, "pool:same", [None, None])?;
        ensure!(one_window, "the three calls fell in one window");
        ensure!(
            granted == 252,
            "one node asking twice weighs 2: r1 got {granted}"
        );
        well_before_a_minutes_last_eighth();
        let nodes = [Some("r2-a"), Some("r2-b")];
        let (granted, one_window) = r1_grant_after_r2_asked_twice(e, "pool:two", nodes)?;
        ensure!(one_window, "the three calls fell in one window");
        ensure!(
            granted == 200,
            "two nodes of weight 2 weigh 4: r1 got {granted}"
        );
        Ok(())
    })
    .await??;
    cluster.stop_all().await
}
