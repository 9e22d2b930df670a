//! The admin API (`leasehold.v1.Admin`): cluster formation and membership,
//! node status, and the replicated policy table.
//!
//! `Init` runs on any pristine member; membership changes, step-down and
//! policy writes need the leader (hint otherwise); `ListPolicies` is a
//! linearizable read; `Status` is local to the member asked.
//!
//! Step-down (openraft 0.9 has no leader transfer): the leader refuses
//! leader work and stops heartbeats and its own election timer, so the
//! other voters' election timers fire and one of them is elected; then it
//! turns both back on. It answers with the new leader, or `UNAVAILABLE`
//! (still leading) if no other voter took over within the admin timeout.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use leasehold_client::transport::normalize_addr;
use leasehold_core::coordinator::sharding::PlacementChange;
use leasehold_core::coordinator::{Command, Outcome};
use leasehold_core::ids::MAX_KEY_BYTES;
use leasehold_proto::convert::required_policy;
use leasehold_proto::refusal::{invalid_field, refusal, Reason};
use leasehold_proto::v1 as pb;

use super::shard::routing::HostedApis;
use leasehold_proto::v1::admin_server::Admin;
use leasehold_raft_store::backup::{backup_bytes, StateSummary};
use leasehold_raft_store::{Node, NodeId};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use tonic::{Request, Response, Status};

use super::context::{forward_status, NodeContext};
use super::leader::{command_error_status, LeaderView};

/// Stops heartbeats and this member's election timer until another member
/// leads or `timeout` passes, then restores both and clears
/// `stepping_down`. Returns the new leader (`Ok(None)`: Raft stopped).
async fn hand_off(
    node: Arc<NodeContext>,
    timeout: std::time::Duration,
) -> Result<Option<NodeId>, tokio::time::error::Elapsed> {
    let runtime = node.raft.runtime_config();
    runtime.heartbeat(false);
    runtime.elect(false);
    let me = node.id;
    let mut metrics = node.raft.metrics();
    let successor = tokio::time::timeout(timeout, async move {
        loop {
            let leader = metrics.borrow_and_update().current_leader;
            if let Some(id) = leader.filter(|id| *id != me) {
                return Some(id);
            }
            if metrics.changed().await.is_err() {
                return None;
            }
        }
    })
    .await;
    runtime.heartbeat(true);
    runtime.elect(true);
    node.stepping_down.store(false, Ordering::SeqCst);
    successor
}

/// How long a membership change waits, once committed, for every remaining
/// member to hold it before answering with those that do not (a live
/// member receives it within a heartbeat or two; a caller's call timeout
/// is 3 s by default).
const LAGGING_MEMBER_WAIT: Duration = Duration::from_secs(1);

/// How long `AddLearner` waits for the new learner to hold the membership
/// entry that adds it, and `ChangeMembership` for each member it makes a
/// voter to hold what this leader had applied, at most (a caller waiting
/// longer asks again; see [`catch_up_wait`]).
const CATCH_UP_WAIT: Duration = Duration::from_secs(2);

/// The wait an admin call may spend before answering: [`CATCH_UP_WAIT`],
/// the member's admin timeout, and half of what the caller's `grpc-timeout`
/// header leaves (the rest carries the answer back), whichever is least.
fn catch_up_wait(metadata: &tonic::metadata::MetadataMap, admin_timeout: Duration) -> Duration {
    let callers = metadata
        .get("grpc-timeout")
        .and_then(|value| value.to_str().ok())
        .and_then(grpc_timeout)
        .map_or(Duration::MAX, |budget| budget / 2);
    CATCH_UP_WAIT.min(admin_timeout).min(callers)
}

/// A `grpc-timeout` header's value (at most 8 digits and a unit of H, M,
/// S, m, u or n, per the gRPC HTTP/2 protocol).
fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.checked_mul(3600)?),
        "M" => Duration::from_secs(amount.checked_mul(60)?),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// How far the leader's replication shows `id`'s log: the index of its
/// last matched entry, `None` when it has matched nothing yet (it never
/// answered the leader, or refused it).
fn matched_index(metrics: &openraft::RaftMetrics<NodeId, Node>, id: NodeId) -> Option<u64> {
    metrics
        .replication
        .as_ref()
        .and_then(|progress| progress.get(&id).copied().flatten())
        .map(|matched| matched.index)
}

