//! The Raft transport, server side: [`RaftService::handle`] decodes
//! postcard-encoded openraft requests, hands them to the local Raft member
//! and returns its `Result` (postcard-encoded, errors included) so the
//! sending side sees openraft's own errors — for the `leasehold.v1.Raft`
//! gRPC service and for the framed transport ([`super::frame_server`]).
//!
//! Before a message reaches Raft, its claimed sender (the vote's node id)
//! is checked against the caller's certificate, this node's current
//! membership — or, before it has one, the members it was told to join —
//! and the replicated record of retired member ids
//! ([`authorize_raft_sender`]; framed connections are checked the same way
//! when they open), and its term against this
//! member's ([`term_in_range`]: no message moves a term by more than
//! [`MAX_TERM_STEP`] or past [`MAX_TERM`], so none can push a cluster to
//! the end of the term's type, where openraft stops for good; ADR 0023); a
//! refused message never touches the member's term or log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use leasehold_core::principal::Principal;
use leasehold_core::shard::ShardId;
use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::v1::raft_server::{Raft as RaftRpc, RaftServer};
use leasehold_proto::v1::RaftPayload;
use leasehold_raft_store::{
    AppendEntriesRequest, InstallSnapshotRequest, NodeId, Raft, StateReader, Vote, VoteRequest,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::network::MAX_PEER_MESSAGE_BYTES;
pub use super::peer_frames::RaftMessage;
use crate::auth::{
    authorize_call, authorize_raft_sender, AuthRefusals, PeerInfo, RaftPeers, Scope,
};

/// One Raft group this member hosts, as the handler sees it.
#[derive(Clone)]
pub struct HostedGroup {
    raft: Raft,
    /// The members this member was told to join in this group: for shard
    /// 0 `join_members`, for another shard its replicas in the placement.
    joining: Arc<BTreeSet<NodeId>>,
    /// Whether this group's store held a log when it started: then an
    /// empty membership means its log is not loaded yet, never "not joined".
    has_log: bool,
}

impl HostedGroup {
    /// The group of `raft`, told to join `joining`; `has_log`: its store
    /// held a log entry when it started.
    pub fn new(raft: Raft, joining: BTreeSet<NodeId>, has_log: bool) -> Self {
        Self {
            raft,
            joining: Arc::new(joining),
            has_log,
        }
    }
}

/// The shards past 0 this member hosts, by id: shared by the handler
/// (which reads it for every message) and whatever starts and stops the
/// groups.
#[derive(Clone, Default)]
pub struct HostedShards(Arc<RwLock<BTreeMap<ShardId, HostedGroup>>>);

impl HostedShards {
    /// Hosts `group` as `shard` (replacing any group hosted as it).
    pub fn insert(&self, shard: ShardId, group: HostedGroup) {
        self.write().insert(shard, group);
    }

    /// Stops routing messages to `shard`; returns its group, if hosted.
    pub fn remove(&self, shard: ShardId) -> Option<HostedGroup> {
        self.write().remove(&shard)
    }

    /// The group hosted as `shard`.
    pub fn get(&self, shard: ShardId) -> Option<HostedGroup> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&shard)
            .cloned()
    }

    /// The ids of the hosted shards, ascending.
    pub fn ids(&self) -> Vec<ShardId> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .keys()
            .copied()
            .collect()
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<ShardId, HostedGroup>> {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Serves peer Raft RPCs for one member: shard 0 (the meta group) and
/// every shard in [`HostedShards`].
#[derive(Clone)]
pub struct RaftService {
    meta: HostedGroup,
    shards: HostedShards,
    /// The meta group's applied state: its record of retired member ids,
    /// which no group hears from.
    state: StateReader,
    refusals: Arc<AuthRefusals>,
}

impl RaftService {
    /// The handler of `raft`'s peer messages (shard 0), whose applied
    /// state is `state`, told to join the cluster of `joining` (see
    /// [`RaftPeers`]); `has_log`: its store held a log entry when it
    /// started. Refused senders are counted in `refusals`. It hosts no
    /// other shard until one is added to [`Self::hosted_shards`].
    pub fn new(
        raft: Raft,
        state: StateReader,
        joining: BTreeSet<NodeId>,
        has_log: bool,
        refusals: Arc<AuthRefusals>,
    ) -> Self {
        Self {
            meta: HostedGroup::new(raft, joining, has_log),
            shards: HostedShards::default(),
            state,
            refusals,
        }
    }

    /// The shards past 0 whose messages this handler routes (shared).
    pub fn hosted_shards(&self) -> HostedShards {
        self.shards.clone()
    }

    /// The gRPC service of this handler, with message limits large enough
    /// for snapshot chunks.
    pub fn into_server(self) -> RaftServer<Self> {
        RaftServer::new(self)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
    }

    /// The hosted group of `shard`, refused `SHARD_NOT_HOSTED` if none.
    fn group(&self, shard: ShardId) -> Result<HostedGroup, Status> {
        if shard == ShardId(0) {
            return Ok(self.meta.clone());
        }
        self.shards.get(shard).ok_or_else(|| {
            refusal(
                Reason::ShardNotHosted,
                format!("this member hosts no replica of shard {}", shard.0),
            )
        })
    }

    /// Whose messages `group` accepts now: its current membership (voters
    /// and learners; empty while it has none), the members it was told to
    /// join, and the ids retired from the cluster. A group that started
    /// with a log and shows no membership yet is still loading it:
    /// `STARTING` (its join list must not stand in for a membership it has).
    fn peers(&self, group: &HostedGroup) -> Result<RaftPeers, Status> {
        let members: BTreeSet<NodeId> = {
            let metrics = group.raft.metrics();
            let metrics = metrics.borrow();
            metrics
                .membership_config
                .membership()
                .nodes()
                .map(|(id, _)| *id)
                .collect()
        };
        RaftPeers::current(
            members,
            (*group.joining).clone(),
            self.state.retired_members(),
            group.has_log,
        )
        .ok_or_else(|| {
            refusal(
                Reason::Starting,
                "this member is still loading its log; retry shortly",
            )
        })
    }

    /// Decodes the message and admits it only from its claimed sender, and
    /// only with a term in range of the group's ([`term_in_range`]).
    fn admit<T: DeserializeOwned>(
        &self,
        group: &HostedGroup,
        data: &[u8],
        peer: Option<&PeerInfo>,
        what: &str,
        vote: impl Fn(&T) -> &Vote,
    ) -> Result<T, Status> {
        let rpc: T = decode(data)?;
        let vote = vote(&rpc);
        let claimed = vote.leader_id.node_id;
        let peers = self.peers(group)?;
        authorize_raft_sender(peer.map(|p| &p.principal), claimed, &peers)
            .map_err(|refusal| self.refusals.refuse(peer, what, refusal))?;
        let current = group.raft.metrics().borrow().current_term;
        if !term_in_range(current, vote.leader_id.term) {
            return Err(refusal(
                Reason::TermOutOfRange,
                format!(
                    "a {what} at term {} from member {claimed}: this member is at term {current}",
                    vote.leader_id.term
                ),
            ));
        }
        Ok(rpc)
    }

    /// Whether `peer` (`None` on a plaintext listener) may open a framed
    /// Raft connection: on a TLS listener only the certificate of a member
    /// whose messages the meta group accepts now ([`authorize_raft_sender`]:
    /// in the membership, or one it was told to join, and not retired);
    /// each message's sender is checked again, against its own group.
    /// A refusal is counted and logged like a refused call.
    pub fn admit_framed_connection(&self, peer: Option<&PeerInfo>) -> Result<(), Status> {
        let principal = peer.map(|p| &p.principal);
        let peers = self.peers(&self.meta)?;
        authorize_call(
            "/leasehold.v1.Raft/AppendEntries",
            principal,
            &Scope::Coordinator,
        )
        .and_then(|()| match principal {
            Some(Principal::Member(id)) => authorize_raft_sender(principal, *id, &peers),
            _ => Ok(()),
        })
        .map_err(|refusal| self.refusals.refuse(peer, "Raft (framed)", refusal))
    }

    /// Decodes one postcard-encoded message to shard 0 from `peer`; see
    /// [`Self::handle_for`].
    pub async fn handle(
        &self,
        message: RaftMessage,
        data: &[u8],
        peer: Option<&PeerInfo>,
    ) -> Result<Vec<u8>, Status> {
        self.handle_for(message, ShardId(0), data, peer).await
    }

    /// Decodes one postcard-encoded message for `shard` from `peer`
    /// (`None` on a plaintext listener), admits it only from its claimed
    /// sender as a peer of that shard's group, hands it to that group's
    /// Raft and returns Raft's `Result` postcard-encoded (errors included,
    /// so the sender sees openraft's own). Both transports — the gRPC
    /// `Raft` service and the framed one — answer through it.
    pub async fn handle_for(
        &self,
        message: RaftMessage,
        shard: ShardId,
        data: &[u8],
        peer: Option<&PeerInfo>,
    ) -> Result<Vec<u8>, Status> {
        let what = message.call_name();
        let group = self.group(shard)?;
        match message {
            RaftMessage::AppendEntries => {
                let rpc =
                    self.admit(&group, data, peer, what, |r: &AppendEntriesRequest| &r.vote)?;
                encode(&group.raft.append_entries(rpc).await)
            }
            RaftMessage::Vote => {
                let rpc = self.admit(&group, data, peer, what, |r: &VoteRequest| &r.vote)?;
                encode(&group.raft.vote(rpc).await)
            }
            RaftMessage::InstallSnapshot => {
                let rpc = self.admit(&group, data, peer, what, |r: &InstallSnapshotRequest| {
                    &r.vote
                })?;
                encode(&group.raft.install_snapshot(rpc).await)
            }
        }
    }

    async fn serve_grpc(
        &self,
        message: RaftMessage,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let payload = request.into_inner();
        let data = self
            .handle_for(
                message,
                ShardId(payload.shard),
                &payload.data,
                peer.as_ref(),
            )
            .await?;
        Ok(Response::new(RaftPayload { data, shard: 0 }))
    }
}

/// A Raft message may move this member's term at most this far ahead at
/// once. Elections raise a term by one each (a member cut off for days
/// campaigns a few hundred thousand times); a jump beyond it is no
/// election, only a message meant to push the cluster towards the end of
/// the term's type, where openraft cannot go on.
pub const MAX_TERM_STEP: u64 = 1 << 20;
/// No Raft message may carry a term beyond this (far from `u64::MAX`,
/// where openraft's arithmetic ends).
pub const MAX_TERM: u64 = 1 << 62;

/// Whether a Raft message at `term` may be handed to a member at term
/// `current`: at most [`MAX_TERM_STEP`] ahead and at most [`MAX_TERM`].
/// Lower terms always are (Raft answers them with its own term).
pub fn term_in_range(current: u64, term: u64) -> bool {
    term <= MAX_TERM && term <= current.saturating_add(MAX_TERM_STEP)
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// A member restarted on a log whose membership is {1}, told to join
    /// {1, 2}: before its Raft has loaded the log (the core has not run yet
    /// on this single-threaded runtime), a message from member 2 is refused
    /// `STARTING` — the join list does not stand in for the membership the
    /// log holds — and once it has, `NOT_A_MEMBER`.
    #[tokio::test]
    async fn a_restarted_member_hears_nobody_until_its_log_is_loaded() {
        use std::collections::BTreeMap;
        use std::time::Duration;

        use leasehold_client::transport::TcpDialer;
        use leasehold_raft_store::{open_with_engine, PowerLossDisk};
        use openraft::storage::RaftLogStorage;
        use openraft::BasicNode;

        use super::super::network::PeerNetwork;

        let config = Arc::new(openraft::Config::default().validate().unwrap());
        let network = || PeerNetwork::new(1, Arc::new(TcpDialer::default()));
        let disk = PowerLossDisk::new();
        {
            let (log, state_machine) = open_with_engine(disk.open_engine()).unwrap();
            let raft = Raft::new(1, config.clone(), network(), log, state_machine)
                .await
                .unwrap();
            raft.initialize(BTreeMap::from([(1, BasicNode::new("127.0.0.1:1"))]))
                .await
                .unwrap();
            raft.wait(Some(Duration::from_secs(10)))
                .current_leader(1, "elected")
                .await
                .unwrap();
            raft.shutdown().await.unwrap();
        }
        let (log, state_machine) = open_with_engine(disk.open_engine()).unwrap();
        let has_log = log
            .clone()
            .get_log_state()
            .await
            .unwrap()
            .last_log_id
            .is_some();
        assert!(has_log);
        let state = state_machine.reader();
        let raft = Raft::new(1, config, network(), log, state_machine)
            .await
            .unwrap();
        let service = RaftService::new(raft.clone(), state, [1, 2].into(), has_log, Arc::default());
        let peer = PeerInfo {
            remote_addr: None,
            principal: Principal::Member(2),
        };
        let forged = postcard::to_allocvec(&AppendEntriesRequest {
            vote: openraft::Vote::new_committed(2, 2),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        })
        .unwrap();
        let reason = |result: Result<Vec<u8>, Status>| {
            let status = result.expect_err("refused");
            status
                .metadata()
                .get("leasehold-reason")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string()
        };
        let early = service
            .handle(RaftMessage::AppendEntries, &forged, Some(&peer))
            .await;
        assert_eq!(reason(early), "STARTING");
        raft.wait(Some(Duration::from_secs(10)))
            .metrics(
                |m| m.membership_config.membership().nodes().next().is_some(),
                "log loaded",
            )
            .await
            .unwrap();
        let loaded = service
            .handle(RaftMessage::AppendEntries, &forged, Some(&peer))
            .await;
        assert_eq!(reason(loaded), "NOT_A_MEMBER");
        raft.shutdown().await.unwrap();
    }

    #[test]
    fn terms_at_the_edges() {
        assert!(term_in_range(5, 0));
        assert!(term_in_range(5, 5 + MAX_TERM_STEP));
        assert!(!term_in_range(5, 6 + MAX_TERM_STEP));
        assert!(term_in_range(MAX_TERM, MAX_TERM));
        assert!(!term_in_range(MAX_TERM, MAX_TERM + 1));
        assert!(!term_in_range(u64::MAX, u64::MAX - 4));
        assert!(!term_in_range(0, u64::MAX));
    }

    proptest! {
        /// Whatever terms arrive, a member's term can reach neither the
        /// edge of its type nor move by more than the step per message:
        /// after any sequence of admitted messages (each adopted), the
        /// term is at most MAX_TERM and grew by at most the step each.
        #[test]
        fn admitted_terms_never_reach_the_edge(
            terms in proptest::collection::vec(any::<u64>(), 1..50),
        ) {
            let mut current = 0u64;
            for term in terms {
                if term_in_range(current, term) {
                    prop_assert!(term <= current.saturating_add(MAX_TERM_STEP));
                    current = current.max(term);
                }
                prop_assert!(current <= MAX_TERM);
            }
        }
    }
}
