//! What a member does for a shard it leads (ADR 0025): makes the group
//! the shard (`BecomeShard`), keeps its policies those of the meta group
//! (`policy_sync_commands`), acquires every move of slots into it, part by
//! part — the move's client sessions (`AcquireSessions`), then its keys
//! (`AcquireSlots`) — once its policies agree, so a moved key is served
//! under the policy it had and every request id is answered as its old
//! owner would; then, once no move it can read is pending, makes its
//! voters the shard's replicas in the placement (new ones join as learners
//! first; a leader the change drops stops hosting the shard once it
//! commits, and the new replicas elect one of theirs), and releases the
//! moves the placement made out of it. A member keeps leading a group it
//! still hosts after the placement dropped it — even one it never founded
//! — so the leader a change drops is the one that makes the change.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use leasehold_core::coordinator::sharding::{policy_sync_commands, MoveId};
use leasehold_core::coordinator::{Command, Outcome, Proposal, ShardingOutcome};
use leasehold_core::shard::{ShardId, SlotMove};
use leasehold_raft_store::{Node, NodeId};

use super::hosted::Hosted;
use crate::coordinator::batcher::Proposer;
use crate::coordinator::context::{NodeContext, RaftProposer};
use crate::coordinator::leader::LeaderView;

/// Most parts of moves one pass proposes for one shard.
const PARTS_PER_PASS: usize = 64;

/// Drives the shards this member leads, reading the placement and the
/// moves from the meta group.
pub(super) struct ShardLeader {
    meta: Arc<NodeContext>,
    /// Moves this member leads the target of but cannot read (it hosts no
    /// replica of the source), each warned about once.
    unreadable_moves: std::sync::Mutex<BTreeSet<MoveId>>,
}

impl ShardLeader {
    /// A leader of shards for the member of `meta` (shard 0's context).
    pub(super) fn new(meta: Arc<NodeContext>) -> Self {
        Self {
            meta,
            unreadable_moves: std::sync::Mutex::default(),
        }
    }

    /// Where this member leads `shard` (its group's `context`): make the
    /// group the shard, its policies the meta group's, acquire the moves
    /// into it (reading the sources this member hosts, `hosted`), follow
    /// the placement's replicas and release the moves out of it.
    pub(super) async fn drive(
        &self,
        shard: ShardId,
        context: &NodeContext,
        hosted: &BTreeMap<ShardId, Hosted>,
    ) {
        if LeaderView::of(&context.raft) != LeaderView::Me {
            return;
        }
        if context.state.read(|state| state.sharding().shard()) != shard {
            if let Err(status) = context.propose(Command::BecomeShard { shard }).await {
                tracing::debug!(shard = shard.0, %status, "BecomeShard not committed");
            }
            return;
        }
        let meta_policies = self.meta.state.read(|state| state.policies());
        let sync = context
            .state
            .read(|state| policy_sync_commands(&meta_policies, &state.policies()));
        if !sync.is_empty() {
            if let Err(status) = context.propose_all(sync).await {
                tracing::debug!(shard = shard.0, %status, "policy sync not committed");
            }
            return;
        }
        self.acquire(shard, context, hosted).await;
        // A replica change waits for the moves into the shard this leader
        // can read: the group's replicas now host their sources (a move
        // out of a shard other than 0 goes to a shard on its replicas),
        // the new ones may not. A move this leader cannot read does not
        // hold it up: the new replicas may be the ones that can.
        if self.next_part(shard, context, hosted).is_some() {
            return;
        }
        if !self.follow_replicas(shard, context).await {
            return;
        }
        self.release(shard, context).await;
    }

    /// Proposes the next parts of the moves into `shard` (up to
    /// [`PARTS_PER_PASS`]).
    async fn acquire(
        &self,
        shard: ShardId,
        context: &NodeContext,
        hosted: &BTreeMap<ShardId, Hosted>,
    ) {
        for _ in 0..PARTS_PER_PASS {
            let Some(part) = self.next_part(shard, context, hosted) else {
                return;
            };
            // A part is an entry of its own, beside no batch: an entry
            // stays within what a peer message is sized for (a batch of
            // `max_batch_commands` small commands, or one part).
            let proposal = Proposal {
                stamp_ms: context.clock.now_ms(),
                commands: vec![part],
            };
            let proposer =
                RaftProposer::new(context.raft.clone(), context.config.proposal_timeout());
            if let Err(error) = proposer.propose(proposal).await {
                tracing::debug!(shard = shard.0, %error, "move part not committed");
                return;
            }
        }
    }

