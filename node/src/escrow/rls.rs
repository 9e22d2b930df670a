//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`,
//! RLS v3) on the escrow node: `ShouldRateLimit` answers every descriptor
//! from the node's escrow, with no coordinator call per request.
//!
//! The node reads `envoyproxy/ratelimit` configuration files
//! (`--ratelimit-config`, [`crate::ratelimit_file`]); each request's
//! descriptors are planned by the pure rules of
//! [`leasehold_core::rls::answer`] and each limited descriptor is charged
//! on its Leasehold key: all its hits or, when fewer are left, what is
//! left (recorded, as upstream records every hit, but never beyond the
//! limit, so the global budget's Δ = 0 holds behind Envoy exactly as it
//! does for the node's own clients); a descriptor whose own `hits_addend`
//! is 0 is check-only and spends nothing. The keys' policies come from the cluster: apply
//! the same files with `leasehold policy apply` (docs/envoy.md).
//!
//! Requests the node cannot answer are refused `INVALID_ARGUMENT` (reason
//! `INVALID_FIELD`): an empty `domain`, no `descriptors`, more than
//! [`MAX_DESCRIPTORS`] descriptors or [`MAX_ENTRIES`] entries in one, an
//! entry with an empty key. A descriptor's `limit` override is not honoured:
//! the descriptor is answered by the rule it matches, as without one (the
//! cluster's policy governs, so every region enforces one limit); it is
//! counted. A descriptor with `is_negative_hits` is a refund, answered `OK`
//! without a limit: it gives back at most what its caller was charged on
//! the key in a window not yet over
//! ([`leasehold_core::rls::refunds::RefundBook`], on this node), and the
//! escrow at most what it served there and has not taken back.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as WireUnit, Code as WireCode, DescriptorStatus, RateLimit as WireLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as WireDuration;
use leasehold_core::escrow::machine::{Acquired, Serving};
use leasehold_core::principal::Principal;
use leasehold_core::rls::answer::{
    descriptor_hits, draft_headers, overall_over_limit, plan_request, unpaid_hits, Code,
    DescriptorAnswer, EscrowOutcome, Plan, RequestDescriptor,
};
use leasehold_core::rls::Unit;
use leasehold_proto::refusal::invalid_field;
use tonic::{Request, Response, Status};

use super::rls_state::Outcome;
pub use super::rls_state::{
    read_domains, reload_periodically, RlsConfig, RlsState, DEFAULT_RELOAD_INTERVAL_MS,
};
use super::service::EscrowApi;

/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;

/// The gRPC face of RLS on the escrow node.
#[derive(Debug, Clone)]
pub struct RateLimitApi {
    escrow: EscrowApi,
    state: Arc<RlsState>,
}

impl RateLimitApi {
    /// RLS answered from `escrow`'s keys with `state`'s domains.
    pub fn new(escrow: EscrowApi, state: Arc<RlsState>) -> Self {
        RateLimitApi { escrow, state }
    }

    /// One refund (an `is_negative_hits` descriptor planned `plan`) by
    /// `caller`: what it was charged on the key in a window not yet over,
    /// at most, given back through the escrow's capped take-back.
    async fn refund(&self, plan: &Plan, caller: &Principal) -> Result<(), Status> {
        let metrics = &self.state.metrics;
        let Plan::Limited(limited) = plan else {
            metrics
                .negative_hits_ignored
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let now_ms = self.escrow.wall_ms();
        let refundable =
            self.state
                .lock_refunds()
                .refundable(&limited.key, caller, limited.hits, now_ms);
        let accepted = match refundable {
            Some(refund) => {
                let settled = self
                    .escrow
                    .refund(
                        &limited.key,
                        refund.tokens,
                        refund.window_start_ms,
                        caller.clone(),
                    )
                    .await?;
                self.state.lock_refunds().refunded(
                    &limited.key,
                    caller,
                    refund.window_start_ms,
                    settled.accepted,
                );
                settled.accepted
            }
            None => 0,
        };
        metrics.hits_refunded.fetch_add(accepted, Ordering::Relaxed);
        metrics
            .refund_hits_refused
            .fetch_add(limited.hits - accepted, Ordering::Relaxed);
        Ok(())
    }
}

fn wire_unit(unit: Unit) -> WireUnit {
    match unit {
        Unit::Second => WireUnit::Second,
        Unit::Minute => WireUnit::Minute,
        Unit::Hour => WireUnit::Hour,
        Unit::Day => WireUnit::Day,
        Unit::Week => WireUnit::Week,
        Unit::Month => WireUnit::Month,
        Unit::Year => WireUnit::Year,
    }
}

fn wire_status(answer: &DescriptorAnswer) -> DescriptorStatus {
    DescriptorStatus {
        code: match answer.code {
            Code::Ok => WireCode::Ok,
            Code::OverLimit => WireCode::OverLimit,
        } as i32,
        current_limit: answer
            .current_limit
            .map(|(requests_per_unit, unit)| WireLimit {
                name: String::new(),
                requests_per_unit,
                unit: wire_unit(unit) as i32,
            }),
        limit_remaining: answer.limit_remaining,
        duration_until_reset: answer.until_reset_ms.map(|ms| WireDuration {
            seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
            nanos: i32::try_from(ms % 1_000 * 1_000_000).unwrap_or(0),
        }),
        quota: None,
    }
}

/// One descriptor of a request, read.
struct ReadDescriptor<'a> {
    entries: Vec<(&'a str, &'a str)>,
    /// Its own `hits_addend`, else the request's.
    hits: u64,
    /// `is_negative_hits`.
    negative: bool,
}

