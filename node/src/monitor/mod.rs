//! The read-only Monitor service (`leasehold.v1.Monitor`): a live stream of
//! the current window of one key or of the keys under a prefix, for
//! operators during an incident (`leasehold watch`).
//!
//! - [`cadence`]: when an update is sent (on change, at least once per
//!   window, a heartbeat), pure and property-tested.
//! - [`watch`]: the service and its sampling loop, over a [`watch::Sampler`]:
//! - [`member`]: a coordinator member's own applied state (no leader needed);
//! - [`escrow`](mod@escrow): an escrow node's keys, with the per-tenant use
//!   of `fair` keys.
//! - [`limits`]: what may be watched ([`WatchTarget`]) and how many
//!   streams a caller and a server may hold ([`WatchSlots`]).
//!
//! The rules a client sees (cadence, back-pressure, limits, staleness) are
//! written in `proto/leasehold.proto` (service Monitor) and
//! `docs/operations.md`.

pub mod cadence;
pub mod escrow;
pub mod limits;
pub mod member;
pub mod watch;

pub use limits::{
    WatchSlot, WatchSlots, WatchTarget, MAX_COUNTED_KEYS, MAX_STREAMS_PER_CALLER,
    MAX_STREAMS_PER_SERVER, MAX_WATCHED_KEYS,
};
