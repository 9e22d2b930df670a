//! One actor per key: a handle (bounded mailbox) and a task that owns the
//! key's [`RegionEscrow`] and performs its coordinator calls. Requests for a
//! key are handled one at a time, so at most one lease is ever in flight and
//! waiters simply see the credited balance when their turn comes.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::escrow::{CoordinatorGrant, EscrowCounters, RegionEscrow, Served};
use leasehold_core::ids::TenantId;
use leasehold_core::policy::{Policy, PolicyKind};
use leasehold_core::sizer::{EoqParams, EoqSizer, LeaseSizer};
use leasehold_core::wfe::{RecordedAsk, WeightedFairEscrow};
use leasehold_core::window::WindowBounds;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use super::service::EscrowShared;

/// Largest lease the EOQ sizer may ask for: past this, one region's lease
/// strands more of a window than it saves in round trips.
pub const EOQ_MAX_LEASE: u64 = 4_096;

/// Capacity of one key's mailbox: requests beyond it wait in the caller.
pub const KEY_MAILBOX_CAPACITY: usize = 256;

/// What an acquisition got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Credits handed out (possibly fewer than asked).
    Credits {
        /// The credits.
        served: Served,
        /// The key's limit.
        limit: u64,
    },
    /// Nothing now; try again after this long.
    Denied {
        /// Retry hint.
        retry_after_ms: u64,
        /// The key's limit.
        limit: u64,
        /// End of the window the denial is about, if known (coordinator ms).
        window_end_ms: u64,
    },
}

/// A request to a key actor.
#[derive(Debug)]
pub enum KeyRequest {
    /// Take up to `tokens` credits.
    Acquire {
        /// How many.
        tokens: u64,
        /// The asking tenant (`fair` keys; `None`: the key's default tenant).
        tenant: Option<TenantId>,
        /// The tenant's weight (≥ 1).
        weight: u64,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<Acquired, Status>>,
    },
    /// Give back `tokens` of `window_start_ms`.
    Return {
        /// How many.
        tokens: u64,
        /// Their window.
        window_start_ms: u64,
        /// Tokens accepted.
        reply: oneshot::Sender<u64>,
    },
}

/// The actor is gone (evicted or stopped); the caller makes a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key's actor has stopped")]
pub struct ActorDropped;

/// The handle of one key's actor.
#[derive(Debug, Clone)]
pub struct KeyHandle {
    sender: mpsc::Sender<KeyRequest>,
}

impl KeyHandle {
    /// Starts the actor of `key`.
    pub fn spawn(key: String, shared: Arc<EscrowShared>) -> Self {
        let (sender, mailbox) = mpsc::channel(KEY_MAILBOX_CAPACITY);
        let sizer = match EoqSizer::new(EoqParams {
            initial_size: shared.config.batch,
            max_size: shared.config.batch.max(EOQ_MAX_LEASE),
            ..EoqParams::default()
        }) {
            Ok(eoq) if shared.config.eoq => LeaseSizer::Eoq(eoq),
            _ => LeaseSizer::Fixed(shared.config.batch),
        };
        let escrow =
            RegionEscrow::with_sizer(sizer, shared.config.probe_interval_ms, Default::default());
        tokio::spawn(
            KeyActor {
                key,
                escrow,
                shared,
                mailbox,
                last_window_end_ms: 0,
                reported: EscrowCounters::default(),
                fair: None,
            }
            .run(),
        );
        KeyHandle { sender }
    }

    /// Sends a request; fails if the actor has stopped.
    pub async fn send(&self, request: KeyRequest) -> Result<(), ActorDropped> {
        self.sender.send(request).await.map_err(|_| ActorDropped)
    }
}

struct KeyActor {
    key: String,
    escrow: RegionEscrow,
    shared: Arc<EscrowShared>,
    mailbox: mpsc::Receiver<KeyRequest>,
    last_window_end_ms: u64,
    reported: EscrowCounters,
    fair: Option<FairState>,
}

/// The weighted-fair escrow of a `fair` key and the pool grant it runs on.
struct FairState {
    escrow: WeightedFairEscrow,
    window: WindowBounds,
    /// Local monotonic deadline of the window's pool grant.
    deadline_ms: u64,
}

/// Tenant used when a request names none.
const DEFAULT_TENANT: &str = "default";