/// A request's descriptors as entries and hits, refusing what cannot be
/// answered.
fn read_descriptors(request: &RateLimitRequest) -> Result<Vec<ReadDescriptor<'_>>, Status> {
    if request.domain.is_empty() {
        return Err(invalid_field(
            "domain",
            "the rate limit domain must not be empty",
        ));
    }
    if request.descriptors.is_empty() {
        return Err(invalid_field(
            "descriptors",
            "the rate limit descriptor list must not be empty",
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid_field(
            "descriptors",
            format!(
                "{} descriptors; at most {MAX_DESCRIPTORS} in one request",
                request.descriptors.len()
            ),
        ));
    }
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, descriptor)| {
            if descriptor.entries.len() > MAX_ENTRIES {
                return Err(invalid_field(
                    "descriptors.entries",
                    format!(
                        "descriptor {i} has {} entries; at most {MAX_ENTRIES}",
                        descriptor.entries.len()
                    ),
                ));
            }
            let entries = descriptor
                .entries
                .iter()
                .map(|entry| {
                    if entry.key.is_empty() {
                        Err(invalid_field(
                            "descriptors.entries.key",
                            format!("descriptor {i} has an entry with an empty key"),
                        ))
                    } else {
                        Ok((entry.key.as_str(), entry.value.as_str()))
                    }
                })
                .collect::<Result<Vec<_>, Status>>()?;
            let hits = descriptor_hits(
                descriptor.hits_addend.as_ref().map(|hits| hits.value),
                request.hits_addend,
            );
            Ok(ReadDescriptor {
                entries,
                hits,
                negative: descriptor.is_negative_hits,
            })
        })
        .collect()
}

