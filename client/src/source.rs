//! The seam between a [`Limiter`](crate::Limiter) and whatever hands out
//! credits: the [`CreditSource`] trait and the messages crossing it.
//!
//! Implementations: [`EscrowSource`](crate::EscrowSource) (a regional escrow
//! node, `leasehold.v1.Escrow`) and
//! [`CoordinatorSource`](crate::CoordinatorSource) (the coordinator
//! directly). Tests use in-memory fakes; the chaos suite wraps real sources
//! to observe or disturb them. The trait is object safe so a limiter holds
//! `Arc<dyn CreditSource>`.

use futures::future::BoxFuture;
use leasehold_core::ids::{Key, RequestId, TenantId};

use crate::error::ClientError;
use crate::Decision;

/// A request for credits of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The budget.
    pub key: Key,
    /// The tenant inside the region (`None`: the key's default tenant).
    pub tenant: Option<TenantId>,
    /// The tenant's weight, ≥ 1 (only `fair` keys use it).
    pub weight: u64,
    /// Tokens wanted, ≥ 1.
    pub tokens: u64,
    /// Identifies this logical request; a source's retries must reuse it.
    pub request_id: RequestId,
}

/// The answer to an [`AcquireRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Tokens granted, in `[0, tokens]`; partial grants are normal.
    pub granted: u64,
    /// The key's limit in this window.
    pub limit: u64,
    /// Start of the window the tokens belong to, coordinator epoch ms.
    pub window_start_ms: u64,
    /// End of that window, coordinator epoch ms.
    pub window_end_ms: u64,
    /// Lifetime of the tokens, counted from when the request was *sent*
    /// (DESIGN §4): the receiver's deadline is `sent + remaining_lifetime_ms`.
    pub remaining_lifetime_ms: u64,
    /// When `granted == 0`: how long to wait before asking again (0 = unknown).
    pub retry_after_ms: u64,
}

/// A request for one admission decision (strict and cached-deny modes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRequest {
    /// The budget.
    pub key: Key,
    /// The tenant inside the region (`None`: the key's default tenant).
    pub tenant: Option<TenantId>,
    /// The tenant's weight, ≥ 1.
    pub weight: u64,
    /// Tokens the admission spends, ≥ 1.
    pub cost: u64,
}

/// The answer to a [`CheckRequest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckReply {
    /// The decision.
    pub decision: Decision,
    /// The window an admission is labelled with (its start, coordinator ms).
    pub window_start_ms: u64,
}

/// Unspent credits handed back while their window is current.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnRequest {
    /// The budget.
    pub key: Key,
    /// The tenant the credits were acquired for.
    pub tenant: Option<TenantId>,
    /// Tokens returned, ≥ 1.
    pub tokens: u64,
    /// The window the credits belong to.
    pub window_start_ms: u64,
    /// Identifies this logical return (used by sources that need exactly-once).
    pub request_id: RequestId,
}

/// Something that grants, checks and takes back credits.
///
/// Contract for implementations:
/// - a denial is `Ok` (`granted == 0`, or a denied decision), never `Err`;
/// - retries of one call reuse the request's [`RequestId`];
/// - the lifetime of a grant is reported relative to when the *first*
///   attempt was sent (the limiter measures its send instant before calling
///   [`CreditSource::acquire`], so any later origin would be unsafe);
/// - every call finishes in bounded time (per-call deadlines).
pub trait CreditSource: Send + Sync + 'static {
    /// Leases up to `request.tokens` credits.
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>>;

    /// Decides one admission remotely.
    fn check(&self, request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>>;

    /// Gives back unspent credits; returns how many the backend accepted.
    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>>;
}

impl<S: CreditSource + ?Sized> CreditSource for std::sync::Arc<S> {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        (**self).acquire(request)
    }

    fn check(&self, request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        (**self).check(request)
    }

    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        (**self).give_back(request)
    }
}
