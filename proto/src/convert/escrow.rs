//! Conversions of the Escrow service's requests: each request written from
//! core types (what a client sends), and what the escrow node reads back
//! from it — the tenant, and a return's claim — validated, the field at
//! fault named. The key and the request id are read as the Coordinator
//! service's are ([`super::coordinator::key`],
//! [`super::coordinator::optional_request_id`]).

use leasehold_core::escrow::ReturnClaim;
use leasehold_core::ids::{Key, RequestId, TenantId};

use super::InvalidField;
use crate::v1 as pb;

/// The `Acquire` of `tokens` on `key` by `tenant` (`None`: the key's
/// default tenant) declaring `weight` (0 means 1), under `request_id` if
/// any (then executed once per holder and seq).
pub fn acquire_request(
    key: &Key,
    tenant: Option<&TenantId>,
    weight: u64,
    tokens: u64,
    request_id: Option<&RequestId>,
) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.as_str().to_string(),
        tenant: tenant_to_wire(tenant),
        weight,
        tokens,
        request_id: request_id.map(pb::RequestId::from),
    }
}

/// The `Return` of `claim` on `key` by the holder `request_id` names: what
/// [`return_claim`] reads back.
pub fn return_request(key: &Key, claim: &ReturnClaim, request_id: &RequestId) -> pb::ReturnRequest {
    pb::ReturnRequest {
        key: key.as_str().to_string(),
        tenant: tenant_to_wire(claim.tenant.as_ref()),
        tokens: claim.tokens,
        window_start_ms: claim.window_start_ms,
        request_id: Some(pb::RequestId::from(request_id)),
    }
}

/// A request's `tenant`: empty is the key's default tenant (`None`).
pub fn tenant(raw: &str) -> Result<Option<TenantId>, InvalidField> {
    if raw.is_empty() {
        return Ok(None);
    }
    TenantId::new(raw)
        .map(Some)
        .map_err(|e| InvalidField::new("tenant", e.to_string()))
}

/// What a `Return` gives back: its tenant, window and tokens.
pub fn return_claim(request: &pb::ReturnRequest) -> Result<ReturnClaim, InvalidField> {
    Ok(ReturnClaim {
        tenant: tenant(&request.tenant)?,
        window_start_ms: request.window_start_ms,
        tokens: request.tokens,
    })
}

fn tenant_to_wire(tenant: Option<&TenantId>) -> String {
    tenant.map_or_else(String::new, |t| t.as_str().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::coordinator::{key, optional_request_id};
    use crate::convert::strategies::{
        assert_refusal_names_the_field, identifier, valid_identifier, valid_request_id,
        valid_tenant,
    };
    use leasehold_core::ids::{MAX_KEY_BYTES, MAX_TENANT_BYTES};
    use proptest::prelude::*;

    fn valid_key() -> impl Strategy<Value = Key> {
        valid_identifier(MAX_KEY_BYTES).prop_map(|k| Key::new(k).unwrap())
    }

    proptest! {
        /// core → wire → core: an acquisition reads back as the key,
        /// tenant, weight, tokens and request id it was written for, and a
        /// return as its key, claim and holder.
        #[test]
        fn every_escrow_request_round_trips(
            key_id in valid_key(),
            asker in proptest::option::of(valid_tenant()),
            (weight, window_start_ms, tokens) in any::<(u64, u64, u64)>(),
            request_id in valid_request_id(),
            with_id in any::<bool>(),
        ) {
            let acquire_id = with_id.then_some(&request_id);
            let wire = acquire_request(&key_id, asker.as_ref(), weight, tokens, acquire_id);
            prop_assert_eq!(key(&wire.key), Ok(key_id.clone()));
            prop_assert_eq!(tenant(&wire.tenant), Ok(asker.clone()));
            prop_assert_eq!((wire.weight, wire.tokens), (weight, tokens));
            prop_assert_eq!(optional_request_id(wire.request_id), Ok(acquire_id.cloned()));
            let claim = ReturnClaim { tenant: asker, window_start_ms, tokens };
            let wire = return_request(&key_id, &claim, &request_id);
            prop_assert_eq!(key(&wire.key), Ok(key_id));
            prop_assert_eq!(return_claim(&wire), Ok(claim));
            prop_assert_eq!(optional_request_id(wire.request_id), Ok(Some(request_id)));
        }

        /// A wire tenant reads as the default tenant when empty, as itself
        /// when it has at most 256 bytes, and names `tenant` otherwise.
        #[test]
        fn a_wire_tenant_converts_or_names_the_field(raw in identifier(MAX_TENANT_BYTES)) {
            match tenant(&raw) {
                Ok(None) => prop_assert!(raw.is_empty()),
                Ok(Some(read)) => prop_assert_eq!(read.as_str(), raw.as_str()),
                Err(error) => {
                    prop_assert!(raw.len() > MAX_TENANT_BYTES);
                    prop_assert_eq!(error.field(), "tenant");
                    assert_refusal_names_the_field(&error)?;
                }
            }
        }
    }
}
