//! The region fair pool of a `fair` key, as the leader runs it: the
//! weighted max-min that shares a window's limit between regions
//! ([`fair_pool`]), and what the leader keeps around the replicated pool
//! commands — its desk ([`desk`]) over the demand totals ([`demand_board`]),
//! the weights of a region's holders ([`holder_weights`]), the asks planned
//! and not yet applied ([`in_flight`]), the regions of
//! recent windows ([`roster`]) and the lapse of unheld
//! reserves late in a window ([`lapse`]). The replicated pool commands live
//! in [`crate::coordinator`] (`pool.rs`); an escrow process's share of a
//! region's total in [`crate::escrow::PoolHolding`].

pub mod demand_board;
pub mod desk;
pub mod fair_pool;
pub mod holder_weights;
pub mod in_flight;
pub mod lapse;
pub mod roster;
