//! The leader's roster of the regions in each `fair` key's recent pool
//! windows, so that a region asking early in a window hears a standing
//! that counts the regions expected to join it.
//!
//! A window's pool reserves a guarantee only for the regions that have
//! asked in it. The first region to ask in a new window would otherwise
//! hear that it may take all of `L`, and an escrow node that joins a
//! window for its whole expected share in one call (the warm start) could
//! not tell its share from that. The leader remembers, per (key, window),
//! the regions that held a pool weight in it and their weights (the last
//! weight ≥ 1 of each: a region that retired during the window is still
//! expected in the next); a grant's
//! *expected standing* ([`PoolRoster::answer`]) counts every region of the
//! window right before that has not asked in this one yet as if it had
//! joined with its weight and nothing granted — while the window is in its
//! first [`EXPECTATION_SHARE`]-th (`window length / 4`). After that, a
//! region that has not come is not waited for. During that first quarter
//! the leader also caps each ask at the asker's expected ceiling
//! ([`PoolRoster::cap`]) before proposing it.
//!
//! The roster also remembers, per (key, window), the tokens regions
//! handed back (`PoolRelease`) in the window's last quarter
//! ([`PoolRoster::note_release`]): a grant's answer tells the region the
//! most handed back late in one of the two windows right before
//! ([`StandingAnswer::late_released_before`]). Regions hand back their
//! margins late window after window (one whose count runs near its
//! margin, every other window); a region held at its ceiling that hears
//! of it looks once more after the late hand-backs.
//!
//! A hint, not state: it lives in the leader's memory only (never
//! replicated); it tells an escrow node how much to ask for and lowers
//! what an ask proposes, while the pool still grants by its own rule, so
//! no roster can make it grant past `L`. Losing it (a leader change) costs
//! one window of the half-size join and no cap.
//! Bounded: at most [`MAX_ROSTER_WINDOWS`] (key, window) entries and
//! [`MAX_ROSTER_CELLS`] (window, region) entries in all, and at most
//! [`MAX_ROSTER_WINDOWS`] windows of late hand-backs; the oldest windows
//! go first.
//!
//! Laws (property-tested below): the cells held never exceed the bound;
//! the expected regions are exactly the previous window's regions not in
//! `present`, and none once the first quarter is over or when the previous
//! window is unknown.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::coordinator::{PoolView, MAX_REGIONS_PER_WINDOW};
use crate::ids::{Key, RegionId, RequestId};
use crate::pool::fair_pool::{reserved_unheld, standing, PoolMember, PoolStanding};
use crate::principal::Principal;
use crate::window::WindowBounds;

/// Most (key, window) entries kept.
pub const MAX_ROSTER_WINDOWS: usize = 16_384;
/// Most (window, region) entries held over every window.
pub const MAX_ROSTER_CELLS: usize = 65_536;
/// Regions of the previous window are expected during the first
/// `1 / EXPECTATION_SHARE` of a window.
pub const EXPECTATION_SHARE: u64 = 4;
/// Most capped asks remembered ([`CappedAsks`]).
pub const MAX_CAPPED_ASKS: usize = 65_536;
/// How long a capped ask is remembered: as long as the coordinator keeps
/// a request id's answer at least.
pub const CAPPED_ASK_RETAIN_MS: u64 = crate::coordinator::SESSION_MIN_RETAIN_MS;

/// The totals asks went out with, by request id, so that a retry of the
/// same id (through the same leader) carries the same total: a request id
/// names one request, `want_total` included, and a retry whose total
/// differed would be refused as a reused id — whether the first attempt
/// was capped and the retry is not, or the other way round, or both by
/// different caps (the cap moves as regions join). Bounded: at most
/// [`MAX_CAPPED_ASKS`], each kept [`CAPPED_ASK_RETAIN_MS`] (the oldest go
/// first). A leader that did not cap the first attempt (a leader change
/// in between) cannot know its total; such a retry may be refused as a
/// reused id, and the next call under a new id is served as usual.
#[derive(Debug, Default, Clone)]
pub struct CappedAsks {
    totals: HashMap<(Principal, RequestId), u64>,
    order: VecDeque<(u64, Principal, RequestId)>,
}

