//! The leader's board of tenants' demand across regions, for the
//! demand-proportional weight split of `fair` keys ([`crate::wfe::split_weight`]).
//!
//! Each holder of a region — an escrow process, see
//! [`super::holder_weights`] — reports, with its pool asks, the tokens each
//! of its tenants asked it for in one window (`d_{t,h}`); the board adds
//! them up per (key, window, tenant) over every holder of every region
//! (`d_t`) and answers the totals, so a holder weighs a tenant it shares
//! with other regions or other holders of its own region by
//! `w_t · d_{t,h} / d_t` instead of its full weight everywhere (its
//! region's weight is then the sum over its holders).
//!
//! A hint, not state: it lives in the leader's memory only (never
//! replicated) and never bounds an admission, so losing it (a leader
//! change) costs one window of less exact weights, never budget. Bounded:
//! at most [`MAX_BOARD_WINDOWS`] (key, window) entries and
//! [`MAX_BOARD_CELLS`] (tenant, reporter) counts in all (the oldest windows
//! go first), [`MAX_BOARD_TENANTS`] tenants per entry and
//! [`MAX_BOARD_REPORTERS`] reporters per tenant (reports beyond them are
//! not counted).

use std::collections::BTreeMap;

use crate::ids::{Key, RegionId, TenantId};
use crate::pool::holder_weights::Holder;

/// Most (key, window) entries kept.
pub const MAX_BOARD_WINDOWS: usize = 16_384;
/// Most tenants counted per (key, window).
pub const MAX_BOARD_TENANTS: usize = 1_024;
/// Most reporters (region holders) counted per (key, window, tenant).
pub const MAX_BOARD_REPORTERS: usize = 64;
/// Most (tenant, reporter) counts held over every entry.
pub const MAX_BOARD_CELLS: usize = 65_536;
/// Most tenants one report may carry.
pub const MAX_REPORTED_TENANTS: usize = 64;

/// Who reports demand: one holder of one region.
pub type Reporter = (RegionId, Holder);

type Entry = BTreeMap<TenantId, BTreeMap<Reporter, u64>>;

/// See the module doc.
#[derive(Debug, Default, Clone)]
pub struct DemandBoard {
    entries: BTreeMap<(u64, Key), Entry>,
    /// (tenant, reporter) counts over every entry.
    cells: usize,
}

impl DemandBoard {
    /// Records `reporter`'s report of `demands` for `key`'s window starting
    /// at `window_start_ms` (replacing its earlier report of the same
    /// tenants there) and returns, per reported tenant, its demand summed
    /// over every reporter that reported it.
    pub fn report(
        &mut self,
        key: &Key,
        window_start_ms: u64,
        reporter: &Reporter,
        demands: &[(TenantId, u64)],
    ) -> Vec<(TenantId, u64)> {
        let id = (window_start_ms, key.clone());
        if !self.entries.contains_key(&id) && self.entries.len() >= MAX_BOARD_WINDOWS {
            // The oldest window goes first; a report older than every kept
            // one is not kept at all.
            match self.entries.keys().next() {
                Some(oldest) if *oldest < id => {
                    let oldest = oldest.clone();
                    let dropped = self.entries.remove(&oldest).unwrap_or_default();
                    self.cells -= dropped.values().map(BTreeMap::len).sum::<usize>();
                }
                _ => return demands.to_vec(),
            }
        }
        // Room for this report's new counts: older windows go first.
        let wanted = demands.len().min(MAX_REPORTED_TENANTS);
        while self.cells + wanted > MAX_BOARD_CELLS {
            match self.entries.keys().next() {
                Some(oldest) if *oldest < id => {
                    let oldest = oldest.clone();
                    let dropped = self.entries.remove(&oldest).unwrap_or_default();
                    self.cells -= dropped.values().map(BTreeMap::len).sum::<usize>();
                }
                _ => break,
            }
        }
        let entry = self.entries.entry(id).or_default();
        for (tenant, demand) in demands.iter().take(MAX_REPORTED_TENANTS) {
            if !entry.contains_key(tenant) && entry.len() >= MAX_BOARD_TENANTS {
                continue;
            }
            let reporters = entry.entry(tenant.clone()).or_default();
            if reporters.contains_key(reporter) {
                reporters.insert(reporter.clone(), *demand);
            } else if reporters.len() < MAX_BOARD_REPORTERS && self.cells < MAX_BOARD_CELLS {
                reporters.insert(reporter.clone(), *demand);
                self.cells += 1;
            }
        }
        demands
            .iter()
            .map(|(tenant, own)| {
                let total = entry.get(tenant).map_or(*own, |regions| {
                    regions
                        .values()
                        .fold(0u64, |sum, d| sum.saturating_add(*d))
                        .max(*own)
                });
                (tenant.clone(), total)
            })
            .collect()
    }

    /// The totals over every reporter of `window_start_ms` of `key`, for
    /// those of `tenants` that anyone reported (read-only). Asked for a
    /// window every active holder has reported by now (the one before the
    /// latest), these totals are settled.
    pub fn totals(
        &self,
        key: &Key,
        window_start_ms: u64,
        tenants: &[TenantId],
    ) -> Vec<(TenantId, u64)> {
        let Some(entry) = self.entries.get(&(window_start_ms, key.clone())) else {
            return Vec::new();
        };
        tenants
            .iter()
            .take(MAX_REPORTED_TENANTS)
            .filter_map(|tenant| {
                let regions = entry.get(tenant)?;
                let total = regions.values().fold(0u64, |sum, d| sum.saturating_add(*d));
                Some((tenant.clone(), total))
            })
            .collect()
    }

