//! The `leasehold.v1.Escrow` service and the table of key actors.
//!
//! The table is bounded by `max_keys`: a request for a new key when it is
//! full is refused with `RESOURCE_EXHAUSTED` (never an unbounded map, never
//! over-admission); idle actors hand their credits back and leave the table
//! after `idle_evict_ms`, making room.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::transport::WallClock;
use leasehold_core::escrow::{EscrowCounters, Reconcile};
use leasehold_core::ids::{Key, RequestId};
use leasehold_core::policy::{Policy, PolicyTable};
use leasehold_proto::v1 as pb;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::actor::{Acquired, KeyHandle, KeyRequest};
use super::EscrowConfig;
use crate::coordinator::convert::policy_from_wire;

/// State shared by the service and every key actor.
pub struct EscrowShared {
    /// The node's configuration.
    pub config: EscrowConfig,
    /// Client of the coordinator cluster.
    pub client: CoordinatorClient,
    clock: Arc<dyn WallClock>,
    started: Instant,
    policies: RwLock<PolicyTable>,
    actors: Mutex<HashMap<String, KeyHandle>>,
    reachable: AtomicBool,
    evicted_keys: AtomicU64,
    leases_sent: AtomicU64,
    outage_denials: AtomicU64,
    fallback_tokens: AtomicU64,
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
            client,
            clock,
            started: Instant::now(),
            policies: RwLock::new(PolicyTable::default()),
            actors: Mutex::new(HashMap::new()),
            reachable: AtomicBool::new(true),
            evicted_keys: AtomicU64::new(0),
            leases_sent: AtomicU64::new(0),
            outage_denials: AtomicU64::new(0),
            fallback_tokens: AtomicU64::new(0),
        })
    }

    /// Monotonic milliseconds since the node started (tokio time).
    pub fn mono_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The node's wall clock, epoch ms (only for fallback windows).
    pub fn wall_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The policy governing `key`, as last read from the cluster.
    pub fn policy_for(&self, key: &str) -> Option<Policy> {
        self.policies
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .lookup(key)
            .cloned()
    }

    /// Notes whether the coordinator answered the last call.
    pub fn set_reachable(&self, reachable: bool) {
        self.reachable.store(reachable, Ordering::Relaxed);
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

    fn handle(self: &Arc<Self>, key: &str) -> Result<KeyHandle, Status> {
        let mut actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(handle) = actors.get(key) {
            return Ok(handle.clone());
        }
        if actors.len() >= self.config.max_keys {
            return Err(Status::resource_exhausted(format!(
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
        Err(Status::unavailable("the key's actor stopped; retry"))
    }

    /// Stops every actor and hands their credits back (shutdown).
    pub async fn return_everything(&self) {
        let handles: Vec<KeyHandle> = self
            .actors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, h)| h)
            .collect();
        drop(handles);
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

    async fn acquire_tokens(
        &self,
        key: &str,
        tokens: u64,
        tenant: &str,
        weight: u64,
    ) -> Result<Acquired, Status> {
        let tenant = if tenant.is_empty() {
            None
        } else {
            Some(
                leasehold_core::ids::TenantId::new(tenant)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
            )
        };
        let weight = weight.max(1);
        let key = Key::new(key).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if tokens == 0 {
            return Err(Status::invalid_argument("tokens must be at least 1"));
        }
        self.shared
            .ask(key.as_str(), |reply| KeyRequest::Acquire {
                tokens,
                tenant: tenant.clone(),
                weight,
                reply,
            })
            .await?
    }
}

fn validate_request_id(raw: Option<pb::RequestId>) -> Result<(), Status> {
    if let Some(id) = raw {
        let client = leasehold_core::ids::ClientId::new(id.client_id)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let _ = RequestId {
            client,
            seq: id.seq,
        };
    }
    Ok(())
}

#[tonic::async_trait]
impl pb::escrow_server::Escrow for EscrowApi {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let request = request.into_inner();
        validate_request_id(request.request_id)?;
        if !request.tenant.is_empty() {
            leasehold_core::ids::TenantId::new(request.tenant.clone())
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
        }
        let reachable = self.shared.reachable.load(Ordering::Relaxed);
        Ok(Response::new(
            match self
                .acquire_tokens(
                    &request.key,
                    request.tokens,
                    &request.tenant,
                    request.weight,
                )
                .await?
            {
                Acquired::Credits { served, limit } => pb::AcquireResponse {
                    granted: served.granted,
                    limit,
                    window_start_ms: served.window_start_ms,
                    window_end_ms: served.window_end_ms,
                    remaining_lifetime_ms: served.remaining_lifetime_ms,
                    retry_after_ms: 0,
                    coordinator_reachable: reachable,
                },
                Acquired::Denied {
                    retry_after_ms,
                    limit,
                    window_end_ms,
                } => pb::AcquireResponse {
                    granted: 0,
                    limit,
                    window_start_ms: 0,
                    window_end_ms,
                    remaining_lifetime_ms: 0,
                    retry_after_ms: retry_after_ms.max(1),
                    coordinator_reachable: reachable,
                },
            },
        ))
    }

    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let request = request.into_inner();
        let cost = request.cost.max(1);
        let key = request.key.clone();
        let acquired = self
            .acquire_tokens(&key, cost, &request.tenant, request.weight)
            .await?;
        let response = match acquired {
            Acquired::Credits { served, limit } if served.granted == cost => pb::CheckResponse {
                decision: Some(pb::Decision {
                    allowed: true,
                    limit,
                    remaining: 0,
                    reset_at_ms: served.window_end_ms,
                    retry_after_ms: 0,
                }),
                window_start_ms: served.window_start_ms,
            },
            Acquired::Credits { served, limit } => {
                // Not enough for the whole cost: put the partial back, deny.
                let window_start_ms = served.window_start_ms;
                let tokens = served.granted;
                if !served.from_fallback {
                    let _ = self
                        .shared
                        .ask(&key, |reply| KeyRequest::Return {
                            tokens,
                            window_start_ms,
                            reply,
                        })
                        .await;
                }
                pb::CheckResponse {
                    decision: Some(pb::Decision {
                        allowed: false,
                        limit,
                        remaining: tokens,
                        reset_at_ms: served.window_end_ms,
                        retry_after_ms: served.remaining_lifetime_ms.max(1),
                    }),
                    window_start_ms: 0,
                }
            }
            Acquired::Denied {
                retry_after_ms,
                limit,
                window_end_ms,
            } => pb::CheckResponse {
                decision: Some(pb::Decision {
                    allowed: false,
                    limit,
                    remaining: 0,
                    reset_at_ms: window_end_ms,
                    retry_after_ms: retry_after_ms.max(1),
                }),
                window_start_ms: 0,
            },
        };
        Ok(Response::new(response))
    }

    async fn r#return(
        &self,
        request: Request<pb::ReturnRequest>,
    ) -> Result<Response<pb::ReturnResponse>, Status> {
        let request = request.into_inner();
        let key = Key::new(request.key).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let (tokens, window_start_ms) = (request.tokens, request.window_start_ms);
        if tokens == 0 {
            return Ok(Response::new(pb::ReturnResponse { accepted: 0 }));
        }
        let accepted = self
            .shared
            .ask(key.as_str(), |reply| KeyRequest::Return {
                tokens,
                window_start_ms,
                reply,
            })
            .await?;
        Ok(Response::new(pb::ReturnResponse { accepted }))
    }

    async fn status(
        &self,
        _: Request<pb::EscrowStatusRequest>,
    ) -> Result<Response<pb::EscrowStatusResponse>, Status> {
        let s = &self.shared;
        Ok(Response::new(pb::EscrowStatusResponse {
            region: s.config.region.to_string(),
            coordinator_reachable: s.reachable.load(Ordering::Relaxed),
            active_keys: s.active_keys(),
            evicted_keys: s.evicted_keys.load(Ordering::Relaxed),
            outage_denials: s.outage_denials.load(Ordering::Relaxed),
            fallback_admissions: s.fallback_tokens.load(Ordering::Relaxed),
            coordinator_calls: s.leases_sent.load(Ordering::Relaxed),
        }))
    }
}
