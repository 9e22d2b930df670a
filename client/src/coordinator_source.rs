//! [`CoordinatorSource`]: credits leased from the coordinator (L3)
//! directly, without a regional escrow node.
//!
//! `Acquire` becomes a coordinator `Lease` for this source's region (the
//! [`CoordinatorClient`] follows the leader and retries with the same
//! request id); `Return` becomes `Reconcile`. A strict `Check` is a `Lease`
//! of exactly the cost: allowed when fully granted, otherwise denied and any
//! partial grant is reconciled back. The coordinator reports no global
//! remaining count, so strict decisions from this source carry
//! `remaining = 0` (a valid lower bound).
//!
//! Strict checks that are in flight together leave together: they go
//! through one [`LeaseCoalescer`] per source (started on the first check),
//! so concurrent checks of any keys become `LeaseBatch` calls, each
//! carrying whatever queued meanwhile (the coalescer's module says how
//! many go out at once), and a lone check is still one plain `Lease`.
//! Each check's answer is its own item's, exactly as if sent alone.
//!
//! `fair` keys are leased per tenant through an escrow node's weighted-fair
//! escrow; asking the coordinator for one, or naming a tenant, is
//! [`ClientError::Unsupported`].

use std::sync::{Arc, OnceLock};

use futures::future::{BoxFuture, FutureExt};
use leasehold_core::ids::RegionId;
use leasehold_proto::v1 as wire;

use crate::coordinator::{CoordinatorClient, CoordinatorError};
use crate::decision::{allowed, denied};
use crate::error::ClientError;
use crate::lease_coalescer::LeaseCoalescer;
use crate::source::{AcquireRequest, CheckReply, CheckRequest, CreditSource, Grant, ReturnRequest};

/// A [`CreditSource`] leasing from the coordinator for one region.
#[derive(Debug, Clone)]
pub struct CoordinatorSource {
    client: CoordinatorClient,
    region: RegionId,
    /// The strict checks' coalescer, started by the first check (inside
    /// the runtime that runs it); shared by clones.
    strict_checks: Arc<OnceLock<LeaseCoalescer>>,
}

impl CoordinatorSource {
    /// A source leasing for `region` through `client`.
    pub fn new(client: CoordinatorClient, region: RegionId) -> Self {
        CoordinatorSource {
            client,
            region,
            strict_checks: Arc::new(OnceLock::new()),
        }
    }

    /// Calls made for strict checks so far (`LeaseBatch` and plain
    /// `Lease`), and checks sent: fewer calls than checks is coalescing.
    pub fn strict_check_calls(&self) -> (u64, u64) {
        self.strict_checks
            .get()
            .map(|coalescer| {
                let stats = coalescer.stats();
                (
                    stats.calls.load(std::sync::atomic::Ordering::Relaxed),
                    stats.items_per_call.snapshot().sum,
                )
            })
            .unwrap_or((0, 0))
    }

    /// The region this source leases for.
    pub fn region(&self) -> &RegionId {
        &self.region
    }

    async fn lease(
        &self,
        key: &str,
        tokens: u64,
        request_id: wire::RequestId,
    ) -> Result<Grant, ClientError> {
        let response = self
            .client
            .lease_with_id(key, self.region.as_str(), tokens, request_id)
            .await
            .map_err(|e| client_error(key, e))?;
        Ok(grant_from_lease(&response))
    }
}

impl CreditSource for CoordinatorSource {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        async move {
            reject_tenant(&request.tenant)?;
            let id = wire::RequestId::from(&request.request_id);
            self.lease(request.key.as_str(), request.tokens, id).await
        }
        .boxed()
    }

    fn check(&self, request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        async move {
            reject_tenant(&request.tenant)?;
            let key = request.key.as_str();
            let coalescer = self
                .strict_checks
                .get_or_init(|| LeaseCoalescer::spawn(self.client.clone()));
            let response = coalescer
                .lease(key, self.region.as_str(), request.cost)
                .await
                .map_err(|e| client_error(key, e))?;
            let grant = grant_from_lease(&response);
            let decision = if grant.granted >= request.cost {
                allowed(grant.limit, 0, grant.window_end_ms)
            } else {
                if grant.granted > 0 {
                    // Best effort: an unreturned partial grant is forfeited,
                    // which is safe.
                    let _ = self
                        .client
                        .reconcile(
                            key,
                            self.region.as_str(),
                            grant.granted,
                            grant.window_start_ms,
                        )
                        .await;
                }
                denied(
                    grant.limit,
                    0,
                    grant.window_end_ms,
                    grant.remaining_lifetime_ms,
                )
            };
            Ok(CheckReply {
                decision,
                window_start_ms: grant.window_start_ms,
            })
        }
        .boxed()
    }

    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        async move {
            reject_tenant(&request.tenant)?;
            let key = request.key.as_str();
            let response = self
                .client
                .reconcile(
                    key,
                    self.region.as_str(),
                    request.tokens,
                    request.window_start_ms,
                )
                .await
                .map_err(|e| client_error(key, e))?;
            Ok(response.credited)
        }
        .boxed()
    }
}

fn reject_tenant(tenant: &Option<leasehold_core::ids::TenantId>) -> Result<(), ClientError> {
    match tenant {
        None => Ok(()),
        Some(t) => Err(ClientError::Unsupported(
            format!(
            "tenant {t}: per-tenant credits need an escrow node; the coordinator leases per region"
        )
            .into(),
        )),
    }
}

/// Converts a coordinator `Lease` answer; an empty grant's retry hint is the
/// rest of the window (nothing more is granted before it ends).
pub fn grant_from_lease(response: &wire::LeaseResponse) -> Grant {
    Grant {
        granted: response.granted,
        limit: response.limit,
        window_start_ms: response.window_start_ms,
        window_end_ms: response.window_end_ms,
        remaining_lifetime_ms: response.remaining_lifetime_ms,
        retry_after_ms: if response.granted == 0 {
            response.remaining_lifetime_ms.max(1)
        } else {
            0
        },
    }
}

/// Maps a coordinator error onto the client's error kinds.
fn client_error(key: &str, e: CoordinatorError) -> ClientError {
    match e {
        CoordinatorError::NoEndpoints
        | CoordinatorError::Address(_)
        | CoordinatorError::InvalidArgument(_) => ClientError::InvalidInput(e.to_string().into()),
        CoordinatorError::NotFound(m) => ClientError::NoPolicy(m.into()),
        CoordinatorError::FailedPrecondition { message: m, reason } => ClientError::Unsupported(
            crate::error::Detail::new(format!(
                "key {key:?} cannot be leased from the coordinator directly ({m}); \
                 `fair` keys are served by escrow nodes"
            ))
            .with_reason(reason),
        ),
        CoordinatorError::NotLeader { .. }
        | CoordinatorError::Unavailable { .. }
        | CoordinatorError::Transport { .. }
        | CoordinatorError::LeaderUnresolvable { .. } => {
            ClientError::Unavailable(e.to_string().into())
        }
        CoordinatorError::DeadlineExceeded { after, .. } => ClientError::DeadlineExceeded(after),
        CoordinatorError::AlreadyExists(_) | CoordinatorError::Rpc { .. } => {
            ClientError::Protocol(e.to_string().into())
        }
    }
}
