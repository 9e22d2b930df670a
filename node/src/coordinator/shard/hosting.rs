//! The shards a member hosts besides shard 0 (ADR 0025).
//!
//! [`ShardHost`] watches this member's applied view of the meta group's
//! placement and, for every shard that names this member a replica:
//!
//! 1. **Hosts it**: opens the shard's store ([`ShardStoreOpener`]; on disk
//!    `data_dir/shards/<id>`, [`crate::coordinator::stores::on_disk`]), starts its Raft group on the member's one
//!    transport ([`PeerNetwork::for_shard`]), registers it with the Raft
//!    handler and the router, and gives it a batcher and clock ticks of
//!    its own. One replica of the shard's *founding* replicas (those it
//!    was created with, kept in the placement; [`forming_replica`]: shard
//!    `s`'s `s % n`-th, so the first leaders of shards on the same
//!    members are spread over them) initialises the group with them as
//!    voters; a member a replica change added waits for the group's
//!    leader to add it. A founding replica dropped before it ever hosted
//!    the shard still joins it until its group no longer needs it.
//! 2. **Leads it**, where this member is the shard's leader: makes the
//!    group the shard (`BecomeShard`), keeps its policies those of the
//!    meta group (`policy_sync_commands`), acquires every move of slots
//!    into it, part by part — the move's client sessions
//!    (`AcquireSessions`), then its keys (`AcquireSlots`) — once its
//!    policies agree, so a moved key is served under the policy it had
//!    and every request id is answered as its old owner would; then, once
//!    no move it can read is pending, makes its voters the shard's
//!    replicas in the placement (new ones join as learners first; a
//!    leader the change drops stops hosting the shard once it commits,
//!    and the new replicas elect one of theirs). A member keeps leading a
//!    group it still hosts after the placement dropped it — even one it
//!    never founded — so the leader a change drops is the one that makes
//!    the change.
//!
//! Each step is a replicated command, idempotent, and re-derived from the
//! applied states on every pass ([`SHARD_PASS_INTERVAL`]), so a new
//! leader, a restarted member or a lost proposal simply carries on where
//! the states stand.
//!
//! 3. **Takes its leadership back**, where this member is the shard's
//!    forming replica (its *preferred* leader) and another member leads
//!    it: once that leader has led it for [`RECLAIM_AFTER`] and leads
//!    more of the groups this member hosts (shard 0 counted) than this
//!    member does, this member stands for election
//!    (`trigger().elect()`). A member that failed and came back so gets
//!    its share of the leaderships again (openraft 0.9 has no leadership
//!    transfer); each reclaim costs the shard one election. Tries back
//!    off from [`RECLAIM_BACKOFF_FIRST`] to [`RECLAIM_BACKOFF_MAX`] while
//!    they do not take.
//!
//! A shard whose replicas no longer name this member stops being routed
//! and is shut down (its store stays on disk) once its group no longer
//! counts this member, or has had no leader for
//! [`DROPPED_REPLICA_LEADERLESS_FOR`] (a member removed from a group is
//! not told) — or at once when the shard left the placement.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::coordinator::sharding::{policy_sync_commands, MoveId};
use leasehold_core::coordinator::{Command, Outcome, Proposal, ShardingOutcome};
use leasehold_core::shard::{forming_replica, ShardId, SlotMove};
use leasehold_raft_store::{Node, NodeId, Raft};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::routing::HostedApis;
use crate::coordinator::api::CoordinatorApi;
use crate::coordinator::batcher::Proposer;
use crate::coordinator::context::{store_has_log, GroupParts, NodeContext, RaftProposer};
use crate::coordinator::leader::LeaderView;
use crate::coordinator::network::PeerNetwork;
use crate::coordinator::raft_service::{HostedGroup, HostedShards};
use crate::coordinator::stores::ShardStoreOpener;
use crate::coordinator::tasks;
use crate::error::NodeError;

/// How often the host compares the placement with what it hosts and
/// drives the shards it leads.
pub const SHARD_PASS_INTERVAL: Duration = Duration::from_millis(100);

/// A replica dropped from a shard's replicas stops hosting it once its
/// group no longer counts it — which a member removed from a group may
/// never learn (the leader stops replicating to it) — or once its group
/// has had no leader this long.
pub const DROPPED_REPLICA_LEADERLESS_FOR: Duration = Duration::from_secs(3);

/// How long another member must have led a shard before its preferred
/// replica takes the leadership back (a member that just came back has
/// caught up by then; a leader just elected is not unseated at once).
pub const RECLAIM_AFTER: Duration = Duration::from_secs(5);

