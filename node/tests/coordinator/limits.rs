//! Resource attacks against a real member on loopback are refused: idle
//! connections that never send a preface, a flood past the connection cap,
//! oversized Raft and public messages, and more streams than advertised.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::admin_client::AdminClient as AdminRpc;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use leasehold_proto::v1::raft_client::RaftClient as RaftRpc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

async fn channel(addr: &str) -> Result<Channel> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await?,
    )
}

fn lease(key: &str, tokens: u64) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: key.into(),
        region: "eu".into(),
        tokens,
        request_id: None,
    }
}

async fn counter(admin: &mut AdminRpc<Channel>, name: &str) -> Result<u64> {
    let status = admin.status(pb::StatusRequest {}).await?.into_inner();
    status
        .counters
        .get(name)
        .copied()
        .with_context(|| format!("no counter {name}"))
}

/// Opens `n` TCP connections that never send a byte.
async fn idle_connections(addr: &str, n: usize) -> Result<Vec<TcpStream>> {
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        idle.push(TcpStream::connect(addr).await?);
    }
    Ok(idle)
}

/// Whether the member closed `stream` within `within` (end of stream or
/// reset), reading and discarding what it sent first (its HTTP/2 SETTINGS).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let until_closed = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(within, until_closed).await.is_ok()
}

async fn with_policy(cluster: &Cluster) -> Result<(CoordinatorRpc<Channel>, AdminRpc<Channel>)> {
    let channel = channel(&cluster.addr(1)).await?;
    let mut admin = AdminRpc::new(channel.clone());
    admin
        .set_policy(pb::SetPolicyRequest {
            policy: Some(counter_policy("k/", 1_000_000, LONG_WINDOW_MS)),
        })
        .await?;
    Ok((CoordinatorRpc::new(channel), admin))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_without_a_preface_are_closed_after_the_deadline_while_clients_lease(
) -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |c| c.first_byte_timeout_ms = 1_000).await?;
    let (mut api, mut admin) = with_policy(&cluster).await?;
    let mut idle = idle_connections(&cluster.addr(1), 200).await?;

    // While the 200 idle connections are open, a client still gets leases.
    let grant = api.lease(lease("k/a", 5)).await?.into_inner();
    ensure!(
        grant.granted == 5,
        "lease while idle connections are open: {grant:?}"
    );

    let closes = idle
        .iter_mut()
        .map(|stream| closed_within(stream, Duration::from_secs(5)));
    let closed = futures::future::join_all(closes)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count();
    ensure!(
        closed == idle.len(),
        "only {closed} of {} idle connections closed",
        idle.len()
    );
    let counted = counter(&mut admin, "connections_closed_idle_before_first_byte").await?;
    ensure!(counted >= 200, "counted {counted} idle closes");
    // The client that talked is not affected by the deadline.
    let grant = api.lease(lease("k/a", 5)).await?.into_inner();
    ensure!(grant.granted == 5);
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_new_connections_are_closed_and_existing_clients_keep_leasing(
) -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |c| {
        c.max_connections = 20;
        c.first_byte_timeout_ms = 4_000;
    })
    .await?;
    // Let the connections of initialisation close, so the count is ours.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (mut api, mut admin) = with_policy(&cluster).await?;
    let addr = cluster.addr(1);

    let mut flood = idle_connections(&addr, 40).await?;
    let closes = flood
        .iter_mut()
        .map(|stream| closed_within(stream, Duration::from_millis(500)));
    let refused = futures::future::join_all(closes)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count();
    ensure!(
        refused >= 20,
        "only {refused} of 40 connections refused at a cap of 20"
    );

    // The existing client keeps being served.
    let grant = api.lease(lease("k/b", 3)).await?.into_inner();
    ensure!(grant.granted == 3);
    // A new client cannot get in while the cap is held by idle connections.
    let newcomer = async {
        let mut api = CoordinatorRpc::new(channel(&addr).await?);
        api.lease(lease("k/b", 1)).await?;
        anyhow::Ok(())
    };
    let attempt = tokio::time::timeout(Duration::from_millis(1_000), newcomer).await;
    ensure!(
        !matches!(attempt, Ok(Ok(()))),
        "a new client was served past the connection cap"
    );
    let counted = counter(&mut admin, "connections_refused_at_capacity").await?;
    ensure!(counted >= 20, "counted {counted} refusals");

    // Once the idle connections pass their first-byte deadline, new clients connect.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    let mut api = CoordinatorRpc::new(channel(&addr).await?);
    let grant = api.lease(lease("k/b", 1)).await?.into_inner();
    ensure!(grant.granted == 1);
    drop(flood);
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_payload_above_the_peer_limit_is_refused_with_resource_exhausted() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let (mut api, mut admin) = with_policy(&cluster).await?;
    let limit = leasehold_node::NodeConfig::default()
        .peer_message_limit_bytes()
        .context("default limit")?;
    let mut raft = RaftRpc::new(channel(&cluster.addr(1)).await?)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    for _ in 0..3 {
        let oversized = pb::RaftPayload {
            data: vec![0u8; limit + 1],
            shard: 0,
        };
        let status = raft
            .append_entries(oversized)
            .await
            .expect_err("an oversized raft payload must be refused");
        ensure!(
            status.code() == Code::ResourceExhausted,
            "got {:?}: {}",
            status.code(),
            status.message()
        );
    }
    let counted = counter(&mut admin, "requests_refused_too_large").await?;
    ensure!(counted >= 3, "counted {counted} oversized requests");
    // The member goes on serving.
    let grant = api.lease(lease("k/c", 2)).await?.into_inner();
    ensure!(grant.granted == 2);
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_request_above_the_request_limit_is_refused_with_resource_exhausted() -> Result<()>
{
    let mut cluster = Cluster::start_initialised(1, |c| c.max_request_bytes = 4 * 1024).await?;
    let (mut api, mut admin) = with_policy(&cluster).await?;
    let mut request = lease("k/d", 1);
    request.region = "r".repeat(8 * 1024);
    let status = api
        .lease(request)
        .await
        .expect_err("an oversized lease must be refused");
    ensure!(
        status.code() == Code::ResourceExhausted
            && leasehold_proto::refusal::reason_of(&status)
                == Some(leasehold_proto::refusal::Reason::RequestTooLarge),
        "got {status:?}"
    );
    let counted = counter(&mut admin, "responses_resource_exhausted").await?;
    ensure!(counted >= 1, "counted {counted}");
    let grant = api.lease(lease("k/d", 2)).await?.into_inner();
    ensure!(grant.granted == 2);
    cluster.stop_all().await
}

