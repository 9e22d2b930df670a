//! The Raft transport, client side: openraft's `RaftNetworkFactory`, sending
//! postcard-encoded openraft messages as frames over one connection per
//! peer ([`super::frame_link`]), or as calls of the `leasehold.v1.Raft` gRPC
//! service to a peer that does not speak frames (an older member) or over
//! a dialer that makes no byte streams.
//!
//! Links and channels come from the injected [`Dialer`] and are cached per
//! peer address; a peer that answered the frame preface with anything else
//! is called over gRPC for [`GRPC_FALLBACK_FOR`] before frames are tried
//! again. Every call is bounded by openraft's `option.hard_ttl()`; after any
//! failed or timed-out call the cached link and channel are dropped, so the
//! next call re-dials instead of reusing a connection that may be wedged.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_client::transport::{DialError, Dialer};
use leasehold_core::shard::ShardId;
use leasehold_proto::v1::raft_client::RaftClient;
use leasehold_proto::v1::RaftPayload;
use leasehold_raft_store::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    Node, NodeId, TypeConfig, VoteRequest, VoteResponse,
};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::Channel;

use super::frame_link::{FrameLink, LinkError};
use super::peer_frames::{request_frame, RaftMessage};
use super::peer_links::{LinkChange, PeerLinks, LOST_AFTER_FAILURES};

/// How long a peer that does not speak frames is called over gRPC before
/// frames are tried again (a rolling upgrade moves it on meanwhile).
pub const GRPC_FALLBACK_FOR: Duration = Duration::from_secs(30);

/// The framed link to one peer address, as last found.
#[derive(Clone)]
enum FrameLinkState {
    /// Connected.
    Up(Arc<FrameLink>),
    /// The peer (or the dialer) speaks gRPC only, until then.
    GrpcUntil(tokio::time::Instant),
}

/// Ceiling of the peer message limit: no configuration may let a peer
/// message exceed this. The limit actually in force is derived from the
/// Raft configuration by [`peer_message_limit_bytes`] (9 MiB by default).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Upper bound of one encoded state-machine command (the largest, a
/// `Lease` with a 256-byte key, a 64-byte region, a 128-byte client id and
/// the longest caller identity, encodes to about 600 bytes, under three
/// quarters of it; a unit test keeps it so). One command is larger: a part
/// of a move of slots (`AcquireSlots`, at most 64 KiB of keys, or one key
/// alone), proposed as an entry of its own and covered by
/// [`PEER_MESSAGE_HEADROOM_BYTES`].
pub const MAX_ENCODED_COMMAND_BYTES: usize = 1024;

/// Room above the computed payload for the envelope of a peer message
/// (log ids, vote, membership entries, postcard and gRPC framing).
pub const PEER_MESSAGE_HEADROOM_BYTES: usize = 1024 * 1024;

/// The largest peer message a member sends or accepts: the larger of an
/// `AppendEntries` of `max_payload_entries` entries of `max_batch_commands`
/// commands each and one snapshot chunk of `snapshot_chunk_bytes`, plus
/// [`PEER_MESSAGE_HEADROOM_BYTES`]. `None` when that overflows.
pub fn peer_message_limit_bytes(
    max_payload_entries: u64,
    max_batch_commands: usize,
    snapshot_chunk_bytes: u64,
) -> Option<usize> {
    let entries = usize::try_from(max_payload_entries).ok()?;
    let entry_bytes = max_batch_commands.checked_mul(MAX_ENCODED_COMMAND_BYTES)?;
    let append_bytes = entries.checked_mul(entry_bytes)?;
    let chunk_bytes = usize::try_from(snapshot_chunk_bytes).ok()?;
    append_bytes
        .max(chunk_bytes)
        .checked_add(PEER_MESSAGE_HEADROOM_BYTES)
}

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, Node, RaftError<NodeId, E>>>;

/// Creates per-peer connections for openraft; shares one channel cache.
/// Every group of a member uses a copy ([`PeerNetwork::for_shard`]) that
/// shares its links: one connection per peer carries them all.
#[derive(Clone)]
pub struct PeerNetwork {
    my_id: NodeId,
    /// The group whose messages this copy sends.
    shard: ShardId,
    dialer: Arc<dyn Dialer>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
    frame_links: Arc<Mutex<HashMap<String, FrameLinkState>>>,
    max_message_bytes: usize,
    links: Arc<Mutex<PeerLinks>>,
    started: tokio::time::Instant,
}

