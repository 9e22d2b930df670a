//! The etcd side of the comparison in docs/benchmarks.md: the same lease as
//! Leasehold's (at most `limit` tokens per key per window) done on a
//! replicated etcd cluster the way it is done without server-side scripts:
//! an optimistic transaction per lease — compare the window counter's
//! `mod_revision` with the one last seen, `Put` the new count if it holds,
//! otherwise read it back in the same transaction and try again. Driven like
//! `redis_lease_load`: a closed loop with `--in-flight` leases outstanding
//! on **one** connection (HTTP/2 streams), keys spread over `--keys`.
//!
//! It speaks etcd's gRPC API (`etcdserverpb.KV/Txn`) with the few messages
//! it needs declared here (field numbers from etcd's `rpc.proto` and
//! `kv.proto`), through the tonic already in the build: no etcd client crate.
//! Prints one JSON object like `leasehold bench --output json`.
//!
//! ```sh
//! etcd --data-dir /tmp/etcd1 &   # or three members, see node/scripts/compare-redis.sh
//! cargo run --release -p leasehold-node --example etcd_lease_load -- \
//!   --endpoint 127.0.0.1:2379 --in-flight 16 --keys 1000 --duration-secs 5
//! ```

use std::collections::HashMap;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

#[path = "support/load.rs"]
mod load;
use load::{latency_report, parse_load_args};
use serde_json::json;
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// etcd's messages, as far as this load needs them.
mod etcd {
    /// `etcdserverpb.ResponseHeader` (only the revision is read).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(int64, tag = "3")]
        pub revision: i64,
    }

    /// `mvccpb.KeyValue`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(int64, tag = "3")]
        pub mod_revision: i64,
        #[prost(bytes = "vec", tag = "5")]
        pub value: Vec<u8>,
    }

    /// `etcdserverpb.RangeRequest` (a single key).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
    }

    /// `etcdserverpb.RangeResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RangeResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(message, repeated, tag = "2")]
        pub kvs: Vec<KeyValue>,
    }

    /// `etcdserverpb.PutRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }

    /// `etcdserverpb.Compare` with `target = MOD` and `result = EQUAL`
    /// (both enum value 2 and 0), on `mod_revision` (field 6 of the oneof).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Compare {
        #[prost(int32, tag = "1")]
        pub result: i32,
        #[prost(int32, tag = "2")]
        pub target: i32,
        #[prost(bytes = "vec", tag = "3")]
        pub key: Vec<u8>,
        #[prost(int64, tag = "6")]
        pub mod_revision: i64,
    }

    /// `etcdserverpb.RequestOp`: a range or a put.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RequestOp {
        #[prost(message, optional, tag = "1")]
        pub request_range: Option<RangeRequest>,
        #[prost(message, optional, tag = "2")]
        pub request_put: Option<PutRequest>,
    }

    /// `etcdserverpb.TxnRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnRequest {
        #[prost(message, repeated, tag = "1")]
        pub compare: Vec<Compare>,
        #[prost(message, repeated, tag = "2")]
        pub success: Vec<RequestOp>,
        #[prost(message, repeated, tag = "3")]
        pub failure: Vec<RequestOp>,
    }

    /// `etcdserverpb.ResponseOp` (the range answer of a failed compare).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseOp {
        #[prost(message, optional, tag = "1")]
        pub response_range: Option<RangeResponse>,
    }

    /// `etcdserverpb.TxnResponse`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TxnResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(bool, tag = "2")]
        pub succeeded: bool,
        #[prost(message, repeated, tag = "3")]
        pub responses: Vec<ResponseOp>,
    }

    /// `CompareTarget.MOD`.
    pub const TARGET_MOD: i32 = 2;
    /// `CompareResult.EQUAL`.
    pub const RESULT_EQUAL: i32 = 0;
}

/// The transaction that takes `tokens` from a window counter last seen at
/// `mod_revision` holding `used` (0 and revision 0: not created yet).
fn lease_txn(key: &[u8], seen: (i64, u64), tokens: u64, limit: u64) -> (etcd::TxnRequest, u64) {
    let (mod_revision, used) = seen;
    let granted = tokens.min(limit.saturating_sub(used));
    let request = etcd::TxnRequest {
        compare: vec![etcd::Compare {
            result: etcd::RESULT_EQUAL,
            target: etcd::TARGET_MOD,
            key: key.to_vec(),
            mod_revision,
        }],
        success: vec![etcd::RequestOp {
            request_put: Some(etcd::PutRequest {
                key: key.to_vec(),
                value: (used + granted).to_string().into_bytes(),
            }),
            ..Default::default()
        }],
        failure: vec![etcd::RequestOp {
            request_range: Some(etcd::RangeRequest { key: key.to_vec() }),
            ..Default::default()
        }],
    };
    (request, granted)
}

