//! Which group answers a key's call on this member (ADR 0025), and the
//! `leasehold.v1.Coordinator` service that sends each call there.
//!
//! [`ShardRouting`] is the service a member serves: for each call it
//! works out the key's shard once, picks that group's [`CoordinatorApi`]
//! (or refuses), and hands it the decoded message and its caller; the
//! APIs know nothing of shards.
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
//!
//! A group's `NOT_LEADER` for a key of a shard past 0 names the shard and
//! the placement version ([`with_shard`]); the refusals of this module
//! (`NOT_OWNER`, a shard still forming) are not annotated further.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use leasehold_core::shard::ShardId;
use leasehold_proto::convert::InvalidField;
use leasehold_proto::refusal::{
    item_refusal, refusal, refusal_with, Reason, LEADER_ADDR, LEADER_ID, PLACEMENT_VERSION, SHARD,
};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::coordinator_server::Coordinator;
use leasehold_proto::LeaderHint;
use leasehold_raft_store::StateReader;
use tonic::{Request, Response, Status};

use crate::coordinator::api::{Caller, CoordinatorApi};
use crate::coordinator::context::NodeContext;
use crate::coordinator::leader::LeaderView;
use crate::coordinator::metrics::{NodeMetrics, Rejection};
use crate::telemetry;

/// Most items in one `LeaseBatch`.
pub const MAX_BATCH_ITEMS: usize = 256;

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

    /// The API of `shard`, if hosted.
    pub fn get(&self, shard: ShardId) -> Option<CoordinatorApi> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&shard)
            .cloned()
    }
}

/// Where one key's call goes on this member: the API of the group that
/// serves the key's shard here.
pub struct Route {
    /// The key's shard.
    pub shard: ShardId,
    /// The placement version the shard was read at.
    pub placement_version: u64,
    /// The API of the shard's group (the meta group's for shard 0).
    pub api: CoordinatorApi,
}

impl Route {
    /// `result` of the call, its `NOT_LEADER` naming the shard and the
    /// placement version when the shard is not 0.
    pub fn answer<T>(&self, result: Result<T, Status>) -> Result<T, Status> {
        if self.shard == ShardId(0) {
            return result;
        }
        result.map_err(|status| with_shard(status, self.shard, self.placement_version))
    }
}