#[tonic::async_trait]
impl RateLimitService for RateLimitApi {
    #[tracing::instrument(name = "rls.should_rate_limit", level = "debug", skip_all, fields(
        domain = %request.get_ref().domain, descriptors = request.get_ref().descriptors.len()))]
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let caller = crate::auth::caller(&request);
        let request = request.into_inner();
        let metrics = &self.state.metrics;
        let descriptors = match read_descriptors(&request) {
            Ok(descriptors) => descriptors,
            Err(status) => {
                metrics.requests_refused.fetch_add(1, Ordering::Relaxed);
                return Err(status);
            }
        };
        let overrides = request
            .descriptors
            .iter()
            .filter(|d| d.limit.is_some())
            .count();
        metrics
            .limit_overrides_ignored
            .fetch_add(overrides as u64, Ordering::Relaxed);
        let domains = self.state.domains();
        let config = domains.get(&request.domain);
        // A negative-hits descriptor takes no part (not even in `replaces`).
        let counted: Vec<RequestDescriptor> = descriptors
            .iter()
            .filter(|d| !d.negative)
            .map(|d| RequestDescriptor {
                entries: &d.entries,
                hits: d.hits,
            })
            .collect();
        let mut counted_plans = plan_request(config, &counted).into_iter();
        let plans: Vec<Plan> = descriptors
            .iter()
            .map(|d| {
                if d.negative {
                    Plan::NoLimit
                } else {
                    counted_plans.next().unwrap_or(Plan::NoLimit)
                }
            })
            .collect();
        // Refunds, planned by the same rules among themselves: each gives
        // back at most what this caller was charged on its key in a window
        // not yet over, and the escrow at most what it served there.
        let refunds: Vec<RequestDescriptor> = descriptors
            .iter()
            .filter(|d| d.negative)
            .map(|d| RequestDescriptor {
                entries: &d.entries,
                hits: d.hits,
            })
            .collect();
        for plan in plan_request(config, &refunds) {
            self.refund(&plan, &caller).await?;
        }
        let outcomes = futures::future::try_join_all(plans.iter().map(|plan| {
            let caller = caller.clone();
            async move {
                let Plan::Limited(limited) = plan else {
                    return Ok(EscrowOutcome::NotAsked);
                };
                if !limited.asks_escrow() {
                    return Ok(EscrowOutcome::NotAsked);
                }
                // A check-only descriptor probes one hit and spends
                // nothing; a charge spends all its hits or what is left.
                let (tokens, serving) = if limited.check_only() {
                    (1, Serving::Probe)
                } else {
                    (limited.hits, Serving::Charge)
                };
                let acquired = self
                    .escrow
                    .admit(&limited.key, tokens, caller.clone(), serving)
                    .await?;
                if let (
                    Serving::Charge,
                    Acquired::Credits {
                        served,
                        shadow_would_deny: false,
                        ..
                    },
                ) = (serving, &acquired)
                {
                    // Only credits served from a grant are refundable:
                    // fallback and shadow credits never entered the escrow.
                    if served.granted > 0 && !served.from_fallback {
                        self.state.lock_refunds().charge(
                            (&limited.key, &caller),
                            (served.window_start_ms, served.window_end_ms),
                            served.granted,
                            self.escrow.wall_ms(),
                        );
                    }
                }
                Ok::<_, Status>(match acquired {
                    Acquired::Credits {
                        served,
                        limit,
                        shadow_would_deny,
                    } => EscrowOutcome::Admitted {
                        spent: served.granted,
                        limit,
                        held_after: served.held_after,
                        window_end_ms: served.window_end_ms,
                        shadow_would_deny,
                    },
                    Acquired::Denied {
                        limit,
                        window_end_ms,
                        ..
                    } => EscrowOutcome::Denied {
                        limit,
                        window_end_ms,
                    },
                })
            }
        }))
        .await
        .inspect_err(|_| {
            metrics.requests_refused.fetch_add(1, Ordering::Relaxed);
        })?;
        let now_ms = self.escrow.wall_ms();
        let answers: Vec<DescriptorAnswer> = plans
            .iter()
            .zip(outcomes)
            .map(|(plan, outcome)| {
                if let Plan::Limited(limited) = plan {
                    if limited.check_only() {
                        metrics.checks_only.fetch_add(1, Ordering::Relaxed);
                    }
                }
                metrics
                    .hits_unpaid
                    .fetch_add(unpaid_hits(plan, outcome), Ordering::Relaxed);
                DescriptorAnswer::of(plan, outcome, now_ms)
            })
            .collect();
        let domain_counters = metrics.domain(&request.domain);
        for (plan, answer) in plans.iter().zip(&answers) {
            let (outcome, hits, detailed) = match plan {
                Plan::NoLimit => (Outcome::NoLimit, 0, None),
                Plan::Unlimited => (Outcome::Unlimited, 0, None),
                Plan::Limited(limited) => (
                    if answer.code == Code::OverLimit {
                        Outcome::OverLimit
                    } else if answer.shadow_would_deny {
                        Outcome::ShadowMode
                    } else {
                        Outcome::WithinLimit
                    },
                    limited.hits,
                    limited
                        .detailed_metric
                        .then(|| metrics.detailed(&limited.rule_prefix))
                        .flatten(),
                ),
            };
            domain_counters.count(outcome, hits);
            if let Some(counters) = detailed {
                counters.count(outcome, hits);
            }
        }
        let over = overall_over_limit(&answers);
        let counter = if over {
            &metrics.requests_over_limit
        } else {
            &metrics.requests_ok
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let response_headers_to_add = if self.state.response_headers {
            draft_headers(&answers)
                .into_iter()
                .map(|(key, value)| HeaderValue {
                    key: key.to_string(),
                    value,
                    raw_value: Vec::new(),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: if over {
                WireCode::OverLimit
            } else {
                WireCode::Ok
            } as i32,
            statuses: answers.iter().map(wire_status).collect(),
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}
