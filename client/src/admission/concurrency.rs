//! The concurrency axis of an [`AdmissionGate`](super::gate::AdmissionGate):
//! the process-wide adaptive in-flight ceiling, shared by the gate that
//! takes its slots and the [`Release`](super::release::Release) handles
//! that give them back.

use std::sync::{Arc, Mutex};

use leasehold_core::admission::concurrency::{
    Completion, ConcurrencyLimit, ConcurrencyParams, WaitBasis,
};
use leasehold_core::admission::AdmissionConfigError;
use leasehold_core::decision::Decision;

use crate::limiter::lock;
use crate::transport::WallClock;

/// The in-flight ceiling, the wait a denial suggests and the clock a
/// slot's latency is measured by.
pub(crate) struct ConcurrencyAxis {
    limit: Mutex<ConcurrencyLimit>,
    retry_after_ms: u64,
    clock: Arc<dyn WallClock>,
}

impl std::fmt::Debug for ConcurrencyAxis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConcurrencyAxis")
            .field("retry_after_ms", &self.retry_after_ms)
            .finish_non_exhaustive()
    }
}

impl ConcurrencyAxis {
    /// An axis of `params` whose denials suggest `retry_after_ms` until a
    /// request has completed, measuring latencies by `clock`.
    pub(crate) fn new(
        params: ConcurrencyParams,
        retry_after_ms: u64,
        clock: Arc<dyn WallClock>,
    ) -> Result<Self, AdmissionConfigError> {
        Ok(Self {
            limit: Mutex::new(ConcurrencyLimit::new(params)?),
            retry_after_ms,
            clock,
        })
    }

    /// Takes a slot at `now_ms` if the ceiling allows one; a denial says
    /// how its wait was found.
    pub(crate) fn try_acquire(&self, now_ms: u64) -> (Decision, Option<WaitBasis>) {
        lock(&self.limit).try_acquire_explained(now_ms, self.retry_after_ms)
    }

    /// Gives back the slot taken at `started_ms` without teaching the
    /// limit anything (a later axis denied, or a handle was dropped).
    pub(crate) fn cancel(&self, started_ms: u64) {
        lock(&self.limit).cancel(started_ms);
    }

    /// Frees the slot taken at `started_ms`, teaching the limit its
    /// latency until now and whether it was `dropped` (an overload signal).
    pub(crate) fn complete(&self, started_ms: u64, dropped: bool) {
        let latency_ms = self.clock.now_ms().saturating_sub(started_ms);
        lock(&self.limit).release(Completion {
            started_ms,
            latency_ms,
            dropped,
        });
    }

    /// The ceiling now and the requests in flight.
    pub(crate) fn limit_and_in_flight(&self) -> (u64, u64) {
        let limit = lock(&self.limit);
        (limit.limit(), limit.in_flight())
    }
}
