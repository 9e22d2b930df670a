//! The errors of the admission gate. A denial is never an error; these
//! mean the question could not be asked or answered.

use leasehold_core::admission::AdmissionConfigError;

use crate::error::ClientError;

/// Why an admission gate could not be built or could not decide.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionError {
    /// The gate's configuration was refused.
    #[error("invalid admission configuration: {0}")]
    Config(#[from] AdmissionConfigError),
    /// The gate has no axis at all.
    #[error("an admission gate needs at least one axis")]
    NoAxis,
    /// A bid-price policy was configured without a cost axis.
    #[error("a bid-price policy needs a cost axis")]
    PolicyNeedsCostAxis,
    /// A request's cost was 0.
    #[error("cost must be at least 1")]
    ZeroCost,
    /// A request costs more than an in-process axis can ever hold, so it
    /// would be denied forever.
    #[error("cost {cost} exceeds the {axis} axis capacity {capacity}: it can never be admitted")]
    CostExceedsCapacity {
        /// The axis whose capacity is too small.
        axis: &'static str,
        /// The request's cost.
        cost: u64,
        /// The capacity.
        capacity: u64,
    },
    /// A request's value was NaN, infinite or negative.
    #[error("value must be a finite number >= 0, got {0}")]
    InvalidValue(f64),
    /// The key was empty.
    #[error("key must not be empty")]
    EmptyKey,
    /// The key or the tenant holds a NUL character, or the tenant is
    /// empty.
    #[error("the {0} must not be empty or hold a NUL character")]
    InvalidName(&'static str),
    /// A request named a tenant, but the cost axis is one limiter's
    /// budget (`CostAxis::Global`): use `CostAxis::GlobalPerTenant`.
    #[error(
        "a request naming a tenant needs CostAxis::GlobalPerTenant (or an in-process cost axis)"
    )]
    TenantNeedsPerTenantCost,
    /// `admit_sync` was called on a gate with a remote axis.
    #[error("admit_sync needs every axis in-process; the cost axis is remote (use admit)")]
    NotInProcess,
    /// The remote cost axis could not answer (the caller chooses to fail
    /// open or closed); every slot and unit taken upstream was given back.
    #[error("cost axis: {0}")]
    Backend(#[from] ClientError),
}