/// The wait after a reclaim of one shard before the next; doubled after
/// each that did not take, up to [`RECLAIM_BACKOFF_MAX`].
pub const RECLAIM_BACKOFF_FIRST: Duration = Duration::from_secs(15);

/// The longest wait between two reclaims of one shard.
pub const RECLAIM_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Most parts of moves one pass proposes for one shard.
const PARTS_PER_PASS: usize = 64;

/// One hosted shard.
struct Hosted {
    context: Arc<NodeContext>,
    /// Since when its group has known no leader (as of the last pass).
    leaderless_since: Option<tokio::time::Instant>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Whether `raft` belongs to a group yet (it has a membership: formed
/// here, or joined by its leader).
fn in_any_group(raft: &Raft) -> bool {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .next()
        .is_some()
}

/// Whether `raft`'s group counts `member` (voter or learner).
fn in_group(raft: &Raft, member: NodeId) -> bool {
    raft.metrics()
        .borrow()
        .membership_config
        .membership()
        .nodes()
        .any(|(id, _)| *id == member)
}

/// Hosts and drives this member's shards past 0 (see the module doc).
pub struct ShardHost {
    meta: Arc<NodeContext>,
    network: PeerNetwork,
    open_stores: ShardStoreOpener,
    raft_groups: HostedShards,
    apis: HostedApis,
    hosted: BTreeMap<ShardId, Hosted>,
    /// Moves this member leads the target of but cannot read (it hosts no
    /// replica of the source), each warned about once.
    unreadable_moves: std::sync::Mutex<BTreeSet<MoveId>>,
    /// Per shard this member is the preferred leader of: who else leads
    /// it, since when, and when a reclaim may be tried next.
    reclaims: BTreeMap<ShardId, Reclaim>,
    /// Shards this member stopped hosting: never joined again as a
    /// founding replica only (its group has moved on without it).
    given_up: BTreeSet<ShardId>,
}

/// The leadership of one shard as its preferred replica sees it.
#[derive(Debug, Clone, Copy)]
struct Reclaim {
    /// The other member leading the shard, and since when (as seen).
    leader: NodeId,
    since: tokio::time::Instant,
    /// No reclaim before this.
    next_try: tokio::time::Instant,
    /// The wait after the next reclaim.
    backoff: Duration,
}

/// Whether `preferred` should stand for election against `leader`, which
/// has led the shard for `led_for`, given how many of the groups
/// `preferred` hosts each member leads: only when `leader` leads more
/// than `preferred`, so a reclaim never leaves the two further apart. It
/// cannot go back and forth either: only a shard's preferred replica
/// reclaims it, and it keeps what it leads.
pub fn should_reclaim(
    leaderships: &BTreeMap<NodeId, usize>,
    preferred: NodeId,
    leader: NodeId,
    led_for: Duration,
) -> bool {
    let count = |member| leaderships.get(&member).copied().unwrap_or(0);
    leader != preferred && led_for >= RECLAIM_AFTER && count(leader) > count(preferred)
}

impl ShardHost {
    /// A host for the member of `meta` (shard 0's context), starting
    /// groups on `network`, their stores from `open_stores`, registering
    /// them in `raft_groups` (the Raft handler) and `apis` (the router).
    pub fn new(
        meta: Arc<NodeContext>,
        network: PeerNetwork,
        open_stores: ShardStoreOpener,
        raft_groups: HostedShards,
        apis: HostedApis,
    ) -> Self {
        Self {
            meta,
            network,
            open_stores,
            raft_groups,
            apis,
            hosted: BTreeMap::new(),
            unreadable_moves: std::sync::Mutex::default(),
            reclaims: BTreeMap::new(),
            given_up: BTreeSet::new(),
        }
    }

    /// Runs passes until `stopped` turns true, then shuts every hosted
    /// group down. Until the placement first changes (a cluster never
    /// sharded) it only waits for that (the state machine's placement
    /// watch): no timer, no wake-up.
    pub async fn run(mut self, mut stopped: watch::Receiver<bool>) {
        let mut placement = self.meta.state.placement_changes();
        tokio::select! {
            sharded = placement.wait_for(|version| *version > 0) => if sharded.is_err() { return },
            _ = stopped.wait_for(|stopped| *stopped) => return,
        }
        let mut interval = tokio::time::interval(SHARD_PASS_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = stopped.wait_for(|stopped| *stopped) => break,
            }
            self.pass().await;
        }
        let shards: Vec<ShardId> = self.hosted.keys().copied().collect();
        for shard in shards {
            self.stop_hosting(shard).await;
        }
    }

    /// One pass: host what the placement gives this member, stop what it
    /// no longer does, drive the shards this member leads.
    async fn pass(&mut self) {
        let me = self.meta.id;
        let (wanted, founding): (
            BTreeMap<ShardId, BTreeSet<NodeId>>,
            BTreeMap<ShardId, BTreeSet<NodeId>>,
        ) = self.meta.state.read(|state| {
            let placement = state.sharding().placement();
            let shards = || placement.shards().filter(|shard| *shard != ShardId(0));
            let wanted = shards()
                .filter_map(|shard| {
                    let replicas = placement.replicas(shard)?;
                    replicas.contains(&me).then(|| (shard, replicas.clone()))
                })
                .collect();
            let founding = shards()
                .filter_map(|shard| {
                    let founders = placement.founding_replicas(shard)?;
                    founders.contains(&me).then(|| (shard, founders.clone()))
                })
                .collect();
            (wanted, founding)
        });
        // A founding replica that a replica change dropped before it ever
        // hosted the shard still joins it: the group is formed by its
        // founders (and keeps their quorum) until its leader has moved it
        // to the replicas the placement names. Given up for good once its
        // group dropped it or went leaderless without it (below).
        let joining: BTreeMap<ShardId, BTreeSet<NodeId>> = founding
            .into_iter()
            .filter(|(shard, _)| !wanted.contains_key(shard) && !self.given_up.contains(shard))
            .collect();
        let placed: BTreeSet<ShardId> = self
            .meta
            .state
            .read(|state| state.sharding().placement().shards().collect());
        // A replica dropped from a shard's replicas keeps hosting it while
        // the group still counts it (until the leader's membership change
        // commits), so the group keeps its quorum through the change.
        let now = tokio::time::Instant::now();
        for hosted in self.hosted.values_mut() {
            let led = hosted
                .context
                .raft
                .metrics()
                .borrow()
                .current_leader
                .is_some();
            hosted.leaderless_since = if led {
                None
            } else {
                Some(hosted.leaderless_since.unwrap_or(now))
            };
        }
        let gone: Vec<ShardId> = self
            .hosted
            .iter()
            .filter(|(shard, hosted)| {
                let cut_off = hosted.leaderless_since.is_some_and(|since| {
                    now.duration_since(since) >= DROPPED_REPLICA_LEADERLESS_FOR
                });
                let joins_unformed =
                    joining.contains_key(shard) && !in_any_group(&hosted.context.raft);
                !wanted.contains_key(shard)
                    && (!placed.contains(shard)
                        || (!in_group(&hosted.context.raft, me) && !joins_unformed)
                        || cut_off)
            })
            .map(|(shard, _)| *shard)
            .collect();
        for shard in gone {
            self.given_up.insert(shard);
            tracing::info!(
                member = me,
                shard = shard.0,
                "no longer a replica of shard {}: stopping it",
                shard.0
            );
            self.stop_hosting(shard).await;
        }
        self.given_up.retain(|shard| !wanted.contains_key(shard));
        let joining: Vec<(ShardId, BTreeSet<NodeId>)> = joining
            .into_iter()
            .filter(|(shard, _)| !self.given_up.contains(shard))
            .collect();
        for (shard, replicas) in wanted.iter().chain(joining.iter().map(|(s, r)| (s, r))) {
            if !self.hosted.contains_key(shard) {
                if let Err(error) = self.start_hosting(*shard, replicas).await {
                    tracing::warn!(member = me, shard = shard.0, %error, "cannot host shard {}", shard.0);
                    continue;
                }
            }
            self.initialize_if_first(*shard).await;
            if let Some(hosted) = self.hosted.get(shard) {
                let context = hosted.context.clone();
                self.drive(*shard, &context).await;
            }
        }
        // A group this member still hosts although the placement names it
        // neither a replica nor a founder is driven too: where it leads, it
        // is the one that makes the replica change dropping it (then the
        // group stops counting it and it stops hosting, above).
        let dropped: Vec<(ShardId, Arc<NodeContext>)> = self
            .hosted
            .iter()
            .filter(|(shard, _)| {
                !wanted.contains_key(shard) && !joining.iter().any(|(s, _)| s == *shard)
            })
            .map(|(shard, hosted)| (*shard, hosted.context.clone()))
            .collect();
        for (shard, context) in dropped {
            self.drive(shard, &context).await;
        }
        self.reclaim_preferred(&wanted, now).await;
    }

    /// Who leads the groups this member hosts (shard 0 and every hosted
    /// shard), counted per member.
    fn leaderships(&self) -> BTreeMap<NodeId, usize> {
        let mut counts = BTreeMap::new();
        let leaders = std::iter::once(self.meta.raft.metrics().borrow().current_leader).chain(
            self.hosted
                .values()
                .map(|hosted| hosted.context.raft.metrics().borrow().current_leader),
        );
        for leader in leaders.flatten() {
            *counts.entry(leader).or_insert(0) += 1;
        }
        counts
    }

    /// Stands for election in each shard this member is the preferred
    /// leader of and another member has led too long while leading too
    /// many (see the module doc, step 3).
    async fn reclaim_preferred(
        &mut self,
        wanted: &BTreeMap<ShardId, BTreeSet<NodeId>>,
        now: tokio::time::Instant,
    ) {
        let me = self.meta.id;
        let leaderships = self.leaderships();
        self.reclaims.retain(|shard, _| {
            wanted
                .get(shard)
                .is_some_and(|replicas| forming_replica(*shard, replicas) == Some(me))
        });
        for (shard, replicas) in wanted {
            if forming_replica(*shard, replicas) != Some(me) {
                continue;
            }
            let Some(hosted) = self.hosted.get(shard) else {
                continue;
            };
            let (leader, voter) = {
                let metrics = hosted.context.raft.metrics();
                let metrics = metrics.borrow();
                let voter = metrics
                    .membership_config
                    .membership()
                    .voter_ids()
                    .any(|id| id == me);
                (metrics.current_leader, voter)
            };
            let leader = match leader {
                Some(leader) if leader != me && voter => leader,
                Some(leader) if leader == me => {
                    // Led here: the next reclaim, if ever, starts afresh.
                    self.reclaims.remove(shard);
                    continue;
                }
                _ => continue,
            };
            let reclaim = self.reclaims.entry(*shard).or_insert(Reclaim {
                leader,
                since: now,
                next_try: now,
                backoff: RECLAIM_BACKOFF_FIRST,
            });
            if reclaim.leader != leader {
                reclaim.leader = leader;
                reclaim.since = now;
            }
            let led_for = now.duration_since(reclaim.since);
            if now < reclaim.next_try || !should_reclaim(&leaderships, me, leader, led_for) {
                continue;
            }
            tracing::info!(
                shard = shard.0,
                leader,
                "shard {}: its preferred replica stands for election (member {leader} leads \
                 {} of the groups here, this member {})",
                shard.0,
                leaderships.get(&leader).copied().unwrap_or(0),
                leaderships.get(&me).copied().unwrap_or(0)
            );
            reclaim.next_try = now + reclaim.backoff;
            reclaim.backoff = (reclaim.backoff * 2).min(RECLAIM_BACKOFF_MAX);
            self.meta.metrics.record_shard_leader_reclaim();
            if let Err(error) = hosted.context.raft.trigger().elect().await {
                tracing::warn!(shard = shard.0, %error, "shard {} could not stand for election", shard.0);
            }
        }
    }

    async fn start_hosting(
        &mut self,
        shard: ShardId,
        replicas: &BTreeSet<NodeId>,
    ) -> Result<(), NodeError> {
        let meta = &self.meta;
        let (log_store, state_machine) = (self.open_stores)(shard)?;
        let has_log = store_has_log(&log_store).await?;
        let state = state_machine.reader();
        let log_flush_latency = log_store.flush_latency();
        let raft_config = meta
            .config
            .raft_config()
            .map_err(|e| NodeError::Raft(e.to_string()))?;
        let raft = Raft::new(
            meta.id,
            raft_config,
            self.network.for_shard(shard),
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;
        let (stop, stopped) = watch::channel(false);
        let (context, batcher_task) = NodeContext::start(
            GroupParts {
                id: meta.id,
                raft: raft.clone(),
                state,
                log_flush_latency,
            },
            meta.config.clone(),
            meta.clock.clone(),
            meta.metrics.clone(),
            stopped.clone(),
        );
        let ticks = tokio::spawn(tasks::tick_clock(context.clone(), stopped));
        // Until the group counts this member, any member of the cluster may
        // be the one that adds it: after a replica change the group's
        // leader may be a replica the placement no longer names (it hands
        // over once the newcomers have joined).
        let joining: BTreeSet<NodeId> = meta
            .state
            .membership()
            .membership()
            .nodes()
            .map(|(id, _)| *id)
            .chain(replicas.iter().copied())
            .collect();
        self.raft_groups
            .insert(shard, HostedGroup::new(raft, joining, has_log));
        self.apis
            .insert(shard, CoordinatorApi::new(context.clone()));
        tracing::info!(
            member = meta.id,
            shard = shard.0,
            "hosting shard {}",
            shard.0
        );
        self.hosted.insert(
            shard,
            Hosted {
                context,
                leaderless_since: None,
                stop,
                tasks: vec![batcher_task, ticks],
            },
        );
        Ok(())
    }

    async fn stop_hosting(&mut self, shard: ShardId) {
        self.apis.remove(shard);
        self.raft_groups.remove(shard);
        let Some(hosted) = self.hosted.remove(&shard) else {
            return;
        };
        let _ = hosted.stop.send(true);
        for task in hosted.tasks {
            let _ = task.await;
        }
        if let Err(error) = hosted.context.raft.shutdown().await {
            tracing::warn!(shard = shard.0, %error, "shard {} did not shut down cleanly", shard.0);
        }
    }

    /// The [`forming_replica`] of the shard's *founding* replicas forms
    /// its group, with them as voters, when the group has no membership
    /// yet. Only that member, and only with them: a member a replica
    /// change added waits for the group's leader to add it (forming a
    /// group of the new replicas instead would start a second group that
    /// the others refuse), and a former dropped before it formed the
    /// group still forms it (it hosts the shard as a founding replica).
    async fn initialize_if_first(&self, shard: ShardId) {
        let Some(hosted) = self.hosted.get(&shard) else {
            return;
        };
        let Some(founders) = self.meta.state.read(|state| {
            state
                .sharding()
                .placement()
                .founding_replicas(shard)
                .cloned()
        }) else {
            return;
        };
        if forming_replica(shard, &founders) != Some(self.meta.id) {
            return;
        }
        if in_any_group(&hosted.context.raft) {
            return;
        }
        let membership = self.meta.state.membership();
        let members: BTreeMap<NodeId, Node> = membership
            .membership()
            .nodes()
            .filter(|(id, _)| founders.contains(id))
            .map(|(id, node)| (*id, node.clone()))
            .collect();
        if members.len() != founders.len() {
            tracing::warn!(
                shard = shard.0,
                "shard {} names founding replicas the cluster has no address for; waiting",
                shard.0
            );
            return;
        }
        match hosted.context.raft.initialize(members).await {
            Ok(()) => tracing::info!(shard = shard.0, "formed shard {}", shard.0),
            Err(error) => tracing::debug!(shard = shard.0, %error, "shard not formed"),
        }
    }

    /// Where this member leads `shard`: make the group the shard, its
    /// policies the meta group's, and acquire the moves into it.
    async fn drive(&self, shard: ShardId, context: &NodeContext) {
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
        self.acquire(shard, context).await;
        // A replica change waits for the moves into the shard this leader
        // can read: the group's replicas now host their sources (a move
        // out of a shard other than 0 goes to a shard on its replicas),
        // the new ones may not. A move this leader cannot read does not
        // hold it up: the new replicas may be the ones that can.
        if self.next_part(shard, context).is_some() {
            return;
        }
        if !self.follow_replicas(shard, context).await {
            return;
        }
        self.release(shard, context).await;
    }

    /// Proposes the next parts of the moves into `shard` (up to
    /// [`PARTS_PER_PASS`]).
    async fn acquire(&self, shard: ShardId, context: &NodeContext) {
        for _ in 0..PARTS_PER_PASS {
            let Some(part) = self.next_part(shard, context) else {
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
    fn next_part(&self, shard: ShardId, context: &NodeContext) -> Option<Command> {
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
            } else if let Some(hosted) = self.hosted.get(&slots.from) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(NodeId, usize)]) -> BTreeMap<NodeId, usize> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_preferred_replica_reclaims_only_from_a_busier_leader_that_settled() {
        let settled = RECLAIM_AFTER;
        // Member 3 came back leading nothing; member 1 leads two groups.
        let back = counts(&[(1, 2), (2, 1)]);
        assert!(should_reclaim(&back, 3, 1, settled));
        assert!(
            !should_reclaim(&back, 3, 1, settled - Duration::from_millis(1)),
            "a leader just elected is left alone"
        );
        assert!(!should_reclaim(&back, 1, 1, settled), "it leads already");
        // Even: a reclaim would only move the imbalance.
        let even = counts(&[(1, 1), (3, 1)]);
        assert!(!should_reclaim(&even, 3, 1, settled));
        // One more than the preferred one: taking it keeps them within one.
        assert!(should_reclaim(&counts(&[(1, 1)]), 3, 1, settled));
        assert!(should_reclaim(&counts(&[(1, 3), (3, 2)]), 3, 1, settled));
        assert!(!should_reclaim(&counts(&[(1, 2), (3, 2)]), 3, 1, settled));
    }
}
