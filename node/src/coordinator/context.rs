//! What the services of one member share: the Raft handle, the group-commit
//! batcher, the applied-state reader, the clock, counters and deadlines,
//! plus the three steps every handler uses (check leadership, propose, make a
//! read linearizable) with their errors already mapped to gRPC.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use leasehold_client::transport::WallClock;
use leasehold_core::coordinator::{Command, Outcome, Proposal, ProposalResult};
use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::LeaderHint;
use leasehold_raft_store::{LogStore, Node, NodeId, Raft, StateReader};
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use tonic::Status;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::batcher::{Batcher, BatcherOptions, ProposeError, Proposer};
use super::leader::{not_leader_status, propose_error_status, require_leader};
use super::metrics::{NodeMetrics, Rejection};
use crate::config::NodeConfig;
use crate::error::NodeError;

/// The shared state of one coordinator member's services.
pub struct NodeContext {
    /// This member's id.
    pub id: NodeId,
    /// The Raft member.
    pub raft: Raft,
    /// Group commit in front of `raft.client_write`.
    pub batcher: Batcher,
    /// The applied coordinator state.
    pub state: StateReader,
    /// Wall clock for stamping and window reads.
    pub clock: Arc<dyn WallClock>,
    /// Counters.
    pub metrics: Arc<NodeMetrics>,
    /// Flush (fsync) latencies of this member's Raft log, µs.
    pub log_flush_latency: Arc<leasehold_core::metrics::Histogram>,
    /// Deadlines and sizes.
    pub config: NodeConfig,
    /// Set while this member hands its leadership off (`StepDown`): it
    /// refuses leader work so that no replication keeps followers from
    /// electing another leader.
    pub stepping_down: AtomicBool,
}

/// The parts of one group's context that differ between groups.
pub struct GroupParts {
    /// The member's id.
    pub id: NodeId,
    /// The group's Raft handle.
    pub raft: Raft,
    /// The group's applied state.
    pub state: StateReader,
    /// Flush latencies of the group's log.
    pub log_flush_latency: Arc<leasehold_core::metrics::Histogram>,
}

/// Whether `log_store` holds a log (an entry, or a purged prefix): then,
/// until Raft has loaded it, an empty membership is no invitation to hear
/// a join list.
pub async fn store_has_log(log_store: &LogStore) -> Result<bool, NodeError> {
    use openraft::storage::RaftLogStorage;
    let log_state = log_store
        .clone()
        .get_log_state()
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    Ok(log_state.last_log_id.is_some() || log_state.last_purged_log_id.is_some())
}

impl NodeContext {
    /// The context of one Raft group of a member (shard 0's or another
    /// shard's), with its group-commit batcher spawned: the batcher's task
    /// ends when `stopped` turns true.
    pub fn start(
        group: GroupParts,
        config: NodeConfig,
        clock: Arc<dyn WallClock>,
        metrics: Arc<NodeMetrics>,
        stopped: watch::Receiver<bool>,
    ) -> (Arc<NodeContext>, JoinHandle<()>) {
        let options = BatcherOptions {
            max_batch: config.max_batch_commands,
            queue_capacity: config.batch_queue_capacity,
            max_inflight: config.max_inflight_proposals,
        };
        let proposer = Arc::new(RaftProposer::new(
            group.raft.clone(),
            config.proposal_timeout(),
        ));
        let (batcher, batcher_task) =
            Batcher::spawn(proposer, clock.clone(), options, metrics.clone(), stopped);
        let context = Arc::new(NodeContext {
            id: group.id,
            raft: group.raft,
            batcher,
            state: group.state,
            clock,
            metrics,
            log_flush_latency: group.log_flush_latency,
            config,
            stepping_down: AtomicBool::new(false),
        });
        (context, batcher_task)
    }

