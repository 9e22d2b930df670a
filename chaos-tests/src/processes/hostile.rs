//! Hostile peers against real mutual-TLS processes, interleaved with the
//! usual faults: Raft messages forged with certificates the cluster must
//! not listen to (a retired member's, a stranger's, a member claiming
//! another's id) at plausible and absurd terms, over both transports and
//! also at a member that is joining; TLS handshakes stalled from another
//! source address; and a service flooding an escrow node with holders.
//! Every forged message and its answer is recorded for the `hostile`
//! invariant; the flooder's grants are recorded as admissions, so Δ counts
//! them.

use std::sync::Arc;
use std::time::Duration;

use leasehold_client::coordinator::{CoordinatorClient, RetryOptions};
use leasehold_client::transport::Dialer;
use leasehold_core::principal::Principal;
use leasehold_node::coordinator::frame_link::{FrameLink, LinkError};
use leasehold_node::coordinator::peer_frames::FrameKind;
use leasehold_node::coordinator::raft_service::MAX_TERM_STEP;
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::raft_client::RaftClient;
use leasehold_raft_store::{AppendEntriesRequest, VoteRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

use super::identities::Identities;
use super::wall_now_ms;
use crate::history::{Admission, PeerAnswer, PeerProbe, Recorder, HOSTILE_CLIENT_BASE};

/// A certificate and the member id its messages claim.
#[derive(Debug, Clone, Copy)]
pub struct Forger {
    /// The member id of the certificate.
    pub certificate: u64,
    /// The sender the messages name.
    pub claims: u64,
    /// Why the cluster must not listen (`retired`, `stranger`, `impostor`).
    pub kind: &'static str,
}

/// The term `addr` is at, asked as the operator (1 when it does not say).
async fn term_of(ids: &Identities, addr: &str) -> u64 {
    let Ok(client) = CoordinatorClient::with_options(
        [addr],
        ids.dialer(&super::identities::operator()),
        RetryOptions {
            call_timeout: Duration::from_millis(500),
            total_timeout: Duration::from_millis(500),
            max_attempts: 1,
            ..RetryOptions::default()
        },
    ) else {
        return 1;
    };
    client
        .admin()
        .status()
        .await
        .map_or(1, |s| s.current_term.max(1))
}

fn payload<T: serde::Serialize>(request: &T) -> Vec<u8> {
    postcard::to_allocvec(request).unwrap_or_default()
}

/// Sends every forger's Vote and AppendEntries at a plausible term (one
/// ahead), beyond the step and at the edge of the type, to every target,
/// over gRPC and framed; records each answer. Returns how many were sent.
pub async fn forge_raft_messages(
    ids: &Identities,
    targets: &[String],
    forgers: &[Forger],
    recorder: &Recorder,
) -> usize {
    let mut sent = 0;
    for target in targets {
        let current = term_of(ids, target).await;
        for forger in forgers {
            let dialer = ids.dialer(&Principal::Member(forger.certificate));
            for term in [current + 1, current + MAX_TERM_STEP + 1, u64::MAX - 4] {
                let vote = VoteRequest {
                    vote: openraft::Vote::new(term, forger.claims),
                    last_log_id: None,
                };
                let append = AppendEntriesRequest {
                    vote: openraft::Vote::new_committed(term, forger.claims),
                    prev_log_id: None,
                    entries: Vec::new(),
                    leader_commit: None,
                };
                let from = format!(
                    "member {}'s certificate ({}) claiming member {}",
                    forger.certificate, forger.kind, forger.claims
                );
                for (message, body, kind) in [
                    ("Vote", payload(&vote), FrameKind::Vote),
                    ("AppendEntries", payload(&append), FrameKind::AppendEntries),
                ] {
                    let answer = over_grpc(&*dialer, target, message, body.clone()).await;
                    recorder.peer_probe(PeerProbe {
                        from: from.clone(),
                        to: target.clone(),
                        message: format!("{message} over gRPC"),
                        term,
                        answer,
                    });
                    let answer = framed(&*dialer, target, kind, &body).await;
                    recorder.peer_probe(PeerProbe {
                        from: from.clone(),
                        to: target.clone(),
                        message: format!("{message} framed"),
                        term,
                        answer,
                    });
                    sent += 2;
                }
            }
        }
    }
    sent
}

async fn over_grpc(dialer: &dyn Dialer, addr: &str, message: &str, data: Vec<u8>) -> PeerAnswer {
    let Ok(channel) = dialer.dial(addr).await else {
        return PeerAnswer::NoAnswer;
    };
    let mut client = RaftClient::new(channel);
    let request = tonic::Request::new(pb::RaftPayload { data, shard: 0 });
    let answer = match message {
        "Vote" => client.vote(request).await,
        _ => client.append_entries(request).await,
    };
    match answer {
        Ok(_) => PeerAnswer::Accepted,
        Err(status) => {
            let reason = status
                .metadata()
                .get("leasehold-reason")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            match status.code() {
                tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                    if reason.is_empty() =>
                {
                    PeerAnswer::NoAnswer
                }
                code => PeerAnswer::Refused {
                    code: format!("{code:?}"),
                    reason,
                },
            }
        }
    }
}

async fn framed(dialer: &dyn Dialer, addr: &str, kind: FrameKind, body: &[u8]) -> PeerAnswer {
    let link = match FrameLink::connect(dialer, addr, Duration::from_secs(2), 1 << 20).await {
        Ok(link) => link,
        Err(LinkError::NotSpoken) => return PeerAnswer::ConnectionRefused,
        Err(_) => return PeerAnswer::NoAnswer,
    };
    match link.call(kind, body).await {
        Ok(Ok(_)) => PeerAnswer::Accepted,
        Ok(Err(reason)) => PeerAnswer::Refused {
            code: reason.split(':').next().unwrap_or_default().to_string(),
            reason,
        },
        Err(_) => PeerAnswer::NoAnswer,
    }
}

/// The first bytes of a TLS record, after which a hoarder stalls.
const STALLED_RECORD: [u8; 5] = [0x16, 0x03, 0x01, 0x02, 0x00];

/// Keeps `per_target` connections to each target from 127.0.0.2 that send
/// five bytes of a TLS record and stall, reopening each as the target
/// closes it, until `until_ms`. The handle answers how many were opened.
pub fn stall_handshakes(targets: Vec<String>, per_target: usize, until_ms: u64) -> JoinHandle<u64> {
    tokio::spawn(async move {
        let mut slots = Vec::new();
        for target in targets {
            for _ in 0..per_target {
                let target = target.clone();
                slots.push(tokio::spawn(async move {
                    let mut opened = 0u64;
                    while wall_now_ms() < until_ms {
                        let Ok(mut stream) = connect_from_other_source(&target).await else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        opened += 1;
                        let _ = stream.write_all(&STALLED_RECORD).await;
                        let left = until_ms.saturating_sub(wall_now_ms());
                        let mut byte = [0u8; 64];
                        // Held until the target gives up on it (or the run ends).
                        let _ = tokio::time::timeout(
                            Duration::from_millis(left),
                            stream.read(&mut byte),
                        )
                        .await;
                    }
                    opened
                }));
            }
        }
        let mut opened = 0;
        for slot in slots {
            opened += slot.await.unwrap_or(0);
        }
        opened
    })
}

async fn connect_from_other_source(target: &str) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.2:0".parse().map_err(std::io::Error::other)?)?;
    let addr = target.parse().map_err(std::io::Error::other)?;
    socket.connect(addr).await
}

