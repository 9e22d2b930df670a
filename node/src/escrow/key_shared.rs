//! What every key actor of an escrow node shares, and all of the node a
//! key actor sees ([`KeyShared`]): the settings keys run with, the link to
//! the coordinator cluster (its client, the lease coalescer, reachability
//! and outage tracking, call round trips), the policy table as last read,
//! the node's counters and the actors still running. It knows nothing of
//! the listener, the key table, the services or the RLS front, which
//! depend on it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::lease_coalescer::LeaseCoalescer;
use leasehold_client::transport::WallClock;
use leasehold_core::escrow::{
    EscrowCounters, FairGateCounters, HolderCounters, HolderLimits, Reconcile,
};
use leasehold_core::ids::RegionId;
use leasehold_core::metrics::Histogram;
use leasehold_core::policy::{OutagePolicy, Policy, PolicyTable};
use leasehold_core::predictive_sizer::SizerKind;
use leasehold_proto::v1 as pb;
use tokio::time::Instant;

use super::config::EscrowConfig;
use super::fair_throttle::FairThrottleRule;
use super::outage::{describe_outage, OutageChange, OutageCounters, OutageTracker};
use crate::telemetry;

/// What a key actor is configured with: the node's region and the parts
/// of its configuration that shape one key (see [`EscrowConfig`]).
#[derive(Debug, Clone)]
pub struct KeySettings {
    /// The region the node serves.
    pub region: RegionId,
    /// Tokens per coordinator lease; the learning sizers' starting size.
    pub batch: u64,
    /// How each key's lease size is chosen.
    pub sizer: SizerKind,
    /// While the coordinator is unreachable, one probe per this interval.
    pub probe_interval_ms: u64,
    /// Most tenants tracked per `fair` key.
    pub max_tenants: usize,
    /// A key's actor returns its credits and stops after this long idle.
    pub idle_evict_ms: u64,
    /// An idle `fair` key hands its unspent pool grant back after this long.
    pub pool_release_idle_ms: u64,
    /// Bounds of each key's credit holders.
    pub holder_limits: HolderLimits,
    /// Keys fronted by a fair throttle, by key prefix.
    pub fair_throttle: Vec<FairThrottleRule>,
    /// Seed of the fair throttles' random source (`None`: the OS's).
    pub fair_throttle_rng_seed: Option<u64>,
}

impl KeySettings {
    /// The key settings of `config`.
    pub fn of(config: &EscrowConfig) -> Self {
        Self {
            region: config.region.clone(),
            batch: config.batch,
            sizer: config.sizer,
            probe_interval_ms: config.probe_interval_ms,
            max_tenants: config.max_tenants,
            idle_evict_ms: config.idle_evict_ms,
            pool_release_idle_ms: config.pool_release_idle_ms,
            holder_limits: config.holder_limits,
            fair_throttle: config.fair_throttle.clone(),
            fair_throttle_rng_seed: config.fair_throttle_rng_seed,
        }
    }
}

/// What every key actor of a node shares (see the module doc).
pub struct KeyShared {
    /// What the key actors are configured with.
    pub config: KeySettings,
    /// Client of the coordinator cluster.
    pub client: CoordinatorClient,
    /// Refills of every key, coalesced into `LeaseBatch` calls.
    pub leases: LeaseCoalescer,
    /// Round trips of answered Lease and PoolGrant calls to the coordinator
    /// (client retries included), µs.
    pub lease_round_trip: Histogram,
    clock: Arc<dyn WallClock>,
    started: Instant,
    /// The policy table as last read from the cluster.
    policies: RwLock<PolicyTable>,
    /// Whether the coordinator answers, and the outage it is in if not.
    reachability: Reachability,
    /// What `Escrow.Status` and `/metrics` count.
    counters: NodeCounters,
    /// Key actors still running (a stopping node waits for them to hand
    /// their credits back).
    actors: RunningActors,
}

/// Whether the coordinator answered the last call, and the outage the node
/// is in while it does not (logged once on entering and on leaving).
#[derive(Debug)]
struct Reachability {
    reachable: AtomicBool,
    outage: Mutex<OutageTracker>,
}

