//! The Raft transport, client side: openraft's `RaftNetworkFactory` over the
//! `leasehold.v1.Raft` gRPC service, with postcard-encoded openraft messages.
//!
//! Channels come from the injected [`Dialer`] and are cached per peer
//! address. Every call is bounded by openraft's `option.hard_ttl()`; after any
//! failed or timed-out call the cached channel is dropped, so the next call
//! re-dials instead of reusing a connection that may be wedged.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_client::transport::{DialError, Dialer};
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

/// Largest gRPC message between peers (snapshot chunks, batches of entries).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

type RpcResult<T, E = openraft::error::Infallible> =
    Result<T, RPCError<NodeId, Node, RaftError<NodeId, E>>>;

/// Creates per-peer connections for openraft; shares one channel cache.
#[derive(Clone)]
pub struct PeerNetwork {
    my_id: NodeId,
    dialer: Arc<dyn Dialer>,
    channels: Arc<Mutex<HashMap<String, Channel>>>,
}

impl PeerNetwork {
    /// A network for member `my_id` dialling peers with `dialer`.
    pub fn new(my_id: NodeId, dialer: Arc<dyn Dialer>) -> Self {
        Self {
            my_id,
            dialer,
            channels: Arc::default(),
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
        let channel = self.channel().await.map_err(CallError::Dial)?;
        let mut client = RaftClient::new(channel)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let mut grpc_request = tonic::Request::new(RaftPayload { data });
        grpc_request.set_timeout(ttl);
        let call = async {
            match action {
                RPCTypes::AppendEntries => client.append_entries(grpc_request).await,
                RPCTypes::Vote => client.vote(grpc_request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(grpc_request).await,
            }
        };
        let result = match tokio::time::timeout(ttl, call).await {
            Err(_) => Err(CallError::Timeout(ttl)),
            Ok(Err(status)) => Err(CallError::Status(status)),
            Ok(Ok(response)) => {
                postcard::from_bytes(&response.into_inner().data).map_err(CallError::Codec)
            }
        };
        if result.is_err() {
            self.forget_channel();
        }
        result
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
