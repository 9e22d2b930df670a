//! The shards a member hosts besides shard 0 (ADR 0025).
//!
//! [`ShardHost`] watches this member's applied view of the meta group's
//! placement and, for every shard that names this member a replica:
//!
//! 1. **Hosts it** ([`super::hosted::Hosted`]): opens the shard's store
//!    ([`ShardStoreOpener`]; on disk `data_dir/shards/<id>`,
//!    [`crate::coordinator::stores::on_disk`]), starts its Raft group on
//!    the member's one transport ([`PeerNetwork::for_shard`]), registers
//!    it with the Raft handler and the router, and gives it a batcher and
//!    clock ticks of its own. One replica of the shard's *founding* replicas (those it
//!    was created with, kept in the placement; [`forming_replica`]: shard
//!    `s`'s `s % n`-th, so the first leaders of shards on the same
//!    members are spread over them) initialises the group with them as
//!    voters; a member a replica change added waits for the group's
//!    leader to add it. A founding replica dropped before it ever hosted
//!    the shard still joins it until its group no longer needs it.
//! 2. **Leads it**, where this member is the shard's leader: makes the
//!    group the shard, its policies the meta group's, acquires the moves
//!    into it and follows the placement's replicas ([`super::leading`]).
//! 3. **Takes its leadership back**, where this member is the shard's
//!    preferred leader and another member has led it long while leading
//!    more of the groups here ([`super::reclaim`]).
//!
//! Each step is a replicated command, idempotent, and re-derived from the
//! applied states on every pass ([`SHARD_PASS_INTERVAL`]), so a new
//! leader, a restarted member or a lost proposal simply carries on where
//! the states stand.
//!
//! A shard whose replicas no longer name this member stops being routed
//! and is shut down (its store stays on disk) once its group no longer
//! counts this member, or has had no leader for
//! [`DROPPED_REPLICA_LEADERLESS_FOR`] (a member removed from a group is
//! not told) — or at once when the shard left the placement.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::shard::{forming_replica, ShardId};
use leasehold_raft_store::{Node, NodeId, Raft};
use tokio::sync::watch;

use super::hosted::{in_any_group, in_group, Hosted};
use super::leading::ShardLeader;
use super::reclaim::Reclaims;
use super::routing::HostedApis;
use crate::coordinator::api::CoordinatorApi;
use crate::coordinator::context::{store_has_log, GroupParts, NodeContext};
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

/// Hosts and drives this member's shards past 0 (see the module doc).
pub struct ShardHost {
    meta: Arc<NodeContext>,
    network: PeerNetwork,
    open_stores: ShardStoreOpener,
    raft_groups: HostedShards,
    apis: HostedApis,
    hosted: BTreeMap<ShardId, Hosted>,
    /// What it does for the shards it leads.
    leader: ShardLeader,
    /// The leaderships it takes back as a preferred replica.
    reclaims: Reclaims,
    /// Shards this member stopped hosting: never joined again as a
    /// founding replica only (its group has moved on without it).
    given_up: BTreeSet<ShardId>,
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
            leader: ShardLeader::new(meta.clone()),
            meta,
            network,
            open_stores,
            raft_groups,
            apis,
            hosted: BTreeMap::new(),
            reclaims: Reclaims::default(),
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
                self.leader.drive(*shard, &context, &self.hosted).await;
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
            self.leader.drive(shard, &context, &self.hosted).await;
        }
        self.reclaims
            .reclaim_preferred(&self.meta, &self.hosted, &wanted, now)
            .await;
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
}
