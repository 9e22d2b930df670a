//! The Redis side of the comparison in docs/benchmarks.md: the same lease
//! as Leasehold's (at most `limit` tokens per key per window) done the way
//! people do it today, with one Redis and a Lua script, driven the way
//! `leasehold bench --connections 1` drives a cluster: a closed loop with
//! `--in-flight` requests outstanding on **one** connection (pipelined, in
//! order), keys spread over `--keys`, for `--duration-secs`.
//!
//! It speaks RESP directly (no client crate): `SCRIPT LOAD` once, then
//! `EVALSHA` per lease. Prints one JSON object like `leasehold bench
//! --output json` (leases, leases_per_sec, latency_ms p50/p90/p99/max).
//!
//! ```sh
//! redis-server --port 6391 --save '' --appendonly no &
//! cargo run --release -p leasehold-node --example redis_lease_load -- \
//!   --addr 127.0.0.1:6391 --in-flight 16 --keys 1000 --duration-secs 5
//! ```
//! `node/scripts/compare-redis.sh` runs the whole matrix.

use std::collections::VecDeque;
use std::time::Instant;

use anyhow::{bail, Context, Result};

#[path = "support/load.rs"]
mod load;
use load::{latency_report, parse_load_args};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The lease: grant min(tokens, limit − used) in the current window of the
/// key (windows aligned to the epoch on Redis's clock), expiring with it.
const LEASE_SCRIPT: &str = r#"
local limit = tonumber(ARGV[1])
local tokens = tonumber(ARGV[2])
local window_ms = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local start = now - now % window_ms
local k = KEYS[1] .. ':' .. start
local used = tonumber(redis.call('GET', k) or '0')
local granted = limit - used
if granted > tokens then granted = tokens end
if granted < 0 then granted = 0 end
if granted > 0 then
  redis.call('INCRBY', k, granted)
  redis.call('PEXPIRE', k, window_ms)
end
return granted
"#;

/// One RESP command (an array of bulk strings).
fn command(parts: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", parts.len()).into_bytes();
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one RESP reply line; a bulk string's payload is read too.
async fn read_reply<R: tokio::io::AsyncBufRead + Unpin>(reader: &mut R) -> Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line).await? == 0 {
        bail!("redis closed the connection");
    }
    let line = line.trim_end().to_string();
    match line.as_bytes().first() {
        Some(b':') | Some(b'+') => Ok(line[1..].to_string()),
        Some(b'-') => bail!("redis error: {}", &line[1..]),
        Some(b'$') => {
            let len: usize = line[1..].parse()?;
            let mut payload = vec![0; len + 2];
            reader.read_exact(&mut payload).await?;
            payload.truncate(len);
            Ok(String::from_utf8(payload)?)
        }
        _ => bail!("unexpected reply {line:?}"),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = parse_load_args("addr", "127.0.0.1:6379")?;
    let stream = TcpStream::connect(&args.target)
        .await
        .with_context(|| format!("connect to redis at {}", args.target))?;
    stream.set_nodelay(true)?;
    let (reader, mut writer) = stream.into_split();
    let mut reader = BufReader::new(reader);
    writer
        .write_all(&command(&["SCRIPT", "LOAD", LEASE_SCRIPT]))
        .await?;
    let sha = read_reply(&mut reader).await?;

    let (limit, window, tokens) = (
        args.limit.to_string(),
        args.window_ms.to_string(),
        args.tokens.to_string(),
    );
    let mut next_key = 0u64;
    let mut lease = || {
        let key = format!("lease:{}", next_key % args.keys);
        next_key += 1;
        command(&["EVALSHA", &sha, "1", &key, &limit, &tokens, &window])
    };
    let started = Instant::now();
    let until = started + args.duration;
    let mut outstanding = VecDeque::with_capacity(args.in_flight);
    let mut first = Vec::new();
    for _ in 0..args.in_flight {
        first.extend(lease());
        outstanding.push_back(Instant::now());
    }
    writer.write_all(&first).await?;
    let (mut leases, mut tokens_granted) = (0u64, 0u64);
    let mut latencies_us = Vec::new();
    while let Some(sent) = outstanding.pop_front() {
        let granted: u64 = read_reply(&mut reader).await?.parse()?;
        latencies_us.push(u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX));
        leases += 1;
        tokens_granted += granted;
        if Instant::now() < until {
            writer.write_all(&lease()).await?;
            outstanding.push_back(Instant::now());
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies_us.sort_unstable();
    println!(
        "{}",
        json!({
            "target": "redis",
            "addr": args.target,
            "in_flight": args.in_flight,
            "keys": args.keys,
            "duration_secs": elapsed,
            "leases": leases,
            "tokens_granted": tokens_granted,
            "leases_per_sec": leases as f64 / elapsed.max(1e-9),
            "latency_ms": latency_report(&latencies_us),
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_resp_arrays_of_bulk_strings() {
        assert_eq!(
            command(&["GET", "k"]),
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n".to_vec()
        );
    }

    #[tokio::test]
    async fn replies_are_read_by_type() {
        let mut input: &[u8] = b":7\r\n$3\r\nabc\r\n+OK\r\n-ERR no\r\n";
        assert_eq!(read_reply(&mut input).await.unwrap(), "7");
        assert_eq!(read_reply(&mut input).await.unwrap(), "abc");
        assert_eq!(read_reply(&mut input).await.unwrap(), "OK");
        assert!(read_reply(&mut input).await.is_err());
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        use load::percentile_ms;
        let sorted = [1_000, 2_000, 3_000, 4_000];
        assert_eq!(percentile_ms(&sorted, 0.5), 2.0);
        assert_eq!(percentile_ms(&sorted, 1.0), 4.0);
        assert_eq!(percentile_ms(&[], 0.5), 0.0);
        assert_eq!(latency_report(&sorted)["p90"], 4.0);
    }
}