impl PeerNetwork {
    /// A network for member `my_id` dialling peers with `dialer`.
    /// Messages are limited to [`MAX_PEER_MESSAGE_BYTES`] until
    /// [`with_max_message_bytes`](Self::with_max_message_bytes) lowers it.
    pub fn new(my_id: NodeId, dialer: Arc<dyn Dialer>) -> Self {
        Self {
            my_id,
            shard: ShardId(0),
            dialer,
            channels: Arc::default(),
            frame_links: Arc::default(),
            max_message_bytes: MAX_PEER_MESSAGE_BYTES,
            links: Arc::default(),
            started: tokio::time::Instant::now(),
        }
    }

    /// The same network, sending and accepting peer messages of at most
    /// `bytes` (capped at [`MAX_PEER_MESSAGE_BYTES`]).
    pub fn with_max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes.min(MAX_PEER_MESSAGE_BYTES);
        self
    }

    /// The same network (the same links to the same peers) sending the
    /// messages of `shard`'s group.
    pub fn for_shard(&self, shard: ShardId) -> Self {
        Self {
            shard,
            ..self.clone()
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerConnection {
        PeerConnection {
            network: self.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

/// openraft's connection to one peer.
pub struct PeerConnection {
    network: PeerNetwork,
    target: NodeId,
    addr: String,
}

/// Why one peer call failed, before it is mapped to openraft's errors.
enum CallError {
    Dial(DialError),
    Status(tonic::Status),
    Timeout(Duration),
    Codec(postcard::Error),
    /// The framed link failed.
    Frames(LinkError),
    /// The peer refused the framed request (a UTF-8 reason).
    Refused(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Dial(e) => write!(f, "{e}"),
            CallError::Status(status) => {
                write!(f, "{:?}: {}", status.code(), status.message())
            }
            CallError::Timeout(after) => write!(f, "no answer within {} ms", after.as_millis()),
            CallError::Codec(e) => write!(f, "bad message: {e}"),
            CallError::Frames(e) => write!(f, "{e}"),
            CallError::Refused(reason) => write!(f, "refused: {reason}"),
        }
    }
}

impl PeerConnection {
    async fn channel(&self) -> Result<Channel, DialError> {
        if let Some(channel) = self.cache().get(&self.addr) {
            return Ok(channel.clone());
        }
        let channel = self.network.dialer.dial(&self.addr).await?;
        self.cache().insert(self.addr.clone(), channel.clone());
        Ok(channel)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.network
            .channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn forget_channel(&self) {
        self.cache().remove(&self.addr);
    }

    fn frame_links(&self) -> std::sync::MutexGuard<'_, HashMap<String, FrameLinkState>> {
        self.network
            .frame_links
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The framed link to the peer, dialled if there is none; `None` while
    /// the peer (or the dialer) speaks gRPC only.
    async fn frame_link(&self, ttl: Duration) -> Result<Option<Arc<FrameLink>>, CallError> {
        let now = tokio::time::Instant::now();
        match self.frame_links().get(&self.addr) {
            Some(FrameLinkState::Up(link)) if !link.is_broken() => return Ok(Some(link.clone())),
            Some(FrameLinkState::GrpcUntil(until)) if now < *until => return Ok(None),
            _ => {}
        }
        let connected = FrameLink::connect(
            self.network.dialer.as_ref(),
            &self.addr,
            ttl,
            self.network.max_message_bytes,
        )
        .await;
        let state = match connected {
            Ok(link) => FrameLinkState::Up(link),
            Err(LinkError::NotSpoken | LinkError::Dial(DialError::Unsupported { .. })) => {
                tracing::debug!(
                    member = self.network.my_id,
                    peer = self.target,
                    addr = %self.addr,
                    "member {} does not answer framed Raft; calling it over gRPC",
                    self.target
                );
                FrameLinkState::GrpcUntil(now + GRPC_FALLBACK_FOR)
            }
            Err(error) => return Err(CallError::Frames(error)),
        };
        self.frame_links().insert(self.addr.clone(), state.clone());
        Ok(match state {
            FrameLinkState::Up(link) => Some(link),
            FrameLinkState::GrpcUntil(_) => None,
        })
    }

    fn forget_frame_link(&self) {
        let mut links = self.frame_links();
        if matches!(links.get(&self.addr), Some(FrameLinkState::Up(_))) {
            links.remove(&self.addr);
        }
    }

    /// Sends one encoded request and returns the encoded answer: as a
    /// frame when the peer speaks frames, else as a gRPC call.
    async fn exchange(
        &self,
        action: RPCTypes,
        data: Vec<u8>,
        ttl: Duration,
    ) -> Result<Vec<u8>, CallError> {
        let shard = self.network.shard;
        if let Some(link) = self.frame_link(ttl).await? {
            let message = match action {
                RPCTypes::AppendEntries => RaftMessage::AppendEntries,
                RPCTypes::Vote => RaftMessage::Vote,
                RPCTypes::InstallSnapshot => RaftMessage::InstallSnapshot,
            };
            let (kind, body) = request_frame(message, shard, &data);
            return match link.call(kind, &body).await {
                Ok(Ok(answer)) => Ok(answer),
                Ok(Err(reason)) => Err(CallError::Refused(reason)),
                Err(error) => Err(CallError::Frames(error)),
            };
        }
        let channel = self.channel().await.map_err(CallError::Dial)?;
        let mut client = RaftClient::new(channel)
            .max_decoding_message_size(self.network.max_message_bytes)
            .max_encoding_message_size(self.network.max_message_bytes);
        let mut grpc_request = tonic::Request::new(RaftPayload {
            data,
            shard: shard.0,
        });
        grpc_request.set_timeout(ttl);
        let answer = match action {
            RPCTypes::AppendEntries => client.append_entries(grpc_request).await,
            RPCTypes::Vote => client.vote(grpc_request).await,
            RPCTypes::InstallSnapshot => client.install_snapshot(grpc_request).await,
        };
        answer
            .map(|response| response.into_inner().data)
            .map_err(CallError::Status)
    }

    async fn call<Req, Resp>(
        &self,
        action: RPCTypes,
        request: &Req,
        ttl: Duration,
    ) -> Result<Resp, CallError>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
    {
        let data = postcard::to_allocvec(request).map_err(CallError::Codec)?;
        let result = match tokio::time::timeout(ttl, self.exchange(action, data, ttl)).await {
            Err(_) => Err(CallError::Timeout(ttl)),
            Ok(answer) => {
                answer.and_then(|data| postcard::from_bytes(&data).map_err(CallError::Codec))
            }
        };
        if result.is_err() {
            self.forget_channel();
            self.forget_frame_link();
        }
        self.note_link(action, &result);
        result
    }

    /// Logs a lost or restored link to the peer (once per change).
    fn note_link<T>(&self, action: RPCTypes, result: &Result<T, CallError>) {
        let now = u64::try_from(self.network.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let change = {
            let mut links = self
                .network
                .links
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match result {
                Ok(_) => links.on_success(self.target, now),
                Err(error) => links.on_failure(self.target, now, || error.to_string()),
            }
        };
        let what = match action {
            RPCTypes::Vote => "vote requests",
            RPCTypes::AppendEntries | RPCTypes::InstallSnapshot => "replication",
        };
        match change {
            Some(LinkChange::Lost { peer, error }) => tracing::warn!(
                member = self.network.my_id,
                peer,
                addr = %self.addr,
                error = %error,
                "{what} to member {peer} lost ({LOST_AFTER_FAILURES} failed calls in a row); retrying quietly"
            ),
            Some(LinkChange::Restored {
                peer,
                down_ms,
                failed_calls,
            }) => tracing::info!(
                member = self.network.my_id,
                peer,
                addr = %self.addr,
                down_ms,
                failed_calls,
                "{what} to member {peer} restored after {down_ms} ms"
            ),
            None => {}
        }
    }

    fn map_error<E: std::error::Error>(
        &self,
        action: RPCTypes,
        error: CallError,
    ) -> RPCError<NodeId, Node, RaftError<NodeId, E>> {
        match error {
            CallError::Dial(e) => RPCError::Unreachable(Unreachable::new(&e)),
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: self.network.my_id,
                target: self.target,
                timeout,
            }),
            CallError::Status(status) if status.code() == tonic::Code::Unavailable => {
                RPCError::Unreachable(Unreachable::new(&status))
            }
            CallError::Status(status) => RPCError::Network(NetworkError::new(&status)),
            CallError::Codec(e) => RPCError::Network(NetworkError::new(&e)),
            // A dial that failed or a connection that broke: as gRPC's
            // `Unavailable`.
            CallError::Frames(e @ (LinkError::Dial(_) | LinkError::Lost(_))) => {
                RPCError::Unreachable(Unreachable::new(&e))
            }
            CallError::Frames(e) => RPCError::Network(NetworkError::new(&e)),
            CallError::Refused(reason) => {
                RPCError::Network(NetworkError::new(&io::Error::other(reason)))
            }
        }
    }

    #[allow(clippy::result_large_err)] // openraft's own error type
    fn remote<T, E: std::error::Error>(
        &self,
        result: Result<T, RaftError<NodeId, E>>,
    ) -> RpcResult<T, E> {
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse> {
        let action = RPCTypes::AppendEntries;
        let result = self
            .call(action, &rpc, option.hard_ttl())
            .await
            .map_err(|e| self.map_error(action, e))?;
        self.remote(result)
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse, InstallSnapshotError> {
        let action = RPCTypes::InstallSnapshot;
        let result = self
            .call(action, &rpc, option.hard_ttl())
            .await
            .map_err(|e| self.map_error(action, e))?;
        self.remote(result)
    }

    async fn vote(&mut self, rpc: VoteRequest, option: RPCOption) -> RpcResult<VoteResponse> {
        let action = RPCTypes::Vote;
        let result = self
            .call(action, &rpc, option.hard_ttl())
            .await
            .map_err(|e| self.map_error(action, e))?;
        self.remote(result)
    }

    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::coordinator::Command;
    use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
    use leasehold_core::policy::{Policy, PolicyKind};

    #[test]
    fn the_largest_commands_encode_within_the_per_command_bound() {
        let key = Key::new("k".repeat(leasehold_core::ids::MAX_KEY_BYTES)).unwrap();
        let region = RegionId::new("r".repeat(leasehold_core::ids::MAX_REGION_BYTES)).unwrap();
        let request_id = Some(RequestId {
            client: ClientId::new("c".repeat(leasehold_core::ids::MAX_CLIENT_ID_BYTES)).unwrap(),
            seq: u64::MAX,
        });
        let name = "s".repeat(leasehold_core::principal::MAX_PRINCIPAL_NAME_BYTES);
        let caller = leasehold_core::principal::Principal::Service {
            name,
            region: RegionId::new("r".repeat(leasehold_core::ids::MAX_REGION_BYTES)).unwrap(),
        };
        let commands = [
            Command::Lease {
                key: key.clone(),
                region: region.clone(),
                tokens: u64::MAX,
                request_id: request_id.clone(),
                caller: caller.clone(),
            },
            Command::Reconcile {
                key: key.clone(),
                region: region.clone(),
                leftover: u64::MAX,
                window_start_ms: u64::MAX,
                request_id: request_id.clone(),
                caller: caller.clone(),
            },
            Command::PoolGrant {
                key: key.clone(),
                region: region.clone(),
                region_weight: u64::MAX,
                want_total: u64::MAX,
                request_id: request_id.clone(),
                caller: caller.clone(),
            },
            Command::PoolJoinNext {
                key: key.clone(),
                region: region.clone(),
                region_weight: u64::MAX,
                want_total: u64::MAX,
                window_start_ms: u64::MAX,
                retire: true,
                request_id: request_id.clone(),
                caller: caller.clone(),
            },
            Command::PoolRelease {
                key: key.clone(),
                region,
                from_total: u64::MAX,
                keep_total: u64::MAX,
                window_start_ms: u64::MAX,
                request_id,
                caller,
            },
            Command::SetPolicy(Policy {
                prefix: "p".repeat(leasehold_core::ids::MAX_KEY_BYTES),
                limit: u64::MAX,
                window_ms: u64::MAX,
                kind: PolicyKind::Fair,
                outage: leasehold_core::policy::OutagePolicy::Fallback {
                    tokens_per_region: u64::MAX,
                },
                shadow: true,
            }),
        ];
        for command in commands {
            let bytes = postcard::to_allocvec(&command).unwrap().len();
            assert!(
                bytes <= MAX_ENCODED_COMMAND_BYTES * 3 / 4,
                "{command:?} encodes to {bytes} bytes"
            );
        }
    }

    #[test]
    fn the_peer_limit_derives_from_entries_batch_and_chunk_and_refuses_overflow() {
        let limit = peer_message_limit_bytes(8, 1_024, 3 * 1024 * 1024).unwrap();
        assert_eq!(
            limit,
            8 * 1_024 * MAX_ENCODED_COMMAND_BYTES + PEER_MESSAGE_HEADROOM_BYTES
        );
        let chunk_bound = peer_message_limit_bytes(1, 1, 5 * 1024 * 1024).unwrap();
        assert_eq!(chunk_bound, 5 * 1024 * 1024 + PEER_MESSAGE_HEADROOM_BYTES);
        assert_eq!(peer_message_limit_bytes(u64::MAX, usize::MAX, 0), None);
    }
}
