//! Conversions of the Coordinator service's messages: each request into the
//! replicated [`Command`] it asks for, validated before anything is
//! proposed (so bad input never reaches the log), each outcome into its
//! answer, and the pieces requests share — request ids, keys and regions,
//! the tenant demand report of a pool grant.
//!
//! The caller's identity is not on the wire: the server authenticates it
//! and passes the [`Principal`] in, which the command carries.

use std::collections::BTreeSet;

use leasehold_core::coordinator::{
    Command, LeaseGrant, PoolGrantOutcome, PoolReleaseDisposition, PoolReleaseOutcome,
    ReconcileDisposition, ReconcileOutcome, WindowView,
};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId, TenantId};
use leasehold_core::pool::demand_board::MAX_REPORTED_TENANTS;
use leasehold_core::principal::Principal;

use super::InvalidField;
use crate::v1 as pb;

/// A request's `key`.
pub fn key(raw: &str) -> Result<Key, InvalidField> {
    Key::new(raw).map_err(|e| InvalidField::new("key", e.to_string()))
}

/// A request's `region`.
pub fn region(raw: &str) -> Result<RegionId, InvalidField> {
    RegionId::new(raw).map_err(|e| InvalidField::new("region", e.to_string()))
}

impl TryFrom<pb::RequestId> for RequestId {
    type Error = InvalidField;

    /// A request id with a valid client id (any `seq` is valid).
    fn try_from(raw: pb::RequestId) -> Result<Self, Self::Error> {
        let client = ClientId::new(raw.client_id)
            .map_err(|e| InvalidField::new("request_id.client_id", format!("request_id: {e}")))?;
        Ok(RequestId {
            client,
            seq: raw.seq,
        })
    }
}

impl From<&RequestId> for pb::RequestId {
    /// A request id on the wire.
    fn from(id: &RequestId) -> Self {
        pb::RequestId {
            client_id: id.client.as_str().to_string(),
            seq: id.seq,
        }
    }
}

impl From<RequestId> for pb::RequestId {
    /// As the conversion of a borrowed request id.
    fn from(id: RequestId) -> Self {
        pb::RequestId::from(&id)
    }
}

/// A request's optional `request_id`; absent means "not retried
/// idempotently".
pub fn optional_request_id(raw: Option<pb::RequestId>) -> Result<Option<RequestId>, InvalidField> {
    raw.map(RequestId::try_from).transpose()
}

/// A lease request of `caller` as a command: key and region valid, `tokens > 0`.
pub fn lease_command(
    request: pb::LeaseRequest,
    caller: Principal,
) -> Result<Command, InvalidField> {
    if request.tokens == 0 {
        return Err(InvalidField::new("tokens", "tokens must be greater than 0"));
    }
    Ok(Command::Lease {
        key: key(&request.key)?,
        region: region(&request.region)?,
        tokens: request.tokens,
        request_id: optional_request_id(request.request_id)?,
        caller,
    })
}

/// The lease request for `tokens` of `key`'s current window for `region`,
/// under `request_id` if any: what [`lease_command`] reads back.
pub fn lease_request(
    key: &Key,
    region: &RegionId,
    tokens: u64,
    request_id: Option<&RequestId>,
) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: key.as_str().to_string(),
        region: region.as_str().to_string(),
        tokens,
        request_id: request_id.map(pb::RequestId::from),
    }
}

/// A reconcile request of `caller` as a command (a zero leftover is a valid no-op).
pub fn reconcile_command(
    request: pb::ReconcileRequest,
    caller: Principal,
) -> Result<Command, InvalidField> {
    Ok(Command::Reconcile {
        key: key(&request.key)?,
        region: region(&request.region)?,
        leftover: request.leftover,
        window_start_ms: request.window_start_ms,
        request_id: optional_request_id(request.request_id)?,
        caller,
    })
}

