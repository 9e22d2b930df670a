//! The Raft transport, server side: the `leasehold.v1.Raft` service decodes
//! postcard-encoded openraft requests, hands them to the local Raft member
//! and returns its `Result` (postcard-encoded, errors included) so the
//! sending side sees openraft's own errors.
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
use crate::auth::{authorize_raft_sender, AuthRefusals, PeerInfo};

/// Serves peer Raft RPCs for one member.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
    refusals: Arc<AuthRefusals>,
}

impl RaftService {
    /// The service for `raft`, with message limits large enough for
    /// snapshot chunks; refused senders are counted in `refusals`.
    pub fn server(raft: Raft, refusals: Arc<AuthRefusals>) -> RaftServer<Self> {
        RaftServer::new(Self { raft, refusals })
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
        request: Request<RaftPayload>,
        what: &str,
        sender: impl Fn(&T) -> NodeId,
    ) -> Result<T, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let rpc: T = decode(request)?;
        let claimed = sender(&rpc);
        authorize_raft_sender(
            peer.as_ref().map(|p| &p.principal),
            claimed,
            &self.members(),
        )
        .map_err(|refusal| self.refusals.refuse(peer.as_ref(), what, refusal))?;
        Ok(rpc)
    }
}

fn decode<T: DeserializeOwned>(request: Request<RaftPayload>) -> Result<T, Status> {
    postcard::from_bytes(&request.into_inner().data).map_err(|e| {
        refusal(
            Reason::MalformedRequest,
            format!("undecodable raft payload: {e}"),
        )
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    postcard::to_allocvec(value)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| refusal(Reason::Internal, format!("cannot encode raft reply: {e}")))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = self.admit(request, "Raft/AppendEntries", |r: &AppendEntriesRequest| {
            r.vote.leader_id.node_id
        })?;
        encode(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = self.admit(request, "Raft/Vote", |r: &VoteRequest| {
            r.vote.leader_id.node_id
        })?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = self.admit(
            request,
            "Raft/InstallSnapshot",
            |r: &InstallSnapshotRequest| r.vote.leader_id.node_id,
        )?;
        encode(&self.raft.install_snapshot(rpc).await)
    }
}