    /// Releases the moves the placement made out of `shard` that it has
    /// not released yet (each once the shard owns every slot of it).
    async fn release(&self, shard: ShardId, context: &NodeContext) {
        let released: BTreeSet<MoveId> = context
            .state
            .read(|state| state.sharding().outgoing().keys().copied().collect());
        let pending: Vec<Command> = self.meta.state.read(|meta| {
            meta.sharding()
                .outgoing()
                .iter()
                .filter(|(id, outgoing)| outgoing.slots.from == shard && !released.contains(id))
                .map(|(id, outgoing)| Command::ReleaseSlots {
                    id: *id,
                    slots: outgoing.slots,
                })
                .collect()
        });
        for command in pending {
            match context.propose(command).await {
                Ok(Outcome::Sharding(ShardingOutcome::Released { keys })) => tracing::info!(
                    shard = shard.0,
                    keys,
                    "shard {} released slots with {keys} keys",
                    shard.0
                ),
                Ok(outcome) => {
                    tracing::debug!(shard = shard.0, ?outcome, "slots not released yet");
                }
                Err(status) => {
                    tracing::debug!(shard = shard.0, %status, "release not committed");
                    return;
                }
            }
        }
    }

    /// Makes the group's voters the shard's replicas in the placement:
    /// adds the new ones as learners, then changes the voters. `true` when
    /// they already agree (the pass goes on).
    async fn follow_replicas(&self, shard: ShardId, context: &NodeContext) -> bool {
        let Some(replicas) = self
            .meta
            .state
            .read(|state| state.sharding().placement().replicas(shard).cloned())
        else {
            return false;
        };
        let (voters, nodes): (BTreeSet<NodeId>, BTreeSet<NodeId>) = {
            let metrics = context.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            (
                membership.voter_ids().collect(),
                membership.nodes().map(|(id, _)| *id).collect(),
            )
        };
        if voters == replicas {
            return true;
        }
        let addresses: BTreeMap<NodeId, Node> = self
            .meta
            .state
            .membership()
            .membership()
            .nodes()
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        let timeout = self.meta.config.admin_timeout();
        for id in replicas.difference(&nodes) {
            let Some(node) = addresses.get(id) else {
                tracing::warn!(shard = shard.0, member = id, "no address for member {id}");
                return false;
            };
            let added =
                tokio::time::timeout(timeout, context.raft.add_learner(*id, node.clone(), true))
                    .await;
            if !matches!(added, Ok(Ok(_))) {
                tracing::debug!(shard = shard.0, member = id, "learner not added yet");
                return false;
            }
        }
        let changed = tokio::time::timeout(
            timeout,
            context.raft.change_membership(replicas.clone(), false),
        )
        .await;
        match changed {
            Ok(Ok(_)) => tracing::info!(
                shard = shard.0,
                replicas = ?replicas,
                "shard {} replicated by {replicas:?}",
                shard.0
            ),
            Ok(Err(error)) => {
                tracing::debug!(shard = shard.0, %error, "replica change not committed yet")
            }
            Err(_) => tracing::debug!(
                shard = shard.0,
                "replica change not committed yet (timed out)"
            ),
        }
        false
    }

    /// The next part of the first move into `shard` not yet complete whose
    /// source has released it — its client sessions first
    /// (`AcquireSessions`), then its keys (`AcquireSlots`): read from the
    /// meta group for a move out of shard 0, else from this member's
    /// replica of the source (a move out of a shard other than 0 goes to a
    /// shard on its replicas).
    fn next_part(
        &self,
        shard: ShardId,
        context: &NodeContext,
        hosted: &BTreeMap<ShardId, Hosted>,
    ) -> Option<Command> {
        let moves: Vec<(MoveId, SlotMove)> = self.meta.state.read(|meta| {
            meta.sharding()
                .outgoing()
                .iter()
                .filter(|(_, outgoing)| outgoing.slots.to == shard)
                .map(|(id, outgoing)| (*id, outgoing.slots))
                .collect()
        });
        moves.into_iter().find_map(|(id, slots)| {
            let arrival = context.state.read(|state| state.sharding().arrival(id));
            if arrival.complete {
                return None;
            }
            let source = if slots.from == ShardId(0) {
                &self.meta.state
            } else if let Some(hosted) = hosted.get(&slots.from) {
                &hosted.context.state
            } else {
                let first_time = self
                    .unreadable_moves
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(id);
                if first_time {
                    tracing::warn!(
                        shard = shard.0,
                        from = slots.from.0,
                        "shard {} cannot acquire move {id}: this member (its leader) hosts no \
                         replica of shard {} to read it from (said once per move)",
                        shard.0,
                        slots.from.0
                    );
                }
                return None;
            };
            source.read(|state| {
                state
                    .sharding()
                    .outgoing()
                    .get(&id)
                    .map(|released| released.next_part(id, arrival))
            })
        })
    }
}
