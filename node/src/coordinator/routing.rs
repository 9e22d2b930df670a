//! Which group answers a key's call on this member (ADR 0025).
//!
//! The meta group's placement (this member's applied view of it) gives
//! each key a shard. A call for a key of shard 0 is answered by the meta
//! group, as on a cluster never sharded; one for a shard this member hosts
//! by that shard's group (its leadership, its log, its sessions); one for
//! a shard it does not host is refused `NOT_OWNER`, naming the shard, the
//! placement version and one of the shard's replicas as a leader hint (a
//! client that follows `NOT_LEADER` hints follows it, and the replica
//! answers or names the shard's leader). A cluster never sharded routes every call to
//! shard 0 without hashing the key.
//!
//! A `LeaseBatch` may mix shards: its items are cut by shard, each part
//! answered by its group at once, and the answers put back in order; a
//! part whose group cannot answer (not its leader here, no quorum) has
//! its items refused, not the batch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use leasehold_core::shard::ShardId;
use leasehold_proto::refusal::{
    refusal_with, Reason, LEADER_ADDR, LEADER_ID, PLACEMENT_VERSION, SHARD,
};
use leasehold_proto::LeaderHint;
use leasehold_raft_store::StateReader;
use tonic::Status;

use leasehold_proto::v1 as pb;

use super::api::CoordinatorApi;
use super::context::NodeContext;
use super::leader::LeaderView;
use super::metrics::{NodeMetrics, Rejection};

/// The coordinator APIs of the shards past 0 this member hosts (shared by
/// the router and the shard host, which adds and removes them).
#[derive(Clone, Default)]
pub struct HostedApis(Arc<RwLock<BTreeMap<ShardId, CoordinatorApi>>>);

impl HostedApis {
    /// Serves `shard`'s keys with `api`.
    pub fn insert(&self, shard: ShardId, api: CoordinatorApi) {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(shard, api);
    }

    /// Stops serving `shard`'s keys here.
    pub fn remove(&self, shard: ShardId) {
        self.0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(&shard);
    }

    /// Every hosted shard's API, in id order.
    pub fn all(&self) -> Vec<(ShardId, CoordinatorApi)> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .map(|(id, api)| (*id, api.clone()))
            .collect()
    }

    /// The APIs of every hosted shard but `shard`.
    pub fn others(&self, shard: ShardId) -> Vec<CoordinatorApi> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .filter(|(id, _)| **id != shard)
            .map(|(_, api)| api.clone())
            .collect()
    }

    /// The API of `shard`, if hosted.
    pub fn get(&self, shard: ShardId) -> Option<CoordinatorApi> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&shard)
            .cloned()
    }
}

/// Where one key's call goes on this member.
pub enum Route {
    /// The meta group (shard 0).
    Meta,
    /// A hosted shard's group.
    Hosted(ShardId, CoordinatorApi),
}

/// Routes keys by the meta group's placement.
pub struct ShardRouting {
    meta_state: StateReader,
    /// The meta group's placement version, as applied: 0 (never sharded)
    /// answers every key without the state's lock, which `apply` contends.
    placement_version: tokio::sync::watch::Receiver<u64>,
    hosted: HostedApis,
    metrics: Arc<NodeMetrics>,
    /// Turns the replica a `NOT_OWNER` names, so callers spread out.
    next_replica: AtomicUsize,
}

impl ShardRouting {
    /// A router reading the placement from `meta_state` and serving the
    /// shards in `hosted`.
    pub fn new(meta_state: StateReader, hosted: HostedApis, metrics: Arc<NodeMetrics>) -> Self {
        Self {
            placement_version: meta_state.placement_changes(),
            meta_state,
            hosted,
            metrics,
            next_replica: AtomicUsize::new(0),
        }
    }

    /// A replica of `shard` (id and address) for a caller to ask: one of
    /// its replicas the meta group knows an address of, in turn.
    fn a_replica_of(&self, shard: ShardId) -> Option<(u64, String)> {
        let replicas: Vec<u64> = self.meta_state.read(|state| {
            state
                .sharding()
                .placement()
                .replicas(shard)
                .map(|r| r.iter().copied().collect())
                .unwrap_or_default()
        });
        let membership = self.meta_state.membership();
        let known: Vec<(u64, String)> = membership
            .membership()
            .nodes()
            .filter(|(id, _)| replicas.contains(id))
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect();
        if known.is_empty() {
            return None;
        }
        let turn = self.next_replica.fetch_add(1, Ordering::Relaxed);
        known.get(turn % known.len()).cloned()
    }

    /// The shard of `key` and the placement version, as this member knows
    /// them. On a cluster never sharded (the usual case, on every call's
    /// path) neither the key is hashed nor the state's lock taken.
    pub fn shard_of(&self, key: &str) -> (ShardId, u64) {
        if *self.placement_version.borrow() == 0 {
            return (ShardId(0), 0);
        }
        self.meta_state.read(|state| {
            let sharding = state.sharding();
            (sharding.shard_of(key), sharding.placement_version())
        })
    }

    /// The groups past 0 this member hosts, but `shard`'s (where a retry
    /// of a request a key's earlier owner executed is answered).
    pub fn hosted_except(&self, shard: ShardId) -> Vec<CoordinatorApi> {
        self.hosted.others(shard)
    }

