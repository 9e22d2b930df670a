//! The `leasehold.v1.Escrow` service: validates each call and hands it to
//! the key's actor through the key table (`super::table`).

use std::sync::Arc;

use leasehold_core::escrow::{Holder, ReturnSettled};
use leasehold_core::principal::Principal;
use leasehold_proto::convert::coordinator::{self as coordinator_wire, optional_request_id};
use leasehold_proto::convert::escrow as escrow_wire;
use leasehold_proto::refusal::invalid_field;
use leasehold_proto::v1 as pb;
use leasehold_proto::{REASON_FAIR_THROTTLED, REASON_METADATA};
use tonic::{Request, Response, Status};

use super::actor::{Acquired, HolderRequest, KeyRequest};
use super::key_shared::DenialReason;
use super::shared::{status_of, EscrowShared};
use super::table::KeyTable;
use crate::telemetry;
use leasehold_core::escrow::machine::Serving;

/// The gRPC face of the escrow node.
#[derive(Debug, Clone)]
pub struct EscrowApi {
    shared: Arc<EscrowShared>,
    table: Arc<KeyTable>,
}

impl EscrowApi {
    /// The service over the key table `table`.
    pub fn new(table: Arc<KeyTable>) -> Self {
        EscrowApi {
            shared: table.shared.clone(),
            table,
        }
    }

    /// One admission of `tokens` on `key` for `caller`, served as
    /// `serving` says, its denial recorded: the RLS path.
    pub(crate) async fn admit(
        &self,
        key: &str,
        tokens: u64,
        caller: Principal,
        serving: Serving,
    ) -> Result<Acquired, Status> {
        let acquired = traced(
            self.acquire_tokens(key, tokens, "", 0, (caller, None), serving)
                .await,
        )?;
        record_escrow_denial(&self.shared, &acquired);
        Ok(acquired)
    }

    /// Takes back `tokens` of `key` served without a holder in the window
    /// starting at `window_start_ms` (an RLS refund), capped by what the
    /// key served there and has not taken back.
    pub(crate) async fn refund(
        &self,
        key: &str,
        tokens: u64,
        window_start_ms: u64,
        caller: Principal,
    ) -> Result<ReturnSettled, Status> {
        let key = coordinator_wire::key(key)?;
        self.table
            .ask((key.as_str(), &caller), |reply| KeyRequest::Refund {
                tokens,
                window_start_ms,
                reply,
            })
            .await?
    }

    /// The node's wall clock, epoch ms.
    pub(crate) fn wall_ms(&self) -> u64 {
        self.shared.keys.wall_ms()
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
        serving: Serving,
    ) -> Result<Acquired, Status> {
        let tenant = escrow_wire::tenant(tenant)?;
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
        let key = coordinator_wire::key(key)?;
        if tokens == 0 {
            return Err(invalid_field("tokens", "tokens must be at least 1"));
        }
        self.table
            .ask((key.as_str(), &principal), |reply| KeyRequest::Acquire {
                tokens,
                tenant: tenant.clone(),
                weight,
                from: from.clone(),
                principal: principal.clone(),
                serving,
                reply,
                span: tracing::Span::current(),
            })
            .await?
    }
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
    let id = optional_request_id(raw)?;
    Ok(id.map(|id| HolderRequest {
        holder: Holder {
            principal: caller,
            client: id.client,
        },
        seq: id.seq,
    }))
}

/// Records why an escrow answer admitted nothing, on the current span.
fn record_escrow_denial(shared: &EscrowShared, acquired: &Acquired) {
    if let Acquired::Denied { fair_throttled, .. } = acquired {
        let reason = if *fair_throttled {
            DenialReason::FairThrottled
        } else if !shared.keys.is_reachable() {
            DenialReason::CoordinatorUnreachable
        } else {
            DenialReason::WindowExhausted
        };
        shared.keys.record_denial(reason);
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
        let reachable = self.shared.keys.is_reachable();
        let mut fair_throttled = false;
        let acquired = traced(
            self.acquire_tokens(
                &request.key,
                request.tokens,
                &request.tenant,
                request.weight,
                (caller, from),
                Serving::Part,
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
                Serving::Whole,
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
        let mut request = request.into_inner();
        let key = coordinator_wire::key(&request.key)?;
        let from = holder_request(caller.clone(), request.request_id.take())?.ok_or_else(|| {
            invalid_field(
                "request_id",
                "Return needs a request_id: it names the holder whose credits come back",
            )
        })?;
        let claim = escrow_wire::return_claim(&request)?;
        if claim.tokens == 0 {
            return Ok(Response::new(pb::ReturnResponse { accepted: 0 }));
        }
        let settled = self
            .table
            .ask((key.as_str(), &caller), |reply| KeyRequest::Return {
                from: from.clone(),
                claim: claim.clone(),
                reply,
            })
            .await??;
        Ok(Response::new(pb::ReturnResponse {
            accepted: settled.accepted,
        }))
    }

    async fn forecast(
        &self,
        request: Request<pb::ForecastRequest>,
    ) -> Result<Response<pb::ForecastResponse>, Status> {
        let caller = crate::auth::caller(&request);
        let request = request.into_inner();
        let key = coordinator_wire::key(&request.key)?;
        let used = self
            .table
            .ask((key.as_str(), &caller), |reply| KeyRequest::Forecast {
                demand: request.demand,
                reply,
            })
            .await?;
        Ok(Response::new(pb::ForecastResponse { used }))
    }

    async fn status(
        &self,
        _: Request<pb::EscrowStatusRequest>,
    ) -> Result<Response<pb::EscrowStatusResponse>, Status> {
        Ok(Response::new(status_of(
            &self.shared,
            self.table.active_keys(),
        )))
    }
}
