//! The pool asks the leader has planned and not yet seen applied, per
//! (key, window, region), so that two holders of one region asking by
//! `want_more` at once (two escrow processes joining the next window at
//! the same late check) both get what they asked for: the second ask is
//! sized on top of the region's total *and* of the asks ahead of it in the
//! log (see [`super::desk::size_ask`]). Without it, both are sized on the
//! same total, the first is applied, and the second adds nothing.
//!
//! A hint, not state: the leader's memory only; an ask is forgotten when
//! its outcome is known ([`InFlightAsks::settle`]) or, should that never
//! come (a call dropped mid-flight), [`IN_FLIGHT_EXPIRY_MS`] after it was
//! planned. Bounded by [`MAX_IN_FLIGHT`] asks (the oldest go first). A
//! wrong count only sizes an ask too large or too small; every grant is
//! still capped by the pool's rule.

use std::collections::BTreeMap;

use crate::ids::{Key, RegionId};

/// How long a planned ask counts when its outcome never comes, ms.
pub const IN_FLIGHT_EXPIRY_MS: u64 = 2_000;
/// Most planned asks remembered.
pub const MAX_IN_FLIGHT: usize = 65_536;

type Slot = (Key, u64, RegionId);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Planned {
    id: u64,
    more: u64,
    planned_ms: u64,
}

/// See the module doc.
#[derive(Debug, Default, Clone)]
pub struct InFlightAsks {
    slots: BTreeMap<Slot, Vec<Planned>>,
    ids: BTreeMap<u64, Slot>,
    next_id: u64,
}

impl InFlightAsks {
    /// What the asks planned for `region` in `key`'s window starting at
    /// `window_start_ms` and not yet settled ask for beyond the region's
    /// total, as of `now_ms` (expired ones no longer count).
    pub fn pending(&self, key: &Key, window_start_ms: u64, region: &RegionId, now_ms: u64) -> u64 {
        let slot = (key.clone(), window_start_ms, region.clone());
        self.slots.get(&slot).map_or(0, |planned| {
            planned
                .iter()
                .filter(|p| now_ms < p.planned_ms.saturating_add(IN_FLIGHT_EXPIRY_MS))
                .fold(0u64, |sum, p| sum.saturating_add(p.more))
        })
    }

    /// Remembers an ask of `more` beyond the total, planned at `now_ms`;
    /// its id, to [`Self::settle`] once its outcome is known.
    pub fn add(
        &mut self,
        key: &Key,
        window_start_ms: u64,
        region: &RegionId,
        more: u64,
        now_ms: u64,
    ) -> u64 {
        self.expire(now_ms);
        while self.ids.len() >= MAX_IN_FLIGHT {
            let Some((&oldest, _)) = self.ids.iter().next() else {
                break;
            };
            self.settle(oldest);
        }
        self.next_id += 1;
        let id = self.next_id;
        let slot = (key.clone(), window_start_ms, region.clone());
        self.slots.entry(slot.clone()).or_default().push(Planned {
            id,
            more,
            planned_ms: now_ms,
        });
        self.ids.insert(id, slot);
        id
    }

    /// Forgets ask `id`: its outcome is known (applied or refused).
    pub fn settle(&mut self, id: u64) {
        let Some(slot) = self.ids.remove(&id) else {
            return;
        };
        if let Some(planned) = self.slots.get_mut(&slot) {
            planned.retain(|p| p.id != id);
            if planned.is_empty() {
                self.slots.remove(&slot);
            }
        }
    }

    /// Asks remembered.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Forgets the asks planned [`IN_FLIGHT_EXPIRY_MS`] or more before
    /// `now_ms` (ids grow with time: the oldest come first).
    fn expire(&mut self, now_ms: u64) {
        let expired: Vec<u64> = self
            .slots
            .values()
            .flatten()
            .filter(|p| now_ms >= p.planned_ms.saturating_add(IN_FLIGHT_EXPIRY_MS))
            .map(|p| p.id)
            .collect();
        for id in expired {
            self.settle(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn key() -> Key {
        Key::new("p/k").expect("valid")
    }

    fn eu() -> RegionId {
        RegionId::new("eu").expect("valid")
    }

    #[test]
    fn asks_count_until_settled_or_expired() {
        let mut asks = InFlightAsks::default();
        assert!(asks.is_empty());
        let first = asks.add(&key(), 0, &eu(), 40, 100);
        assert!(!asks.is_empty());
        let second = asks.add(&key(), 0, &eu(), 25, 110);
        assert_eq!(asks.pending(&key(), 0, &eu(), 120), 65);
        // Another window or region is apart.
        assert_eq!(asks.pending(&key(), 1_000, &eu(), 120), 0);
        asks.settle(first);
        assert_eq!(asks.pending(&key(), 0, &eu(), 120), 25);
        // Settling twice changes nothing.
        asks.settle(first);
        assert_eq!(asks.len(), 1);
        // An ask whose outcome never comes stops counting, then is dropped.
        assert_eq!(asks.pending(&key(), 0, &eu(), 110 + IN_FLIGHT_EXPIRY_MS), 0);
        asks.add(&key(), 0, &eu(), 1, 110 + IN_FLIGHT_EXPIRY_MS);
        assert_eq!(asks.len(), 1);
        asks.settle(second);
        assert_eq!(asks.len(), 1);
    }

    proptest! {
        /// Whatever is added and settled, the pending sum of a slot is the
        /// sum of its unsettled, unexpired asks, and the memory holds no
        /// more than what is unsettled.
        #[test]
        fn pending_is_the_sum_of_the_unsettled(
            steps in proptest::collection::vec((any::<bool>(), 0u64..100, 0usize..8), 1..60),
        ) {
            let mut asks = InFlightAsks::default();
            let mut open: Vec<(u64, u64)> = Vec::new();
            for (add, more, pick) in steps {
                if add || open.is_empty() {
                    let id = asks.add(&key(), 0, &eu(), more, 0);
                    open.push((id, more));
                } else {
                    let (id, _) = open.remove(pick % open.len());
                    asks.settle(id);
                }
                let expected: u64 = open.iter().map(|(_, more)| more).sum();
                prop_assert_eq!(asks.pending(&key(), 0, &eu(), 1), expected);
                prop_assert_eq!(asks.len(), open.len());
            }
        }
    }
}
