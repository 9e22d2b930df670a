//! `leasehold health` against a real member: the process is SERVING from
//! the start, the Coordinator service only once the cluster is initialised
//! and a leader is known; unknown services and unreachable endpoints fail.

use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};

use crate::harness::Cluster;

fn health(endpoint: &str, extra: &[&str]) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env_remove("LEASEHOLD_HEALTH_ENDPOINT")
        .env_remove("LEASEHOLD_HEALTH_SERVICE")
        .args([
            "health",
            "--insecure",
            "--timeout-ms",
            "3000",
            "-e",
            endpoint,
        ])
        .args(extra)
        .output()
        .context("run leasehold health")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn health_async(endpoint: String, extra: &'static [&'static str]) -> Result<Output> {
    tokio::task::spawn_blocking(move || health(&endpoint, extra)).await?
}

const COORDINATOR: &[&str] = &["--service", "leasehold.v1.Coordinator"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_the_coordinator_service_through_cluster_init() -> Result<()> {
    let cluster = Cluster::start(1, |_| {}).await?;
    let endpoint = cluster.addr(1);

    let process = health_async(endpoint.clone(), &["--output", "json"]).await?;
    ensure!(process.status.success(), "{}", stderr(&process));
    let answer: serde_json::Value = serde_json::from_slice(&process.stdout)?;
    ensure!(answer["status"] == "SERVING", "{answer}");

    let before_init = health_async(endpoint.clone(), COORDINATOR).await?;
    ensure!(
        !before_init.status.success() && stderr(&before_init).contains("NOT_SERVING"),
        "before init the coordinator service is not serving: {}",
        stderr(&before_init)
    );

    cluster.admin_of(1)?.init(&cluster.member_list()).await?;
    cluster.leader().await?;
    let after_init = health_async(endpoint.clone(), COORDINATOR).await?;
    ensure!(after_init.status.success(), "{}", stderr(&after_init));
    ensure!(String::from_utf8_lossy(&after_init.stdout).contains("SERVING"));

    let unknown = health_async(endpoint, &["--service", "leasehold.v1.Nothing"]).await?;
    ensure!(
        !unknown.status.success() && stderr(&unknown).contains("does not know"),
        "{}",
        stderr(&unknown)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_of_an_unreachable_endpoint_fails_within_its_deadline() -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let started = std::time::Instant::now();
    let output = health_async(format!("127.0.0.1:{port}"), &[]).await?;
    ensure!(!output.status.success());
    ensure!(
        stderr(&output).contains("health check of"),
        "{}",
        stderr(&output)
    );
    ensure!(started.elapsed() < std::time::Duration::from_secs(10));
    Ok(())
}

/// The services a port's gRPC reflection lists, sorted.
async fn reflected_services(addr: &str) -> Result<Vec<String>> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await?
        .into_inner();
    let answer = answers
        .message()
        .await?
        .context("reflection answered nothing")?;
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        anyhow::bail!("not a service list: {answer:?}");
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    Ok(names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_services_each_port_serves() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let member = reflected_services(&cluster.addr(1)).await?;
    ensure!(
        member
            == [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "leasehold.v1.Admin",
                "leasehold.v1.Coordinator",
                "leasehold.v1.Monitor",
            ],
        "a member lists its public services (Raft is for peers): {member:?}"
    );
    let escrow = crate::escrow::EscrowNode::start(&cluster, "eu", |_| {}).await?;
    let regional = reflected_services(&escrow.addr).await?;
    ensure!(
        regional
            == [
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "leasehold.v1.Escrow",
                "leasehold.v1.Monitor",
            ],
        "an escrow node lists its own: {regional:?}"
    );
    escrow.stop().await;
    cluster.stop_all().await
}