/// The node's counters since it started, summed over its key actors.
#[derive(Debug, Default)]
struct NodeCounters {
    evicted_keys: AtomicU64,
    leases_sent: AtomicU64,
    /// PoolGrant and Reconcile calls (leases are counted by the actors).
    other_calls_sent: AtomicU64,
    outage_denials: AtomicU64,
    fallback_tokens: AtomicU64,
    tokens_served: AtomicU64,
    returns_capped: AtomicU64,
    return_tokens_refused: AtomicU64,
    acquire_replays: AtomicU64,
    return_replays: AtomicU64,
    refused_request_ids: AtomicU64,
    refused_holders_exhausted: AtomicU64,
    refused_identity_holders: AtomicU64,
    refused_identity_keys: AtomicU64,
    fair_passes: AtomicU64,
    fair_denials: AtomicU64,
    fair_idle_admissions: AtomicU64,
    shadow_would_deny_requests: AtomicU64,
    shadow_would_deny_tokens: AtomicU64,
    pool_tokens_released: AtomicU64,
    /// Denied Acquire and Check calls, by [`DenialReason`].
    denials: [AtomicU64; DenialReason::ALL.len()],
}

/// Key actors still running, and a wake-up when one ends.
#[derive(Debug, Default)]
struct RunningActors {
    running: AtomicUsize,
    ended: tokio::sync::Notify,
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
/// [`KeyShared::wait_for_actors`]).
#[derive(Debug)]
pub struct RunningActor(Arc<KeyShared>);

impl Drop for RunningActor {
    fn drop(&mut self) {
        self.0.actors.running.fetch_sub(1, Ordering::AcqRel);
        self.0.actors.ended.notify_waiters();
    }
}

impl std::fmt::Debug for KeyShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyShared")
            .field("region", &self.config.region)
            .finish()
    }
}

impl KeyShared {
    /// What the key actors of a node configured with `config` share,
    /// calling the coordinator with `client` and reading `clock`.
    pub fn new(
        config: &EscrowConfig,
        client: CoordinatorClient,
        clock: Arc<dyn WallClock>,
    ) -> Arc<Self> {
        Arc::new(KeyShared {
            config: KeySettings::of(config),
            leases: LeaseCoalescer::spawn(client.clone()),
            client,
            lease_round_trip: Histogram::latency(),
            clock,
            started: Instant::now(),
            policies: RwLock::new(PolicyTable::default()),
            reachability: Reachability {
                reachable: AtomicBool::new(true),
                outage: Mutex::new(OutageTracker::default()),
            },
            counters: NodeCounters::default(),
            actors: RunningActors::default(),
        })
    }

