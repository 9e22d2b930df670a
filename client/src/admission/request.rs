//! What one admission asks and what it answers: [`AdmitRequest`],
//! [`AdmitOutcome`] and the per-axis denial counts [`DeniedByAxis`].

use leasehold_core::admission::axis::{retry_after_secs, Axis};
use leasehold_core::admission::concurrency::WaitBasis;
use leasehold_core::decision::Decision;

use super::release::Release;

/// One request to admit.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct AdmitRequest<'a> {
    /// Whose rate and cost budgets it spends (a user, an API key, a model).
    pub key: &'a str,
    /// The tenant it acts for: its in-process rate and cost are kept per
    /// tenant and key, and a `CostAxis::GlobalPerTenant` charges the global
    /// budget to it (`None`: the key alone, the default tenant).
    pub tenant: Option<&'a str>,
    /// Cost units it spends (tokens, bytes, …), at least 1.
    pub cost: u64,
    /// What admitting it is worth, for a bid-price policy (default 1).
    pub value: Option<f64>,
    /// How long it is expected to hold its concurrency slot, in ms, for a
    /// three-axis bid-price policy. Missing, negative or not finite: the
    /// policy adds no concurrency term (fail-open).
    pub hold_ms: Option<f64>,
}

impl<'a> AdmitRequest<'a> {
    /// A request of `cost` units on `key`.
    pub fn new(key: &'a str, cost: u64) -> Self {
        AdmitRequest {
            key,
            tenant: None,
            cost,
            value: None,
            hold_ms: None,
        }
    }

    /// For `tenant`.
    pub fn with_tenant(self, tenant: &'a str) -> Self {
        AdmitRequest {
            tenant: Some(tenant),
            ..self
        }
    }

    /// With the value of admitting it.
    pub fn with_value(self, value: f64) -> Self {
        AdmitRequest {
            value: Some(value),
            ..self
        }
    }

    /// With its expected hold time in milliseconds.
    pub fn with_hold_ms(self, hold_ms: f64) -> Self {
        AdmitRequest {
            hold_ms: Some(hold_ms),
            ..self
        }
    }
}

/// The answer to one admission.
#[derive(Debug)]
#[non_exhaustive]
pub struct AdmitOutcome {
    /// The combined decision of every axis reached.
    pub decision: Decision,
    /// Frees the concurrency slot of an allowed admission (a no-op when
    /// denied).
    pub release: Release,
    /// The first denying axis in priority order (`None` when allowed, or
    /// when only the bid-price policy denied).
    pub binding_axis: Option<Axis>,
    /// How a concurrency denial's `retry_after_ms` was found: an estimate
    /// from the latencies seen, one resting on requests that have run past
    /// them, or the configured fallback before any request completed
    /// (no estimate). `None` unless the concurrency axis denied.
    pub slot_wait: Option<WaitBasis>,
    /// Whether the bid-price policy denied a request every axis reached
    /// had room for.
    pub policy_denied: bool,
    /// Whether that denial is because the request's value is below its
    /// bid price: no request like it is admitted at these prices, so
    /// waiting does not help (its `retry_after_ms` is still the policy's
    /// setting). `false` for a request on its price that was rationed (a
    /// later one like it may be admitted).
    pub priced_out: bool,
}

impl AdmitOutcome {
    /// The decision and the release handle.
    pub fn into_parts(self) -> (Decision, Release) {
        (self.decision, self.release)
    }

    /// The `Retry-After` header value in whole seconds (rounded up, at
    /// least 1) when denied; `None` when allowed.
    pub fn retry_after_secs(&self) -> Option<u64> {
        retry_after_secs(&self.decision)
    }
}

/// Denials counted per binding axis since the gate was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeniedByAxis {
    /// Denied because the in-flight ceiling was reached.
    pub concurrency: u64,
    /// Denied by the rate axis.
    pub rate: u64,
    /// Denied by the cost axis.
    pub cost: u64,
    /// Denied by the bid-price policy with every axis reached having room.
    pub policy: u64,
}

impl DeniedByAxis {
    /// The count for one axis.
    pub fn get(&self, axis: Axis) -> u64 {
        match axis {
            Axis::Concurrency => self.concurrency,
            Axis::Rate => self.rate,
            Axis::Cost => self.cost,
        }
    }
}
