//! Pure, deterministic logic of Leasehold. No IO, no clocks, no randomness:
//! time and randomness come in as arguments, so everything here is
//! property-testable and identical on every replica.
//!
//! # Layout
//! - [`window`]: epoch-aligned window arithmetic and relative lifetimes.
//! - [`ids`]: validated newtypes for keys, regions, tenants and request ids.
//! - [`principal`]: who is calling (the identity of an mTLS certificate).
//! - [`policy`]: the replicated policy table (longest-prefix match).
//! - [`shadow`]: shadow mode: decisions computed and counted as would-deny, never enforced.
//! - [`shard`]: hash slots and the versioned placement of slots on shards
//!   (Raft groups) and of shards on members.
//! - [`coordinator`]: the L3 state machine: commands, responses, `apply`.
//! - [`pool`]: the region fair pool as the leader runs it: the weighted
//!   max-min across regions, the leader's desk around the pool commands
//!   (capped asks, lapsed reserves, standings, tenants' demand totals).
//! - [`fair_throttle`]: constant-memory fair throttling of many anonymous callers (stochastic fair BLUE).
//! - [`decision`]: the `Decision` type and its combine algebra.
//! - [`admission`]: the axes of unified admission (GCRA, token bucket,
//!   adaptive concurrency), the binding axis, bid-price admission.
//! - [`window_credit`]: the one rule by which L1 and L2 credit a window's grant.
//! - [`escrow`]: the rules of one region's escrow for one key (L2, sans IO).
//! - [`wfe`]: in-region weighted-fair escrow over a region's pool grant.
//! - [`sizer`]: how a key's lease size is chosen (fixed, EOQ, predictive).
//! - [`eoq_sizer`]: the online EOQ lease-size learner.
//! - [`predictive_sizer`]: prediction-following and EOQ experts under Hedge.
//! - [`water_fill`]: the flat weighted max-min oracle.
//! - [`static_partition`]: the uncoordinated even split, the baseline leasing beats.
//! - [`rls`]: Envoy's rate limit configuration, matching, keys and answers
//!   (token budgets' checks, charges and refunds).
//! - [`metrics`]: the Prometheus text exposition every `/metrics` writes.
#![deny(missing_docs)]

pub mod admission;
pub mod coordinator;
pub mod decision;
pub mod eoq_sizer;
pub mod escrow;
pub mod fair_throttle;
pub mod ids;
pub mod metrics;
pub mod policy;
pub mod pool;
pub mod predictive_sizer;
pub mod principal;
pub mod rls;
pub mod shadow;
pub mod shard;
pub mod sizer;
pub mod static_partition;
pub mod water_fill;
pub mod wfe;
pub mod window;
pub mod window_credit;
