//! Wire ↔ core conversions for the coordinator services, with input
//! validation: a request that fails here is answered `INVALID_ARGUMENT`
//! before anything is proposed, so bad input never reaches the log.

use leasehold_core::coordinator::{
    Command, LeaseGrant, PoolGrantOutcome, PoolReleaseDisposition, PoolReleaseOutcome,
    ReconcileDisposition, ReconcileOutcome, WindowView,
};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId, TenantId};
use leasehold_core::policy::Policy;
use leasehold_core::principal::Principal;
use leasehold_proto::refusal::invalid_field;
use leasehold_proto::v1 as pb;
use tonic::Status;

fn key(raw: &str) -> Result<Key, Status> {
    Key::new(raw).map_err(|e| invalid_field("key", e.to_string()))
}

fn region(raw: &str) -> Result<RegionId, Status> {
    RegionId::new(raw).map_err(|e| invalid_field("region", e.to_string()))
}

/// Validates a wire request id; absent means "not retried idempotently".
pub fn request_id(raw: Option<pb::RequestId>) -> Result<Option<RequestId>, Status> {
    let Some(raw) = raw else { return Ok(None) };
    let client = ClientId::new(raw.client_id)
        .map_err(|e| invalid_field("request_id.client_id", format!("request_id: {e}")))?;
    Ok(Some(RequestId {
        client,
        seq: raw.seq,
    }))
}

/// A lease request of `caller` as a command: key and region valid, `tokens > 0`.
pub fn lease_command(request: pb::LeaseRequest, caller: Principal) -> Result<Command, Status> {
    if request.tokens == 0 {
        return Err(invalid_field("tokens", "tokens must be greater than 0"));
    }
    Ok(Command::Lease {
        key: key(&request.key)?,
        region: region(&request.region)?,
        tokens: request.tokens,
        request_id: request_id(request.request_id)?,
        caller,
    })
}

/// A reconcile request of `caller` as a command (a zero leftover is a valid no-op).
pub fn reconcile_command(
    request: pb::ReconcileRequest,
    caller: Principal,
) -> Result<Command, Status> {
    Ok(Command::Reconcile {
        key: key(&request.key)?,
        region: region(&request.region)?,
        leftover: request.leftover,
        window_start_ms: request.window_start_ms,
        request_id: request_id(request.request_id)?,
        caller,
    })
}

/// A pool grant request of `caller` as a command: `region_weight ≥ 1`,
/// `want_total ≥ 1`.
pub fn pool_grant_command(
    request: pb::PoolGrantRequest,
    caller: Principal,
) -> Result<Command, Status> {
    if request.region_weight == 0 {
        return Err(invalid_field(
            "region_weight",
            "region_weight must be at least 1",
        ));
    }
    if request.want_total == 0 {
        return Err(invalid_field(
            "want_total",
            "want_total must be greater than 0",
        ));
    }
    Ok(Command::PoolGrant {
        key: key(&request.key)?,
        region: region(&request.region)?,
        region_weight: request.region_weight,
        want_total: request.want_total,
        request_id: request_id(request.request_id)?,
        caller,
    })
}

/// The key of a window read.
pub fn window_key(request: &pb::GetWindowRequest) -> Result<Key, Status> {
    key(&request.key)
}

/// A wire policy as a validated core policy (see
/// [`leasehold_proto::convert`]); a missing one names the field `policy`.
pub fn policy_from_wire(raw: Option<pb::Policy>) -> Result<Policy, Status> {
    let raw = raw.ok_or_else(|| invalid_field("policy", "policy is required"))?;
    Ok(Policy::try_from(raw)?)
}

/// A core policy on the wire.
pub fn policy_to_wire(policy: &Policy) -> pb::Policy {
    pb::Policy::from(policy)
}

/// A lease grant on the wire, with its relative lifetime.
pub fn lease_response(grant: &LeaseGrant) -> pb::LeaseResponse {
    pb::LeaseResponse {
        granted: grant.granted,
        limit: grant.limit,
        window_start_ms: grant.window_start_ms,
        window_end_ms: grant.window_end_ms,
        coordinator_now_ms: grant.coordinator_now_ms,
        remaining_lifetime_ms: grant.window_end_ms.saturating_sub(grant.coordinator_now_ms),
    }
}

