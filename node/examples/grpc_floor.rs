//! The floor under any coordinator on this host that speaks gRPC: what one
//! unary call costs when the server does nothing with it, next to one raw
//! TCP round trip — the numbers the single-call goals of docs/benchmarks.md
//! are measured against.
//!
//! A server runtime (threads named `floor-server`, as many workers as
//! `leasehold serve` starts by default: the cores, at most four; the
//! members' HTTP/2 settings, `ServerLimits::server_builder`) serves a
//! gRPC echo (`leasehold.v1.Raft/AppendEntries` answering its own ~100-byte
//! payload, about the size of a `LeaseRequest`); a client runtime calls it
//! over **one** HTTP/2 connection, as `leasehold bench --connections 1`
//! does. It reports, as JSON lines:
//!
//! - `tcp_echo`: one 100-byte write and its echo over one loopback TCP
//!   connection, one at a time (300 µs apart, so every call finds the
//!   threads idle, as one lease at a time does);
//! - `grpc_echo` with `in_flight` 1: the same with a unary gRPC call;
//! - `grpc_echo` with `in_flight` N: a closed loop of N calls outstanding
//!   for `--duration-secs`: calls per second.
//!
//! Each line has the server threads' CPU per call (user + system from
//! `/proc/self/task/*/stat`; the client's is not counted, as the members'
//! CPU per lease does not count `leasehold bench`'s).
//!
//! ```sh
//! cargo run --release -p leasehold-node --example grpc_floor -- --in-flight 1,256,1024
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use leasehold_proto::v1::raft_client::RaftClient;
use leasehold_proto::v1::raft_server::{Raft, RaftServer};
use leasehold_proto::v1::RaftPayload;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "support/load.rs"]
#[allow(dead_code)] // the floor reads no load arguments
mod load;
use load::latency_report;

/// Bytes of every echoed message.
const PAYLOAD_BYTES: usize = 100;
/// Calls of a one-at-a-time measurement.
const SEQUENTIAL_CALLS: usize = 3_000;
/// Pause before each one-at-a-time call.
const IDLE_GAP: Duration = Duration::from_micros(300);
/// Name of the server runtime's threads (their CPU is what is counted).
const SERVER_THREAD: &str = "floor-server";

/// A gRPC service that answers every call with its own payload.
struct Echo;

#[tonic::async_trait]
impl Raft for Echo {
    async fn append_entries(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        Ok(tonic::Response::new(request.into_inner()))
    }
    async fn vote(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        Ok(tonic::Response::new(request.into_inner()))
    }
    async fn install_snapshot(
        &self,
        request: tonic::Request<RaftPayload>,
    ) -> Result<tonic::Response<RaftPayload>, tonic::Status> {
        Ok(tonic::Response::new(request.into_inner()))
    }
}

/// User + system CPU of this process's server threads, in clock ticks.
fn server_cpu_ticks() -> Result<u64> {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let Some((head, fields)) = stat.rsplit_once(") ") else {
            continue;
        };
        if !head.ends_with(SERVER_THREAD) {
            continue;
        }
        // Fields 14 and 15 of stat(5); `fields` starts at field 3.
        let fields: Vec<&str> = fields.split_whitespace().collect();
        ticks += fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    }
    Ok(ticks)
}

/// Server CPU per call in µs between two tick readings.
fn cpu_us_per_call(before: u64, after: u64, calls: u64) -> u64 {
    // Linux reports thread CPU in USER_HZ ticks, 100 per second on every
    // architecture it runs on.
    // (A blocking-pool thread that ended meanwhile takes its ticks along.)
    after.saturating_sub(before) * 10_000 / calls.max(1)
}

fn sorted_us(mut took: Vec<Duration>) -> Vec<u64> {
    took.sort();
    took.iter()
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .collect()
}

async fn tcp_echo(server: &tokio::runtime::Handle) -> Result<serde_json::Value> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    server.spawn(async move {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let _ = socket.set_nodelay(true);
        let mut message = [0u8; PAYLOAD_BYTES];
        while socket.read_exact(&mut message).await.is_ok() {
            if socket.write_all(&message).await.is_err() {
                break;
            }
        }
    });
    let mut socket = tokio::net::TcpStream::connect(addr).await?;
    socket.set_nodelay(true)?;
    let mut message = [7u8; PAYLOAD_BYTES];
    let before = server_cpu_ticks()?;
    let mut took = Vec::with_capacity(SEQUENTIAL_CALLS);
    for _ in 0..SEQUENTIAL_CALLS {
        tokio::time::sleep(IDLE_GAP).await;
        let started = Instant::now();
        socket.write_all(&message).await?;
        socket.read_exact(&mut message).await?;
        took.push(started.elapsed());
    }
    let after = server_cpu_ticks()?;
    Ok(json!({
        "floor": "tcp_echo", "in_flight": 1, "calls": SEQUENTIAL_CALLS,
        "latency_ms": latency_report(&sorted_us(took)),
        "server_cpu_us_per_call": cpu_us_per_call(before, after, SEQUENTIAL_CALLS as u64),
    }))
}