impl CappedAsks {
    /// The total an ask of `want_total` under `id` from `caller` goes out
    /// with at `now_ms`, capped at `cap` (when any): the one its id went
    /// out with before, if remembered; otherwise `min(want_total, cap)`,
    /// remembered under the id.
    pub fn total(
        &mut self,
        caller: &Principal,
        id: Option<&RequestId>,
        want_total: u64,
        cap: Option<u64>,
        now_ms: u64,
    ) -> u64 {
        self.forget_before(now_ms.saturating_sub(CAPPED_ASK_RETAIN_MS));
        let Some(id) = id else {
            return cap.map_or(want_total, |cap| want_total.min(cap));
        };
        let entry = (caller.clone(), id.clone());
        if let Some(total) = self.totals.get(&entry) {
            return *total;
        }
        let total = cap.map_or(want_total, |cap| want_total.min(cap));
        if self.totals.len() >= MAX_CAPPED_ASKS {
            if let Some((_, caller, id)) = self.order.pop_front() {
                self.totals.remove(&(caller, id));
            }
        }
        self.totals.insert(entry, total);
        self.order.push_back((now_ms, caller.clone(), id.clone()));
        total
    }

    fn forget_before(&mut self, cutoff_ms: u64) {
        while let Some((at, _, _)) = self.order.front() {
            if *at >= cutoff_ms {
                break;
            }
            if let Some((_, caller, id)) = self.order.pop_front() {
                self.totals.remove(&(caller, id));
            }
        }
    }

    /// Asks remembered.
    pub fn len(&self) -> usize {
        self.totals.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.totals.is_empty()
    }
}

/// See the module doc.
#[derive(Debug, Default, Clone)]
pub struct PoolRoster {
    entries: BTreeMap<(u64, Key), Vec<(RegionId, u64)>>,
    cells: usize,
    /// Tokens handed back in each (window, key)'s last quarter.
    late_released: BTreeMap<(u64, Key), u64>,
}

/// `region`'s weight and total in `view` (`None` when it has not joined;
/// the view's regions are sorted).
fn member_of(view: &PoolView, region: &RegionId) -> Option<PoolMember> {
    view.regions
        .binary_search_by(|(id, _)| id.cmp(region))
        .ok()
        .map(|at| view.regions[at].1)
}

/// What the leader answers about a region's place in a pool window after
/// a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StandingAnswer {
    /// Where the region stands among the regions that have asked.
    pub standing: Option<PoolStanding>,
    /// The same, also counting the regions expected to join (see the
    /// module doc); `None` when the roster holds nothing of the window
    /// before.
    pub expected: Option<PoolStanding>,
    /// What the pool reserves for the other regions beyond what they
    /// hold ([`reserved_unheld`]).
    pub reserved_unheld: u64,
    /// What the other regions that retired from the window (weight 0:
    /// they handed back what their pace would not need) keep: they may
    /// hand back what is left of their margin late in the window.
    pub retired_kept: u64,
    /// The most regions handed back in the last quarter of one of the two
    /// windows right before this one ([`PoolRoster::note_release`]): they
    /// will likely hand back their margins late again (0 when the leader
    /// holds nothing of them).
    pub late_released_before: u64,
}

impl PoolRoster {
    /// Records that `key`'s window starting at `window_start_ms` holds
    /// `regions` (region, pool weight), merged with what was recorded for
    /// it: a region keeps the latest weight ≥ 1 it was recorded with, so
    /// one that retired during the window (weight 0 now: it handed back
    /// what its pace would not need) is still expected in the next one.
    /// At most [`MAX_REGIONS_PER_WINDOW`] are kept, in region order. A
    /// window older than every kept one is not recorded once the roster is
    /// full.
    pub fn record(&mut self, key: &Key, window_start_ms: u64, regions: Vec<(RegionId, u64)>) {
        let id = (window_start_ms, key.clone());
        let mut merged: BTreeMap<RegionId, u64> = self
            .entries
            .get(&id)
            .map(|old| old.iter().cloned().collect())
            .unwrap_or_default();
        for (region, weight) in regions.into_iter().filter(|(_, w)| *w > 0) {
            merged.insert(region, weight);
        }
        let mut regions: Vec<(RegionId, u64)> = merged.into_iter().collect();
        regions.truncate(MAX_REGIONS_PER_WINDOW);
        if let Some(old) = self.entries.remove(&id) {
            self.cells -= old.len();
        }
        while self.entries.len() >= MAX_ROSTER_WINDOWS
            || self.cells + regions.len() > MAX_ROSTER_CELLS
        {
            match self.entries.keys().next() {
                Some(oldest) if *oldest < id => {
                    let oldest = oldest.clone();
                    if let Some(dropped) = self.entries.remove(&oldest) {
                        self.cells -= dropped.len();
                    }
                }
                _ => return,
            }
        }
        self.cells += regions.len();
        self.entries.insert(id, regions);
    }

