//! The load of the RLS comparison in docs/benchmarks.md: Envoy's rate limit
//! service (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`)
//! on an escrow node, next to the same descriptor limited the way
//! `envoyproxy/ratelimit` limits it in Redis — one pipelined
//! `INCRBY key hits` + `EXPIRE key window` round trip per request.
//!
//! Both sides are driven alike: a closed loop with `--in-flight` requests
//! outstanding on **one** connection for `--duration-secs`, each request
//! one descriptor `(remote_address, <value>)` with values spread over
//! `--keys` addresses (caller `i` of N asks for values i, i + N, i + 2N, …).
//!
//! - RLS (`--endpoint HOST:PORT`, plaintext): one HTTP/2 connection (one
//!   tonic `Channel`), a client clone per request in flight.
//! - Redis (`--redis HOST:PORT`): one TCP connection; each request writes
//!   `INCRBY <domain>_<key>_<value>_<window start> hits` and
//!   `EXPIRE … <window seconds>` pipelined in one write, and is OK while
//!   the count is at most `--limit`. A writer task sends requests in
//!   order, a reader task takes replies off the connection in the same
//!   order and hands each request its two replies (a FIFO of oneshots), so
//!   the N requests in flight share one connection as the RLS side's do.
//!
//! Prints one JSON object: answers, answers_per_sec, ok, over_limit,
//! errors, latency_us p50/p90/p99/max.
//!
//! ```sh
//! cargo run --release -p leasehold-node --example rls_load -- \
//!   --endpoint 127.0.0.1:7200 --in-flight 16 --keys 1000 --duration-secs 5
//! cargo run --release -p leasehold-node --example rls_load -- \
//!   --redis 127.0.0.1:6393 --limit 1000 --unit second --in-flight 16
//! ```
//! `node/scripts/compare-rls.sh` runs the whole matrix.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tonic::transport::Channel;

#[path = "support/resp.rs"]
mod resp;
use resp::{parse_reply, push_command, Reply};

/// What is under load.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// An RLS endpoint (an escrow node), `host:port`, plaintext.
    Rls(String),
    /// A Redis, `host:port`.
    Redis(String),
}

/// One run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Args {
    target: Target,
    /// Requests outstanding at once, over one connection.
    in_flight: usize,
    /// Distinct descriptor values (addresses).
    keys: u64,
    duration: Duration,
    /// The RLS domain (also the first part of the Redis key).
    domain: String,
    /// The descriptor entry's key.
    entry_key: String,
    /// `hits_addend` of each request.
    hits: u32,
    /// Redis side: requests per window per value (the rule's
    /// `requests_per_unit`).
    limit: u64,
    /// Redis side: the window (the rule's `unit`), seconds.
    window_secs: u64,
}

const USAGE: &str = "rls_load (--endpoint HOST:PORT | --redis HOST:PORT) [--in-flight N] [--keys N] \
[--duration-secs N] [--domain D] [--entry-key K] [--hits N] [--limit N] [--unit second|minute|hour|day]";

/// Reads the flags (each one followed by its value).
fn parse_args(words: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut args = Args {
        target: Target::Rls("127.0.0.1:7201".into()),
        in_flight: 1,
        keys: 1_000,
        duration: Duration::from_secs(5),
        domain: "bench".into(),
        entry_key: "remote_address".into(),
        hits: 1,
        limit: 1_000,
        window_secs: 1,
    };
    let mut words = words.into_iter();
    while let Some(flag) = words.next() {
        let value = words
            .next()
            .with_context(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--endpoint" => args.target = Target::Rls(value),
            "--redis" => args.target = Target::Redis(value),
            "--in-flight" => args.in_flight = value.parse()?,
            "--keys" => args.keys = value.parse()?,
            "--duration-secs" => args.duration = Duration::from_secs(value.parse()?),
            "--domain" => args.domain = value,
            "--entry-key" => args.entry_key = value,
            "--hits" => args.hits = value.parse()?,
            "--limit" => args.limit = value.parse()?,
            "--unit" => {
                args.window_secs = match value.to_ascii_lowercase().as_str() {
                    "second" => 1,
                    "minute" => 60,
                    "hour" => 3_600,
                    "day" => 86_400,
                    other => bail!("unknown unit {other:?}\n{USAGE}"),
                }
            }
            other => bail!("unknown flag {other}\n{USAGE}"),
        }
    }
    if args.in_flight == 0 || args.keys == 0 {
        bail!("--in-flight and --keys must be at least 1");
    }
    Ok(args)
}