/// Serves `leasehold.v1.Coordinator` for one member: routes each key by
/// the meta group's placement to the group that answers it.
pub struct ShardRouting {
    /// The meta group's API (shard 0's keys, and every key on a cluster
    /// never sharded).
    meta: CoordinatorApi,
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
    /// A router over the meta group's API `meta`, reading the placement
    /// from its state and serving the shards in `hosted`.
    pub fn new(meta: CoordinatorApi, hosted: HostedApis) -> Self {
        let meta_state = meta.context().state.clone();
        let metrics = meta.context().metrics.clone();
        Self {
            placement_version: meta_state.placement_changes(),
            meta,
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

    /// The leader of `shard` as this member sees it, if it hosts it (the
    /// meta group's for shard 0).
    pub fn leader_of(&self, shard: ShardId) -> Option<LeaderView> {
        if shard == ShardId(0) {
            return Some(LeaderView::of(&self.meta.context().raft));
        }
        self.hosted
            .get(shard)
            .map(|api| LeaderView::of(&api.raft()))
    }

    /// Where `key`'s call goes (see the module doc).
    pub fn route(&self, key: &str) -> Result<Route, Status> {
        let (shard, version) = self.shard_of(key);
        self.route_to(shard, version)
    }

    /// Where a call for a key of `shard` goes, the placement read at
    /// `version`.
    fn route_to(&self, shard: ShardId, version: u64) -> Result<Route, Status> {
        if shard == ShardId(0) {
            return Ok(Route {
                shard,
                placement_version: version,
                api: self.meta.clone(),
            });
        }
        match self.hosted.get(shard) {
            // A new group serves nothing before it is the shard (before
            // `BecomeShard` is applied, its state would take any key).
            Some(api) if api.context().state.read(|s| s.sharding().shard()) != shard => {
                Err(refusal(
                    Reason::SlotMoving,
                    format!(
                        "shard {} is still forming on this member; retry shortly",
                        shard.0
                    ),
                ))
            }
            Some(api) => Ok(Route {
                shard,
                placement_version: version,
                api,
            }),
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

impl ShardRouting {
    /// `LeaseBatch`: the items cut by shard, each part answered by its
    /// group at once ([`CoordinatorApi::lease_items`]), the answers put
    /// back in order. A batch all of shard 0 is the meta group's alone: a
    /// failure to propose it fails the call.
    async fn lease_batch_results(
        &self,
        request: Request<pb::LeaseBatchRequest>,
    ) -> Result<Vec<pb::LeaseItemResult>, Status> {
        let caller = Caller::of(&request);
        let items = request.into_inner().items;
        if items.is_empty() || items.len() > MAX_BATCH_ITEMS {
            self.metrics.record_rejection(Rejection::InvalidArgument);
            return Err(Status::from(InvalidField::new(
                "items",
                format!(
                    "a batch holds 1 to {MAX_BATCH_ITEMS} items, not {}",
                    items.len()
                ),
            )));
        }
        let count = items.len();
        // Each part: its shard, the placement version its first item was
        // read at, and its items with their places in the batch.
        let mut parts: BTreeMap<ShardId, (u64, Vec<(usize, pb::LeaseRequest)>)> = BTreeMap::new();
        for (index, item) in items.into_iter().enumerate() {
            let (shard, version) = self.shard_of(&item.key);
            parts
                .entry(shard)
                .or_insert_with(|| (version, Vec::new()))
                .1
                .push((index, item));
        }
        if parts.len() == 1 && parts.contains_key(&ShardId(0)) {
            let items = parts
                .into_values()
                .flat_map(|(_, part)| part)
                .map(|(_, item)| item)
                .collect();
            return self.meta.lease_items(&caller, items).await;
        }
        let caller = &caller;
        let answers = parts
            .into_iter()
            .map(|(shard, (version, part))| async move {
                let (indices, items): (Vec<usize>, Vec<pb::LeaseRequest>) =
                    part.into_iter().unzip();
                let answered = match self.route_to(shard, version) {
                    Ok(route) => route.answer(route.api.lease_items(caller, items).await),
                    Err(status) => Err(status),
                };
                let results = match answered {
                    Ok(results) => results,
                    Err(status) => indices
                        .iter()
                        .map(|_| pb::LeaseItemResult {
                            result: Some(pb::lease_item_result::Result::Refused(item_refusal(
                                &status,
                            ))),
                        })
                        .collect(),
                };
                indices.into_iter().zip(results).collect::<Vec<_>>()
            });
        let mut ordered: Vec<Option<pb::LeaseItemResult>> = vec![None; count];
        for (index, result) in futures::future::join_all(answers)
            .await
            .into_iter()
            .flatten()
        {
            ordered[index] = Some(result);
        }
        Ok(ordered
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| pb::LeaseItemResult {
                    result: Some(pb::lease_item_result::Result::Refused(item_refusal(
                        &refusal(Reason::Internal, "no answer for the item"),
                    ))),
                })
            })
            .collect())
    }
}

/// Records a refusal (or a grant of nothing) on the current span, and
/// wraps the answer.
fn traced<T>(
    result: Result<T, Status>,
    granted_nothing: impl Fn(&T) -> bool,
) -> Result<Response<T>, Status> {
    match &result {
        Err(status) => telemetry::record_refusal(status),
        Ok(response) if granted_nothing(response) => {
            telemetry::record_denial(telemetry::DENIED_WINDOW_EXHAUSTED)
        }
        Ok(_) => {}
    }
    result.map(Response::new)
}

impl ShardRouting {
    /// The prologue of every key-addressed call, in one place: the call
    /// routed by its key (`key_of` its message; a refusal here is returned
    /// as it is) and its caller worked out once, with the decoded message
    /// for the key's group to answer.
    fn prologue<T>(
        &self,
        request: Request<T>,
        key_of: impl FnOnce(&T) -> &str,
    ) -> Result<(Route, Caller, T), Status> {
        let route = self.route(key_of(request.get_ref()))?;
        let caller = Caller::of(&request);
        Ok((route, caller, request.into_inner()))
    }
}

/// Each key-addressed call: its [`ShardRouting::prologue`], then its
/// message answered by the key's group with its caller, the answer
/// annotated with the shard ([`Route::answer`]) and recorded on the call's
/// span. A batch is cut by shard ([`ShardRouting::lease_batch_results`]).
#[tonic::async_trait]
impl Coordinator for ShardRouting {
    #[tracing::instrument(name = "coordinator.lease", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region, tokens = request.get_ref().tokens))]
    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let (route, caller, message) = self.prologue(request, |m| &m.key)?;
        let answer = route.api.lease(&caller, message).await;
        traced(route.answer(answer), |r| r.granted == 0)
    }

    #[tracing::instrument(name = "coordinator.lease_batch", level = "debug", skip_all, fields(
        items = request.get_ref().items.len()))]
    async fn lease_batch(
        &self,
        request: Request<pb::LeaseBatchRequest>,
    ) -> Result<Response<pb::LeaseBatchResponse>, Status> {
        let results = self.lease_batch_results(request).await;
        traced(
            results.map(|results| pb::LeaseBatchResponse { results }),
            |_| false,
        )
    }

    #[tracing::instrument(name = "coordinator.reconcile", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn reconcile(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        let (route, caller, message) = self.prologue(request, |m| &m.key)?;
        let answer = route.api.reconcile(&caller, message).await;
        traced(route.answer(answer), |_| false)
    }

    #[tracing::instrument(name = "coordinator.pool_grant", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn pool_grant(
        &self,
        request: Request<pb::PoolGrantRequest>,
    ) -> Result<Response<pb::PoolGrantResponse>, Status> {
        let (route, caller, message) = self.prologue(request, |m| &m.key)?;
        let answer = route.api.pool_grant(&caller, message).await;
        traced(route.answer(answer), |r| r.granted_total == 0)
    }

    #[tracing::instrument(name = "coordinator.pool_release", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn pool_release(
        &self,
        request: Request<pb::PoolReleaseRequest>,
    ) -> Result<Response<pb::PoolReleaseResponse>, Status> {
        let (route, caller, message) = self.prologue(request, |m| &m.key)?;
        let answer = route.api.pool_release(&caller, message).await;
        traced(route.answer(answer), |_| false)
    }

    #[tracing::instrument(name = "coordinator.get_window", level = "debug", skip_all, fields(
        key = %request.get_ref().key))]
    async fn get_window(
        &self,
        request: Request<pb::GetWindowRequest>,
    ) -> Result<Response<pb::GetWindowResponse>, Status> {
        let (route, _caller, message) = self.prologue(request, |m| &m.key)?;
        let answer = route.api.get_window(&message).await;
        traced(route.answer(answer), |_| false)
    }

    /// This member's view of the placement, with the leaders of the
    /// shards it hosts.
    async fn get_placement(
        &self,
        _request: Request<pb::GetPlacementRequest>,
    ) -> Result<Response<pb::Placement>, Status> {
        Ok(Response::new(placement_message(
            self.meta.context(),
            |shard| self.leader_of(shard),
        )))
    }
}