    /// Notes that a region handed `released` tokens back to `key`'s pool
    /// `window` at coordinator time `now_ms`: counted when that is in the
    /// window's last quarter. At most [`MAX_ROSTER_WINDOWS`] windows are
    /// kept (the oldest go first; one older than every kept one is not
    /// recorded once full).
    pub fn note_release(&mut self, key: &Key, window: WindowBounds, now_ms: u64, released: u64) {
        let length = window.end_ms.saturating_sub(window.start_ms);
        let last_quarter = window.end_ms.saturating_sub(length / EXPECTATION_SHARE);
        if released == 0 || now_ms < last_quarter || now_ms >= window.end_ms {
            return;
        }
        let id = (window.start_ms, key.clone());
        if !self.late_released.contains_key(&id) {
            while self.late_released.len() >= MAX_ROSTER_WINDOWS {
                match self.late_released.keys().next() {
                    Some(oldest) if *oldest < id => {
                        let oldest = oldest.clone();
                        self.late_released.remove(&oldest);
                    }
                    _ => return,
                }
            }
        }
        let sum = self.late_released.entry(id).or_default();
        *sum = sum.saturating_add(released);
    }

    /// The most regions handed back in the last quarter of one of `key`'s
    /// two windows right before `window` (0 when nothing is held of
    /// them): a region whose count runs near its margin hands back in
    /// one window and asks again in the next.
    pub fn late_released_before(&self, key: &Key, window: WindowBounds) -> u64 {
        let length = window.end_ms.saturating_sub(window.start_ms);
        let at = |back: u64| {
            window
                .start_ms
                .checked_sub(length.saturating_mul(back))
                .and_then(|previous| self.late_released.get(&(previous, key.clone())))
                .copied()
                .unwrap_or(0)
        };
        at(1).max(at(2))
    }

    /// Windows of late hand-backs held.
    pub fn late_release_windows(&self) -> usize {
        self.late_released.len()
    }

    /// The regions expected in `key`'s `window` at coordinator time
    /// `now_ms`: those recorded for the window right before it that
    /// `present` says have not asked in this one. `None` when nothing is
    /// recorded for the window before; empty once the first
    /// `1 / EXPECTATION_SHARE` of `window` is over.
    pub fn expected(
        &self,
        key: &Key,
        window: WindowBounds,
        now_ms: u64,
        present: impl Fn(&RegionId) -> bool,
    ) -> Option<Vec<(RegionId, u64)>> {
        let length = window.end_ms.checked_sub(window.start_ms)?;
        let previous = window.start_ms.checked_sub(length)?;
        let regions = self.entries.get(&(previous, key.clone()))?;
        let expecting_until = window.start_ms.saturating_add(length / EXPECTATION_SHARE);
        if now_ms >= expecting_until {
            return Some(Vec::new());
        }
        Some(
            regions
                .iter()
                .filter(|(id, _)| !present(id))
                .cloned()
                .collect(),
        )
    }

    /// Where `region` stands in `view` (with `weight` when given, else
    /// its weight there), counting the `absent` regions — from
    /// [`Self::expected`]: neither in the window nor `region`, of weight
    /// ≥ 1 — as joined with nothing granted.
    fn standing_in(
        view: &PoolView,
        region: &RegionId,
        weight: Option<u64>,
        absent: &[(RegionId, u64)],
    ) -> PoolStanding {
        let own = member_of(view, region).unwrap_or_default();
        let asker = PoolMember {
            weight: weight.unwrap_or(own.weight),
            granted: own.granted,
        };
        let others = view
            .regions
            .iter()
            .filter(|(id, _)| id != region)
            .map(|(_, member)| *member)
            .chain(absent.iter().map(|(_, weight)| PoolMember {
                weight: *weight,
                granted: 0,
            }));
        standing(view.limit, asker, others)
    }

