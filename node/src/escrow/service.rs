//! The `leasehold.v1.Escrow` service and the table of key actors.
//!
//! The table is bounded by `max_keys`: a request for a new key when it is
//! full is refused with `RESOURCE_EXHAUSTED` (never an unbounded map, never
//! over-admission); idle actors hand their credits back and leave the table
//! after `idle_evict_ms`, making room.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::transport::WallClock;
use leasehold_core::escrow::{
    EscrowCounters, FairGateCounters, Holder, HolderCounters, Reconcile, ReturnClaim,
};
use leasehold_core::ids::{ClientId, Key, TenantId};
use leasehold_core::metrics::Histogram;
use leasehold_core::policy::{OutagePolicy, Policy, PolicyTable};
use leasehold_core::principal::Principal;
use leasehold_proto::refusal::{invalid_field, refusal, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::{REASON_FAIR_THROTTLED, REASON_METADATA};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::actor::{Acquired, HolderRequest, KeyHandle, KeyRequest, KeyView};
use super::lease_coalescer::LeaseCoalescer;
use super::outage::{describe_outage, OutageChange, OutageCounters, OutageTracker};
use super::EscrowConfig;
use crate::coordinator::convert::policy_from_wire;
use crate::net::ConnectionCounters;
use crate::telemetry;

/// State shared by the service and every key actor.
pub struct EscrowShared {
    /// The node's configuration.
    pub config: EscrowConfig,
    /// Client of the coordinator cluster.
    pub client: CoordinatorClient,
    /// Refills of every key, coalesced into `LeaseBatch` calls.
    pub leases: LeaseCoalescer,
    clock: Arc<dyn WallClock>,
    started: Instant,
    policies: RwLock<PolicyTable>,
    actors: Mutex<HashMap<String, KeyHandle>>,
    reachable: AtomicBool,
    outage: Mutex<OutageTracker>,
    evicted_keys: AtomicU64,
    leases_sent: AtomicU64,
    /// PoolGrant and Reconcile calls (leases are counted by the actors).
    other_calls_sent: AtomicU64,
    outage_denials: AtomicU64,
    fallback_tokens: AtomicU64,
    /// The listener's counters (connections, refused requests).
    pub connections: Arc<ConnectionCounters>,
    tokens_served: AtomicU64,
    returns_capped: AtomicU64,
    return_tokens_refused: AtomicU64,
    acquire_replays: AtomicU64,
    return_replays: AtomicU64,
    refused_request_ids: AtomicU64,
    refused_holders_exhausted: AtomicU64,
    /// Calls refused by identity (shared with the listener's auth layer).
    pub auth_refusals: Arc<crate::auth::AuthRefusals>,
    fair_passes: AtomicU64,
    fair_denials: AtomicU64,
    fair_idle_admissions: AtomicU64,
    shadow_would_deny_requests: AtomicU64,
    shadow_would_deny_tokens: AtomicU64,
    pool_tokens_released: AtomicU64,
    /// Key actors still running (a stopping node waits for them to hand
    /// their credits back), and a wake-up when one ends.
    running_actors: AtomicUsize,
    actor_ended: tokio::sync::Notify,
    /// Round trips of answered Lease and PoolGrant calls to the coordinator
    /// (client retries included), µs.
    pub lease_round_trip: Histogram,
    /// Denied Acquire and Check calls, by [`DenialReason`].
    denials: [AtomicU64; DenialReason::ALL.len()],
}

/// Why an escrow node denied a request (a denial is an answer, not a refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenialReason {
    /// The key's window budget is used up.
    WindowExhausted,
    /// The fair throttle refused the caller.
    FairThrottled,
    /// The coordinator is unreachable and the key's outage policy denies.
    CoordinatorUnreachable,
}

impl DenialReason {
    /// Every reason, in exposition order.
    pub const ALL: [DenialReason; 3] = [
        DenialReason::WindowExhausted,
        DenialReason::FairThrottled,
        DenialReason::CoordinatorUnreachable,
    ];