/// The descriptor value of key number `i`: an IPv4 address in 10/8.
fn value_of(i: u64) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
}

/// The Redis key `envoyproxy/ratelimit` counts a descriptor under:
/// `<domain>_<key>_<value>_<window start, unix seconds>`.
fn redis_key(
    domain: &str,
    entry_key: &str,
    value: &str,
    now_secs: u64,
    window_secs: u64,
) -> String {
    let start = now_secs - now_secs % window_secs;
    format!("{domain}_{entry_key}_{value}_{start}")
}

/// One request's commands: `INCRBY key hits` and `EXPIRE key window`,
/// pipelined in one write.
fn incr_expire(key: &str, hits: u32, window_secs: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + 2 * key.len());
    push_command(
        &mut out,
        &[b"INCRBY", key.as_bytes(), hits.to_string().as_bytes()],
    );
    push_command(
        &mut out,
        &[
            b"EXPIRE",
            key.as_bytes(),
            window_secs.to_string().as_bytes(),
        ],
    );
    out
}

/// The count after a request, from its two replies (INCRBY's, EXPIRE's).
fn incr_count(incr: &Reply, expire: &Reply) -> Result<u64, String> {
    match (incr, expire) {
        (Reply::Integer(count), Reply::Integer(_)) => {
            u64::try_from(*count).map_err(|_| format!("negative count {count}"))
        }
        (Reply::Error(e), _) | (_, Reply::Error(e)) => Err(format!("redis error: {e}")),
        other => Err(format!("unexpected replies {other:?}")),
    }
}