    /// The most the leader lets `region` ask for in `key`'s pool window
    /// `view` (as of `now_ms`) with weight `region_weight`: its ceiling
    /// counting the expected regions, while any is expected. `None` (no
    /// cap) when none is, when the roster holds nothing of the window
    /// before, or under a shadow policy (which grants beyond the fair
    /// total anyway and counts it).
    pub fn cap(
        &self,
        view: &PoolView,
        key: &Key,
        region: &RegionId,
        region_weight: u64,
        now_ms: u64,
    ) -> Option<u64> {
        if view.shadow {
            return None;
        }
        let absent = self.expected(key, view.bounds, now_ms, |id| {
            id == region || member_of(view, id).is_some()
        })?;
        if absent.is_empty() {
            return None;
        }
        Some(Self::standing_in(view, region, Some(region_weight), &absent).ceiling)
    }

    /// After a pool grant to `region` in `view` (the granted window, read
    /// at coordinator time `now_ms`): records the window's regions and
    /// answers the region's standing, plain and expected.
    pub fn answer(
        &mut self,
        view: &PoolView,
        key: &Key,
        region: &RegionId,
        now_ms: u64,
    ) -> StandingAnswer {
        let Some(own) = member_of(view, region) else {
            return StandingAnswer::default();
        };
        let standing = Self::standing_in(view, region, None, &[]);
        let unheld = reserved_unheld(
            view.limit,
            own,
            view.regions
                .iter()
                .filter(|(id, _)| id != region)
                .map(|(_, member)| *member),
        );
        let expected = self
            .expected(key, view.bounds, now_ms, |id| member_of(view, id).is_some())
            .map(|absent| Self::standing_in(view, region, None, &absent));
        let regions = view
            .regions
            .iter()
            .map(|(id, member)| (id.clone(), member.weight))
            .collect();
        self.record(key, view.bounds.start_ms, regions);
        let retired_kept = view
            .regions
            .iter()
            .filter(|(id, member)| id != region && member.weight == 0)
            .fold(0u64, |sum, (_, member)| sum.saturating_add(member.granted));
        StandingAnswer {
            standing: Some(standing),
            expected,
            reserved_unheld: unheld,
            retired_kept,
            late_released_before: self.late_released_before(key, view.bounds),
        }
    }

    /// (key, window) entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// (window, region) entries held over every window.
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

    fn key(i: u8) -> Key {
        Key::new(format!("k{i}")).expect("valid key")
    }

    fn region(i: u8) -> RegionId {
        RegionId::new(format!("r{i}")).expect("valid region")
    }

    fn window(start_ms: u64) -> WindowBounds {
        WindowBounds {
            start_ms,
            end_ms: start_ms + 1_000,
        }
    }

    #[test]
    fn the_previous_windows_regions_are_expected_in_the_first_quarter_only() {
        let mut roster = PoolRoster::default();
        roster.record(
            &key(1),
            1_000,
            vec![(region(1), 3), (region(2), 2), (region(3), 0)],
        );
        let present = |id: &RegionId| *id == region(1);
        assert_eq!(
            roster.expected(&key(1), window(2_000), 2_249, present),
            Some(vec![(region(2), 2)]),
            "r1 has asked, r3 was retired"
        );
        assert_eq!(
            roster.expected(&key(1), window(2_000), 2_250, present),
            Some(Vec::new()),
            "the first quarter is over"
        );
        assert_eq!(
            roster.expected(&key(1), window(3_000), 3_000, present),
            None,
            "nothing recorded for the window right before"
        );
        assert_eq!(
            roster.expected(&key(2), window(2_000), 2_000, present),
            None
        );
    }

    /// An answer says what the other retired regions keep, and what the
    /// others reserve and do not hold.
    #[test]
    fn an_answer_counts_what_other_retired_regions_keep() {
        let member = |weight, granted| PoolMember { weight, granted };
        let view = PoolView {
            bounds: window(1_000),
            limit: 600,
            shadow: false,
            regions: vec![
                (region(1), member(1, 100)),
                (region(2), member(0, 120)),
                (region(3), member(0, 30)),
                (region(4), member(2, 50)),
            ],
        };
        let mut roster = PoolRoster::default();
        let answer = roster.answer(&view, &key(1), &region(1), 1_100);
        assert_eq!(answer.retired_kept, 150);
        // L − kept = 450 shared by weights 1 and 2: region 4 is owed 300
        // and holds 50.
        assert_eq!(answer.reserved_unheld, 250);
        let retired = roster.answer(&view, &key(1), &region(2), 1_100);
        assert_eq!(retired.retired_kept, 30, "its own total is not counted");
    }