async fn grpc_sequential(
    client: RaftClient<tonic::transport::Channel>,
) -> Result<serde_json::Value> {
    let mut client = client;
    let before = server_cpu_ticks()?;
    let mut took = Vec::with_capacity(SEQUENTIAL_CALLS);
    for _ in 0..SEQUENTIAL_CALLS {
        tokio::time::sleep(IDLE_GAP).await;
        let started = Instant::now();
        client
            .append_entries(RaftPayload {
                data: vec![7; PAYLOAD_BYTES],
                shard: 0,
            })
            .await?;
        took.push(started.elapsed());
    }
    let after = server_cpu_ticks()?;
    Ok(json!({
        "floor": "grpc_echo", "in_flight": 1, "calls": SEQUENTIAL_CALLS,
        "latency_ms": latency_report(&sorted_us(took)),
        "server_cpu_us_per_call": cpu_us_per_call(before, after, SEQUENTIAL_CALLS as u64),
    }))
}

async fn grpc_closed_loop(
    client: RaftClient<tonic::transport::Channel>,
    in_flight: usize,
    duration: Duration,
) -> Result<serde_json::Value> {
    let calls = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + duration;
    let before = server_cpu_ticks()?;
    let started = Instant::now();
    let callers: Vec<_> = (0..in_flight)
        .map(|_| {
            let mut client = client.clone();
            let calls = calls.clone();
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    client
                        .append_entries(RaftPayload {
                            data: vec![7; PAYLOAD_BYTES],
                            shard: 0,
                        })
                        .await?;
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, tonic::Status>(())
            })
        })
        .collect();
    for caller in callers {
        caller.await??;
    }
    let elapsed = started.elapsed();
    let after = server_cpu_ticks()?;
    let calls = calls.load(Ordering::Relaxed);
    Ok(json!({
        "floor": "grpc_echo", "in_flight": in_flight, "calls": calls,
        "calls_per_sec": calls as f64 / elapsed.as_secs_f64(),
        "server_cpu_us_per_call": cpu_us_per_call(before, after, calls),
    }))
}

fn parse_args() -> Result<(Vec<usize>, Duration)> {
    let mut in_flight = vec![1, 256, 1024];
    let mut duration = Duration::from_secs(3);
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--in-flight" => {
                in_flight = value
                    .split(',')
                    .map(|n| n.trim().parse::<usize>())
                    .collect::<Result<_, _>>()
                    .context("--in-flight takes a comma-separated list of counts")?;
            }
            "--duration-secs" => duration = Duration::from_secs(value.parse()?),
            other => bail!("unknown flag {other}"),
        }
    }
    if in_flight.contains(&0) {
        bail!("--in-flight counts must be at least 1");
    }
    Ok((in_flight, duration))
}

fn main() -> Result<()> {
    let (levels, duration) = parse_args()?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(4))
        .thread_name(SERVER_THREAD)
        .enable_all()
        .build()?;
    let client = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.min(4))
        .thread_name("floor-client")
        .enable_all()
        .build()?;
    let listener = server.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let addr = listener.local_addr()?;
    server.spawn(
        leasehold_node::net::ServerLimits::default()
            .server_builder()
            .add_service(RaftServer::new(Echo))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    client.block_on(async {
        println!("{}", tcp_echo(server.handle()).await?);
        let channel = leasehold_client::transport::TcpDialer::default()
            .endpoint(&addr.to_string())?
            .connect()
            .await?;
        let grpc = RaftClient::new(channel);
        for in_flight in levels {
            let line = if in_flight == 1 {
                grpc_sequential(grpc.clone()).await?
            } else {
                grpc_closed_loop(grpc.clone(), in_flight, duration).await?
            };
            println!("{line}");
        }
        Ok::<_, anyhow::Error>(())
    })?;
    server.shutdown_background();
    Ok(())
}
