//! The state an escrow node's key actors and its service share: the node's
//! configuration, its coordinator client and lease coalescer, the policy
//! table as last read, reachability and outage tracking, and the counters
//! `Escrow.Status` and `/metrics` report. It knows nothing of the key table
//! (`super::table`) or the actors themselves, so an actor depends on it and
//! never on the service.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::transport::WallClock;
use leasehold_core::escrow::{EscrowCounters, FairGateCounters, HolderCounters, Reconcile};
use leasehold_core::metrics::Histogram;
use leasehold_core::policy::{OutagePolicy, Policy, PolicyTable};
use leasehold_proto::v1 as pb;
use tokio::time::Instant;

use super::outage::{describe_outage, OutageChange, OutageCounters, OutageTracker};
use super::EscrowConfig;
use crate::net::ConnectionCounters;
use crate::telemetry;
use leasehold_client::lease_coalescer::LeaseCoalescer;

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
/// [`EscrowShared::wait_for_actors`]).
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

    /// Counts a key actor evicted for idleness (it left the key table).
    pub fn note_evicted(&self) {
        self.evicted_keys.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a denied Acquire or Check.
    pub fn record_denial(&self, reason: DenialReason) {
        self.denials[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Waits, at most `deadline`, until every key actor has ended (each
    /// hands its credits back first); returns how many still run.
    pub async fn wait_for_actors(&self, deadline: std::time::Duration) -> usize {
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

    /// Counts a PoolGrant, PoolRelease or Reconcile call to the coordinator.
    pub fn count_call(&self) {
        self.other_calls_sent.fetch_add(1, Ordering::Relaxed);
    }
}

impl EscrowShared {
    /// Reads the policy table from the cluster now; keeps the last one on failure.
    pub async fn refresh_policies_now(&self) {
        match self.client.admin().list_policies().await {
            Ok(list) => {
                let mut table = PolicyTable::default();
                for raw in list {
                    match Policy::try_from(raw) {
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

/// This node's counters and state, as `Escrow.Status` answers them (and as
/// `/metrics` exports them).
pub(crate) fn status_of(s: &EscrowShared, active_keys: u64) -> pb::EscrowStatusResponse {
    pb::EscrowStatusResponse {
        region: s.config.region.to_string(),
        coordinator_reachable: s.reachable.load(Ordering::Relaxed),
        active_keys,
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