/// The members of `metrics`' membership other than `me` whose log does not
/// reach `index` as far as the leader's replication shows (every other
/// member when `metrics` shows no replication: `me` does not lead).
fn members_lacking(
    metrics: &openraft::RaftMetrics<NodeId, Node>,
    me: NodeId,
    index: u64,
) -> Vec<NodeId> {
    let holds = |id: &NodeId| matched_index(metrics, *id).is_some_and(|matched| matched >= index);
    metrics
        .membership_config
        .membership()
        .nodes()
        .map(|(id, _)| *id)
        .filter(|id| *id != me && !holds(id))
        .collect()
}

/// Bytes of the backup file per `SaveSnapshot` message.
const SNAPSHOT_CHUNK_BYTES: usize = 1 << 20;

/// The messages of a `SaveSnapshot` answer.
pub type SnapshotChunks =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::SaveSnapshotChunk, Status>> + Send>>;

/// Serves `leasehold.v1.Admin` for one member.
#[derive(Clone)]
pub struct AdminApi {
    node: Arc<NodeContext>,
    /// The shards past 0 this member hosts (their status).
    hosted: HostedApis,
}

impl AdminApi {
    /// The admin API over a member's shared context.
    pub fn new(node: Arc<NodeContext>) -> Self {
        Self {
            node,
            hosted: HostedApis::default(),
        }
    }

    /// The same API reporting the status of the shards in `hosted` too.
    pub fn with_hosted(mut self, hosted: HostedApis) -> Self {
        self.hosted = hosted;
        self
    }

    /// The status of every shard past 0 this member hosts, in id order.
    fn hosted_shards(&self) -> Vec<pb::HostedShardStatus> {
        self.hosted
            .all()
            .into_iter()
            .map(|(id, api)| {
                let context = api.context();
                let metrics = context.raft.metrics().borrow().clone();
                let (live_windows, owned_slots) = context.state.read(|state| {
                    let owned = if state.sharding().shard() == id {
                        state.sharding().owned_slots()
                    } else {
                        0
                    };
                    (state.live_windows(), owned)
                });
                pb::HostedShardStatus {
                    id: id.0,
                    state: format!("{:?}", metrics.state),
                    current_leader: metrics.current_leader,
                    last_applied_index: metrics.last_applied.map_or(0, |applied| applied.index),
                    live_windows,
                    owned_slots,
                }
            })
            .collect()
    }

    /// Waits until every other member of the current membership holds log
    /// index `index` (the leader's replication progress), or `deadline`;
    /// returns those that do not (all others when this member no longer
    /// leads: it cannot tell).
    async fn wait_until_members_hold(
        &self,
        index: u64,
        deadline: tokio::time::Instant,
    ) -> Vec<NodeId> {
        let me = self.node.id;
        self.wait_until_none_lack(|metrics| members_lacking(metrics, me, index), deadline)
            .await
    }

    /// Waits until the leader's replication shows every member of `ids`
    /// holding log index `index`, or `deadline`; returns those that do not,
    /// each with the index it holds (`None`: nothing matched yet).
    async fn wait_until_these_hold(
        &self,
        ids: &[NodeId],
        index: u64,
        deadline: tokio::time::Instant,
    ) -> Vec<(NodeId, Option<u64>)> {
        let lacking = |metrics: &openraft::RaftMetrics<NodeId, Node>| {
            ids.iter()
                .map(|id| (*id, matched_index(metrics, *id)))
                .filter(|(_, matched)| !matched.is_some_and(|m| m >= index))
                .collect()
        };
        self.wait_until_none_lack(lacking, deadline).await
    }

    /// Re-reads the Raft metrics at every change until `lacking` finds
    /// nothing, or `deadline`; returns what it found last.
    async fn wait_until_none_lack<T>(
        &self,
        lacking: impl Fn(&openraft::RaftMetrics<NodeId, Node>) -> Vec<T>,
        deadline: tokio::time::Instant,
    ) -> Vec<T> {
        let mut metrics = self.node.raft.metrics();
        let wait = async {
            loop {
                let lagging = lacking(&metrics.borrow_and_update());
                if lagging.is_empty() || metrics.changed().await.is_err() {
                    return lagging;
                }
            }
        };
        match tokio::time::timeout_at(deadline, wait).await {
            Ok(lagging) => lagging,
            Err(_) => lacking(&self.node.raft.metrics().borrow()),
        }
    }