/// The `q` quantile of latencies sorted in µs (nearest rank); 0 when none.
fn percentile_us(sorted_us: &[u64], q: f64) -> u64 {
    if sorted_us.is_empty() {
        return 0;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    sorted_us[rank - 1]
}

/// What one caller (or all of them) saw.
#[derive(Debug, Default)]
struct Tally {
    ok: u64,
    over_limit: u64,
    errors: u64,
    first_error: Option<String>,
    latencies_us: Vec<u64>,
}

impl Tally {
    fn error(&mut self, error: String) {
        self.errors += 1;
        self.first_error.get_or_insert(error);
    }

    fn add(&mut self, other: Tally) {
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latencies_us.extend(other.latencies_us);
    }
}

fn micros_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// One RLS caller: asks about values first, first + N, … until `until`.
async fn rls_caller(
    mut client: RateLimitServiceClient<Channel>,
    first: u64,
    args: Arc<Args>,
    until: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut next = first;
    while Instant::now() < until {
        let request = RateLimitRequest {
            domain: args.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: args.entry_key.clone(),
                    value: value_of(next % args.keys),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: args.hits,
        };
        next += args.in_flight as u64;
        let sent = Instant::now();
        match client.should_rate_limit(request).await {
            Ok(answer) => {
                tally.latencies_us.push(micros_since(sent));
                match Code::try_from(answer.into_inner().overall_code) {
                    Ok(Code::Ok) => tally.ok += 1,
                    Ok(Code::OverLimit) => tally.over_limit += 1,
                    other => tally.error(format!("overall_code {other:?}")),
                }
            }
            Err(status) => tally.error(status.to_string()),
        }
    }
    tally
}

/// A request to Redis: its bytes, and where its two replies go.
type Job = (Vec<u8>, oneshot::Sender<Result<u64, String>>);

/// Writes requests in the order they come, as many as are waiting in one
/// write; hands each request's reply slot to the reader first, in order.
async fn redis_writer(
    mut writer: OwnedWriteHalf,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    slots: mpsc::UnboundedSender<oneshot::Sender<Result<u64, String>>>,
) -> Result<()> {
    let mut out = Vec::with_capacity(64 * 1024);
    while let Some((bytes, slot)) = jobs.recv().await {
        out.clear();
        out.extend_from_slice(&bytes);
        slots.send(slot).ok().context("reader gone")?;
        while let Ok((bytes, slot)) = jobs.try_recv() {
            out.extend_from_slice(&bytes);
            slots.send(slot).ok().context("reader gone")?;
        }
        writer.write_all(&out).await?;
    }
    Ok(())
}

/// Takes replies off the connection in order: every two (INCRBY's and
/// EXPIRE's) answer the oldest request.
async fn redis_reader(
    mut reader: OwnedReadHalf,
    mut slots: mpsc::UnboundedReceiver<oneshot::Sender<Result<u64, String>>>,
) -> Result<()> {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut pair: Vec<Reply> = Vec::with_capacity(2);
    loop {
        let mut used = 0;
        while let Some((reply, n)) = parse_reply(&buf[used..])? {
            used += n;
            pair.push(reply);
            if pair.len() == 2 {
                let slot = slots.recv().await.context("a reply no request waits for")?;
                let _ = slot.send(incr_count(&pair[0], &pair[1]));
                pair.clear();
            }
        }
        buf.drain(..used);
        buf.reserve(16 * 1024);
        if reader.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
    }
}

/// One Redis caller: like [`rls_caller`], one INCRBY + EXPIRE per request.
async fn redis_caller(
    jobs: mpsc::UnboundedSender<Job>,
    first: u64,
    args: Arc<Args>,
    until: Instant,
) -> Tally {
    let mut tally = Tally::default();
    let mut next = first;
    while Instant::now() < until {
        let now_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let key = redis_key(
            &args.domain,
            &args.entry_key,
            &value_of(next % args.keys),
            now_secs,
            args.window_secs,
        );
        next += args.in_flight as u64;
        let sent = Instant::now();
        let (slot, reply) = oneshot::channel();
        if jobs
            .send((incr_expire(&key, args.hits, args.window_secs), slot))
            .is_err()
        {
            tally.error("redis connection closed".into());
            break;
        }
        match reply.await {
            Ok(Ok(count)) => {
                tally.latencies_us.push(micros_since(sent));
                if count <= args.limit {
                    tally.ok += 1;
                } else {
                    tally.over_limit += 1;
                }
            }
            Ok(Err(error)) => tally.error(error),
            Err(_) => {
                tally.error("redis connection closed".into());
                break;
            }
        }
    }
    tally
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Arc::new(parse_args(std::env::args().skip(1))?);
    let mut callers = JoinSet::new();
    let mut connection = JoinSet::new();
    let (name, addr, started) = match &args.target {
        Target::Rls(addr) => {
            let channel = Channel::from_shared(format!("http://{addr}"))?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| format!("connect to the RLS endpoint at {addr}"))?;
            let client = RateLimitServiceClient::new(channel);
            let started = Instant::now();
            let until = started + args.duration;
            for i in 0..args.in_flight {
                callers.spawn(rls_caller(client.clone(), i as u64, args.clone(), until));
            }
            ("leasehold-rls", addr, started)
        }
        Target::Redis(addr) => {
            let stream = TcpStream::connect(addr)
                .await
                .with_context(|| format!("connect to redis at {addr}"))?;
            stream.set_nodelay(true)?;
            let (reader, writer) = stream.into_split();
            let (jobs, job_queue) = mpsc::unbounded_channel();
            let (slots, slot_queue) = mpsc::unbounded_channel();
            connection.spawn(redis_writer(writer, job_queue, slots));
            connection.spawn(redis_reader(reader, slot_queue));
            let started = Instant::now();
            let until = started + args.duration;
            for i in 0..args.in_flight {
                callers.spawn(redis_caller(jobs.clone(), i as u64, args.clone(), until));
            }
            ("redis-incrby-expire", addr, started)
        }
    };
    let mut tally = Tally::default();
    while let Some(done) = callers.join_next().await {
        tally.add(done?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    connection.abort_all();
    tally.latencies_us.sort_unstable();
    let answers = tally.ok + tally.over_limit;
    let lat = &tally.latencies_us;
    println!(
        "{}",
        json!({
            "target": name,
            "addr": addr,
            "in_flight": args.in_flight,
            "keys": args.keys,
            "hits": args.hits,
            "duration_secs": elapsed,
            "answers": answers,
            "answers_per_sec": answers as f64 / elapsed.max(1e-9),
            "ok": tally.ok,
            "over_limit": tally.over_limit,
            "errors": tally.errors,
            "first_error": tally.first_error,
            "latency_us": {
                "p50": percentile_us(lat, 0.50),
                "p90": percentile_us(lat, 0.90),
                "p99": percentile_us(lat, 0.99),
                "max": percentile_us(lat, 1.0),
            },
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_choose_the_target_and_the_window() {
        let args = parse_args(words(
            "--redis 127.0.0.1:6393 --in-flight 16 --keys 10 --limit 5 --unit Minute --hits 2",
        ))
        .unwrap();
        assert_eq!(args.target, Target::Redis("127.0.0.1:6393".into()));
        assert_eq!((args.in_flight, args.keys, args.limit), (16, 10, 5));
        assert_eq!((args.window_secs, args.hits), (60, 2));
        let rls = parse_args(words("--endpoint 127.0.0.1:7200")).unwrap();
        assert_eq!(rls.target, Target::Rls("127.0.0.1:7200".into()));
        assert!(parse_args(words("--unit week")).is_err());
        assert!(parse_args(words("--in-flight 0")).is_err());
        assert!(parse_args(words("--keys")).is_err());
        assert!(parse_args(words("--nope 1")).is_err());
    }

    #[test]
    fn values_are_distinct_addresses() {
        assert_eq!(value_of(0), "10.0.0.0");
        assert_eq!(value_of(999), "10.0.3.231");
        assert_eq!(value_of(70_000), "10.1.17.112");
        let distinct: std::collections::HashSet<_> = (0..1_000).map(value_of).collect();
        assert_eq!(distinct.len(), 1_000);
    }

    #[test]
    fn redis_keys_name_the_window_start() {
        assert_eq!(
            redis_key("bench", "remote_address", "10.0.0.1", 1_700_000_042, 60),
            "bench_remote_address_10.0.0.1_1700000040"
        );
        assert_eq!(
            redis_key("d", "k", "v", 1_700_000_042, 1),
            "d_k_v_1700000042"
        );
    }

    #[test]
    fn a_request_is_incrby_then_expire_in_one_write() {
        assert_eq!(
            incr_expire("k", 3, 60),
            b"*3\r\n$6\r\nINCRBY\r\n$1\r\nk\r\n$1\r\n3\r\n*3\r\n$6\r\nEXPIRE\r\n$1\r\nk\r\n$2\r\n60\r\n"
                .to_vec()
        );
    }

    #[test]
    fn replies_parse_incrementally() {
        let input = b":7\r\n$3\r\nabc\r\n+OK\r\n-ERR no\r\n$-1\r\n*2\r\n:1\r\n$1\r\nx\r\n";
        let mut at = 0;
        let mut replies = Vec::new();
        while let Some((reply, n)) = parse_reply(&input[at..]).unwrap() {
            replies.push(reply);
            at += n;
        }
        assert_eq!(at, input.len());
        assert_eq!(
            replies,
            vec![
                Reply::Integer(7),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Simple("OK".into()),
                Reply::Error("ERR no".into()),
                Reply::Bulk(None),
                Reply::Array(Some(vec![
                    Reply::Integer(1),
                    Reply::Bulk(Some(b"x".to_vec()))
                ])),
            ]
        );
        // Whatever has arrived, the replies read are the first ones, whole:
        // a cut reply waits for the rest, never misread.
        for cut in 0..=input.len() {
            let (mut at, mut read) = (0, Vec::new());
            while let Some((reply, n)) = parse_reply(&input[at..cut]).unwrap() {
                read.push(reply);
                at += n;
            }
            assert_eq!(read[..], replies[..read.len()], "cut at {cut}");
        }
        assert!(parse_reply(b"$5\r\nab").unwrap().is_none());
        assert!(parse_reply(b"*2\r\n:1\r\n").unwrap().is_none());
        assert!(parse_reply(b"?x\r\n").is_err());
        assert!(parse_reply(b":x\r\n").is_err());
        assert!(parse_reply(b"$1\r\nab\r\n").is_err());
    }

    #[test]
    fn the_count_comes_from_incrby() {
        assert_eq!(incr_count(&Reply::Integer(4), &Reply::Integer(1)), Ok(4));
        assert!(incr_count(&Reply::Error("ERR x".into()), &Reply::Integer(1)).is_err());
        assert!(incr_count(&Reply::Integer(4), &Reply::Error("ERR y".into())).is_err());
        assert!(incr_count(&Reply::Simple("OK".into()), &Reply::Integer(1)).is_err());
        assert!(incr_count(&Reply::Integer(-1), &Reply::Integer(1)).is_err());
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let sorted = [100, 200, 300, 400];
        assert_eq!(percentile_us(&sorted, 0.5), 200);
        assert_eq!(percentile_us(&sorted, 0.99), 400);
        assert_eq!(percentile_us(&sorted, 1.0), 400);
        assert_eq!(percentile_us(&[], 0.5), 0);
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_us(&hundred, 0.99), 99);
        assert_eq!(percentile_us(&hundred, 0.5), 50);
    }
}
