//! Unified admission at the service edge, the pure half: the state machines
//! of the three axes a request must clear, and the rules that join them.
//!
//! # Layout
//! - [`gcra`]: the generic cell rate algorithm (a rate axis).
//! - [`token_bucket`]: the token bucket (a rate or cost axis).
//! - [`concurrency`]: the adaptive in-flight ceiling (AIMD or gradient).
//! - [`axis`]: the three axes, their evaluation order, the binding axis of
//!   a denial and the `Retry-After` of the dominant wait.
//! - [`bid_price`]: bid-price (joint-LP) admission: the fluid-LP duals and
//!   the static or sample-then-price filter.
//! - [`simulation`]: seeded synthetic workloads and the regret benchmarks
//!   that measure the bid-price filter against marginal-AND.
//!
//! Time comes in as epoch milliseconds; nothing here reads a clock. Every
//! state machine answers with a [`Decision`](crate::decision::Decision), so
//! the answers of the axes reduce with
//! [`combine`](crate::decision::combine).

pub mod axis;
pub mod bid_price;
pub mod concurrency;
pub mod gcra;
pub mod simulation;
pub mod token_bucket;

/// Why an admission configuration or input was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdmissionConfigError {
    /// A limit, period, rate or budget was zero, negative or not finite.
    #[error("{0} must be a finite number greater than 0")]
    NotPositive(&'static str),
    /// The concurrency bounds are empty (`min_limit > max_limit`) or start at 0.
    #[error("limits must satisfy 1 <= min_limit <= initial_limit <= max_limit, got {min_limit}..={max_limit} starting at {initial_limit}")]
    LimitBounds {
        /// The lower bound.
        min_limit: u64,
        /// The starting limit.
        initial_limit: u64,
        /// The upper bound.
        max_limit: u64,
    },
    /// A ratio that must lie in an open or half-open interval does not.
    #[error("{name} must lie in {range}, got {value}")]
    OutOfRange {
        /// What was out of range.
        name: &'static str,
        /// The accepted range, in words.
        range: &'static str,
        /// The value given.
        value: f64,
    },
    /// A workload model has no request types, or a type is ill-formed.
    #[error("invalid workload: {0}")]
    Workload(String),
}