    /// Fails fast unless this member is the leader (see [`require_leader`])
    /// and is not handing its leadership off.
    pub fn require_leader(&self) -> Result<(), Status> {
        require_leader(&self.raft, &self.metrics)?;
        if self.stepping_down.load(Ordering::SeqCst) {
            self.metrics.record_rejection(Rejection::Unavailable);
            return Err(refusal(
                Reason::SteppingDown,
                "this member is handing its leadership off; retry shortly",
            ));
        }
        Ok(())
    }

    /// Proposes `command` through group commit and returns its outcome.
    #[tracing::instrument(name = "coordinator.propose", level = "debug", skip_all)]
    pub async fn propose(&self, command: Command) -> Result<Outcome, Status> {
        self.batcher
            .submit(command)
            .await
            .map_err(|e| propose_error_status(e, &self.metrics))
    }

    /// Proposes `commands` as one group (see `Batcher::submit_all`) and
    /// returns their outcomes in order.
    pub async fn propose_all(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, Status> {
        self.batcher
            .submit_all(commands)
            .await
            .map_err(|e| propose_error_status(e, &self.metrics))
    }

    /// Waits until a read of the local state is linearizable: this member
    /// confirmed its leadership with a quorum and applied up to the read index.
    pub async fn linearizable_read(&self) -> Result<(), Status> {
        self.require_leader()?;
        self.metrics.record_linearizable_read();
        let timeout = self.config.read_timeout();
        match tokio::time::timeout(timeout, self.raft.ensure_linearizable()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward)))) => {
                self.metrics.record_rejection(Rejection::NotLeader);
                Err(forward_status(&forward))
            }
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e)))) => {
                self.metrics.record_rejection(Rejection::Unavailable);
                Err(refusal(
                    Reason::NoQuorum,
                    format!("cannot confirm leadership: {e}"),
                ))
            }
            Ok(Err(RaftError::Fatal(e))) => {
                self.metrics.record_rejection(Rejection::Unavailable);
                Err(refusal(Reason::ShuttingDown, format!("raft stopped: {e}")))
            }
            Err(_) => {
                self.metrics.record_rejection(Rejection::Unavailable);
                Err(refusal(
                    Reason::NoQuorum,
                    format!(
                        "leadership not confirmed within {} ms (no quorum?)",
                        timeout.as_millis()
                    ),
                ))
            }
        }
    }
}

/// The gRPC error for openraft's "forward to leader".
pub fn forward_status(forward: &ForwardToLeader<NodeId, Node>) -> Status {
    let hint = LeaderHint::new(
        forward.leader_id,
        forward.leader_node.as_ref().map(|n| n.addr.clone()),
    );
    not_leader_status(&hint, true)
}

/// Proposes through `Raft::client_write`, bounded by the proposal timeout.
pub struct RaftProposer {
    raft: Raft,
    timeout: std::time::Duration,
}

impl RaftProposer {
    /// A proposer for `raft` whose proposals fail after `timeout`.
    pub fn new(raft: Raft, timeout: std::time::Duration) -> Self {
        Self { raft, timeout }
    }
}

impl Proposer for RaftProposer {
    fn propose(
        &self,
        proposal: Proposal,
    ) -> BoxFuture<'static, Result<ProposalResult, ProposeError>> {
        let raft = self.raft.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            match tokio::time::timeout(timeout, raft.client_write(proposal.into())).await {
                Ok(Ok(response)) => {
                    tracing::Span::current().record("raft.log_index", response.log_id.index);
                    Ok(response.data)
                }
                Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
                    // A leader is named only with its address.
                    let leader = forward
                        .leader_id
                        .zip(forward.leader_node.map(|node| node.addr))
                        .map(|(id, addr)| LeaderHint::new(Some(id), Some(addr)))
                        .unwrap_or_default();
                    Err(ProposeError::NotLeader { leader })
                }
                Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                    Err(ProposeError::Unavailable(e.to_string()))
                }
                Ok(Err(RaftError::Fatal(e))) => {
                    Err(ProposeError::Unavailable(format!("raft stopped: {e}")))
                }
                Err(_) => Err(ProposeError::Timeout(
                    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                )),
            }
        })
    }
}
