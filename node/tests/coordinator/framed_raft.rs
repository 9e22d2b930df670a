//! The members' framed Raft transport from outside: hostile bytes after the
//! preface, unknown kinds, undecodable bodies and oversized lengths end in
//! a refusal frame or a closed connection — never a panic, never a moved
//! term — and the member keeps granting; a listener that speaks only gRPC
//! is told apart at the preface, and members whose dialer makes no byte
//! streams replicate over the gRPC `Raft` service, as a mixed-release
//! cluster does. (Forged senders over frames are in `tls`.)

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use std::sync::Arc;

use leasehold_client::transport::{DialFuture, Dialer, TcpDialer};
use leasehold_node::coordinator::frame_link::{FrameLink, LinkError};
use leasehold_node::coordinator::peer_frames::{
    read_frame, write_frame, FrameKind, HEADER_BYTES, PREFACE,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

const LIMIT: usize = 1 << 20;

/// A raw connection to `addr` past the preface.
async fn framed(addr: &str) -> Result<TcpStream> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(&PREFACE).await?;
    let mut echo = [0u8; 8];
    stream.read_exact(&mut echo).await?;
    ensure!(echo == PREFACE, "the member answered {echo:?}");
    Ok(stream)
}

/// Whether the member closes `stream` within a few seconds.
async fn closes(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await,
        Ok(Ok(_) | Err(_))
    )
}

async fn terms(cluster: &Cluster) -> Result<Vec<u64>> {
    let mut terms = Vec::new();
    for id in 1..=3 {
        terms.push(cluster.status(id).await?.current_term);
    }
    Ok(terms)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_are_refused_or_end_the_connection_and_the_member_keeps_granting() -> Result<()>
{
    let cluster = Cluster::start_initialised(3, |config| config.insecure = true).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("framed/", 1_000, LONG_WINDOW_MS))
        .await?;
    let terms_before = terms(&cluster).await?;
    let addr = cluster.addr(1);

    // An unknown kind and an undecodable body: refusals, and the same
    // connection answers the next frame.
    let mut stream = framed(&addr).await?;
    write_frame(&mut stream, 7, FrameKind::Refusal, b"not a request", LIMIT).await?;
    let refusal = read_frame(&mut stream, LIMIT).await?;
    ensure!(refusal.call == 7 && refusal.kind == FrameKind::Refusal.byte());
    write_frame(&mut stream, 8, FrameKind::Vote, &[0xff; 40], LIMIT).await?;
    let refusal = read_frame(&mut stream, LIMIT).await?;
    ensure!(refusal.call == 8 && refusal.kind == FrameKind::Refusal.byte());
    let reason = String::from_utf8(refusal.body)?;
    ensure!(reason.starts_with("InvalidArgument"), "{reason}");
    let mut raw = [0u8; HEADER_BYTES];
    raw[..4].copy_from_slice(&9u32.to_be_bytes());
    raw[4..12].copy_from_slice(&9u64.to_be_bytes());
    raw[12] = 0x42;
    stream.write_all(&raw).await?;
    let refusal = read_frame(&mut stream, LIMIT).await?;
    ensure!(refusal.call == 9 && refusal.kind == FrameKind::Refusal.byte());

    // A length past the peer message limit, and one below the header: the
    // member closes the connection.
    for length in [u32::MAX, 3] {
        let mut stream = framed(&addr).await?;
        stream.write_all(&length.to_be_bytes()).await?;
        stream.write_all(&[0u8; 16]).await?;
        ensure!(closes(&mut stream).await, "length {length} left open");
    }

    // Random bytes after the preface.
    let mut runner = TestRunner::new(Config {
        cases: 24,
        ..Config::default()
    });
    let bytes = proptest::collection::vec(any::<u8>(), 0..200);
    for _ in 0..24 {
        let garbage = bytes
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .current();
        let mut stream = framed(&addr).await?;
        stream.write_all(&garbage).await?;
        drop(stream);
    }

    ensure!(
        terms(&cluster).await? == terms_before,
        "terms moved: {terms_before:?}"
    );
    ensure!(
        client.lease("framed/k", "eu", 5).await?.granted == 5,
        "the cluster keeps granting"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_that_speaks_only_grpc_is_told_apart_at_the_preface() -> Result<()> {
    // A gRPC server without frames: the health service alone.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let link = FrameLink::connect(&TcpDialer::default(), &addr, Duration::from_secs(5), LIMIT)
        .await
        .err()
        .context("a gRPC-only listener accepted frames")?;
    ensure!(matches!(link, LinkError::NotSpoken), "{link:?}");
    server.abort();
    Ok(())
}

/// Makes gRPC channels only (`dial_stream` left to its `Unsupported`
/// default): the members call each other over the gRPC `Raft` service.
struct ChannelsOnly(TcpDialer);

impl Dialer for ChannelsOnly {
    fn dial(&self, addr: &str) -> DialFuture {
        self.0.dial(addr)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_without_byte_streams_replicate_over_grpc_and_survive_a_leader_loss() -> Result<()>
{
    let mut cluster = Cluster::start_with_dialer(
        3,
        |config| config.insecure = true,
        Arc::new(ChannelsOnly(TcpDialer::default())),
    )
    .await?;
    cluster.admin_of(1)?.init(&cluster.member_list()).await?;
    let leader = cluster.leader().await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("grpc/", 1_000, LONG_WINDOW_MS))
        .await?;
    for _ in 0..20 {
        ensure!(client.lease("grpc/k", "eu", 1).await?.granted == 1);
    }
    // Every member applied the leases: they reached the followers.
    let applied = cluster.status(leader).await?.last_applied_index;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for id in 1..=3 {
        while cluster.status(id).await?.last_applied_index < applied {
            ensure!(
                tokio::time::Instant::now() < deadline,
                "member {id} did not apply up to {applied}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // A new leader is elected and replicates over gRPC too.
    cluster.stop(leader).await?;
    let next = cluster.leader().await?;
    ensure!(next != leader);
    ensure!(
        client.lease("grpc/k", "eu", 5).await?.granted == 5,
        "the new leader grants"
    );
    cluster.stop_all().await
}