/// One HTTP/2 frame: 9-byte header then payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .unwrap_or(u32::MAX)
        .to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK block of literal fields without indexing (no Huffman coding).
fn header_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        out.push(u8::try_from(name.len()).unwrap_or(0x7f));
        out.extend_from_slice(name.as_bytes());
        out.push(u8::try_from(value.len()).unwrap_or(0x7f));
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Reads one frame: (type, flags, stream id, payload).
async fn read_frame(tcp: &mut TcpStream) -> Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    tcp.read_exact(&mut head).await?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let stream = u32::from_be_bytes([head[5] & 0x7f, head[6], head[7], head[8]]);
    let mut payload = vec![0u8; len];
    tcp.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const REFUSED_STREAM: u32 = 0x7;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_opening_more_streams_than_advertised_gets_the_extra_ones_refused() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |c| c.max_concurrent_streams = 7).await?;
    let mut tcp = TcpStream::connect(cluster.addr(1)).await?;
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
    tcp.write_all(&frame(SETTINGS, 0, 0, &[])).await?;

    // The member's SETTINGS advertise the cap; acknowledge them so they apply.
    let advertised = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            let (kind, flags, _, payload) = read_frame(&mut tcp).await?;
            if kind == SETTINGS && flags & ACK == 0 {
                let cap = payload.chunks_exact(6).find_map(|setting| {
                    (u16::from_be_bytes([setting[0], setting[1]])
                        == SETTINGS_MAX_CONCURRENT_STREAMS)
                        .then(|| {
                            u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]])
                        })
                });
                return anyhow::Ok(cap);
            }
        }
    })
    .await??;
    ensure!(advertised == Some(7), "advertised {advertised:?}");
    tcp.write_all(&frame(SETTINGS, ACK, 0, &[])).await?;

    // Ten requests whose bodies never end, ignoring the advertised cap.
    let fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/leasehold.v1.Coordinator/Lease"),
        (":authority", "member"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    for n in 0..10u32 {
        let stream = n * 2 + 1;
        tcp.write_all(&frame(HEADERS, END_HEADERS, stream, &header_block(&fields)))
            .await?;
    }
    let mut refused = Vec::new();
    let _ = tokio::time::timeout(Duration::from_millis(1_000), async {
        while let Ok((kind, _, stream, payload)) = read_frame(&mut tcp).await {
            if kind == RST_STREAM && payload.len() == 4 {
                let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                if code == REFUSED_STREAM {
                    refused.push(stream);
                }
            }
        }
    })
    .await;
    ensure!(
        refused == vec![15, 17, 19],
        "streams refused beyond the cap of 7: {refused:?}"
    );
    drop(tcp);
    cluster.stop_all().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escrow_node_closes_idle_connections_refuses_oversized_requests_and_counts_both(
) -> Result<()> {
    use leasehold_client::transport::{SystemClock, TcpDialer};
    use leasehold_core::ids::RegionId;
    use leasehold_node::escrow::{run_escrow, EscrowConfig};
    use leasehold_proto::v1::escrow_client::EscrowClient;
    use std::sync::Arc;

    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let mut config = EscrowConfig::new(RegionId::new("eu")?, addr.clone(), vec![cluster.addr(1)]);
    config.limits.first_byte_timeout_ms = 500;
    config.limits.max_request_bytes = 4 * 1024;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(run_escrow(
        config,
        tonic::transport::server::TcpIncoming::from(listener),
        Arc::new(TcpDialer::default()),
        Arc::new(SystemClock),
        async {
            let _ = stopped.await;
        },
    ));

    let mut idle = idle_connections(&addr, 20).await?;
    let closes = idle
        .iter_mut()
        .map(|stream| closed_within(stream, Duration::from_secs(3)));
    let closed = futures::future::join_all(closes)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count();
    ensure!(closed == 20, "only {closed} of 20 idle connections closed");

    let mut escrow = EscrowClient::new(channel(&addr).await?);
    let status = escrow
        .acquire(pb::AcquireRequest {
            key: "k".repeat(8 * 1024),
            tenant: String::new(),
            weight: 1,
            tokens: 1,
            request_id: None,
        })
        .await
        .expect_err("an oversized acquire must be refused");
    ensure!(status.code() == Code::ResourceExhausted, "got {status:?}");
    let counters = escrow
        .status(pb::EscrowStatusRequest {})
        .await?
        .into_inner()
        .counters;
    let count = |name: &str| counters.get(name).copied().unwrap_or(0);
    ensure!(
        count("connections_closed_idle_before_first_byte") >= 20,
        "{counters:?}"
    );
    ensure!(count("requests_refused_too_large") >= 1, "{counters:?}");

    let _ = stop.send(());
    node.await??;
    cluster.stop_all().await
}

/// Opens an HTTP/2 connection by hand (preface, SETTINGS, ACK of the member's).
async fn raw_h2(addr: &str) -> Result<TcpStream> {
    let mut tcp = TcpStream::connect(addr).await?;
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
    tcp.write_all(&frame(SETTINGS, 0, 0, &[])).await?;
    tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            let (kind, flags, _, _) = read_frame(&mut tcp).await?;
            if kind == SETTINGS && flags & ACK == 0 {
                return anyhow::Ok(());
            }
        }
    })
    .await??;
    tcp.write_all(&frame(SETTINGS, ACK, 0, &[])).await?;
    Ok(tcp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_raft_bodies_announcing_sixty_mib_are_refused_at_their_length_prefix() -> Result<()>
{
    const DATA: u8 = 0x0;
    const END_STREAM: u8 = 0x1;
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let mut tcp = raw_h2(&cluster.addr(1)).await?;
    let fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/leasehold.v1.Raft/AppendEntries"),
        (":authority", "member"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    // Eight streams, each a gRPC message announcing 60 MiB of which only
    // 1 000 bytes are sent; the body never ends.
    let announced = 60u32 * 1024 * 1024;
    let mut partial = vec![0u8];
    partial.extend_from_slice(&announced.to_be_bytes());
    partial.extend_from_slice(&[0u8; 1_000]);
    let streams: Vec<u32> = (0..8).map(|n| n * 2 + 1).collect();
    for &stream in &streams {
        tcp.write_all(&frame(HEADERS, END_HEADERS, stream, &header_block(&fields)))
            .await?;
        tcp.write_all(&frame(DATA, 0, stream, &partial)).await?;
    }
    // The member answers and ends every stream at once instead of buffering
    // toward 60 MiB while waiting for the rest.
    let mut ended = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        while let Ok((kind, flags, stream, _)) = read_frame(&mut tcp).await {
            let ends = (kind == HEADERS && flags & END_STREAM != 0) || kind == RST_STREAM;
            if ends && !ended.contains(&stream) {
                ended.push(stream);
                if ended.len() == streams.len() {
                    return;
                }
            }
        }
    })
    .await;
    ended.sort_unstable();
    ensure!(ended == streams, "streams ended by the member: {ended:?}");
    let mut admin = AdminRpc::new(channel(&cluster.addr(1)).await?);
    let counted = counter(&mut admin, "requests_refused_too_large").await?;
    ensure!(counted >= 8, "counted {counted} oversized requests");
    drop(tcp);
    cluster.stop_all().await
}