/// A pool grant request of `caller` as a command: `region_weight ≥ 1`,
/// `want_total ≥ 1`. Its demand report is read by [`tenant_demands`].
pub fn pool_grant_command(
    request: pb::PoolGrantRequest,
    caller: Principal,
) -> Result<Command, InvalidField> {
    if request.region_weight == 0 {
        return Err(InvalidField::new(
            "region_weight",
            "region_weight must be at least 1",
        ));
    }
    if request.want_total == 0 {
        return Err(InvalidField::new(
            "want_total",
            "want_total must be greater than 0",
        ));
    }
    Ok(Command::PoolGrant {
        key: key(&request.key)?,
        region: region(&request.region)?,
        region_weight: request.region_weight,
        want_total: request.want_total,
        request_id: optional_request_id(request.request_id)?,
        caller,
    })
}

/// The join of `key`'s next window a pool call of `region` by `caller`
/// carries, as a command (`region_weight` and `want_total` at least 1).
/// Errors name the field `join_next`.
pub fn join_next_command(
    join: pb::NextWindowJoin,
    key: Key,
    region: RegionId,
    caller: Principal,
) -> Result<Command, InvalidField> {
    if join.region_weight == 0 {
        return Err(InvalidField::new(
            "join_next",
            "join_next.region_weight must be at least 1",
        ));
    }
    if join.want_total == 0 {
        return Err(InvalidField::new(
            "join_next",
            "join_next.want_total must be greater than 0",
        ));
    }
    let request_id = optional_request_id(join.request_id)
        .map_err(|e| InvalidField::new("join_next", format!("join_next.request_id: {e}")))?;
    Ok(Command::PoolJoinNext {
        key,
        region,
        region_weight: join.region_weight,
        want_total: join.want_total,
        window_start_ms: join.window_start_ms,
        retire: join.retire,
        request_id,
        caller,
    })
}

