//! Unified admission at the service edge: one [`Decision`](crate::Decision)
//! across **concurrency** (a process-wide adaptive in-flight ceiling),
//! **rate** (per-key GCRA or token bucket) and **cost** (a per-key
//! in-process limit, or the global budget through a [`Limiter`](crate::Limiter)).
//!
//! ```
//! use leasehold_client::admission::{AdmissionGate, AdmitRequest, CostAxis, InProcessLimit};
//! use leasehold_client::admission::ConcurrencyParams;
//!
//! let gate = AdmissionGate::builder()
//!     .concurrency(ConcurrencyParams::aimd(4, 32))
//!     .rate(InProcessLimit::gcra(60, 60_000))
//!     .cost(CostAxis::InProcess(InProcessLimit::token_bucket(100_000, 1_667)))
//!     .build()?;
//! let outcome = gate.admit_sync(AdmitRequest::new("user:42", 1_000))?;
//! assert!(outcome.decision.allowed);
//! // … serve the request, then:
//! outcome.release.release(false);
//! # Ok::<(), leasehold_client::admission::AdmissionError>(())
//! ```
//!
//! The pure state machines and the rules (evaluation order, binding axis,
//! `Retry-After`) live in `leasehold_core::admission`; this module adds the
//! per-key tables, the clock, the remote cost axis and the counters. See
//! `docs/admission.md`.
//!
//! # Layout
//! - [`gate`] — [`AdmissionGate`], its builder and the cost axis.
//! - [`request`] — [`AdmitRequest`], [`AdmitOutcome`], [`DeniedByAxis`].
//! - [`in_process`] — per-key in-process limits ([`InProcessLimit`]).
//! - [`layer`] — [`AdmissionLayer`]: the gate as a tower layer for HTTP
//!   services (axum, hyper, tonic), `429` with `Retry-After`.
//! - [`release`] — the concurrency slot's [`Release`] handle.
//! - `concurrency` — the concurrency axis the gate takes slots from and
//!   each [`Release`] gives its slot back to.
//! - [`error`] — [`AdmissionError`].

mod concurrency;
pub mod error;
pub mod gate;
pub mod in_process;
pub mod layer;
pub mod release;
pub mod request;

pub use error::AdmissionError;
pub use gate::{AdmissionGate, AdmissionGateBuilder, CostAxis};
pub use in_process::InProcessLimit;
pub use layer::{AdmissionLayer, AdmissionLayerStats, AdmissionService, Admit, WhenUnanswered};
pub use leasehold_core::admission::axis::{Axis, AxisDecisions};
pub use leasehold_core::admission::bid_price::{BidPriceFilter, Duals, RequestType, Workload};
pub use leasehold_core::admission::concurrency::{ConcurrencyParams, WaitBasis};
pub use leasehold_core::admission::gcra::GcraParams;
pub use leasehold_core::admission::token_bucket::TokenBucketParams;
pub use release::{Release, ReleaseOutcome};
pub use request::{AdmitOutcome, AdmitRequest, DeniedByAxis};

#[cfg(test)]
mod tests;