impl KeyActor {
    async fn run(mut self) {
        let idle = Duration::from_millis(self.shared.config.idle_evict_ms.max(1));
        loop {
            match tokio::time::timeout(idle, self.mailbox.recv()).await {
                Ok(Some(request)) => self.handle(request).await,
                Ok(None) => break,
                Err(_) => {
                    // Idle: stop taking requests, hand credits back, leave the table.
                    self.shared.forget(&self.key);
                    self.mailbox.close();
                    while let Some(request) = self.mailbox.recv().await {
                        self.handle(request).await;
                    }
                    break;
                }
            }
        }
        if let Some(back) = self.escrow.return_all(self.shared.mono_ms()) {
            self.shared.reconcile(&self.key, back).await;
        }
        self.shared
            .record(&mut self.reported, self.escrow.counters());
    }

    async fn handle(&mut self, request: KeyRequest) {
        match request {
            KeyRequest::Acquire {
                tokens,
                tenant,
                weight,
                reply,
            } => {
                let answer = self.acquire(tokens, tenant, weight).await;
                self.shared
                    .record(&mut self.reported, self.escrow.counters());
                let _ = reply.send(answer);
            }
            KeyRequest::Return {
                tokens,
                window_start_ms,
                reply,
            } => {
                let accepted =
                    self.escrow
                        .take_back(tokens, window_start_ms, self.shared.mono_ms());
                let _ = reply.send(accepted);
            }
        }
    }

    async fn policy(&mut self) -> Result<Policy, Status> {
        if self.shared.policy_for(&self.key).is_none() {
            // The cached table may predate a policy set moments ago.
            self.shared.refresh_policies_now().await;
        }
        let policy = self
            .shared
            .policy_for(&self.key)
            .ok_or_else(|| Status::not_found(format!("no policy matches key {:?}", self.key)))?;
        self.escrow.set_outage_policy(policy.outage);
        Ok(policy)
    }

    async fn acquire(
        &mut self,
        tokens: u64,
        tenant: Option<TenantId>,
        weight: u64,
    ) -> Result<Acquired, Status> {
        let policy = self.policy().await?;
        if policy.kind == PolicyKind::Fair {
            let tenant = match tenant {
                Some(t) => t,
                None => {
                    TenantId::new(DEFAULT_TENANT).map_err(|e| Status::internal(e.to_string()))?
                }
            };
            return self
                .acquire_fair(&policy, &tenant, weight.max(1), tokens)
                .await;
        }
        let limit = policy.limit;
        let now = self.shared.mono_ms();
        if let Some(served) = self.escrow.serve(tokens, now) {
            return Ok(Acquired::Credits { served, limit });
        }
        let mut retry_after_ms = None;
        if let Some(lease_tokens) = self.escrow.lease_to_send(tokens, now) {
            let result = self
                .shared
                .client
                .lease(&self.key, self.shared.config.region.as_str(), lease_tokens)
                .await;
            let arrived = self.shared.mono_ms();
            match result {
                Ok(grant) => {
                    self.shared.set_reachable(true);
                    self.last_window_end_ms = grant.window_end_ms;
                    if grant.granted == 0 {
                        retry_after_ms = Some(grant.remaining_lifetime_ms.max(1));
                    }
                    let grant = CoordinatorGrant {
                        granted: grant.granted,
                        window_start_ms: grant.window_start_ms,
                        window_end_ms: grant.window_end_ms,
                        remaining_lifetime_ms: grant.remaining_lifetime_ms,
                    };
                    if let Some(back) = self.escrow.on_grant(grant, arrived) {
                        self.shared.reconcile(&self.key, back).await;
                    }
                }
                Err(e)
                    if matches!(
                        e.code(),
                        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition
                    ) =>
                {
                    // Not an outage: the cluster answered. Clear the in-flight lease.
                    let cleared = CoordinatorGrant {
                        granted: 0,
                        window_start_ms: 0,
                        window_end_ms: 0,
                        remaining_lifetime_ms: 0,
                    };
                    self.escrow.on_grant(cleared, arrived);
                    return Err(Status::new(e.code(), e.to_string()));
                }
                Err(e) => {
                    tracing::warn!(key = %self.key, error = %e, "coordinator unreachable; outage policy applies");
                    self.shared.set_reachable(false);
                    self.escrow.on_lease_failed(arrived);
                }
            }
            if let Some(served) = self.escrow.serve(tokens, self.shared.mono_ms()) {
                return Ok(Acquired::Credits { served, limit });
            }
        }
        if self.escrow.coordinator_unreachable() {
            let wall = self.shared.wall_ms();
            // Fallback credits live only for the rest of the local window.
            if let Some(served) = self.escrow.serve_outage_at(tokens, wall, policy.window_ms) {
                return Ok(Acquired::Credits { served, limit });
            }
        }
        let now = self.shared.mono_ms();
        Ok(Acquired::Denied {
            retry_after_ms: retry_after_ms.unwrap_or_else(|| self.escrow.retry_after_ms(now)),
            limit,
            window_end_ms: self.last_window_end_ms,
        })
    }
}