/// A pool release request of `caller` as a command: `keep_total ≤ from_total`.
pub fn pool_release_command(
    request: pb::PoolReleaseRequest,
    caller: Principal,
) -> Result<Command, InvalidField> {
    if request.keep_total > request.from_total {
        return Err(InvalidField::new(
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
        request_id: optional_request_id(request.request_id)?,
        caller,
    })
}

/// The holder a pool call names (`PoolGrantRequest.holder`,
/// `PoolReleaseRequest.holder`): `None` when empty (the region's anonymous
/// holder), else 1..=128 bytes.
pub fn pool_holder(raw: &str) -> Result<Option<ClientId>, InvalidField> {
    optional_name("holder", raw)
}

/// The node a pool call names (`PoolGrantRequest.node`,
/// `PoolReleaseRequest.node`): absent when empty, 1..=128 bytes.
pub fn pool_node(raw: &str) -> Result<Option<ClientId>, InvalidField> {
    optional_name("node", raw)
}

fn optional_name(field: &'static str, raw: &str) -> Result<Option<ClientId>, InvalidField> {
    if raw.is_empty() {
        return Ok(None);
    }
    ClientId::new(raw)
        .map(Some)
        .map_err(|e| InvalidField::new(field, e.to_string()))
}

/// The key of a window read.
pub fn window_key(request: &pb::GetWindowRequest) -> Result<Key, InvalidField> {
    key(&request.key)
}

/// The demand report a join ahead carries (`NextWindowJoin.tenant_demands`,
/// read like [`tenant_demands`]); a bad one is the join's fault
/// (`join_next`).
pub fn join_next_demands(join: &pb::NextWindowJoin) -> Result<Vec<(TenantId, u64)>, InvalidField> {
    tenant_demands(&join.tenant_demands).map_err(|e| {
        InvalidField::new(
            "join_next",
            format!("join_next.tenant_demands: {}", e.message()),
        )
    })
}

/// A demand report (a pool grant's or answer's `tenant_demands`): at most
/// [`MAX_REPORTED_TENANTS`] valid, distinct tenants, in their order.
pub fn tenant_demands(raw: &[pb::TenantDemand]) -> Result<Vec<(TenantId, u64)>, InvalidField> {
    if raw.len() > MAX_REPORTED_TENANTS {
        return Err(InvalidField::new(
            "tenant_demands",
            format!("at most {MAX_REPORTED_TENANTS} tenant demands per request"),
        ));
    }
    let mut seen = BTreeSet::new();
    raw.iter()
        .map(|d| {
            let tenant = TenantId::new(d.tenant.clone())
                .map_err(|e| InvalidField::new("tenant_demands", format!("tenant: {e}")))?;
            if !seen.insert(tenant.clone()) {
                return Err(InvalidField::new(
                    "tenant_demands",
                    format!("tenant {:?} reported twice", d.tenant),
                ));
            }
            Ok((tenant, d.demand))
        })
        .collect()
}

/// Tenants' demands on the wire, in their order.
pub fn tenant_demands_to_wire(demands: &[(TenantId, u64)]) -> Vec<pb::TenantDemand> {
    demands
        .iter()
        .map(|(tenant, demand)| pb::TenantDemand {
            tenant: tenant.as_str().to_string(),
            demand: *demand,
        })
        .collect()
}

impl From<&LeaseGrant> for pb::LeaseResponse {
    /// A lease grant on the wire, with its relative lifetime
    /// (`window_end_ms - coordinator_now_ms`, at least 0).
    fn from(grant: &LeaseGrant) -> Self {
        pb::LeaseResponse {
            granted: grant.granted,
            limit: grant.limit,
            window_start_ms: grant.window_start_ms,
            window_end_ms: grant.window_end_ms,
            coordinator_now_ms: grant.coordinator_now_ms,
            remaining_lifetime_ms: grant.window_end_ms.saturating_sub(grant.coordinator_now_ms),
        }
    }
}

impl From<&pb::LeaseResponse> for LeaseGrant {
    /// The grant a lease answer carries (its relative lifetime is derived
    /// from the window end and the coordinator's clock, so it is not kept).
    fn from(response: &pb::LeaseResponse) -> Self {
        LeaseGrant {
            granted: response.granted,
            limit: response.limit,
            window_start_ms: response.window_start_ms,
            window_end_ms: response.window_end_ms,
            coordinator_now_ms: response.coordinator_now_ms,
        }
    }
}

impl From<&PoolGrantOutcome> for pb::PoolGrantResponse {
    /// A pool grant on the wire, with its relative lifetime; what the
    /// outcome does not carry is left empty for the server to add from its
    /// state (the tenants' demand totals, the region's standing).
    fn from(grant: &PoolGrantOutcome) -> Self {
        pb::PoolGrantResponse {
            granted_total: grant.granted_total,
            granted_increment: grant.granted_increment,
            limit: grant.limit,
            window_start_ms: grant.window_start_ms,
            window_end_ms: grant.window_end_ms,
            coordinator_now_ms: grant.coordinator_now_ms,
            remaining_lifetime_ms: grant.window_end_ms.saturating_sub(grant.coordinator_now_ms),
            ..Default::default()
        }
    }
}

impl From<&pb::PoolGrantResponse> for PoolGrantOutcome {
    /// The region's total and the increment a pool grant answer carries.
    fn from(response: &pb::PoolGrantResponse) -> Self {
        PoolGrantOutcome {
            granted_total: response.granted_total,
            granted_increment: response.granted_increment,
            limit: response.limit,
            window_start_ms: response.window_start_ms,
            window_end_ms: response.window_end_ms,
            coordinator_now_ms: response.coordinator_now_ms,
        }
    }
}

impl From<ReconcileDisposition> for pb::ReconcileDisposition {
    fn from(disposition: ReconcileDisposition) -> Self {
        match disposition {
            ReconcileDisposition::Credited => pb::ReconcileDisposition::Credited,
            ReconcileDisposition::WindowEnded => pb::ReconcileDisposition::WindowEnded,
            ReconcileDisposition::Duplicate => pb::ReconcileDisposition::Duplicate,
        }
    }
}

impl From<&ReconcileOutcome> for pb::ReconcileResponse {
    /// A reconcile outcome on the wire.
    fn from(outcome: &ReconcileOutcome) -> Self {
        pb::ReconcileResponse {
            credited: outcome.credited,
            disposition: pb::ReconcileDisposition::from(outcome.disposition) as i32,
        }
    }
}

impl TryFrom<&pb::ReconcileResponse> for ReconcileOutcome {
    type Error = InvalidField;

    /// A reconcile answer; an unspecified or unknown disposition names
    /// the field `disposition`.
    fn try_from(response: &pb::ReconcileResponse) -> Result<Self, Self::Error> {
        let disposition = match pb::ReconcileDisposition::try_from(response.disposition) {
            Ok(pb::ReconcileDisposition::Credited) => ReconcileDisposition::Credited,
            Ok(pb::ReconcileDisposition::WindowEnded) => ReconcileDisposition::WindowEnded,
            Ok(pb::ReconcileDisposition::Duplicate) => ReconcileDisposition::Duplicate,
            Ok(pb::ReconcileDisposition::Unspecified) | Err(_) => {
                return Err(InvalidField::new(
                    "disposition",
                    format!("unknown reconcile disposition {}", response.disposition),
                ))
            }
        };
        Ok(ReconcileOutcome {
            credited: response.credited,
            disposition,
        })
    }
}

impl From<PoolReleaseDisposition> for pb::PoolReleaseDisposition {
    fn from(disposition: PoolReleaseDisposition) -> Self {
        match disposition {
            PoolReleaseDisposition::Released => pb::PoolReleaseDisposition::Released,
            PoolReleaseDisposition::WindowEnded => pb::PoolReleaseDisposition::WindowEnded,
            PoolReleaseDisposition::StaleTotal => pb::PoolReleaseDisposition::StaleTotal,
        }
    }
}

impl From<&PoolReleaseOutcome> for pb::PoolReleaseResponse {
    /// A pool release outcome on the wire.
    fn from(outcome: &PoolReleaseOutcome) -> Self {
        pb::PoolReleaseResponse {
            disposition: pb::PoolReleaseDisposition::from(outcome.disposition) as i32,
            released: outcome.released,
            granted_total: outcome.granted_total,
            window_start_ms: outcome.window_start_ms,
            window_end_ms: outcome.window_end_ms,
            ..Default::default()
        }
    }
}

impl TryFrom<&pb::PoolReleaseResponse> for PoolReleaseOutcome {
    type Error = InvalidField;

    /// A pool release answer; an unspecified or unknown disposition names
    /// the field `disposition`.
    fn try_from(response: &pb::PoolReleaseResponse) -> Result<Self, Self::Error> {
        let disposition = match pb::PoolReleaseDisposition::try_from(response.disposition) {
            Ok(pb::PoolReleaseDisposition::Released) => PoolReleaseDisposition::Released,
            Ok(pb::PoolReleaseDisposition::WindowEnded) => PoolReleaseDisposition::WindowEnded,
            Ok(pb::PoolReleaseDisposition::StaleTotal) => PoolReleaseDisposition::StaleTotal,
            Ok(pb::PoolReleaseDisposition::Unspecified) | Err(_) => {
                return Err(InvalidField::new(
                    "disposition",
                    format!("unknown pool release disposition {}", response.disposition),
                ))
            }
        };
        Ok(PoolReleaseOutcome {
            disposition,
            released: response.released,
            granted_total: response.granted_total,
            window_start_ms: response.window_start_ms,
            window_end_ms: response.window_end_ms,
        })
    }
}

/// `key`'s window view on the wire.
pub fn window_response(key: &Key, view: &WindowView) -> pb::GetWindowResponse {
    pb::GetWindowResponse {
        key: key.to_string(),
        policy: Some(pb::Policy::from(&view.policy)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::strategies::{
        assert_refusal_names_the_field, identifier, valid_identifier, valid_request_id,
        valid_tenant,
    };
    use leasehold_core::coordinator::RegionView;
    use leasehold_core::ids::{
        MAX_CLIENT_ID_BYTES, MAX_KEY_BYTES, MAX_REGION_BYTES, MAX_TENANT_BYTES,
    };
    use leasehold_core::policy::{OutagePolicy, Policy, PolicyKind};
    use leasehold_core::shadow::ShadowTally;
    use proptest::prelude::*;

    fn wire_request_id() -> impl Strategy<Value = pb::RequestId> {
        (identifier(MAX_CLIENT_ID_BYTES), any::<u64>())
            .prop_map(|(client_id, seq)| pb::RequestId { client_id, seq })
    }

    /// Distinct valid tenants with demands, at most the report's bound.
    fn valid_demands() -> impl Strategy<Value = Vec<(TenantId, u64)>> {
        proptest::collection::btree_map(valid_tenant(), any::<u64>(), 0..=MAX_REPORTED_TENANTS)
            .prop_map(|demands| demands.into_iter().collect())
    }

    proptest! {
        /// core → wire → core is the identity for every request id.
        #[test]
        fn every_request_id_round_trips(id in valid_request_id()) {
            let wire = pb::RequestId::from(&id);
            prop_assert_eq!(RequestId::try_from(wire.clone()), Ok(id.clone()));
            prop_assert_eq!(optional_request_id(Some(wire)), Ok(Some(id)));
        }

        /// A wire request id converts exactly when its client id has
        /// 1..=128 bytes; otherwise `request_id.client_id` is named.
        #[test]
        fn a_wire_request_id_converts_or_names_its_client_id(raw in wire_request_id()) {
            let valid = !raw.client_id.is_empty() && raw.client_id.len() <= MAX_CLIENT_ID_BYTES;
            match RequestId::try_from(raw.clone()) {
                Ok(id) => {
                    prop_assert!(valid);
                    prop_assert_eq!(pb::RequestId::from(id), raw);
                }
                Err(error) => {
                    prop_assert!(!valid);
                    prop_assert_eq!(error.field(), "request_id.client_id");
                    assert_refusal_names_the_field(&error)?;
                }
            }
        }

        /// Distinct valid tenants, at most the bound: wire → core is the
        /// inverse of core → wire, order kept.
        #[test]
        fn every_valid_demand_report_round_trips(demands in valid_demands()) {
            let wire = tenant_demands_to_wire(&demands);
            prop_assert_eq!(tenant_demands(&wire), Ok(demands));
        }

        /// One entry past the bound is refused, naming `tenant_demands`.
        #[test]
        fn too_many_tenant_demands_are_refused(extra in 1usize..=8) {
            let wire: Vec<pb::TenantDemand> = (0..MAX_REPORTED_TENANTS + extra)
                .map(|n| pb::TenantDemand { tenant: format!("t{n}"), demand: 1 })
                .collect();
            let error = tenant_demands(&wire).unwrap_err();
            prop_assert_eq!(error.field(), "tenant_demands");
            prop_assert!(error.message().contains("at most 64"), "{}", error.message());
            assert_refusal_names_the_field(&error)?;
        }

        /// A tenant reported twice anywhere in a report is refused, naming
        /// `tenant_demands` and the tenant.
        #[test]
        fn a_tenant_reported_twice_is_refused(
            demands in valid_demands().prop_filter("some tenant", |d| !d.is_empty()),
            pick in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
        ) {
            prop_assume!(demands.len() < MAX_REPORTED_TENANTS);
            let mut wire = tenant_demands_to_wire(&demands);
            let twice = wire[pick.index(wire.len())].clone();
            wire.insert(at.index(wire.len() + 1), twice.clone());
            let error = tenant_demands(&wire).unwrap_err();
            prop_assert_eq!(error.field(), "tenant_demands");
            prop_assert_eq!(
                error.message(),
                format!("tenant {:?} reported twice", twice.tenant)
            );
            assert_refusal_names_the_field(&error)?;
        }

        /// An empty or too long tenant anywhere in a report is refused,
        /// naming `tenant_demands`.
        #[test]
        fn an_invalid_tenant_is_refused(
            demands in valid_demands(),
            bad in prop_oneof![Just(String::new()), Just("t".repeat(MAX_TENANT_BYTES + 1))],
            at in any::<prop::sample::Index>(),
        ) {
            prop_assume!(demands.len() < MAX_REPORTED_TENANTS);
            let mut wire = tenant_demands_to_wire(&demands);
            wire.insert(at.index(wire.len() + 1), pb::TenantDemand { tenant: bad, demand: 1 });
            let error = tenant_demands(&wire).unwrap_err();
            prop_assert_eq!(error.field(), "tenant_demands");
            prop_assert!(error.message().starts_with("tenant: "), "{}", error.message());
            assert_refusal_names_the_field(&error)?;
        }

        /// core → wire → core: a lease request reads back as the lease it
        /// was written for.
        #[test]
        fn every_valid_lease_request_round_trips(
            key in valid_identifier(MAX_KEY_BYTES),
            region in valid_identifier(MAX_REGION_BYTES),
            tokens in 1u64..,
            request_id in proptest::option::of(valid_request_id()),
        ) {
            let (key, region) = (Key::new(key).unwrap(), RegionId::new(region).unwrap());
            let wire = lease_request(&key, &region, tokens, request_id.as_ref());
            let caller = Principal::Region(region.clone());
            prop_assert_eq!(
                lease_command(wire, caller.clone()),
                Ok(Command::Lease { key, region, tokens, request_id, caller })
            );
        }

        /// Any wire lease request becomes the lease it spells out, or names
        /// a field that is invalid in it.
        #[test]
        fn a_lease_request_converts_or_names_an_invalid_field(
            key in identifier(MAX_KEY_BYTES),
            region in identifier(MAX_REGION_BYTES),
            tokens in prop_oneof![Just(0u64), any::<u64>()],
            request_id in proptest::option::of(wire_request_id()),
        ) {
            let request = pb::LeaseRequest {
                key: key.clone(),
                region: region.clone(),
                tokens,
                request_id: request_id.clone(),
            };
            let key_ok = Key::new(key.clone()).is_ok();
            let region_ok = RegionId::new(region.clone()).is_ok();
            let id_ok = optional_request_id(request_id.clone()).is_ok();
            match lease_command(request, Principal::Anonymous) {
                Ok(command) => {
                    prop_assert!(key_ok && region_ok && id_ok && tokens > 0);
                    prop_assert_eq!(command, Command::Lease {
                        key: Key::new(key).unwrap(),
                        region: RegionId::new(region).unwrap(),
                        tokens,
                        request_id: optional_request_id(request_id).unwrap(),
                        caller: Principal::Anonymous,
                    });
                }
                Err(error) => {
                    let invalid = match error.field() {
                        "key" => !key_ok,
                        "region" => !region_ok,
                        "tokens" => tokens == 0,
                        "request_id.client_id" => !id_ok,
                        _ => false,
                    };
                    prop_assert!(invalid, "{:?}", error);
                    assert_refusal_names_the_field(&error)?;
                }
            }
        }

        /// A pool grant converts exactly when its weight and wanted total
        /// are positive (for a valid key and region), naming the first
        /// that is not.
        #[test]
        fn a_pool_grant_needs_a_weight_and_a_wanted_total(
            region_weight in prop_oneof![Just(0u64), any::<u64>()],
            want_total in prop_oneof![Just(0u64), any::<u64>()],
        ) {
            let request = pb::PoolGrantRequest {
                key: "k".into(),
                region: "eu".into(),
                region_weight,
                want_total,
                ..Default::default()
            };
            match pool_grant_command(request, Principal::Anonymous) {
                Ok(command) => {
                    prop_assert!(region_weight > 0 && want_total > 0);
                    let is_pool_grant = matches!(
                        command,
                        Command::PoolGrant { region_weight: w, want_total: t, .. }
                            if w == region_weight && t == want_total
                    );
                    prop_assert!(is_pool_grant);
                }
                Err(error) if region_weight == 0 => prop_assert_eq!(error.field(), "region_weight"),
                Err(error) => {
                    prop_assert_eq!(want_total, 0);
                    prop_assert_eq!(error.field(), "want_total");
                }
            }
        }

        /// A pool call's holder reads as none when empty, as itself when it
        /// is a valid client id, and is refused (field `holder`) otherwise.
        #[test]
        fn a_pool_holder_is_none_a_client_id_or_refused(raw in ".{0,140}") {
            match pool_holder(&raw) {
                Ok(None) => prop_assert!(raw.is_empty()),
                Ok(Some(holder)) => prop_assert_eq!(holder.as_str(), raw.as_str()),
                Err(error) => {
                    prop_assert_eq!(error.field(), "holder");
                    prop_assert!(ClientId::new(raw.clone()).is_err());
                }
            }
        }

        /// A pool release converts exactly when it keeps at most its total.
        #[test]
        fn a_pool_release_keeps_at_most_its_total(from_total in any::<u64>(), keep_total in any::<u64>()) {
            let request = pb::PoolReleaseRequest {
                key: "k".into(),
                region: "eu".into(),
                from_total,
                keep_total,
                window_start_ms: 1_000,
                request_id: None,
                join_next: None,
                holder: String::new(),
                node: String::new(),
            };
            match pool_release_command(request, Principal::Anonymous) {
                Ok(command) => {
                    prop_assert!(keep_total <= from_total);
                    let kept = matches!(
                        command,
                        Command::PoolRelease { from_total: f, keep_total: k, window_start_ms: 1_000, .. }
                            if f == from_total && k == keep_total
                    );
                    prop_assert!(kept);
                }
                Err(error) => {
                    prop_assert!(keep_total > from_total);
                    prop_assert_eq!(error.field(), "keep_total");
                }
            }
        }

        /// A lease grant survives the wire, and its answer carries the
        /// lifetime left on the coordinator's clock.
        #[test]
        fn a_lease_grant_round_trips(
            granted in any::<u64>(),
            limit in any::<u64>(),
            window_start_ms in any::<u64>(),
            window_end_ms in any::<u64>(),
            coordinator_now_ms in any::<u64>(),
        ) {
            let grant = LeaseGrant { granted, limit, window_start_ms, window_end_ms, coordinator_now_ms };
            let wire = pb::LeaseResponse::from(&grant);
            prop_assert_eq!(wire.remaining_lifetime_ms, window_end_ms.saturating_sub(coordinator_now_ms));
            prop_assert_eq!(LeaseGrant::from(&wire), grant);
        }

        /// A pool grant survives the wire, with its lifetime and no demand totals.
        #[test]
        fn a_pool_grant_round_trips(
            granted_total in any::<u64>(),
            granted_increment in any::<u64>(),
            limit in any::<u64>(),
            window_start_ms in any::<u64>(),
            window_end_ms in any::<u64>(),
            coordinator_now_ms in any::<u64>(),
        ) {
            let grant = PoolGrantOutcome { granted_total, granted_increment, limit, window_start_ms, window_end_ms, coordinator_now_ms };
            let wire = pb::PoolGrantResponse::from(&grant);
            prop_assert_eq!(wire.remaining_lifetime_ms, window_end_ms.saturating_sub(coordinator_now_ms));
            prop_assert!(wire.tenant_demands.is_empty());
            prop_assert_eq!(PoolGrantOutcome::from(&wire), grant);
        }

        /// Every reconcile outcome survives the wire; any other disposition
        /// number names `disposition`.
        #[test]
        fn a_reconcile_outcome_round_trips(
            credited in any::<u64>(),
            disposition in prop_oneof![
                Just(ReconcileDisposition::Credited),
                Just(ReconcileDisposition::WindowEnded),
                Just(ReconcileDisposition::Duplicate),
            ],
            unknown in prop_oneof![Just(0i32), 4i32.., ..0i32],
        ) {
            let outcome = ReconcileOutcome { credited, disposition };
            let wire = pb::ReconcileResponse::from(&outcome);
            prop_assert_eq!(ReconcileOutcome::try_from(&wire), Ok(outcome));
            let garbled = pb::ReconcileResponse { disposition: unknown, ..wire };
            let error = ReconcileOutcome::try_from(&garbled).unwrap_err();
            prop_assert_eq!(error.field(), "disposition");
        }

        /// Every pool release outcome survives the wire; any other
        /// disposition number names `disposition`.
        #[test]
        fn a_pool_release_outcome_round_trips(
            disposition in prop_oneof![
                Just(PoolReleaseDisposition::Released),
                Just(PoolReleaseDisposition::WindowEnded),
                Just(PoolReleaseDisposition::StaleTotal),
            ],
            released in any::<u64>(),
            granted_total in any::<u64>(),
            window_start_ms in any::<u64>(),
            window_end_ms in any::<u64>(),
            unknown in prop_oneof![Just(0i32), 4i32.., ..0i32],
        ) {
            let outcome = PoolReleaseOutcome { disposition, released, granted_total, window_start_ms, window_end_ms };
            let wire = pb::PoolReleaseResponse::from(&outcome);
            prop_assert_eq!(PoolReleaseOutcome::try_from(&wire), Ok(outcome));
            let garbled = pb::PoolReleaseResponse { disposition: unknown, ..wire };
            let error = PoolReleaseOutcome::try_from(&garbled).unwrap_err();
            prop_assert_eq!(error.field(), "disposition");
        }
    }

    fn lease(key: &str, region: &str, tokens: u64) -> pb::LeaseRequest {
        pb::LeaseRequest {
            key: key.into(),
            region: region.into(),
            tokens,
            request_id: None,
        }
    }

    #[test]
    fn each_invalid_lease_field_is_named() {
        let long_key = "k".repeat(MAX_KEY_BYTES + 1);
        let long_region = "r".repeat(MAX_REGION_BYTES + 1);
        let bad_id = pb::LeaseRequest {
            request_id: Some(pb::RequestId {
                client_id: String::new(),
                seq: 1,
            }),
            ..lease("k", "eu", 1)
        };
        for (request, field) in [
            (lease("", "eu", 1), "key"),
            (lease(&long_key, "eu", 1), "key"),
            (lease("k", "", 1), "region"),
            (lease("k", &long_region, 1), "region"),
            (lease("k", "eu", 0), "tokens"),
            (bad_id, "request_id.client_id"),
        ] {
            let error = lease_command(request, Principal::Anonymous).unwrap_err();
            assert_eq!(error.field(), field, "{error:?}");
        }
        assert!(lease_command(lease("k", "eu", 1), Principal::Anonymous).is_ok());
    }

    #[test]
    fn a_reconcile_request_becomes_its_command_for_the_caller() {
        let caller = Principal::Region(RegionId::new("eu").unwrap());
        let request = pb::ReconcileRequest {
            key: "k".into(),
            region: "eu".into(),
            leftover: 0,
            window_start_ms: 60_000,
            request_id: Some(pb::RequestId {
                client_id: "c".into(),
                seq: 7,
            }),
        };
        assert_eq!(
            reconcile_command(request.clone(), caller.clone()),
            Ok(Command::Reconcile {
                key: Key::new("k").unwrap(),
                region: RegionId::new("eu").unwrap(),
                leftover: 0,
                window_start_ms: 60_000,
                request_id: Some(RequestId {
                    client: ClientId::new("c").unwrap(),
                    seq: 7,
                }),
                caller: caller.clone(),
            })
        );
        let error = reconcile_command(
            pb::ReconcileRequest {
                region: String::new(),
                ..request
            },
            caller,
        )
        .unwrap_err();
        assert_eq!(error.field(), "region");
    }

    #[test]
    fn a_window_view_is_answered_field_by_field() {
        let policy = Policy {
            prefix: "p/".into(),
            limit: 100,
            window_ms: 1_000,
            kind: PolicyKind::Fair,
            outage: OutagePolicy::FailClosed,
            shadow: true,
        };
        let view = WindowView {
            policy: policy.clone(),
            limit: 100,
            window_start_ms: 5_000,
            window_end_ms: 6_000,
            granted: 70,
            returned: 5,
            regions: vec![RegionView {
                region: "eu".into(),
                granted: 70,
                returned: 5,
                pool_weight: 3,
            }],
            shadow: ShadowTally {
                would_deny_tokens: 9,
                would_deny_requests: 2,
            },
            coordinator_now_ms: 5_500,
        };
        let key = Key::new("p/a").unwrap();
        assert_eq!(
            window_response(&key, &view),
            pb::GetWindowResponse {
                key: "p/a".into(),
                policy: Some(pb::Policy::from(&policy)),
                limit: 100,
                window_start_ms: 5_000,
                window_end_ms: 6_000,
                granted: 70,
                returned: 5,
                regions: vec![pb::RegionUsage {
                    region: "eu".into(),
                    granted: 70,
                    returned: 5,
                    pool_weight: 3,
                }],
                coordinator_now_ms: 5_500,
                would_deny_tokens: 9,
                would_deny_requests: 2,
            }
        );
        assert_eq!(
            window_key(&pb::GetWindowRequest { key: String::new() })
                .unwrap_err()
                .field(),
            "key"
        );
    }
}