    /// Refuses a membership whose new voters (the members of `voters` not
    /// voting now) do not hold, within [`CATCH_UP_WAIT`], what this leader
    /// had applied when asked: a voter that never took the log adds
    /// nothing to the quorum but its absence, and one more failure loses it.
    async fn refuse_voters_behind(
        &self,
        voters: &BTreeSet<NodeId>,
        wait: Duration,
    ) -> Result<(), Status> {
        let (new_voters, applied) = {
            let metrics = self.node.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            let voting: BTreeSet<NodeId> = membership.voter_ids().collect();
            let new_voters: Vec<NodeId> = voters
                .iter()
                .copied()
                .filter(|id| !voting.contains(id) && *id != self.node.id)
                .collect();
            (
                new_voters,
                metrics.last_applied.map_or(0, |applied| applied.index),
            )
        };
        if new_voters.is_empty() {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + wait;
        let behind = self
            .wait_until_these_hold(&new_voters, applied, deadline)
            .await;
        let Some((id, matched)) = behind.first() else {
            return Ok(());
        };
        let holds = match matched {
            Some(index) => format!("holds the log up to index {index}"),
            None => "has taken nothing of the log".to_string(),
        };
        Err(refusal(
            Reason::MembershipRejected,
            format!(
                "member {id} {holds}, and this leader has applied up to {applied}: it cannot \
                 be made a voter before it catches up. Add it first (`cluster add-learner`, \
                 which waits for it), and check that it runs, reaches the members and was \
                 started with --join-members listing the current members \
                 (docs/security.md, \"Joining a member\"); nothing changed"
            ),
        ))
    }

    async fn policy_write(&self, command: Command) -> Result<Outcome, Status> {
        self.node.require_leader()?;
        match self.node.propose(command).await? {
            Outcome::Rejected(error) => Err(command_error_status(&error)),
            outcome => Ok(outcome),
        }
    }
}

fn member(raw: &pb::Member) -> Result<(NodeId, Node), Status> {
    if raw.id == 0 {
        return Err(invalid_field("members.id", "member ids start at 1"));
    }
    let addr = normalize_addr(&raw.addr)
        .map_err(|e| invalid_field("members.addr", format!("member {}: {e}", raw.id)))?;
    Ok((raw.id, Node::new(addr)))
}

fn membership_write_status<E>(
    error: RaftError<NodeId, ClientWriteError<NodeId, Node>>,
) -> Result<E, Status> {
    Err(match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => forward_status(&forward),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            refusal(Reason::MembershipRejected, e.to_string())
        }
        RaftError::Fatal(e) => refusal(Reason::ShuttingDown, format!("raft stopped: {e}")),
    })
}

fn admin_timeout(ms: u128) -> Status {
    refusal(
        Reason::NoQuorum,
        format!("the membership change did not commit within {ms} ms (no quorum?)"),
    )
}

#[tonic::async_trait]
impl Admin for AdminApi {
    async fn init(
        &self,
        request: Request<pb::InitRequest>,
    ) -> Result<Response<pb::InitResponse>, Status> {
        let request = request.into_inner();
        if request.members.is_empty() {
            return Err(invalid_field("members", "init needs at least one member"));
        }
        let mut members = BTreeMap::new();
        for raw in &request.members {
            let (id, node) = member(raw)?;
            if members.insert(id, node).is_some() {
                return Err(invalid_field(
                    "members.id",
                    format!("member id {id} appears twice"),
                ));
            }
        }
        if !members.contains_key(&self.node.id) {
            return Err(invalid_field(
                "members",
                format!(
                    "the members must include the member asked to initialise (id {})",
                    self.node.id
                ),
            ));
        }
        let timeout = self.node.config.admin_timeout();
        match tokio::time::timeout(timeout, self.node.raft.initialize(members)).await {
            Ok(Ok(())) => Ok(Response::new(pb::InitResponse {})),
            Ok(Err(RaftError::APIError(InitializeError::NotAllowed(e)))) => Err(refusal(
                Reason::AlreadyInitialized,
                format!("this member is already initialised ({e})"),
            )),
            Ok(Err(RaftError::APIError(InitializeError::NotInMembers(e)))) => {
                Err(invalid_field("members", e.to_string()))
            }
            Ok(Err(RaftError::Fatal(e))) => {
                Err(refusal(Reason::ShuttingDown, format!("raft stopped: {e}")))
            }
            Err(_) => Err(admin_timeout(timeout.as_millis())),
        }
    }