/// A pool grant's demand report: at most
/// [`MAX_REPORTED_TENANTS`](leasehold_core::demand_board::MAX_REPORTED_TENANTS)
/// valid, distinct tenants.
pub fn tenant_demands(request: &pb::PoolGrantRequest) -> Result<Vec<(TenantId, u64)>, Status> {
    use leasehold_core::demand_board::MAX_REPORTED_TENANTS;
    if request.tenant_demands.len() > MAX_REPORTED_TENANTS {
        return Err(invalid_field(
            "tenant_demands",
            format!("at most {MAX_REPORTED_TENANTS} tenant demands per request"),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    request
        .tenant_demands
        .iter()
        .map(|d| {
            let tenant = TenantId::new(d.tenant.clone())
                .map_err(|e| invalid_field("tenant_demands", format!("tenant: {e}")))?;
            if !seen.insert(tenant.clone()) {
                return Err(invalid_field(
                    "tenant_demands",
                    format!("tenant {:?} reported twice", d.tenant),
                ));
            }
            Ok((tenant, d.demand))
        })
        .collect()
}

/// A pool grant on the wire, with its relative lifetime.
pub fn pool_grant_response(grant: &PoolGrantOutcome) -> pb::PoolGrantResponse {
    pb::PoolGrantResponse {
        granted_total: grant.granted_total,
        limit: grant.limit,
        window_start_ms: grant.window_start_ms,
        window_end_ms: grant.window_end_ms,
        coordinator_now_ms: grant.coordinator_now_ms,
        remaining_lifetime_ms: grant.window_end_ms.saturating_sub(grant.coordinator_now_ms),
        tenant_demands: Vec::new(),
    }
}

/// A reconcile outcome on the wire.
pub fn reconcile_response(outcome: &ReconcileOutcome) -> pb::ReconcileResponse {
    let disposition = match outcome.disposition {
        ReconcileDisposition::Credited => pb::ReconcileDisposition::Credited,
        ReconcileDisposition::WindowEnded => pb::ReconcileDisposition::WindowEnded,
        ReconcileDisposition::Duplicate => pb::ReconcileDisposition::Duplicate,
    };
    pb::ReconcileResponse {
        credited: outcome.credited,
        disposition: disposition as i32,
    }
}

/// A window view on the wire.
pub fn window_response(key: &Key, view: &WindowView) -> pb::GetWindowResponse {
    pb::GetWindowResponse {
        key: key.to_string(),
        policy: Some(policy_to_wire(&view.policy)),
        limit: view.limit,
        window_start_ms: view.window_start_ms,
        window_end_ms: view.window_end_ms,
        granted: view.granted,
        returned: view.returned,
        regions: view
            .regions
            .iter()
            .map(|r| pb::RegionUsage {
                region: r.region.clone(),
                granted: r.granted,
                returned: r.returned,
                pool_weight: r.pool_weight,
            })
            .collect(),
        coordinator_now_ms: view.coordinator_now_ms,
        would_deny_tokens: view.shadow.would_deny_tokens,
        would_deny_requests: view.shadow.would_deny_requests,
    }
}

/// A pool release request of `caller` as a command: `keep_total ≤ from_total`.
pub fn pool_release_command(
    request: pb::PoolReleaseRequest,
    caller: Principal,
) -> Result<Command, Status> {
    if request.keep_total > request.from_total {
        return Err(invalid_field(
            "keep_total",
            "keep_total must not exceed from_total",
        ));
    }
    Ok(Command::PoolRelease {
        key: key(&request.key)?,
        region: region(&request.region)?,
        from_total: request.from_total,
        keep_total: request.keep_total,
        window_start_ms: request.window_start_ms,
        request_id: request_id(request.request_id)?,
        caller,
    })
}

/// A pool release outcome on the wire.
pub fn pool_release_response(outcome: &PoolReleaseOutcome) -> pb::PoolReleaseResponse {
    let disposition = match outcome.disposition {
        PoolReleaseDisposition::Released => pb::PoolReleaseDisposition::Released,
        PoolReleaseDisposition::WindowEnded => pb::PoolReleaseDisposition::WindowEnded,
        PoolReleaseDisposition::StaleTotal => pb::PoolReleaseDisposition::StaleTotal,
    };
    pb::PoolReleaseResponse {
        disposition: disposition as i32,
        released: outcome.released,
        granted_total: outcome.granted_total,
        window_start_ms: outcome.window_start_ms,
        window_end_ms: outcome.window_end_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn lease(key: &str, region: &str, tokens: u64) -> pb::LeaseRequest {
        pb::LeaseRequest {
            key: key.into(),
            region: region.into(),
            tokens,
            request_id: None,
        }
    }

    #[test]
    fn bad_lease_input_is_invalid_argument() {
        let long_key = "k".repeat(257);
        let long_region = "r".repeat(65);
        for request in [
            lease("", "eu", 1),
            lease(&long_key, "eu", 1),
            lease("k", "", 1),
            lease("k", &long_region, 1),
            lease("k", "eu", 0),
        ] {
            assert_eq!(
                lease_command(request, Principal::Anonymous)
                    .unwrap_err()
                    .code(),
                Code::InvalidArgument
            );
        }
        let bad_id = pb::LeaseRequest {
            request_id: Some(pb::RequestId {
                client_id: String::new(),
                seq: 1,
            }),
            ..lease("k", "eu", 1)
        };
        assert_eq!(
            lease_command(bad_id, Principal::Anonymous)
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
        assert!(lease_command(lease("k", "eu", 1), Principal::Anonymous).is_ok());
    }

    #[test]
    fn bad_pool_grant_and_policy_input_is_invalid_argument() {
        let pool = |weight, want| pb::PoolGrantRequest {
            key: "k".into(),
            region: "eu".into(),
            region_weight: weight,
            want_total: want,
            request_id: None,
            ..Default::default()
        };
        assert_eq!(
            pool_grant_command(pool(0, 1), Principal::Anonymous)
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
        assert_eq!(
            pool_grant_command(pool(1, 0), Principal::Anonymous)
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
        assert!(pool_grant_command(pool(1, 1), Principal::Anonymous).is_ok());
        let policy = |limit, window_ms, kind| pb::Policy {
            prefix: "p".into(),
            limit,
            window_ms,
            kind,
            ..Default::default()
        };
        assert_eq!(
            policy_from_wire(None).unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(
            policy_from_wire(Some(policy(0, 1000, 1)))
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
        assert_eq!(
            policy_from_wire(Some(policy(10, 0, 1))).unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(
            policy_from_wire(Some(policy(10, 1000, 99)))
                .unwrap_err()
                .code(),
            Code::InvalidArgument
        );
    }
}
