//! Proptest strategies the conversions' tests share: identifiers at the
//! edges of their bounds, valid request ids and tenants, and the check that
//! a refusal names its field.

use leasehold_core::ids::{ClientId, RequestId, TenantId, MAX_CLIENT_ID_BYTES, MAX_TENANT_BYTES};
use proptest::prelude::*;
use tonic::{Code, Status};

use super::InvalidField;
use crate::refusal::{self, Reason};

/// An identifier of `0..=max + 1` bytes, the edges likelier: valid
/// exactly when its length is in `1..=max`.
pub fn identifier(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9/_-]{1,12}",
        Just("x".repeat(max)),
        Just("x".repeat(max + 1)),
        (1..=max + 1).prop_map(|n| "y".repeat(n)),
    ]
}

/// An identifier of `1..=max` bytes.
pub fn valid_identifier(max: usize) -> impl Strategy<Value = String> {
    identifier(max).prop_filter("1..=max bytes", move |s| !s.is_empty() && s.len() <= max)
}

/// A request id with a valid client id.
pub fn valid_request_id() -> impl Strategy<Value = RequestId> {
    (valid_identifier(MAX_CLIENT_ID_BYTES), any::<u64>()).prop_map(|(client, seq)| RequestId {
        client: ClientId::new(client).unwrap(),
        seq,
    })
}

/// A valid tenant.
pub fn valid_tenant() -> impl Strategy<Value = TenantId> {
    valid_identifier(MAX_TENANT_BYTES).prop_map(|t| TenantId::new(t).unwrap())
}

/// The refusal a server answers for `error` names its field.
pub fn assert_refusal_names_the_field(error: &InvalidField) -> Result<(), TestCaseError> {
    let status = Status::from(error.clone());
    prop_assert_eq!(status.code(), Code::InvalidArgument);
    prop_assert_eq!(refusal::reason_of(&status), Some(Reason::InvalidField));
    let field = refusal::detail(&status, refusal::FIELD);
    prop_assert_eq!(field.as_deref(), Some(error.field()));
    Ok(())
}