    async fn add_learner(
        &self,
        request: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::AddLearnerResponse>, Status> {
        let wait = catch_up_wait(request.metadata(), self.node.config.admin_timeout());
        let raw = request
            .into_inner()
            .member
            .ok_or_else(|| invalid_field("member", "member is required"))?;
        let (id, node) = member(&raw)?;
        self.node.require_leader()?;
        if self.node.state.is_retired(id) {
            return Err(refusal(
                Reason::MembershipRejected,
                format!(
                    "member {id} was removed from this cluster and its id is never accepted \
                     again: give the new member a new id (and its own certificate)"
                ),
            ));
        }
        let known = self
            .node
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&id)
            .map(|known| known.addr.clone());
        if let Some(known) = known.filter(|known| *known != node.addr) {
            // The membership keeps a member's first address: adding the id
            // again elsewhere would answer as if it moved, and never reach it.
            return Err(refusal(
                Reason::MembershipRejected,
                format!(
                    "member {id} is already in the membership at {known}, not {}: start it \
                     there, or give the member at the new address a new id; nothing changed",
                    node.addr
                ),
            ));
        }
        let timeout = self.node.config.admin_timeout();
        match tokio::time::timeout(timeout, self.node.raft.add_learner(id, node, false)).await {
            Ok(Ok(response)) => {
                // Added is not joined: a learner that cannot take the log
                // (not running, unreachable, refusing the leader) is named
                // in the answer, never promoted by `ChangeMembership`.
                let log_index = response.log_id.index;
                let deadline = tokio::time::Instant::now() + wait;
                let lagging = self.wait_until_these_hold(&[id], log_index, deadline).await;
                let matched = lagging.first().map_or(Some(log_index), |(_, m)| *m);
                Ok(Response::new(pb::AddLearnerResponse {
                    log_index,
                    caught_up: lagging.is_empty(),
                    matched_index: matched.unwrap_or(0),
                    matched_any: matched.is_some(),
                }))
            }
            Ok(Err(error)) => membership_write_status(error),
            Err(_) => Err(admin_timeout(timeout.as_millis())),
        }
    }

    async fn change_membership(
        &self,
        request: Request<pb::ChangeMembershipRequest>,
    ) -> Result<Response<pb::ChangeMembershipResponse>, Status> {
        let wait = catch_up_wait(request.metadata(), self.node.config.admin_timeout());
        let request = request.into_inner();
        let voters: BTreeSet<NodeId> = request.voter_ids.iter().copied().collect();
        if voters.is_empty() || voters.contains(&0) {
            return Err(invalid_field(
                "voter_ids",
                "voter ids must be a non-empty list of ids ≥ 1",
            ));
        }
        self.node.require_leader()?;
        let timeout = self.node.config.admin_timeout();
        self.refuse_voters_behind(&voters, wait).await?;
        match tokio::time::timeout(
            timeout,
            self.node.raft.change_membership(voters, request.retain),
        )
        .await
        {
            Ok(Ok(response)) => {
                let log_index = response.log_id.index;
                let deadline = tokio::time::Instant::now() + LAGGING_MEMBER_WAIT;
                let lagging_member_ids = self.wait_until_members_hold(log_index, deadline).await;
                if !lagging_member_ids.is_empty() {
                    tracing::warn!(
                        ?lagging_member_ids,
                        log_index,
                        "membership changed; these members do not hold the change yet and \
                         still accept Raft messages from removed members until they do"
                    );
                }
                Ok(Response::new(pb::ChangeMembershipResponse {
                    log_index,
                    lagging_member_ids,
                }))
            }
            Ok(Err(error)) => membership_write_status(error),
            Err(_) => Err(admin_timeout(timeout.as_millis())),
        }
    }

