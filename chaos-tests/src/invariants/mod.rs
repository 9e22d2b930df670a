//! The promises of Leasehold as checks over a recorded [`History`], one
//! file each. Every checker returns the violations it found (empty: holds)
//! and is unit-tested on synthetic histories that break it.

mod credits_die_with_window;
mod delta;
mod exactly_once;
mod hostile;
mod liveness;
mod no_forgotten_grant;
mod utilisation;

pub use credits_die_with_window::check_credits_die_with_window;
pub use delta::{check_delta, max_ratio};
pub use exactly_once::check_exactly_once;
pub use hostile::{check_hostile, hostile_probes_checked};
pub use liveness::check_liveness;
pub use no_forgotten_grant::check_no_forgotten_grant;
pub use utilisation::utilisation;

use crate::history::History;

/// One broken promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant.
    pub invariant: &'static str,
    /// What was seen.
    pub detail: String,
}

/// Runs every safety and liveness check (utilisation is reported, not checked).
pub fn check_all(history: &History, liveness_bound_ms: u64) -> Vec<Violation> {
    let mut out = check_delta(history);
    out.extend(check_credits_die_with_window(history));
    out.extend(check_no_forgotten_grant(history));
    out.extend(check_exactly_once(history));
    out.extend(check_hostile(history));
    out.extend(check_liveness(history, liveness_bound_ms));
    out
}