    /// A region that retired during a window (weight 0 in later records
    /// of it: it handed back what its pace would not need) is expected in
    /// the next window with the weight it had.
    #[test]
    fn a_region_that_retired_during_a_window_is_expected_in_the_next() {
        let mut roster = PoolRoster::default();
        roster.record(&key(1), 1_000, vec![(region(1), 3), (region(2), 2)]);
        roster.record(&key(1), 1_000, vec![(region(1), 3), (region(2), 0)]);
        roster.record(&key(1), 1_000, vec![(region(1), 4)]);
        assert_eq!(
            roster.expected(&key(1), window(2_000), 2_000, |_| false),
            Some(vec![(region(1), 4), (region(2), 2)])
        );
    }

    proptest! {
        #[test]
        fn the_roster_stays_bounded_and_expects_exactly_the_absent_regions(
            records in prop::collection::vec(
                (0u8..4, 0u64..6, prop::collection::btree_map(0u8..8, 0u64..4, 0..8)),
                1..60,
            ),
            present in prop::collection::btree_set(0u8..8, 0..8),
            at in 0u64..1_000,
        ) {
            let mut roster = PoolRoster::default();
            let mut model: BTreeMap<(u64, u8), BTreeMap<RegionId, u64>> = BTreeMap::new();
            for (k, w, regions) in &records {
                let regions: Vec<(RegionId, u64)> =
                    regions.iter().map(|(r, weight)| (region(*r), *weight)).collect();
                roster.record(&key(*k), w * 1_000, regions.clone());
                // A window's record merges: the latest weight ≥ 1 of every
                // region recorded in it.
                model
                    .entry((w * 1_000, *k))
                    .or_default()
                    .extend(regions.into_iter().filter(|(_, weight)| *weight > 0));
                let cells: usize = model.values().map(BTreeMap::len).sum();
                prop_assert_eq!(roster.cells(), cells);
                prop_assert!(roster.cells() <= MAX_ROSTER_CELLS);
            }
            let present_ids: Vec<RegionId> = present.iter().map(|r| region(*r)).collect();
            for k in 0u8..4 {
                for w in 1u64..7 {
                    let now = w * 1_000 + at;
                    let got = roster.expected(&key(k), window(w * 1_000), now, |id| {
                        present_ids.contains(id)
                    });
                    let want = model.get(&((w - 1) * 1_000, k)).map(|regions| {
                        if at >= 250 {
                            Vec::new()
                        } else {
                            regions
                                .iter()
                                .filter(|(id, _)| !present_ids.contains(id))
                                .map(|(id, weight)| (id.clone(), *weight))
                                .collect()
                        }
                    });
                    prop_assert_eq!(got, want);
                }
            }
        }
    }

    #[test]
    fn a_retried_id_goes_out_with_the_total_its_first_attempt_had() {
        let mut asks = CappedAsks::default();
        let caller = Principal::Anonymous;
        let id = RequestId {
            client: crate::ids::ClientId::new("escrow-eu").expect("valid client"),
            seq: 7,
        };
        assert_eq!(asks.total(&caller, Some(&id), 300, Some(200), 1_000), 200);
        // The retry finds another cap (others joined meanwhile): same total.
        assert_eq!(asks.total(&caller, Some(&id), 300, Some(150), 1_010), 200);
        assert_eq!(asks.total(&caller, Some(&id), 300, None, 1_020), 200);
        // Without an id nothing is remembered.
        assert_eq!(asks.total(&caller, None, 300, Some(100), 1_030), 100);
        assert_eq!(asks.len(), 1);
        // An id that went out uncapped stays uncapped on its retry, even
        // if a cap has come into force meanwhile.
        let other = RequestId {
            seq: 8,
            ..id.clone()
        };
        assert_eq!(asks.total(&caller, Some(&other), 300, None, 1_040), 300);
        assert_eq!(
            asks.total(&caller, Some(&other), 300, Some(100), 1_050),
            300
        );
        assert_eq!(asks.len(), 2);
        // Forgotten once its retention is over.
        let later = 1_000 + CAPPED_ASK_RETAIN_MS + 1;
        assert_eq!(asks.total(&caller, Some(&id), 300, Some(250), later), 250);
    }