    /// (key, window) entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// (tenant, reporter) counts held over every entry.
    pub fn cells(&self) -> usize {
        self.cells
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tenant(i: usize) -> TenantId {
        TenantId::new(format!("t{i}")).unwrap()
    }

    /// The one anonymous holder of region `i`.
    fn region(i: usize) -> Reporter {
        (RegionId::new(format!("r{i}")).unwrap(), Holder::Anonymous)
    }

    #[test]
    fn two_holders_of_one_region_report_apart_and_add_up() {
        let mut board = DemandBoard::default();
        let key = Key::new("k").unwrap();
        let holder = |name: &str| {
            let client = crate::ids::ClientId::new(name).unwrap();
            (RegionId::new("eu").unwrap(), Holder::Process(client))
        };
        assert_eq!(
            board.report(&key, 0, &holder("a"), &[(tenant(1), 30)]),
            [(tenant(1), 30)]
        );
        assert_eq!(
            board.report(&key, 0, &holder("b"), &[(tenant(1), 10)]),
            [(tenant(1), 40)]
        );
        // a reports again: its count is replaced, b's stays.
        assert_eq!(
            board.report(&key, 0, &holder("a"), &[(tenant(1), 20)]),
            [(tenant(1), 30)]
        );
        assert_eq!(board.cells(), 2);
    }

    #[test]
    fn totals_add_regions_and_a_new_report_replaces_the_old() {
        let mut board = DemandBoard::default();
        let key = Key::new("k").unwrap();
        assert_eq!(
            board.report(&key, 0, &region(0), &[(tenant(1), 30)]),
            [(tenant(1), 30)]
        );
        assert_eq!(
            board.report(&key, 0, &region(1), &[(tenant(1), 10), (tenant(2), 5)]),
            [(tenant(1), 40), (tenant(2), 5)]
        );
        // r0 reports again for the same window: replaced, not added.
        assert_eq!(
            board.report(&key, 0, &region(0), &[(tenant(1), 20)]),
            [(tenant(1), 30)]
        );
        // Another window, another key: separate.
        assert_eq!(
            board.report(&key, 1_000, &region(0), &[(tenant(1), 7)]),
            [(tenant(1), 7)]
        );
        let other = Key::new("other").unwrap();
        assert_eq!(
            board.report(&other, 0, &region(2), &[(tenant(1), 1)]),
            [(tenant(1), 1)]
        );
    }

    #[test]
    fn settled_totals_read_what_every_region_reported() {
        let mut board = DemandBoard::default();
        let key = Key::new("k").unwrap();
        board.report(&key, 0, &region(0), &[(tenant(1), 30)]);
        board.report(&key, 0, &region(1), &[(tenant(1), 10), (tenant(2), 5)]);
        assert_eq!(
            board.totals(&key, 0, &[tenant(1), tenant(2), tenant(3)]),
            [(tenant(1), 40), (tenant(2), 5)]
        );
        assert!(board.totals(&key, 1_000, &[tenant(1)]).is_empty());
        assert!(board
            .totals(&Key::new("other").unwrap(), 0, &[tenant(1)])
            .is_empty());
    }

    proptest! {
        /// Whatever is reported, the answer for a tenant is at least the
        /// reporter's own demand and exactly the sum of the latest reports
        /// of every region (within the bounds), and the board stays bounded.
        #[test]
        fn the_total_is_the_sum_of_each_regions_latest_report(
            reports in proptest::collection::vec(
                (0usize..4, 0usize..3, 0u64..3, 0u64..1_000), 1..80),
        ) {
            let mut board = DemandBoard::default();
            let key = Key::new("k").unwrap();
            let mut latest: BTreeMap<(u64, usize, usize), u64> = BTreeMap::new();
            for (r, t, window, demand) in reports {
                let start = window * 1_000;
                let answer = board.report(&key, start, &region(r), &[(tenant(t), demand)]);
                latest.insert((start, t, r), demand);
                let expected: u64 = latest
                    .iter()
                    .filter(|((s, tt, _), _)| *s == start && *tt == t)
                    .map(|(_, d)| d)
                    .sum();
                prop_assert_eq!(answer, vec![(tenant(t), expected)]);
                prop_assert!(board.len() <= 3);
                prop_assert_eq!(board.cells(), latest.len());
            }
        }
    }

    #[test]
    fn the_counts_stay_bounded_and_the_newest_windows_stay() {
        let mut board = DemandBoard::default();
        let report: Vec<(TenantId, u64)> =
            (0..MAX_REPORTED_TENANTS).map(|t| (tenant(t), 1)).collect();
        let windows = MAX_BOARD_CELLS / MAX_REPORTED_TENANTS + 5;
        for w in 0..windows {
            let key = Key::new(format!("k{w}")).unwrap();
            board.report(&key, w as u64, &region(0), &report);
            assert!(board.cells() <= MAX_BOARD_CELLS);
        }
        assert_eq!(board.cells(), MAX_BOARD_CELLS);
        // The newest window is kept and counted.
        let newest = Key::new(format!("k{}", windows - 1)).unwrap();
        assert_eq!(
            board.report(&newest, windows as u64 - 1, &region(1), &[(tenant(0), 2)]),
            [(tenant(0), 3)]
        );
    }

    #[test]
    fn the_board_keeps_the_newest_windows() {
        let mut board = DemandBoard::default();
        let key = Key::new("k").unwrap();
        for w in 0..(MAX_BOARD_WINDOWS as u64 + 10) {
            board.report(&key, w * 10, &region(0), &[(tenant(0), 1)]);
        }
        assert_eq!(board.len(), MAX_BOARD_WINDOWS);
        // The oldest are gone: a report there is answered but not kept.
        assert_eq!(
            board.report(&key, 0, &region(1), &[(tenant(0), 5)]),
            [(tenant(0), 5)]
        );
        assert_eq!(board.len(), MAX_BOARD_WINDOWS);
    }
}
