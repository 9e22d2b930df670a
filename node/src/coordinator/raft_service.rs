//! The Raft transport, server side: [`RaftService::handle`] decodes
//! postcard-encoded openraft requests, hands them to the local Raft member
//! and returns its `Result` (postcard-encoded, errors included) so the
//! sending side sees openraft's own errors — for the `leasehold.v1.Raft`
//! gRPC service and for the framed transport ([`super::frame_server`]).
//!
//! Before a message reaches Raft, its claimed sender (the vote's node id)
//! is checked against the caller's certificate and this node's current
//! membership ([`authorize_raft_sender`]); a refused message never touches
//! the member's term or log.

use std::collections::BTreeSet;
use std::sync::Arc;

use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use leasehold_proto::v1::RaftPayload;
use leasehold_raft_store::{
    AppendEntriesRequest, InstallSnapshotRequest, NodeId, Raft, VoteRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::network::MAX_PEER_MESSAGE_BYTES;
use crate::auth::{authorize_call, authorize_raft_sender, AuthRefusals, PeerInfo, Scope};

/// Serves peer Raft RPCs for one member.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    refusals: Arc<AuthRefusals>,
}

/// One of Raft's three peer messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftMessage {
    /// `AppendEntries` (heartbeats included).
    AppendEntries,
    /// `Vote`.
    Vote,
    /// `InstallSnapshot` (one chunk).
    InstallSnapshot,
}

impl RaftMessage {
    /// The call's name in refusals and logs.
    fn call_name(self) -> &'static str {
        match self {
            RaftMessage::AppendEntries => "Raft/AppendEntries",
            RaftMessage::Vote => "Raft/Vote",
            RaftMessage::InstallSnapshot => "Raft/InstallSnapshot",
        }
    }
}

impl RaftService {
    /// The handler of `raft`'s peer messages; refused senders are counted
    /// in `refusals`.
    pub fn new(raft: Raft, refusals: Arc<AuthRefusals>) -> Self {
        Self { raft, refusals }
    }

    /// The gRPC service for `raft`, with message limits large enough for
    /// snapshot chunks; refused senders are counted in `refusals`.
    pub fn server(raft: Raft, refusals: Arc<AuthRefusals>) -> RaftServer<Self> {
        RaftServer::new(Self::new(raft, refusals))
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
    }

    /// This node's current membership: voters and learners (empty while
    /// it has none).
    fn members(&self) -> BTreeSet<NodeId> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect()
    }

    /// Decodes the message and admits it only from its claimed sender.
    fn admit<T: DeserializeOwned>(
        &self,
        data: &[u8],
        peer: Option<&PeerInfo>,
        what: &str,
        sender: impl Fn(&T) -> NodeId,
    ) -> Result<T, Status> {
        let rpc: T = decode(data)?;
        let claimed = sender(&rpc);
        authorize_raft_sender(peer.map(|p| &p.principal), claimed, &self.members())
            .map_err(|refusal| self.refusals.refuse(peer, what, refusal))?;
        Ok(rpc)
    }

    /// Whether `peer` (`None` on a plaintext listener) may open a framed
    /// Raft connection: on a TLS listener only a member's certificate, as
    /// for the gRPC `Raft` service (each message's sender is checked
    /// again). A refusal is counted and logged like a refused call.
    pub fn admit_framed_connection(&self, peer: Option<&PeerInfo>) -> Result<(), Status> {
        authorize_call(
            "/leasehold.v1.Raft/AppendEntries",
            peer.map(|p| &p.principal),
            &Scope::Coordinator,
        )
        .map_err(|refusal| self.refusals.refuse(peer, "Raft (framed)", refusal))
    }

    /// Decodes one postcard-encoded message from `peer` (`None` on a
    /// plaintext listener), admits it only from its claimed sender, hands
    /// it to Raft and returns Raft's `Result` postcard-encoded (errors
    /// included, so the sender sees openraft's own). Both transports — the
    /// gRPC `Raft` service and the framed one — answer through it.
    pub async fn handle(
        &self,
        message: RaftMessage,
        data: &[u8],
        peer: Option<&PeerInfo>,
    ) -> Result<Vec<u8>, Status> {
        let what = message.call_name();
        match message {
            RaftMessage::AppendEntries => {
                let rpc = self.admit(data, peer, what, |r: &AppendEntriesRequest| {
                    r.vote.leader_id.node_id
                })?;
                encode(&self.raft.append_entries(rpc).await)
            }
            RaftMessage::Vote => {
                let rpc =
                    self.admit(data, peer, what, |r: &VoteRequest| r.vote.leader_id.node_id)?;
                encode(&self.raft.vote(rpc).await)
            }
            RaftMessage::InstallSnapshot => {
                let rpc = self.admit(data, peer, what, |r: &InstallSnapshotRequest| {
                    r.vote.leader_id.node_id
                })?;
                encode(&self.raft.install_snapshot(rpc).await)
            }
        }
    }

    async fn serve_grpc(
        &self,
        message: RaftMessage,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let data = request.into_inner().data;
        let data = self.handle(message, &data, peer.as_ref()).await?;
        Ok(Response::new(RaftPayload { data }))
    }
}

fn decode<T: DeserializeOwned>(data: &[u8]) -> Result<T, Status> {
    postcard::from_bytes(data).map_err(|e| {
        refusal(
            Reason::MalformedRequest,
            format!("undecodable raft payload: {e}"),
        )
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, Status> {
    postcard::to_allocvec(value)
        .map_err(|e| refusal(Reason::Internal, format!("cannot encode raft reply: {e}")))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.serve_grpc(RaftMessage::AppendEntries, request).await
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        self.serve_grpc(RaftMessage::Vote, request).await
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.serve_grpc(RaftMessage::InstallSnapshot, request).await
    }
}