    #[test]
    fn capped_asks_stay_bounded() {
        let mut asks = CappedAsks::default();
        for seq in 0..(MAX_CAPPED_ASKS as u64 + 10) {
            let id = RequestId {
                client: crate::ids::ClientId::new("c").expect("valid client"),
                seq,
            };
            asks.total(&Principal::Anonymous, Some(&id), 10, Some(5), 0);
        }
        assert_eq!(asks.len(), MAX_CAPPED_ASKS);
    }

    #[test]
    fn the_oldest_windows_go_first_when_full() {
        let mut roster = PoolRoster::default();
        let many: Vec<(RegionId, u64)> = (0..64)
            .map(|i| (RegionId::new(format!("region-{i}")).expect("valid"), 1))
            .collect();
        let windows = (MAX_ROSTER_CELLS / 64 + 10) as u64;
        for w in 0..windows {
            roster.record(&key(1), w * 1_000, many.clone());
        }
        assert_eq!(roster.cells(), MAX_ROSTER_CELLS);
        assert_eq!(roster.len(), MAX_ROSTER_CELLS / 64);
        // The newest window is kept, the oldest are gone.
        let last = (windows - 1) * 1_000;
        assert!(roster
            .expected(&key(1), window(last + 1_000), last + 1_000, |_| false)
            .is_some());
        assert_eq!(
            roster.expected(&key(1), window(1_000), 1_000, |_| false),
            None
        );
        // A window older than every kept one is not recorded.
        roster.record(&key(2), 0, vec![(region(1), 1)]);
        assert_eq!(
            roster.expected(&key(2), window(1_000), 1_000, |_| false),
            None
        );
        assert_eq!(roster.cells(), MAX_ROSTER_CELLS);
    }

    proptest! {
        /// The late hand-backs answered for a window are exactly the most
        /// tokens released in the last quarter of one of the two windows
        /// before it (releases earlier in a window, after it, or of
        /// nothing count for nothing); at most `MAX_ROSTER_WINDOWS`
        /// windows are held.
        #[test]
        fn late_hand_backs_are_the_last_quarters_releases_of_the_window_before(
            releases in prop::collection::vec((0u8..3, 0u64..8, 0u64..1_100, 0u64..50), 0..80),
        ) {
            let mut roster = PoolRoster::default();
            let mut model: BTreeMap<(u8, u64), u64> = BTreeMap::new();
            for (k, w, at, released) in &releases {
                let start = w * 1_000;
                roster.note_release(&key(*k), window(start), start + at, *released);
                if (750..1_000).contains(at) {
                    *model.entry((*k, *w)).or_default() += released;
                }
            }
            for k in 0u8..3 {
                for w in 1u64..9 {
                    let at = |back: u64| {
                        w.checked_sub(back)
                            .and_then(|before| model.get(&(k, before)).copied())
                            .unwrap_or(0)
                    };
                    let want = at(1).max(at(2));
                    prop_assert_eq!(roster.late_released_before(&key(k), window(w * 1_000)), want);
                }
                prop_assert_eq!(roster.late_released_before(&key(k), window(0)), 0);
            }
            prop_assert!(roster.late_release_windows() <= MAX_ROSTER_WINDOWS);
        }
    }

    #[test]
    fn late_hand_backs_keep_the_newest_windows_when_full() {
        let mut roster = PoolRoster::default();
        let windows = (MAX_ROSTER_WINDOWS + 10) as u64;
        for w in 0..windows {
            roster.note_release(&key(1), window(w * 1_000), w * 1_000 + 900, 5);
        }
        assert_eq!(roster.late_release_windows(), MAX_ROSTER_WINDOWS);
        assert_eq!(
            roster.late_released_before(&key(1), window(windows * 1_000)),
            5
        );
        assert_eq!(roster.late_released_before(&key(1), window(1_000)), 0);
        // A window older than every kept one is not recorded.
        roster.note_release(&key(2), window(0), 900, 5);
        assert_eq!(roster.late_released_before(&key(2), window(1_000)), 0);
        assert_eq!(roster.late_release_windows(), MAX_ROSTER_WINDOWS);
    }
}