    /// The leader of `shard` as this member sees it, if it hosts it.
    pub fn leader_of(&self, shard: ShardId) -> Option<LeaderView> {
        self.hosted
            .get(shard)
            .map(|api| LeaderView::of(&api.raft()))
    }

    /// Where `key`'s call goes (see the module doc).
    pub fn route(&self, key: &str) -> Result<Route, Status> {
        let (shard, version) = self.shard_of(key);
        if shard == ShardId(0) {
            return Ok(Route::Meta);
        }
        match self.hosted.get(shard) {
            // A new group serves nothing before it is the shard (before
            // `BecomeShard` is applied, its state would take any key).
            Some(api) if api.context().state.read(|s| s.sharding().shard()) != shard => {
                Err(leasehold_proto::refusal::refusal(
                    Reason::SlotMoving,
                    format!(
                        "shard {} is still forming on this member; retry shortly",
                        shard.0
                    ),
                ))
            }
            Some(api) => Ok(Route::Hosted(shard, api)),
            None => {
                self.metrics.record_rejection(Rejection::NotOwner);
                let replica = self
                    .a_replica_of(shard)
                    .map(|(id, addr)| LeaderView::Other {
                        id,
                        addr: Some(addr),
                    });
                Err(not_owner(shard, version, replica))
            }
        }
    }
}

/// The `NOT_OWNER` refusal naming `shard` and a member to ask: its
/// leader, or one of its replicas (as a leader hint, in the `ErrorInfo`
/// and the `leasehold-leader-*` metadata, so a client that follows leader
/// hints reaches the shard without knowing of shards).
pub fn not_owner(shard: ShardId, placement_version: u64, ask: Option<LeaderView>) -> Status {
    let mut metadata = vec![
        (SHARD, shard.0.to_string()),
        (PLACEMENT_VERSION, placement_version.to_string()),
    ];
    let mut hint = LeaderHint::default();
    if let Some(LeaderView::Other { id, addr }) = ask {
        metadata.push((LEADER_ID, id.to_string()));
        if let Some(addr) = &addr {
            metadata.push((LEADER_ADDR, addr.clone()));
        }
        hint = LeaderHint::new(Some(id), addr);
    }
    let mut status = refusal_with(
        Reason::NotOwner,
        format!(
            "this member does not serve shard {} (placement version {placement_version}): \
             read the placement and send the call to that shard's leader",
            shard.0
        ),
        metadata,
    );
    hint.write_metadata(status.metadata_mut());
    status
}

/// The placement as `GetPlacement` answers it: the meta group's (as
/// `meta` has applied it), each shard's replicas with their addresses
/// from the meta group's membership, and each leader `leader_of` knows.
pub fn placement_message(
    meta: &NodeContext,
    leader_of: impl Fn(ShardId) -> Option<LeaderView>,
) -> pb::Placement {
    let placement = meta.state.read(|state| state.sharding().placement());
    let membership = meta.state.membership();
    let addresses: BTreeMap<u64, String> = membership
        .membership()
        .nodes()
        .map(|(id, node)| (*id, node.addr.clone()))
        .collect();
    let slots = placement
        .runs()
        .into_iter()
        .map(|(start, end, shard)| pb::SlotRange {
            start: u32::from(start),
            end,
            shard: shard.0,
        })
        .collect();
    let shards = placement
        .shards()
        .map(|shard| {
            let replicas: Vec<u64> = match placement.replicas(shard) {
                Some(replicas) if shard != ShardId(0) => replicas.iter().copied().collect(),
                _ => addresses.keys().copied().collect(),
            };
            let replica_addrs = replicas
                .iter()
                .filter_map(|id| {
                    addresses.get(id).map(|addr| pb::Member {
                        id: *id,
                        addr: addr.clone(),
                    })
                })
                .collect();
            let (leader_id, leader_addr) = match leader_of(shard) {
                Some(LeaderView::Me) => (
                    Some(meta.id),
                    addresses.get(&meta.id).cloned().unwrap_or_default(),
                ),
                Some(LeaderView::Other { id, addr }) => (Some(id), addr.unwrap_or_default()),
                _ => (None, String::new()),
            };
            pb::ShardInfo {
                id: shard.0,
                replicas: if shard == ShardId(0) {
                    Vec::new()
                } else {
                    replicas
                },
                replica_addrs,
                slots: placement.slot_count(shard),
                leader_id,
                leader_addr,
            }
        })
        .collect();
    pb::Placement {
        version: placement.version(),
        slots,
        shards,
    }
}

/// `status` from a shard's group, naming the shard and the placement
/// version when it is a `NOT_LEADER` (so a client that routes by the
/// placement learns it has one to read); any other status as it is.
pub fn with_shard(status: Status, shard: ShardId, placement_version: u64) -> Status {
    if leasehold_proto::refusal::reason_of(&status) != Some(Reason::NotLeader) {
        return status;
    }
    let hint = LeaderHint::from_status(&status);
    let mut metadata = vec![
        (SHARD, shard.0.to_string()),
        (PLACEMENT_VERSION, placement_version.to_string()),
    ];
    if let Some(id) = hint.leader_id {
        metadata.push((LEADER_ID, id.to_string()));
    }
    if let Some(addr) = &hint.leader_addr {
        metadata.push((LEADER_ADDR, addr.clone()));
    }
    let mut annotated = refusal_with(Reason::NotLeader, status.message().to_string(), metadata);
    hint.write_metadata(annotated.metadata_mut());
    annotated
}
