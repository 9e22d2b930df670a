//! The Raft transport, server side: the `leasehold.v1.Raft` service decodes
//! postcard-encoded openraft requests, hands them to the local Raft member
//! and returns its `Result` (postcard-encoded, errors included) so the
//! sending side sees openraft's own errors.

use leasehold_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use leasehold_proto::v1::RaftPayload;
use leasehold_raft_store::Raft;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::network::MAX_PEER_MESSAGE_BYTES;

/// Serves peer Raft RPCs for one member.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
}

impl RaftService {
    /// The service for `raft`, with message limits large enough for snapshot chunks.
    pub fn server(raft: Raft) -> RaftServer<Self> {
        RaftServer::new(Self { raft })
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
    }
}

fn decode<T: DeserializeOwned>(request: Request<RaftPayload>) -> Result<T, Status> {
    postcard::from_bytes(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft payload: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    postcard::to_allocvec(value)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(format!("cannot encode raft reply: {e}")))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        encode(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        encode(&self.raft.install_snapshot(rpc).await)
    }
}