    /// The label value (and span attribute) of the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            DenialReason::WindowExhausted => telemetry::DENIED_WINDOW_EXHAUSTED,
            DenialReason::FairThrottled => telemetry::DENIED_FAIR_THROTTLED,
            DenialReason::CoordinatorUnreachable => telemetry::DENIED_COORDINATOR_UNREACHABLE,
        }
    }
}

/// A running key actor, counted until it drops (see
/// [`EscrowShared::return_everything`]).
#[derive(Debug)]
pub struct RunningActor(Arc<EscrowShared>);

impl Drop for RunningActor {
    fn drop(&mut self) {
        self.0.running_actors.fetch_sub(1, Ordering::AcqRel);
        self.0.actor_ended.notify_waiters();
    }
}

impl std::fmt::Debug for EscrowShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EscrowShared")
            .field("region", &self.config.region)
            .finish()
    }
}

impl EscrowShared {
    /// Shared state for a node.
    pub fn new(
        config: EscrowConfig,
        client: CoordinatorClient,
        clock: Arc<dyn WallClock>,
    ) -> Arc<Self> {
        Arc::new(EscrowShared {
            config,
            leases: LeaseCoalescer::spawn(client.clone()),
            client,
            clock,
            started: Instant::now(),
            policies: RwLock::new(PolicyTable::default()),
            actors: Mutex::new(HashMap::new()),
            reachable: AtomicBool::new(true),
            outage: Mutex::new(OutageTracker::default()),
            evicted_keys: AtomicU64::new(0),
            leases_sent: AtomicU64::new(0),
            other_calls_sent: AtomicU64::new(0),
            outage_denials: AtomicU64::new(0),
            fallback_tokens: AtomicU64::new(0),
            connections: Arc::default(),
            tokens_served: AtomicU64::new(0),
            returns_capped: AtomicU64::new(0),
            return_tokens_refused: AtomicU64::new(0),
            acquire_replays: AtomicU64::new(0),
            return_replays: AtomicU64::new(0),
            refused_request_ids: AtomicU64::new(0),
            refused_holders_exhausted: AtomicU64::new(0),
            auth_refusals: Arc::default(),
            fair_passes: AtomicU64::new(0),
            fair_denials: AtomicU64::new(0),
            fair_idle_admissions: AtomicU64::new(0),
            shadow_would_deny_requests: AtomicU64::new(0),
            shadow_would_deny_tokens: AtomicU64::new(0),
            pool_tokens_released: AtomicU64::new(0),
            running_actors: AtomicUsize::new(0),
            actor_ended: tokio::sync::Notify::new(),
            lease_round_trip: Histogram::latency(),
            denials: Default::default(),
        })
    }

