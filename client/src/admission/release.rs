//! The release handle an admission returns: the lifecycle of the
//! concurrency slot, separate from the decision because a slot is held
//! (acquire, then release) while rate and cost are spent at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::concurrency::ConcurrencyAxis;

/// What a call to [`Release::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// The slot was freed and the limit learned from the completion.
    Released,
    /// The slot had already been freed: nothing happened.
    AlreadyReleased,
    /// No slot was held (a denied admission, or no concurrency axis):
    /// nothing happened.
    NothingHeld,
}

/// Frees the concurrency slot of an allowed admission.
///
/// - `release(dropped)` is idempotent: the first call frees the slot and
///   feeds the adaptive limit (a drop contracts it); later calls are
///   no-ops ([`ReleaseOutcome::AlreadyReleased`]).
/// - A denied admission's release holds nothing and is a no-op.
/// - Dropping the handle without calling `release` frees the slot without
///   teaching the limit anything, so a forgotten handle never leaks a slot.
#[must_use = "an allowed admission holds a concurrency slot until released"]
#[derive(Debug)]
pub struct Release {
    slot: Option<HeldSlot>,
}

#[derive(Debug)]
struct HeldSlot {
    axis: Arc<ConcurrencyAxis>,
    started_ms: u64,
    released: AtomicBool,
}

impl Release {
    pub(crate) fn nothing_held() -> Self {
        Release { slot: None }
    }

    pub(crate) fn holding(axis: Arc<ConcurrencyAxis>, started_ms: u64) -> Self {
        Release {
            slot: Some(HeldSlot {
                axis,
                started_ms,
                released: AtomicBool::new(false),
            }),
        }
    }

    /// Whether this handle still holds a slot.
    pub fn is_holding(&self) -> bool {
        self.slot
            .as_ref()
            .is_some_and(|s| !s.released.load(Ordering::Acquire))
    }

    /// Frees the slot; `dropped = true` reports an overload signal (a
    /// timeout, an error, a client that hung up), which contracts the
    /// adaptive limit.
    pub fn release(&self, dropped: bool) -> ReleaseOutcome {
        let Some(slot) = &self.slot else {
            return ReleaseOutcome::NothingHeld;
        };
        if slot.released.swap(true, Ordering::AcqRel) {
            return ReleaseOutcome::AlreadyReleased;
        }
        slot.axis.complete(slot.started_ms, dropped);
        ReleaseOutcome::Released
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            if !slot.released.swap(true, Ordering::AcqRel) {
                slot.axis.cancel(slot.started_ms);
            }
        }
    }
}
