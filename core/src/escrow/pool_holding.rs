//! What one holder — one escrow node process — holds of its region's
//! total in one window of a `fair` key's pool, and the translation between
//! the region's totals on the wire and the holder's own.
//!
//! The coordinator keeps one total per (key, window, region): what the
//! weighted max-min shares out. Several holders may add to it — two escrow
//! nodes of one region, or a node and an earlier process of itself that
//! lost its memory (a restart, a crash, an idle eviction of the key). So a
//! holder never spends the region's total: it spends what its own calls
//! added (`PoolGrantResponse.granted_increment`), less what it released.
//! Whatever else the total holds is the region's *other* holdings, spent as
//! far as this holder knows.
//!
//! A key's rules ([`super::FairKey`]) think in the holder's own totals;
//! this ledger turns its asks and releases into the region's totals the
//! wire speaks, and the coordinator's answers back:
//!
//! - an ask for an own total `w` goes out as `w + others`;
//! - an answer adds its increment to the own total and learns
//!   `others = granted_total − own` (a retry's answer is the same answer, so
//!   its increment is counted once: the caller feeds each call's answer
//!   once);
//! - the region-wide hints (guarantee, ceiling) become own ones by taking
//!   `others` off;
//! - a release of own totals `from → keep` goes out as
//!   `from + others → keep + others`; a release applied takes `released`
//!   off the own total, a stale one (another holder moved the total) leaves
//!   it as it was and learns the new `others`.
//!
//! Safety rests on the own total alone: it grows only by increments the
//! coordinator granted to this holder's calls and shrinks by every release,
//! so the holders of a region together never hold more than its total, and
//! `Σ total ≤ L`. A wrong `others` (a stale answer, a holder the ledger
//! never heard of) can only make an ask too small or a release stale.

use crate::pool::fair_pool::PoolStanding;
use crate::window::WindowBounds;

/// One holder's part of its region's pool total in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PoolHolding {
    /// The window, once an answer for it was heard.
    window: Option<WindowBounds>,
    /// What this holder holds there: Σ its increments − Σ its releases.
    own: u64,
    /// What the region's other holders hold there, as of the latest answer.
    others: u64,
}

impl PoolHolding {
    /// A holding of nothing, in no window yet.
    pub fn new() -> Self {
        PoolHolding::default()
    }

    /// The window held in, once an answer was heard.
    pub fn window(&self) -> Option<WindowBounds> {
        self.window
    }

    /// What this holder holds.
    pub fn own(&self) -> u64 {
        self.own
    }

    /// What the region's other holders hold, as last heard.
    pub fn others(&self) -> u64 {
        self.others
    }

    /// The region's total as last heard: own + others.
    pub fn region_total(&self) -> u64 {
        self.own.saturating_add(self.others)
    }

    /// The region total to ask for so that this holder may hold `own_want`.
    pub fn wire_want(&self, own_want: u64) -> u64 {
        own_want.saturating_add(self.others)
    }

    /// The own part of a region-wide figure (a guarantee, a ceiling).
    pub fn own_part(&self, region_figure: u64) -> u64 {
        region_figure.saturating_sub(self.others)
    }

    /// A grant answered in `window`: the region's `granted_total` and the
    /// `increment` this call added to it. A window other than the one held
    /// in starts the holding anew (a holding never crosses windows). An
    /// answer for a window older than the one held in changes nothing and
    /// counts nothing: the caller must not spend it.
    /// Returns whether the answer counted.
    pub fn on_grant(&mut self, window: WindowBounds, granted_total: u64, increment: u64) -> bool {
        match self.window {
            Some(held) if held.start_ms > window.start_ms => return false,
            Some(held) if held == window => {}
            _ => *self = PoolHolding::in_window(window),
        }
        self.own = self.own.saturating_add(increment).min(granted_total);
        self.others = granted_total - self.own;
        true
    }

    /// A release applied in the held window: `released` tokens left the own
    /// total; the region's total is now `granted_total`.
    pub fn on_released(&mut self, released: u64, granted_total: u64) {
        self.own = self.own.saturating_sub(released).min(granted_total);
        self.others = granted_total - self.own;
    }

    /// A release refused as stale: the own total is as it was, the region's
    /// total is `granted_total` (another holder moved it).
    pub fn on_stale(&mut self, granted_total: u64) {
        self.own = self.own.min(granted_total);
        self.others = granted_total - self.own;
    }

    /// The own view of a region-wide standing.
    pub fn own_standing(&self, standing: PoolStanding) -> PoolStanding {
        PoolStanding {
            guarantee: self.own_part(standing.guarantee),
            ceiling: self.own_part(standing.ceiling),
        }
    }

    fn in_window(window: WindowBounds) -> Self {
        PoolHolding {
            window: Some(window),
            own: 0,
            others: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn window(start_ms: u64) -> WindowBounds {
        WindowBounds {
            start_ms,
            end_ms: start_ms + 1_000,
        }
    }

    #[test]
    fn a_new_holder_holds_none_of_what_the_region_held_before_it() {
        let mut holding = PoolHolding::new();
        // An earlier process of this node held 100 of the region's total.
        assert!(holding.on_grant(window(0), 100, 0));
        assert_eq!(holding.own(), 0);
        assert_eq!(holding.others(), 100);
        assert_eq!(holding.wire_want(10), 110);
        assert!(holding.on_grant(window(0), 110, 10));
        assert_eq!((holding.own(), holding.others()), (10, 100));
    }

    #[test]
    fn another_window_starts_anew_and_an_older_one_counts_nothing() {
        let mut holding = PoolHolding::new();
        assert!(holding.on_grant(window(1_000), 40, 40));
        assert!(!holding.on_grant(window(0), 90, 90));
        assert_eq!((holding.own(), holding.others()), (40, 0));
        assert!(holding.on_grant(window(2_000), 30, 5));
        assert_eq!((holding.own(), holding.others()), (5, 25));
    }

    #[test]
    fn a_stale_release_keeps_the_own_total_and_learns_the_others() {
        let mut holding = PoolHolding::new();
        holding.on_grant(window(0), 50, 50);
        holding.on_stale(80);
        assert_eq!((holding.own(), holding.others()), (50, 30));
        holding.on_released(20, 60);
        assert_eq!((holding.own(), holding.others()), (30, 30));
    }

    proptest! {
        /// Two holders of one region, each fed its own calls' answers by a
        /// coordinator that grants increments on a region total, hold
        /// together exactly the region's total, and each learns the
        /// other's part from its latest answer.
        #[test]
        fn holders_together_hold_the_region_total(
            calls in proptest::collection::vec((0usize..2, 0u64..40, any::<bool>()), 1..40),
        ) {
            let limit = 100u64;
            let mut total = 0u64;
            let mut holders = [PoolHolding::new(), PoolHolding::new()];
            for (who, amount, release) in calls {
                let holder = &mut holders[who];
                if release {
                    let give = amount.min(holder.own());
                    let from = holder.region_total();
                    if from == total {
                        total -= give;
                        holder.on_released(give, total);
                    } else {
                        holder.on_stale(total);
                    }
                } else {
                    let want = holder.wire_want(holder.own() + amount);
                    let granted = total.max(want.min(limit));
                    let increment = granted - total;
                    total = granted;
                    holder.on_grant(window(0), total, increment);
                }
                prop_assert!(total <= limit);
                prop_assert_eq!(holders[0].own() + holders[1].own(), total);
            }
        }
    }
}
