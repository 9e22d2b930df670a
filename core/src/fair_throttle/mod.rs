//! Fair throttling of many anonymous callers in constant memory
//! (stochastic fair BLUE, after the FAIR design): in front of any resource,
//! requests of callers that keep exhausting it are throttled with a learnt
//! probability, so heavy hitters absorb the throttling while modest callers
//! keep getting through.
//!
//! A caller id is hashed once (Murmur3 x64-128, seeded) onto one cell per
//! level of a `levels × buckets` grid; each cell holds a probability and its
//! last update time. A request is throttled with the min (or mean) of its
//! cells' probabilities; an admitted request's outcome moves every one of its
//! cells: `−Pd` on success, `+Pi` when the resource was exhausted. Cells
//! decay as `p · e^(−λ·Δt)`, so a throttled caller always gets a way back.
//! Two structures learn from the same outcomes; the live one decides and,
//! every rotation interval, the warm shadow replaces it and the old one is
//! rehashed with a fresh seed, so an unlucky collision with a heavy hitter
//! lasts at most one interval.
//!
//! Everything here is pure: time (`now_ms`), hash seeds and the random draw
//! of each decision come in as arguments. Probabilities are `f64`: this state
//! is local to one process and never replicated, so floating point is fine
//! (it must never be used inside the replicated coordinator state machine).
//!
//! # Layout
//! - [`config`]: parameters, defaults, validation, [`FairThrottleError`].
//! - [`murmur3`]: the Murmur3 x64-128 hash, checked against published vectors.
//! - [`structure`]: one structure (cells, hashing, decide, record, decay).
//! - [`rotation`]: [`FairThrottleState`], the live + shadow pair and rotation.
//! - [`tuner`]: levels from heavy hitters, buckets and a target collision rate.
//! - [`evaluation`]: a seeded simulation scoring fairness and utilisation
//!   with and without the throttle.
//!
//! # Laws
//! Each is stated on the item it concerns and property-tested in this module:
//! constant memory whatever the number of callers; probabilities in `[0, 1]`;
//! decay lets a fully throttled caller return; independent levels (the
//! all-level collision rate matches `(1 − (1 − 1/B)^M)^L`); a caller hashed
//! with a heavy hitter is throttled at most until the next rotation.

pub mod config;
pub mod evaluation;
pub mod murmur3;
pub mod rotation;
pub mod structure;
pub mod tuner;

pub use config::{FairThrottleConfig, FairThrottleError, LevelCombine};
pub use rotation::FairThrottleState;
pub use structure::{unit_interval, CallerId, FairVerdict, Outcome, ThrottleStructure};
pub use tuner::{all_level_collision_probability, buckets_for_population, tuned_levels};

#[cfg(test)]
mod tests;