/// What a holder flood got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FloodCounts {
    /// Acquires sent, each under a new holder.
    pub sent: u64,
    /// Tokens granted (recorded as the flooder's admissions).
    pub granted: u64,
    /// Refused `RESOURCE_EXHAUSTED` (its holders bound, or the node's).
    pub refused_exhausted: u64,
}

/// A service of the escrow node's region asks `addr` for one token of
/// `key` under a new holder (client id) each time, 8 at once, until
/// `until_ms`; what it is granted is recorded as admissions of hostile
/// client `index`.
pub fn flood_holders(
    dialer: Arc<dyn Dialer>,
    addr: String,
    key: &'static str,
    index: usize,
    until_ms: u64,
    recorder: Recorder,
) -> JoinHandle<FloodCounts> {
    tokio::spawn(async move {
        let mut lanes = Vec::new();
        for lane in 0..8u64 {
            let (dialer, addr, recorder) = (dialer.clone(), addr.clone(), recorder.clone());
            lanes.push(tokio::spawn(async move {
                let mut counts = FloodCounts::default();
                let Ok(channel) = dialer.dial(&addr).await else {
                    return counts;
                };
                let mut client = pb::escrow_client::EscrowClient::new(channel);
                let mut n = 0u64;
                while wall_now_ms() < until_ms {
                    n += 1;
                    counts.sent += 1;
                    let reply = client
                        .acquire(pb::AcquireRequest {
                            key: key.into(),
                            tenant: String::new(),
                            weight: 0,
                            tokens: 1,
                            request_id: Some(pb::RequestId {
                                client_id: format!("flood-{lane}-{n}"),
                                seq: 1,
                            }),
                        })
                        .await;
                    match reply {
                        Ok(reply) => {
                            let reply = reply.into_inner();
                            let at_ms = wall_now_ms();
                            // Spent at once, as long as the window lasts.
                            if reply.granted > 0 && at_ms < reply.window_end_ms {
                                counts.granted += reply.granted;
                                recorder.admit(Admission {
                                    client: HOSTILE_CLIENT_BASE + index,
                                    key,
                                    cost: reply.granted,
                                    window_start_ms: reply.window_start_ms,
                                    at_ms,
                                });
                            }
                        }
                        Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                            counts.refused_exhausted += 1;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
                counts
            }));
        }
        let mut total = FloodCounts::default();
        for lane in lanes {
            let counts = lane.await.unwrap_or_default();
            total.sent += counts.sent;
            total.granted += counts.granted;
            total.refused_exhausted += counts.refused_exhausted;
        }
        total
    })
}