    /// Denials since the node started, per reason.
    pub fn denials(&self) -> Vec<(DenialReason, u64)> {
        DenialReason::ALL
            .iter()
            .map(|reason| {
                (
                    *reason,
                    self.counters.denials[*reason as usize].load(Ordering::Relaxed),
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
        self.counters
            .shadow_would_deny_requests
            .fetch_add(1, Ordering::Relaxed);
        self.counters
            .shadow_would_deny_tokens
            .fetch_add(tokens, Ordering::Relaxed);
    }

    /// Shadow-mode counters since the node started: (requests, tokens) it
    /// would have denied and admitted.
    pub fn shadow_would_deny(&self) -> (u64, u64) {
        (
            self.counters
                .shadow_would_deny_requests
                .load(Ordering::Relaxed),
            self.counters
                .shadow_would_deny_tokens
                .load(Ordering::Relaxed),
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
        self.reachability.reachable.load(Ordering::Relaxed)
    }

    /// Adds what an actor's fair-throttle counters grew by since it last reported.
    pub fn record_fair(&self, reported: &mut FairGateCounters, now: FairGateCounters) {
        let add = |counter: &AtomicU64, now: u64, before: u64| {
            counter.fetch_add(now.saturating_sub(before), Ordering::Relaxed);
        };
        add(&self.counters.fair_passes, now.passes, reported.passes);
        add(&self.counters.fair_denials, now.denials, reported.denials);
        add(
            &self.counters.fair_idle_admissions,
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
        let mut tracker = self
            .reachability
            .outage
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.reachability
            .reachable
            .store(reachable, Ordering::Relaxed);
        let change = tracker.observe(
            reachable,
            OutageCounters {
                at_ms: self.mono_ms(),
                outage_denials: self.counters.outage_denials.load(Ordering::Relaxed),
                fallback_admissions: self.counters.fallback_tokens.load(Ordering::Relaxed),
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
        self.counters
            .leases_sent
            .fetch_add(now.leases_sent - reported.leases_sent, Ordering::Relaxed);
        self.counters.outage_denials.fetch_add(
            now.outage_denials - reported.outage_denials,
            Ordering::Relaxed,
        );
        self.counters.fallback_tokens.fetch_add(
            now.fallback_tokens - reported.fallback_tokens,
            Ordering::Relaxed,
        );
        self.counters.tokens_served.fetch_add(
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
            &self.counters.returns_capped,
            now.returns_capped,
            reported.returns_capped,
        );
        add(
            &self.counters.return_tokens_refused,
            now.return_tokens_refused,
            reported.return_tokens_refused,
        );
        add(
            &self.counters.acquire_replays,
            now.acquire_replays,
            reported.acquire_replays,
        );
        add(
            &self.counters.return_replays,
            now.return_replays,
            reported.return_replays,
        );
        add(
            &self.counters.refused_request_ids,
            now.refused_reused_ids
                .saturating_add(now.refused_expired_ids),
            reported
                .refused_reused_ids
                .saturating_add(reported.refused_expired_ids),
        );
        add(
            &self.counters.refused_holders_exhausted,
            now.refused_holders_exhausted,
            reported.refused_holders_exhausted,
        );
        add(
            &self.counters.refused_identity_holders,
            now.refused_principal_holders,
            reported.refused_principal_holders,
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
        self.counters
            .pool_tokens_released
            .fetch_add(released, Ordering::Relaxed);
    }

    /// Tokens handed back to the region fair pool since the node started.
    pub fn pool_tokens_released(&self) -> u64 {
        self.counters.pool_tokens_released.load(Ordering::Relaxed)
    }

    /// Registers a running key actor until the guard drops.
    pub fn actor_started(self: &Arc<Self>) -> RunningActor {
        self.actors.running.fetch_add(1, Ordering::AcqRel);
        RunningActor(self.clone())
    }

    /// Counts a key actor evicted for idleness (it left the key table).
    pub fn note_evicted(&self) {
        self.counters.evicted_keys.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a new key refused because its caller's identity created its
    /// most keys.
    pub fn note_identity_keys_refused(&self) {
        self.counters
            .refused_identity_keys
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a denied Acquire or Check.
    pub fn record_denial(&self, reason: DenialReason) {
        self.counters.denials[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Waits, at most `deadline`, until every key actor has ended (each
    /// hands its credits back first); returns how many still run.
    pub async fn wait_for_actors(&self, deadline: std::time::Duration) -> usize {
        let all_ended = async {
            loop {
                let ended = self.actors.ended.notified();
                if self.actors.running.load(Ordering::Acquire) == 0 {
                    return;
                }
                ended.await;
            }
        };
        let _ = tokio::time::timeout(deadline, all_ended).await;
        self.actors.running.load(Ordering::Acquire)
    }

    /// Counts a PoolGrant, PoolRelease or Reconcile call to the coordinator.
    pub fn count_call(&self) {
        self.counters
            .other_calls_sent
            .fetch_add(1, Ordering::Relaxed);
    }

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

    /// The key actors' part of `Escrow.Status`: the region, reachability
    /// and counters (the listener's counters and refusals by identity
    /// left at zero for the node to fill in).
    pub fn status(&self, active_keys: u64) -> pb::EscrowStatusResponse {
        let s = self;
        pb::EscrowStatusResponse {
            region: s.config.region.to_string(),
            coordinator_reachable: s.reachability.reachable.load(Ordering::Relaxed),
            active_keys,
            evicted_keys: s.counters.evicted_keys.load(Ordering::Relaxed),
            outage_denials: s.counters.outage_denials.load(Ordering::Relaxed),
            fallback_admissions: s.counters.fallback_tokens.load(Ordering::Relaxed),
            coordinator_calls: s.counters.leases_sent.load(Ordering::Relaxed)
                + s.counters.other_calls_sent.load(Ordering::Relaxed),
            returns_capped: s.counters.returns_capped.load(Ordering::Relaxed),
            return_tokens_refused: s.counters.return_tokens_refused.load(Ordering::Relaxed),
            acquire_replays: s.counters.acquire_replays.load(Ordering::Relaxed),
            return_replays: s.counters.return_replays.load(Ordering::Relaxed),
            refused_request_ids: s.counters.refused_request_ids.load(Ordering::Relaxed),
            refused_holders_exhausted: s.counters.refused_holders_exhausted.load(Ordering::Relaxed),
            refused_identity_holders: s.counters.refused_identity_holders.load(Ordering::Relaxed),
            refused_identity_keys: s.counters.refused_identity_keys.load(Ordering::Relaxed),
            tokens_served: s.counters.tokens_served.load(Ordering::Relaxed),
            fair_throttle_passes: s.counters.fair_passes.load(Ordering::Relaxed),
            fair_throttle_denials: s.counters.fair_denials.load(Ordering::Relaxed),
            fair_throttle_idle_admissions: s.counters.fair_idle_admissions.load(Ordering::Relaxed),
            shadow_would_deny_requests: s
                .counters
                .shadow_would_deny_requests
                .load(Ordering::Relaxed),
            shadow_would_deny_tokens: s.counters.shadow_would_deny_tokens.load(Ordering::Relaxed),
            pool_tokens_released: s.pool_tokens_released(),
            ..pb::EscrowStatusResponse::default()
        }
    }
}