    /// Denials since the node started, per reason.
    pub fn denials(&self) -> Vec<(DenialReason, u64)> {
        DenialReason::ALL
            .iter()
            .map(|reason| {
                (
                    *reason,
                    self.denials[*reason as usize].load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Monotonic milliseconds since the node started (tokio time).
    pub fn mono_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The node's wall clock, epoch ms (only for fallback windows).
    pub fn wall_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Counts one request of `tokens` a shadow policy admitted where this
    /// node would have denied it (`shadow_would_deny_*` in Status).
    pub fn record_shadow_would_deny(&self, tokens: u64) {
        self.shadow_would_deny_requests
            .fetch_add(1, Ordering::Relaxed);
        self.shadow_would_deny_tokens
            .fetch_add(tokens, Ordering::Relaxed);
    }

    /// Shadow-mode counters since the node started: (requests, tokens) it
    /// would have denied and admitted.
    pub fn shadow_would_deny(&self) -> (u64, u64) {
        (
            self.shadow_would_deny_requests.load(Ordering::Relaxed),
            self.shadow_would_deny_tokens.load(Ordering::Relaxed),
        )
    }

    /// The policy governing `key`, as last read from the cluster.
    pub fn policy_for(&self, key: &str) -> Option<Policy> {
        self.policies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .lookup(key)
            .cloned()
    }

    /// Whether the coordinator answered the last call.
    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed)
    }

    /// Adds what an actor's fair-throttle counters grew by since it last reported.
    pub fn record_fair(&self, reported: &mut FairGateCounters, now: FairGateCounters) {
        let add = |counter: &AtomicU64, now: u64, before: u64| {
            counter.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
        };
        add(&self.fair_passes, now.passes, reported.passes);
        add(&self.fair_denials, now.denials, reported.denials);
        add(
            &self.fair_idle_admissions,
            now.idle_admissions,
            reported.idle_admissions,
        );
        *reported = now;
    }

    /// Notes whether the coordinator answered the last call (made for
    /// `key`, whose outage policy is `outage`), and logs one line when the
    /// node enters or leaves an outage: never one per failed call.
    pub fn set_reachable(
        &self,
        reachable: bool,
        key: &str,
        outage: OutagePolicy,
        error: Option<&str>,
    ) {
        let mut tracker = self.outage.lock().unwrap_or_else(PoisonError::into_inner);
        self.reachable.store(reachable, Ordering::Relaxed);
        let change = tracker.observe(
            reachable,
            OutageCounters {
                at_ms: self.mono_ms(),
                outage_denials: self.outage_denials.load(Ordering::Relaxed),
                fallback_admissions: self.fallback_tokens.load(Ordering::Relaxed),
            },
        );
        drop(tracker);
        match change {
            Some(OutageChange::Entered) => tracing::warn!(
                region = %self.config.region,
                key,
                outage_policy = %describe_outage(outage),
                error = error.unwrap_or("unknown"),
                "coordinator unreachable: escrow node entered an outage; each key serves the credits it holds, then follows its outage policy"
            ),
            Some(OutageChange::Left {
                outage_ms,
                outage_denials,
                fallback_admissions,
            }) => tracing::info!(
                region = %self.config.region,
                key,
                outage_ms,
                outage_denials,
                fallback_admissions,
                "coordinator reachable again: escrow node left its outage"
            ),
            None => {}
        }
    }

    /// Adds what an actor's counters grew by since it last reported.
    pub fn record(&self, reported: &mut EscrowCounters, now: EscrowCounters) {
        self.leases_sent
            .fetch_add(now.leases_sent - reported.leases_sent, Ordering::Relaxed);
        self.outage_denials.fetch_add(
            now.outage_denials - reported.outage_denials,
            Ordering::Relaxed,
        );
        self.fallback_tokens.fetch_add(
            now.fallback_tokens - reported.fallback_tokens,
            Ordering::Relaxed,
        );
        self.tokens_served.fetch_add(
            now.tokens_served.saturating_sub(reported.tokens_served),
            Ordering::Relaxed,
        );
        *reported = now;
    }

    /// Adds what an actor's holder counters grew by since it last reported.
    pub fn record_holders(&self, reported: &mut HolderCounters, now: HolderCounters) {
        let add = |counter: &AtomicU64, now: u64, before: u64| {
            counter.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
        };
        add(
            &self.returns_capped,
            now.returns_capped,
            reported.returns_capped,
        );
        add(
            &self.return_tokens_refused,
            now.return_tokens_refused,
            reported.return_tokens_refused,
        );
        add(
            &self.acquire_replays,
            now.acquire_replays,
            reported.acquire_replays,
        );
        add(
            &self.return_replays,
            now.return_replays,
            reported.return_replays,
        );
        add(
            &self.refused_request_ids,
            now.refused_reused_ids
                .saturating_add(now.refused_expired_ids),
            reported
                .refused_reused_ids
                .saturating_add(reported.refused_expired_ids),
        );
        add(
            &self.refused_holders_exhausted,
            now.refused_holders_exhausted,
            reported.refused_holders_exhausted,
        );
        *reported = now;
    }

    /// Removes `key`'s actor from the table (it is stopping).
    pub fn forget(&self, key: &str) {
        if self
            .actors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
            .is_some()
        {
            self.evicted_keys.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Hands credits back to the coordinator (best effort: a failure only
    /// strands capacity, never over-admits).
    pub async fn reconcile(&self, key: &str, back: Reconcile) {
        tracing::debug!(
            key,
            leftover = back.leftover,
            window_start_ms = back.window_start_ms,
            "reconciling"
        );
        self.count_call();
        if let Err(e) = self
            .client
            .reconcile(
                key,
                self.config.region.as_str(),
                back.leftover,
                back.window_start_ms,
            )
            .await
        {
            tracing::debug!(key, error = %e, "reconcile failed; the credits are forfeited");
        }
    }

    /// Counts tokens handed back to the region fair pool.
    pub fn record_pool_release(&self, released: u64) {
        self.pool_tokens_released
            .fetch_add(released, Ordering::Relaxed);
    }

    /// Tokens handed back to the region fair pool since the node started.
    pub fn pool_tokens_released(&self) -> u64 {
        self.pool_tokens_released.load(Ordering::Relaxed)
    }

    /// Registers a running key actor until the guard drops.
    pub fn actor_started(self: &Arc<Self>) -> RunningActor {
        self.running_actors.fetch_add(1, Ordering::AcqRel);
        RunningActor(self.clone())
    }

    /// Counts a PoolGrant, PoolRelease or Reconcile call to the coordinator.
    pub fn count_call(&self) {
        self.other_calls_sent.fetch_add(1, Ordering::Relaxed);
    }

    fn handle(self: &Arc<Self>, key: &str) -> Result<KeyHandle, Status> {
        let mut actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(handle) = actors.get(key) {
            return Ok(handle.clone());
        }
        if actors.len() >= self.config.max_keys {
            return Err(refusal(Reason::KeysExhausted, format!(
                "this escrow node already tracks its maximum of {} keys; idle keys are released after {} ms",
                self.config.max_keys, self.config.idle_evict_ms
            )));
        }
        let handle = KeyHandle::spawn(key.to_string(), self.clone());
        actors.insert(key.to_string(), handle.clone());
        Ok(handle)
    }

    async fn ask<T>(
        self: &Arc<Self>,
        key: &str,
        make: impl Fn(oneshot::Sender<T>) -> KeyRequest,
    ) -> Result<T, Status> {
        // An actor that stopped between lookup and send is replaced once.
        for _ in 0..2 {
            let handle = self.handle(key)?;
            let (reply, answer) = oneshot::channel();
            if handle.send(make(reply)).await.is_ok() {
                if let Ok(value) = answer.await {
                    return Ok(value);
                }
            }
            self.forget(key);
        }
        Err(refusal(
            Reason::ShuttingDown,
            "the key's actor stopped; retry",
        ))
    }

    /// Stops every actor and waits, at most `deadline`, until each has
    /// handed its credits back (final reconciles, pool releases); returns
    /// how many were still running when it stopped waiting.
    pub async fn return_everything(&self, deadline: std::time::Duration) -> usize {
        let handles: Vec<KeyHandle> = self
            .actors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, h)| h)
            .collect();
        drop(handles);
        let all_ended = async {
            loop {
                let ended = self.actor_ended.notified();
                if self.running_actors.load(Ordering::Acquire) == 0 {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout(deadline, all_ended).await;
        self.running_actors.load(Ordering::Acquire)
    }

    /// The views of the keys a watch of `target` shows (see
    /// [`KeyView`]), in key order: the key itself (its view when this node
    /// holds it), or the first `max` held keys under a prefix; and how many
    /// held keys match, counted up to `count_up_to`. Reads what the actors
    /// published; sends them nothing.
    pub fn key_views(
        &self,
        target: &crate::monitor::WatchTarget,
        max: usize,
        count_up_to: usize,
    ) -> (Vec<(String, Option<KeyView>)>, usize) {
        use crate::monitor::WatchTarget;
        let actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        match target {
            WatchTarget::Key(key) => {
                let view = actors.get(key.as_str()).map(KeyHandle::view);
                (vec![(key.to_string(), view)], 1)
            }
            WatchTarget::Prefix(prefix) => {
                let mut keys: Vec<&String> = actors
                    .keys()
                    .filter(|key| key.starts_with(prefix.as_str()))
                    .collect();
                keys.sort();
                let matching = keys.len().min(count_up_to);
                let views = keys
                    .into_iter()
                    .take(max)
                    .map(|key| (key.clone(), actors.get(key).map(KeyHandle::view)))
                    .collect();
                (views, matching)
            }
        }
    }

    fn active_keys(&self) -> u64 {
        self.actors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64
    }
}

impl EscrowShared {
    /// Reads the policy table from the cluster now; keeps the last one on failure.
    pub async fn refresh_policies_now(&self) {
        match self.client.admin().list_policies().await {
            Ok(list) => {
                let mut table = PolicyTable::default();
                for raw in list {
                    match policy_from_wire(Some(raw)) {
                        Ok(policy) => {
                            let _ = table.set(policy);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "ignoring a policy this node cannot read")
                        }
                    }
                }
                *self
                    .policies
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = table;
            }
            Err(e) => tracing::debug!(error = %e, "policy refresh failed; keeping the last table"),
        }
    }
}

/// Re-reads the policy table from the cluster on a cadence.
pub async fn refresh_policies(shared: Arc<EscrowShared>) {
    let every = std::time::Duration::from_millis(shared.config.policy_refresh_ms.max(10));
    loop {
        shared.refresh_policies_now().await;
        tokio::time::sleep(every).await;
    }
}

/// The gRPC face of the escrow node.
#[derive(Debug, Clone)]
pub struct EscrowApi {
    shared: Arc<EscrowShared>,
}

impl EscrowApi {
    /// The service over `shared`.
    pub fn new(shared: Arc<EscrowShared>) -> Self {
        EscrowApi { shared }
    }

    /// One acquisition of `tokens` on `key` by `principal` (and the holder
    /// and seq its request id names, if any).
    async fn acquire_tokens(
        &self,
        key: &str,
        tokens: u64,
        tenant: &str,
        weight: u64,
        (principal, from): (Principal, Option<HolderRequest>),
        whole_or_nothing: bool,
    ) -> Result<Acquired, Status> {
        let tenant = tenant_from_wire(tenant)?;
        let weight = weight.max(1);
        let max_weight = self.shared.config.max_tenant_weight;
        if weight > max_weight {
            return Err(invalid_field(
                "weight",
                format!(
                    "weight {weight} exceeds this escrow node's max_tenant_weight ({max_weight})"
                ),
            ));
        }
        let key = Key::new(key).map_err(|e| invalid_field("key", e.to_string()))?;
        if tokens == 0 {
            return Err(invalid_field("tokens", "tokens must be at least 1"));
        }
        self.shared
            .ask(key.as_str(), |reply| KeyRequest::Acquire {
                tokens,
                tenant: tenant.clone(),
                weight,
                from: from.clone(),
                principal: principal.clone(),
                whole_or_nothing,
                reply,
                span: tracing::Span::current(),
            })
            .await?
    }
}

fn tenant_from_wire(tenant: &str) -> Result<Option<TenantId>, Status> {
    if tenant.is_empty() {
        return Ok(None);
    }
    TenantId::new(tenant)
        .map(Some)
        .map_err(|e| invalid_field("tenant", e.to_string()))
}

/// Tells a fair-throttle denial from a budget denial: `leasehold-reason:
/// FAIR_THROTTLED` in the response metadata.
fn mark_fair_throttled<T>(response: &mut Response<T>) {
    if let Ok(value) = REASON_FAIR_THROTTLED.parse() {
        response.metadata_mut().insert(REASON_METADATA, value);
    }
}

/// The holder and seq a request id names for `caller`, if it carries one.
fn holder_request(
    caller: Principal,
    raw: Option<pb::RequestId>,
) -> Result<Option<HolderRequest>, Status> {
    let Some(id) = raw else {
        return Ok(None);
    };
    let client = ClientId::new(id.client_id)
        .map_err(|e| invalid_field("request_id.client_id", format!("request_id: {e}")))?;
    Ok(Some(HolderRequest {
        holder: Holder {
            principal: caller,
            client,
        },
        seq: id.seq,
    }))
}

/// Records why an escrow answer admitted nothing, on the current span.
fn record_escrow_denial(shared: &EscrowShared, acquired: &Acquired) {
    if let Acquired::Denied { fair_throttled, .. } = acquired {
        let reason = if *fair_throttled {
            DenialReason::FairThrottled
        } else if !shared.is_reachable() {
            DenialReason::CoordinatorUnreachable
        } else {
            DenialReason::WindowExhausted
        };
        shared.denials[reason as usize].fetch_add(1, Ordering::Relaxed);
        telemetry::record_denial(reason.as_str());
    }
}

/// Records a refused escrow call on the current span.
fn traced<T>(result: Result<T, Status>) -> Result<T, Status> {
    if let Err(status) = &result {
        telemetry::record_refusal(status);
    }
    result
}

#[tonic::async_trait]
impl pb::escrow_server::Escrow for EscrowApi {
    #[tracing::instrument(name = "escrow.acquire", level = "debug", skip_all, fields(
        key = %request.get_ref().key, tokens = request.get_ref().tokens))]
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let caller = crate::auth::caller(&request);
        let request = request.into_inner();
        let from = holder_request(caller.clone(), request.request_id)?;
        let reachable = self.shared.reachable.load(Ordering::Relaxed);
        let mut fair_throttled = false;
        let acquired = traced(
            self.acquire_tokens(
                &request.key,
                request.tokens,
                &request.tenant,
                request.weight,
                (caller, from),
                false,
            )
            .await,
        )?;
        record_escrow_denial(&self.shared, &acquired);
        let mut response = Response::new(match acquired {
            Acquired::Credits {
                served,
                limit,
                shadow_would_deny,
            } => pb::AcquireResponse {
                granted: served.granted,
                limit,
                window_start_ms: served.window_start_ms,
                window_end_ms: served.window_end_ms,
                remaining_lifetime_ms: served.remaining_lifetime_ms,
                retry_after_ms: 0,
                coordinator_reachable: reachable,
                shadow_would_deny,
            },
            Acquired::Denied {
                retry_after_ms,
                limit,
                window_end_ms,
                fair_throttled: throttled,
            } => {
                fair_throttled = throttled;
                pb::AcquireResponse {
                    granted: 0,
                    limit,
                    window_start_ms: 0,
                    window_end_ms,
                    remaining_lifetime_ms: 0,
                    retry_after_ms: retry_after_ms.max(1),
                    coordinator_reachable: reachable,
                    shadow_would_deny: false,
                }
            }
        });
        if fair_throttled {
            mark_fair_throttled(&mut response);
        }
        Ok(response)
    }

    #[tracing::instrument(name = "escrow.check", level = "debug", skip_all, fields(
        key = %request.get_ref().key, cost = request.get_ref().cost))]
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let caller = crate::auth::caller(&request);
        let request = request.into_inner();
        let cost = request.cost.max(1);
        let key = request.key.clone();
        // Whole or nothing: a partial serve is put back inside the key's
        // actor, through the escrow's capped take-back.
        let acquired = traced(
            self.acquire_tokens(
                &key,
                cost,
                &request.tenant,
                request.weight,
                (caller, None),
                true,
            )
            .await,
        )?;
        record_escrow_denial(&self.shared, &acquired);
        let fair_throttled = matches!(
            acquired,
            Acquired::Denied {
                fair_throttled: true,
                ..
            }
        );
        let response = match acquired {
            Acquired::Credits {
                served,
                limit,
                shadow_would_deny,
            } => pb::CheckResponse {
                decision: Some(pb::Decision {
                    allowed: true,
                    limit,
                    remaining: 0,
                    reset_at_ms: served.window_end_ms,
                    retry_after_ms: 0,
                }),
                window_start_ms: served.window_start_ms,
                shadow_would_deny,
            },
            Acquired::Denied {
                retry_after_ms,
                limit,
                window_end_ms,
                ..
            } => pb::CheckResponse {
                decision: Some(pb::Decision {
                    allowed: false,
                    limit,
                    remaining: 0,
                    reset_at_ms: window_end_ms,
                    retry_after_ms: retry_after_ms.max(1),
                }),
                window_start_ms: 0,
                shadow_would_deny: false,
            },
        };
        let mut response = Response::new(response);
        if fair_throttled {
            mark_fair_throttled(&mut response);
        }
        Ok(response)
    }

    async fn r#return(
        &self,
        request: Request<pb::ReturnRequest>,
    ) -> Result<Response<pb::ReturnResponse>, Status> {
        let caller = crate::auth::caller(&request);
        let request = request.into_inner();
        let key = Key::new(request.key).map_err(|e| invalid_field("key", e.to_string()))?;
        let from = holder_request(caller, request.request_id)?.ok_or_else(|| {
            invalid_field(
                "request_id",
                "Return needs a request_id: it names the holder whose credits come back",
            )
        })?;
        let claim = ReturnClaim {
            tenant: tenant_from_wire(&request.tenant)?,
            window_start_ms: request.window_start_ms,
            tokens: request.tokens,
        };
        if claim.tokens == 0 {
            return Ok(Response::new(pb::ReturnResponse { accepted: 0 }));
        }
        let settled = self
            .shared
            .ask(key.as_str(), |reply| KeyRequest::Return {
                from: from.clone(),
                claim: claim.clone(),
                reply,
            })
            .await??;
        Ok(Response::new(pb::ReturnResponse {
            accepted: settled.accepted,
        }))
    }

    async fn status(
        &self,
        _: Request<pb::EscrowStatusRequest>,
    ) -> Result<Response<pb::EscrowStatusResponse>, Status> {
        Ok(Response::new(status_of(&self.shared)))
    }
}