/// What a failed compare read back: (mod_revision, used).
fn seen_after_failure(response: &etcd::TxnResponse) -> (i64, u64) {
    response
        .responses
        .iter()
        .filter_map(|op| op.response_range.as_ref())
        .flat_map(|range| range.kvs.first())
        .map(|kv| {
            let used = std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            (kv.mod_revision, used)
        })
        .next()
        .unwrap_or((0, 0))
}

async fn txn(channel: &Channel, request: etcd::TxnRequest) -> Result<etcd::TxnResponse> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.context("etcd connection")?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.KV/Txn");
    let codec: tonic_prost::ProstCodec<etcd::TxnRequest, etcd::TxnResponse> = Default::default();
    Ok(grpc
        .unary(tonic::Request::new(request), path, codec)
        .await
        .context("etcd Txn")?
        .into_inner())
}

/// One caller: leases on its share of the keys until `until`; returns
/// (leases, tokens granted, attempts, latencies in µs).
async fn caller(
    channel: Channel,
    first_key: u64,
    args: std::sync::Arc<load::LoadArgs>,
    until: Instant,
) -> Result<(u64, u64, u64, Vec<u64>)> {
    let mut seen: HashMap<Vec<u8>, (i64, u64)> = HashMap::new();
    let (mut leases, mut tokens, mut attempts) = (0u64, 0u64, 0u64);
    let mut latencies = Vec::new();
    let mut next = first_key;
    while Instant::now() < until {
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as u64;
        let window = now_ms - now_ms % args.window_ms;
        let key = format!("lease:{}:{window}", next % args.keys).into_bytes();
        next += args.in_flight as u64;
        let started = Instant::now();
        loop {
            let state = seen.get(&key).copied().unwrap_or((0, 0));
            let (request, granted) = lease_txn(&key, state, args.tokens, args.limit);
            attempts += 1;
            let response = txn(&channel, request).await?;
            if response.succeeded {
                let revision = response.header.map_or(0, |h| h.revision);
                seen.insert(key.clone(), (revision, state.1 + granted));
                tokens += granted;
                break;
            }
            seen.insert(key.clone(), seen_after_failure(&response));
        }
        leases += 1;
        latencies.push(u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    Ok((leases, tokens, attempts, latencies))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = std::sync::Arc::new(parse_load_args("endpoint", "127.0.0.1:2379")?);
    let channel = Channel::from_shared(format!("http://{}", args.target))?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connect to etcd at {}", args.target))?;
    let started = Instant::now();
    let until = started + args.duration;
    let mut callers = JoinSet::new();
    for i in 0..args.in_flight {
        callers.spawn(caller(channel.clone(), i as u64, args.clone(), until));
    }
    let (mut leases, mut tokens, mut attempts) = (0u64, 0u64, 0u64);
    let mut latencies_us = Vec::new();
    while let Some(done) = callers.join_next().await {
        let (l, t, a, lat) = done??;
        leases += l;
        tokens += t;
        attempts += a;
        latencies_us.extend(lat);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies_us.sort_unstable();
    println!(
        "{}",
        json!({
            "target": "etcd",
            "endpoint": args.target,
            "in_flight": args.in_flight,
            "keys": args.keys,
            "duration_secs": elapsed,
            "leases": leases,
            "tokens_granted": tokens,
            "txn_attempts": attempts,
            "leases_per_sec": leases as f64 / elapsed.max(1e-9),
            "latency_ms": latency_report(&latencies_us),
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_lease_never_takes_past_the_limit() {
        let (request, granted) = lease_txn(b"k", (7, 95), 10, 100);
        assert_eq!(granted, 5);
        assert_eq!(request.compare[0].mod_revision, 7);
        assert_eq!(
            request.success[0].request_put.as_ref().unwrap().value,
            b"100".to_vec()
        );
        let (_, none) = lease_txn(b"k", (8, 100), 10, 100);
        assert_eq!(none, 0);
    }

    #[test]
    fn a_failed_compare_reads_back_the_counter() {
        let response = etcd::TxnResponse {
            header: None,
            succeeded: false,
            responses: vec![etcd::ResponseOp {
                response_range: Some(etcd::RangeResponse {
                    header: None,
                    kvs: vec![etcd::KeyValue {
                        key: b"k".to_vec(),
                        mod_revision: 42,
                        value: b"17".to_vec(),
                    }],
                }),
            }],
        };
        // Survives the wire, and reads (revision, used).
        let decoded = etcd::TxnResponse::decode(response.encode_to_vec().as_slice()).unwrap();
        assert_eq!(seen_after_failure(&decoded), (42, 17));
        assert_eq!(seen_after_failure(&etcd::TxnResponse::default()), (0, 0));
    }
}
