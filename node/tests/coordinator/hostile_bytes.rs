//! Every gRPC method of a member fed arbitrary bytes and arbitrary field
//! values: each call ends in an answer or a clear status, never a panic,
//! and the member keeps granting afterwards. Every refusal carries a
//! `google.rpc.ErrorInfo` of domain `leasehold.v1` whose reason travels
//! with the status's code (the proto's contract).

use anyhow::{ensure, Result};
use bytes::{Buf, BufMut};
use leasehold_proto::refusal::{reason_of, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::Code;

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

/// Sends and receives message bodies as raw bytes, so a test can put any
/// bytes on the wire where a protobuf message belongs.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

#[derive(Debug, Clone, Copy, Default)]
struct RawEncoder;

#[derive(Debug, Clone, Copy, Default)]
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}

/// Every unary method a member serves.
const METHODS: &[&str] = &[
    "/leasehold.v1.Coordinator/Lease",
    "/leasehold.v1.Coordinator/LeaseBatch",
    "/leasehold.v1.Coordinator/Reconcile",
    "/leasehold.v1.Coordinator/PoolGrant",
    "/leasehold.v1.Coordinator/GetWindow",
    "/leasehold.v1.Admin/Init",
    "/leasehold.v1.Admin/AddLearner",
    "/leasehold.v1.Admin/ChangeMembership",
    "/leasehold.v1.Admin/StepDown",
    "/leasehold.v1.Admin/Status",
    "/leasehold.v1.Admin/SetPolicy",
    "/leasehold.v1.Admin/DeletePolicy",
    "/leasehold.v1.Admin/ListPolicies",
    "/leasehold.v1.Raft/AppendEntries",
    "/leasehold.v1.Raft/Vote",
    "/leasehold.v1.Raft/InstallSnapshot",
];

/// The answer's code; a refusal without a Leasehold `ErrorInfo`, or with
/// one whose reason goes with another code, is an error. tonic's own decode
/// failure (reason `MALFORMED_REQUEST`) is told apart as [`UNDECODABLE`].
async fn call_raw(channel: Channel, method: &'static str, body: Vec<u8>) -> Result<Code> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static(method);
    let mut request = tonic::Request::new(body);
    request.set_timeout(std::time::Duration::from_secs(5));
    Ok(match grpc.unary(request, path, RawCodec).await {
        Ok(_) => Code::Ok,
        Err(status) => {
            let reason = reason_of(&status);
            ensure!(
                reason.is_some_and(|reason| reason.code() == status.code()),
                "{method}: a refusal without a matching ErrorInfo reason: {status:?}"
            );
            if reason == Some(Reason::MalformedRequest) {
                UNDECODABLE
            } else {
                status.code()
            }
        }
    })
}

/// What [`call_raw`] reports for a body tonic could not decode.
const UNDECODABLE: Code = Code::DataLoss;

/// One protobuf field with an arbitrary value of a valid wire type.
#[derive(Debug, Clone)]
enum Field {
    Varint(u32, u64),
    Bytes(u32, Vec<u8>),
    Text(u32, String),
    Nested(u32, Vec<(u32, u64)>),
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn put_len(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_varint(out, u64::from(number) << 3 | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Encodes fields as a protobuf message body: well-formed framing with
/// arbitrary field numbers and values, so decoding mostly succeeds and the
/// handlers see arbitrary messages.
fn encode_fields(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in fields {
        match field {
            Field::Varint(number, value) => {
                put_varint(&mut out, u64::from(*number) << 3);
                put_varint(&mut out, *value);
            }
            Field::Bytes(number, bytes) => put_len(&mut out, *number, bytes),
            Field::Text(number, text) => put_len(&mut out, *number, text.as_bytes()),
            Field::Nested(number, inner) => {
                let mut nested = Vec::new();
                for (n, v) in inner {
                    put_varint(&mut nested, u64::from(*n) << 3);
                    put_varint(&mut nested, *v);
                }
                put_len(&mut out, *number, &nested);
            }
        }
    }
    out
}

fn field() -> impl Strategy<Value = Field> {
    let number = 1u32..12;
    let small_or_any = prop_oneof![0u64..4, any::<u64>()];
    prop_oneof![
        (number.clone(), small_or_any.clone()).prop_map(|(n, v)| Field::Varint(n, v)),
        (number.clone(), prop::collection::vec(any::<u8>(), 0..200))
            .prop_map(|(n, b)| Field::Bytes(n, b)),
        (number.clone(), ".{0,40}").prop_map(|(n, t)| Field::Text(n, t)),
        (number, prop::collection::vec((1u32..8, small_or_any), 0..4))
            .prop_map(|(n, inner)| Field::Nested(n, inner)),
    ]
}

fn arbitrary_bodies(cases: u32) -> Vec<(usize, Vec<u8>)> {
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let body = prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..256),
        4 => prop::collection::vec(field(), 0..6).prop_map(|fields| encode_fields(&fields)),
    ];
    let strategy = (0..METHODS.len(), body);
    (0..cases)
        .map(|_| strategy.new_tree(&mut runner).expect("a value").current())
        .collect()
}

fn arbitrary_leases(cases: u32) -> Vec<pb::LeaseRequest> {
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let strategy = (
        ".{0,300}",
        ".{0,80}",
        any::<u64>(),
        proptest::option::of((".{0,200}", any::<u64>())),
    )
        .prop_map(|(key, region, tokens, id)| pb::LeaseRequest {
            key,
            region,
            tokens,
            request_id: id.map(|(client_id, seq)| pb::RequestId { client_id, seq }),
        });
    (0..cases)
        .map(|_| strategy.new_tree(&mut runner).expect("a value").current())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arbitrary_bytes_on_every_method_never_break_a_member() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addr(1)))?
        .connect()
        .await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("fz/", 1_000, LONG_WINDOW_MS))
        .await?;

    let mut reached_a_handler = 0;
    for (method, body) in arbitrary_bodies(400) {
        let code = call_raw(channel.clone(), METHODS[method], body).await?;
        ensure!(
            !matches!(code, Code::Internal | Code::Unknown),
            "{} answered {code:?}",
            METHODS[method]
        );
        if code != UNDECODABLE {
            reached_a_handler += 1;
        }
    }
    // Many bodies are well-framed protobuf of the method's type: many calls
    // test the handlers themselves, not only the decoder (about half; a
    // batch's nested items fail to decode more often).
    ensure!(
        reached_a_handler >= 160,
        "only {reached_a_handler} of 400 decoded"
    );

    let mut api = CoordinatorRpc::new(channel.clone());
    for request in arbitrary_leases(200) {
        match api.lease(request.clone()).await {
            Ok(response) => {
                let response = response.into_inner();
                ensure!(
                    response.granted <= request.tokens,
                    "{request:?} → {response:?}"
                );
            }
            Err(status) => ensure!(
                !matches!(status.code(), Code::Internal | Code::Unknown)
                    && reason_of(&status).is_some_and(|r| r.code() == status.code()),
                "{request:?} → {status:?}"
            ),
        }
    }

    // The member still serves: re-assert the policy (random admin calls may
    // have replaced it) and lease through elections if a random vote moved
    // the term.
    client
        .admin()
        .set_policy(counter_policy("fz/", 1_000, LONG_WINDOW_MS))
        .await?;
    let grant = client.lease("fz/after", "eu", 3).await?;
    ensure!(grant.granted == 3, "{grant:?}");
    cluster.stop_all().await
}