/// This node's counters and state, as `Escrow.Status` answers them (and as
/// `/metrics` exports them).
pub(crate) fn status_of(s: &EscrowShared) -> pb::EscrowStatusResponse {
    pb::EscrowStatusResponse {
        region: s.config.region.to_string(),
        coordinator_reachable: s.reachable.load(Ordering::Relaxed),
        active_keys: s.active_keys(),
        evicted_keys: s.evicted_keys.load(Ordering::Relaxed),
        outage_denials: s.outage_denials.load(Ordering::Relaxed),
        fallback_admissions: s.fallback_tokens.load(Ordering::Relaxed),
        coordinator_calls: s.leases_sent.load(Ordering::Relaxed)
            + s.other_calls_sent.load(Ordering::Relaxed),
        counters: s
            .connections
            .snapshot()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect(),
        returns_capped: s.returns_capped.load(Ordering::Relaxed),
        return_tokens_refused: s.return_tokens_refused.load(Ordering::Relaxed),
        acquire_replays: s.acquire_replays.load(Ordering::Relaxed),
        return_replays: s.return_replays.load(Ordering::Relaxed),
        refused_request_ids: s.refused_request_ids.load(Ordering::Relaxed),
        refused_holders_exhausted: s.refused_holders_exhausted.load(Ordering::Relaxed),
        tokens_served: s.tokens_served.load(Ordering::Relaxed),
        refused_unauthenticated: s.auth_refusals.unauthenticated(),
        refused_permission_denied: s.auth_refusals.permission_denied(),
        fair_throttle_passes: s.fair_passes.load(Ordering::Relaxed),
        fair_throttle_denials: s.fair_denials.load(Ordering::Relaxed),
        fair_throttle_idle_admissions: s.fair_idle_admissions.load(Ordering::Relaxed),
        shadow_would_deny_requests: s.shadow_would_deny_requests.load(Ordering::Relaxed),
        shadow_would_deny_tokens: s.shadow_would_deny_tokens.load(Ordering::Relaxed),
        pool_tokens_released: s.pool_tokens_released(),
    }
}