impl KeyActor {
    /// Asks the region fair pool for the region's total; `None` when the
    /// coordinator could not be reached.
    async fn pool_grant(
        &mut self,
        region_weight: u64,
        want_total: u64,
    ) -> Result<Option<u64>, Status> {
        let sent = self.shared.mono_ms();
        match self
            .shared
            .client
            .pool_grant(
                &self.key,
                self.shared.config.region.as_str(),
                region_weight,
                want_total,
            )
            .await
        {
            Ok(grant) => {
                self.shared.set_reachable(true);
                let window = WindowBounds {
                    start_ms: grant.window_start_ms,
                    end_ms: grant.window_end_ms,
                };
                let deadline_ms = sent.saturating_add(grant.remaining_lifetime_ms);
                let limit = grant.limit;
                let state = self.fair.get_or_insert_with(|| FairState {
                    escrow: WeightedFairEscrow::new(limit, self.shared.config.max_tenants),
                    window,
                    deadline_ms,
                });
                if state.window != window {
                    state.window = window;
                    state.deadline_ms = deadline_ms;
                } else {
                    state.deadline_ms = state.deadline_ms.min(deadline_ms);
                }
                state.escrow.observe_grant(window, grant.granted_total);
                self.last_window_end_ms = grant.window_end_ms;
                Ok(Some(grant.granted_total))
            }
            Err(e)
                if matches!(
                    e.code(),
                    Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition
                ) =>
            {
                Err(Status::new(e.code(), e.to_string()))
            }
            Err(e) => {
                tracing::warn!(key = %self.key, error = %e, "coordinator unreachable; fair key denies (fail closed)");
                self.shared.set_reachable(false);
                Ok(None)
            }
        }
    }

    /// One weighted-fair decision of `cost` tokens for `tenant`, over the
    /// region's pool grant; an admission hands out `cost` credits.
    async fn acquire_fair(
        &mut self,
        policy: &Policy,
        tenant: &TenantId,
        weight: u64,
        cost: u64,
    ) -> Result<Acquired, Status> {
        let now = self.shared.mono_ms();
        let live = self.fair.as_ref().is_some_and(|f| now < f.deadline_ms);
        if !live && self.pool_grant(weight, cost).await?.is_none() {
            return Ok(Acquired::Denied {
                retry_after_ms: self.shared.config.probe_interval_ms.max(1),
                limit: policy.limit,
                window_end_ms: self.last_window_end_ms,
            });
        }
        for _ in 0..leasehold_core::wfe::MAX_POOL_ASKS_PER_CHECK {
            let Some(state) = self.fair.as_mut() else {
                break;
            };
            let now = self.shared.mono_ms();
            if now >= state.deadline_ms {
                break;
            }
            let remaining = state.deadline_ms - now;
            let coordinator_now = state.window.end_ms.saturating_sub(remaining);
            let window = state.window;
            let mut ask = RecordedAsk {
                current: state.escrow.budget(),
                asked: None,
            };
            let decision =
                state
                    .escrow
                    .check(tenant, weight, cost, window, coordinator_now, &mut ask);
            if decision.allowed {
                let served = Served {
                    granted: cost,
                    window_start_ms: window.start_ms,
                    window_end_ms: window.end_ms,
                    remaining_lifetime_ms: remaining,
                    from_fallback: false,
                };
                return Ok(Acquired::Credits {
                    served,
                    limit: decision.limit,
                });
            }
            let before = state.escrow.budget();
            let Some((region_weight, want)) = ask.asked else {
                return Ok(Acquired::Denied {
                    retry_after_ms: decision.retry_after_ms,
                    limit: decision.limit,
                    window_end_ms: window.end_ms,
                });
            };
            match self.pool_grant(region_weight, want).await? {
                Some(total) if total > before => continue,
                _ => {
                    return Ok(Acquired::Denied {
                        retry_after_ms: decision.retry_after_ms,
                        limit: decision.limit,
                        window_end_ms: window.end_ms,
                    })
                }
            }
        }
        Ok(Acquired::Denied {
            retry_after_ms: 1,
            limit: policy.limit,
            window_end_ms: self.last_window_end_ms,
        })
    }
}