    async fn step_down(
        &self,
        request: Request<pb::StepDownRequest>,
    ) -> Result<Response<pb::StepDownResponse>, Status> {
        let asked = request.into_inner().leader_id;
        self.node.require_leader()?;
        if asked != 0 && asked != self.node.id {
            // Member `asked` already handed off (this is a retry): done.
            return Ok(Response::new(pb::StepDownResponse {
                new_leader: self.node.id,
            }));
        }
        let me = self.node.id;
        let other_voters = self
            .node
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .filter(|id| *id != me)
            .count();
        if other_voters == 0 {
            return Err(refusal(
                Reason::NoOtherVoter,
                "no other voter to hand leadership to; add one first",
            ));
        }
        if self
            .node
            .stepping_down
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(refusal(
                Reason::SteppingDown,
                "a step-down is already in progress",
            ));
        }
        // Run to the end even if the caller goes away: the member must not
        // be left without heartbeats or refusing leader work.
        let timeout = self.node.config.admin_timeout();
        let successor = tokio::spawn(hand_off(self.node.clone(), timeout))
            .await
            .map_err(|e| refusal(Reason::Internal, format!("step-down task failed: {e}")))?;
        match successor {
            Ok(Some(new_leader)) => {
                tracing::info!(new_leader, "stepped down");
                Ok(Response::new(pb::StepDownResponse { new_leader }))
            }
            Ok(None) => Err(refusal(Reason::ShuttingDown, "raft stopped during the step-down")),
            Err(_) => Err(refusal(Reason::NoQuorum, format!(
                "no other voter took over within {} ms (is a quorum of the other voters up?); this member still leads",
                timeout.as_millis()
            ))),
        }
    }

    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let metrics = self.node.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let member_list = |ids: Vec<NodeId>| -> Vec<pb::Member> {
            ids.into_iter()
                .map(|id| pb::Member {
                    id,
                    addr: membership
                        .get_node(&id)
                        .map(|n| n.addr.clone())
                        .unwrap_or_default(),
                })
                .collect()
        };
        let voters = member_list(membership.voter_ids().collect());
        let learners = member_list(membership.learner_ids().collect());
        let leader_addr = match LeaderView::from_metrics(&metrics) {
            LeaderView::Other { addr, .. } => addr.unwrap_or_default(),
            LeaderView::Me => membership
                .get_node(&metrics.id)
                .map(|n| n.addr.clone())
                .unwrap_or_default(),
            LeaderView::Unknown { .. } => String::new(),
        };
        let (now_ms, live_windows, policies, shadow, restored_at_ms) =
            self.node.state.read(|state| {
                let shadow = state
                    .shadow_tallies()
                    .map(|(prefix, tally)| pb::ShadowTally {
                        prefix: prefix.to_string(),
                        would_deny_tokens: tally.would_deny_tokens,
                        would_deny_requests: tally.would_deny_requests,
                    })
                    .collect::<Vec<_>>();
                (
                    state.now_ms(),
                    state.live_windows(),
                    state.policies().len() as u64,
                    shadow,
                    state.restored_at_ms(),
                )
            });
        Ok(Response::new(pb::StatusResponse {
            node_id: metrics.id,
            state: format!("{:?}", metrics.state),
            current_term: metrics.current_term,
            current_leader: metrics.current_leader,
            leader_addr,
            last_log_index: metrics.last_log_index.unwrap_or(0),
            last_applied_index: metrics.last_applied.map(|id| id.index).unwrap_or(0),
            snapshot_index: metrics.snapshot.map(|id| id.index).unwrap_or(0),
            purged_index: metrics.purged.map(|id| id.index).unwrap_or(0),
            initialized: !voters.is_empty(),
            voters,
            learners,
            state_machine_now_ms: now_ms,
            live_windows,
            policies,
            shadow,
            retired_member_ids: self.node.state.retired_members().into_iter().collect(),
            restored_at_ms,
            shards: self.hosted_shards(),
            counters: self
                .node
                .metrics
                .snapshot()
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect(),
        }))
    }

    async fn change_placement(
        &self,
        request: Request<pb::ChangePlacementRequest>,
    ) -> Result<Response<pb::Placement>, Status> {
        let (expected_version, change) =
            leasehold_proto::convert::placement_change(request.into_inner())?;
        let replicas = match &change {
            PlacementChange::AddShard { replicas, .. }
            | PlacementChange::SetReplicas { replicas, .. }
            | PlacementChange::Split { replicas, .. } => replicas.as_slice(),
            PlacementChange::RemoveShard { .. } | PlacementChange::MoveSlots { .. } => &[],
        };
        let members: BTreeSet<NodeId> = self
            .node
            .state
            .membership()
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .collect();
        if let Some(stranger) = replicas.iter().find(|id| !members.contains(id)) {
            return Err(invalid_field(
                "replicas",
                format!("member {stranger} is not a member of the cluster: add it first"),
            ));
        }
        let command = Command::ChangePlacement {
            expected_version,
            change,
        };
        match self.policy_write(command).await? {
            Outcome::Sharding(_) => Ok(Response::new(super::shard::routing::placement_message(
                &self.node,
                |shard| (shard.0 == 0).then(|| LeaderView::of(&self.node.raft)),
            ))),
            other => Err(refusal(
                Reason::Internal,
                format!("unexpected outcome {other:?}"),
            )),
        }
    }

    async fn set_policy(
        &self,
        request: Request<pb::SetPolicyRequest>,
    ) -> Result<Response<pb::SetPolicyResponse>, Status> {
        let policy = required_policy(request.into_inner().policy)?;
        match self.policy_write(Command::SetPolicy(policy)).await? {
            Outcome::PolicySet => Ok(Response::new(pb::SetPolicyResponse {})),
            other => Err(refusal(
                Reason::Internal,
                format!("unexpected outcome {other:?}"),
            )),
        }
    }

    async fn delete_policy(
        &self,
        request: Request<pb::DeletePolicyRequest>,
    ) -> Result<Response<pb::DeletePolicyResponse>, Status> {
        let prefix = request.into_inner().prefix;
        if prefix.len() > MAX_KEY_BYTES {
            return Err(invalid_field(
                "prefix",
                format!("prefix is longer than {MAX_KEY_BYTES} bytes"),
            ));
        }
        match self.policy_write(Command::DeletePolicy { prefix }).await? {
            Outcome::PolicyDeleted { existed } => {
                Ok(Response::new(pb::DeletePolicyResponse { existed }))
            }
            other => Err(refusal(
                Reason::Internal,
                format!("unexpected outcome {other:?}"),
            )),
        }
    }

    type SaveSnapshotStream = SnapshotChunks;

    async fn save_snapshot(
        &self,
        request: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<SnapshotChunks>, Status> {
        let any_member = request.into_inner().any_member;
        let linearizable = !any_member || self.node.require_leader().is_ok();
        if linearizable {
            self.node.linearizable_read().await?;
        }
        let state = self.node.state.clone();
        let written = tokio::task::spawn_blocking(move || {
            let envelope = state.envelope();
            backup_bytes(&envelope).map(|bytes| (StateSummary::of(&envelope), bytes))
        })
        .await
        .map_err(|e| refusal(Reason::Internal, format!("backup task failed: {e}")))?;
        let (summary, bytes) =
            written.map_err(|e| refusal(Reason::Internal, format!("encoding the state: {e}")))?;
        let Some(last) = summary.last_log_id else {
            return Err(refusal(
                Reason::NotInitialized,
                "this member holds no state yet (the cluster is not initialised)",
            ));
        };
        let info = pb::SnapshotInfo {
            last_log_index: last.index,
            last_log_term: last.leader_id.term,
            taken_from: self.node.id,
            linearizable,
            state_clock_ms: summary.clock_ms,
            live_windows: summary.live_windows,
            policies: summary.policies,
            voter_ids: summary.voters,
            retired_member_ids: summary.retired,
            bytes: bytes.len() as u64,
            crc32: crc32fast::hash(&bytes),
            restored_at_ms: summary.restored_at_ms,
        };
        tracing::info!(
            last_log_index = info.last_log_index,
            bytes = info.bytes,
            linearizable,
            "backup of the state taken"
        );
        let mut info = Some(info);
        let chunks: Vec<Result<pb::SaveSnapshotChunk, Status>> = bytes
            .chunks(SNAPSHOT_CHUNK_BYTES)
            .map(|data| {
                Ok(pb::SaveSnapshotChunk {
                    info: info.take(),
                    data: data.to_vec(),
                })
            })
            .collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn list_policies(
        &self,
        _request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::ListPoliciesResponse>, Status> {
        self.node.linearizable_read().await?;
        let policies = self.node.state.read(|state| state.policies());
        Ok(Response::new(pb::ListPoliciesResponse {
            policies: policies.iter().map(pb::Policy::from).collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_read_in_every_unit_and_nothing_else() {
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("780m"), Some(Duration::from_millis(780)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(grpc_timeout("5u"), Some(Duration::from_micros(5)));
        assert_eq!(grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "S", "123456789S", "-1S", "1s", "1.5S", "１S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_catch_up_wait_leaves_the_caller_half_its_budget() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        let admin = Duration::from_secs(10);
        assert_eq!(catch_up_wait(&metadata, admin), CATCH_UP_WAIT);
        assert_eq!(
            catch_up_wait(&metadata, Duration::from_millis(300)),
            Duration::from_millis(300)
        );
        metadata.insert("grpc-timeout", "780m".parse().unwrap());
        assert_eq!(catch_up_wait(&metadata, admin), Duration::from_millis(390));
        metadata.insert("grpc-timeout", "60S".parse().unwrap());
        assert_eq!(catch_up_wait(&metadata, admin), CATCH_UP_WAIT);
    }
}
