//! The region fair pool: weighted max-min sharing of one window's limit `L`
//! across regions, with exact integer arithmetic.
//!
//! A region asks for a *total* grant for the window (`want_total`) and gets
//! back its new total, which never decreases within the window. For the asking
//! region `r` with weight `W_r`, among the active regions (every region that
//! asked at least once in the window):
//!
//! ```text
//! kept        = Σ granted_j over regions of weight 0   (retired: they reserve nothing more)
//! g_j         = floor(W_j · (L − kept) / ΣW)       (u128 product, guarantee of j)
//! others_hold = Σ_{j ≠ r} max(granted_j, g_j)
//! ceiling     = max(granted_r, L − others_hold)    (saturating subtraction)
//! granted_r   = min(want_total, ceiling)           (only if want_total > granted_r)
//! ```
//!
//! **Retiring** (reclaim): a region that has gone idle hands back what it did
//! not spend: its total drops to what it keeps (what it already spent) and its
//! weight to 0 ([`retire`]). It then holds exactly what it kept and reserves
//! no guarantee, so the regions still asking share `L − kept` by their
//! weights. A retired region that asks again rejoins with its weight, from
//! what it kept.
//!
//! Laws (each property-tested below):
//! - **Safety:** `Σ_j granted_j ≤ L` after any sequence of grants and
//!   retirements.
//! - **Monotonic:** a region's total never decreases within a window except
//!   when it retires itself.
//! - **Guarantee:** every other active region keeps at least `max(granted_j, g_j)`
//!   reserved: a grant to `r` never eats into it.
//! - **Reclaim:** when satisfied regions retire keeping their demand, the
//!   regions still asking end within a few tokens of the flat weighted
//!   water-fill of the live demand ([`crate::water_fill`]).
//!
//! [`next_grant`] is the pure arithmetic (used by the coordinator state
//! machine, where the regions live inside a window record); [`RegionFairPool`]
//! is a self-contained in-process pool with window rolling, for tests and
//! single-arbiter setups.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::RegionId;
use crate::window::WindowBounds;

/// One active region of a pool: its latest weight and its total grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PoolMember {
    /// The region's weight (Σ of its active tenants' weights); ≥ 1 when it asks.
    pub weight: u64,
    /// The region's total grant in the window.
    pub granted: u64,
}

/// Where a region stands in a window's pool, from the pool's state: what
/// the pool reserves for it and the most it could hold if it asked now.
/// Both are hints to the region (they change as others join, ask and
/// retire); only [`next_grant`] moves budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PoolStanding {
    /// `g_r = floor(W_r · (L − kept) / ΣW)`: the region's guarantee among
    /// the active regions (0 for a retired region).
    pub guarantee: u64,
    /// `max(granted_r, L − others_hold)`: asking for this total now would
    /// grant exactly it; asking for more grants no more.
    pub ceiling: u64,
}

/// Σ of the weights (`asker` included) and the base the guarantees share:
/// `L −` what retired (weight-0) regions keep.
fn shared_base(
    limit: u64,
    asker: PoolMember,
    others: impl Iterator<Item = PoolMember> + Clone,
) -> (u128, u64) {
    let total_weight: u128 =
        others.clone().map(|m| u128::from(m.weight)).sum::<u128>() + u128::from(asker.weight);
    let kept: u64 = others
        .filter(|m| m.weight == 0)
        .fold(0u64, |sum, m| sum.saturating_add(m.granted));
    (total_weight, limit.saturating_sub(kept))
}

/// The asker's [`PoolStanding`] with `asker`'s weight and total among
/// `others` (every other active region, as for [`next_grant`]).
pub fn standing<I>(limit: u64, asker: PoolMember, others: I) -> PoolStanding
where
    I: IntoIterator<Item = PoolMember>,
    I::IntoIter: Clone,
{
    let others = others.into_iter();
    let (total_weight, base) = shared_base(limit, asker, others.clone());
    let others_hold: u128 = others
        .map(|m| u128::from(m.granted.max(guarantee(base, m.weight, total_weight))))
        .sum();
    let free = u128::from(limit).saturating_sub(others_hold);
    // free <= limit, so it fits in u64.
    let free = u64::try_from(free).unwrap_or(limit);
    PoolStanding {
        guarantee: guarantee(base, asker.weight, total_weight),
        ceiling: asker.granted.max(free),
    }
}

/// What the pool reserves for the regions of `others` beyond what they
/// hold: `Σ_j max(granted_j, g_j) − granted_j`, their guarantees not yet
/// taken (with `asker` counted in the weights, as for [`standing`]). A
/// region at its ceiling may find more once these regions release.
pub fn reserved_unheld<I>(limit: u64, asker: PoolMember, others: I) -> u64
where
    I: IntoIterator<Item = PoolMember>,
    I::IntoIter: Clone,
{
    let others = others.into_iter();
    let (total_weight, base) = shared_base(limit, asker, others.clone());
    others.fold(0u64, |sum, m| {
        sum.saturating_add(guarantee(base, m.weight, total_weight).saturating_sub(m.granted))
    })
}

/// The asking region's new total grant (see the module doc for the formula).
///
/// `asker` carries the asker's refreshed weight and current total; `others`
/// yields every *other* active region (iterated twice, so it must be `Clone`;
/// callers pass them in sorted region order). The result is `asker.granted`
/// when `want_total <= asker.granted` (grants never shrink), and otherwise lies
/// in `[asker.granted, max(asker.granted, L − others_hold)]`.
pub fn next_grant<I>(limit: u64, asker: PoolMember, want_total: u64, others: I) -> u64
where
    I: IntoIterator<Item = PoolMember>,
    I::IntoIter: Clone,
{
    if want_total <= asker.granted {
        return asker.granted;
    }
    want_total.min(standing(limit, asker, others).ceiling)
}

/// `g = floor(weight · limit / total_weight)`, zero when `total_weight` is zero.
pub fn guarantee(limit: u64, weight: u64, total_weight: u128) -> u64 {
    if total_weight == 0 {
        return 0;
    }
    let g = u128::from(weight) * u128::from(limit) / total_weight;
    // weight <= total_weight, so g <= limit.
    u64::try_from(g).unwrap_or(limit)
}

/// A region's retirement: its total drops from `from_total` to
/// `keep_total` and its weight to 0, so it stops reserving a guarantee and
/// the tokens it did not spend go back to the pool for this window.
///
/// Refused (`None`, nothing changes) when `from_total` is not the region's
/// current total — the caller acted on a stale view (say, a grant whose
/// answer it lost) and must learn its real total first — or when
/// `keep_total > from_total` (a retirement never raises a total).
pub fn retire(current: PoolMember, from_total: u64, keep_total: u64) -> Option<PoolMember> {
    if from_total != current.granted || keep_total > from_total {
        return None;
    }
    Some(PoolMember {
        weight: 0,
        granted: keep_total,
    })
}

/// Why a pool call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FairPoolError {
    /// The pool limit must be ≥ 1.
    #[error("pool limit must be at least 1")]
    ZeroLimit,
    /// The window length must be ≥ 1 ms.
    #[error("pool window_ms must be at least 1")]
    ZeroWindow,
    /// A region's weight must be ≥ 1.
    #[error("region weight must be at least 1")]
    ZeroWeight,
}

/// A snapshot of a pool for observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionFairPoolStats {
    /// The current window, if any region asked yet.
    pub window: Option<WindowBounds>,
    /// L.
    pub limit: u64,
    /// Σ granted over the active regions.
    pub total_granted: u64,
    /// Active regions in sorted order.
    pub regions: Vec<(RegionId, PoolMember)>,
}

/// An in-process region fair pool for one key: one arbiter, epoch-aligned
/// windows of `window_ms`, active set cleared when the window rolls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionFairPool {
    limit: u64,
    window_ms: u64,
    window: Option<WindowBounds>,
    regions: BTreeMap<RegionId, PoolMember>,
}

impl RegionFairPool {
    /// A pool sharing `limit` tokens per window of `window_ms`.
    pub fn new(limit: u64, window_ms: u64) -> Result<Self, FairPoolError> {
        if limit == 0 {
            return Err(FairPoolError::ZeroLimit);
        }
        if window_ms == 0 {
            return Err(FairPoolError::ZeroWindow);
        }
        Ok(Self {
            limit,
            window_ms,
            window: None,
            regions: BTreeMap::new(),
        })
    }

    /// L.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Raises `region`'s total grant for the window containing `now_ms`
    /// towards `want_total` and returns its new total. The region joins the
    /// active set (reserving its guarantee) even when `want_total` is 0, and
    /// its weight is refreshed on every call.
    pub fn grant(
        &mut self,
        region: &RegionId,
        weight: u64,
        want_total: u64,
        now_ms: u64,
    ) -> Result<u64, FairPoolError> {
        if weight == 0 {
            return Err(FairPoolError::ZeroWeight);
        }
        self.roll(now_ms);
        let current = self.regions.get(region).map_or(0, |m| m.granted);
        let asker = PoolMember {
            weight,
            granted: current,
        };
        let others = self
            .regions
            .iter()
            .filter(|(id, _)| *id != region)
            .map(|(_, m)| *m);
        let granted = next_grant(self.limit, asker, want_total, others);
        self.regions
            .insert(region.clone(), PoolMember { weight, granted });
        Ok(granted)
    }

    /// Where `region` stands in the current window ([`standing`]); `None`
    /// when it has not joined it.
    pub fn standing(&self, region: &RegionId) -> Option<PoolStanding> {
        let asker = *self.regions.get(region)?;
        let others = self
            .regions
            .iter()
            .filter(|(id, _)| *id != region)
            .map(|(_, m)| *m);
        Some(standing(self.limit, asker, others))
    }

    /// Retires `region` in the window containing `now_ms`, keeping
    /// `keep_total` of its `from_total` ([`retire`]); returns the tokens
    /// handed back, `None` when refused (stale `from_total`, or a keep above it).
    pub fn retire(
        &mut self,
        region: &RegionId,
        from_total: u64,
        keep_total: u64,
        now_ms: u64,
    ) -> Option<u64> {
        self.roll(now_ms);
        let current = self.regions.get(region).copied().unwrap_or_default();
        let retired = retire(current, from_total, keep_total)?;
        if self.regions.contains_key(region) {
            self.regions.insert(region.clone(), retired);
        }
        Some(from_total - keep_total)
    }

    /// Drops `region` from the active set of the window containing `now_ms`;
    /// its grant returns to the pool. (An administrative operation: if the
    /// region already spent its grant, the window can then exceed L.)
    pub fn release(&mut self, region: &RegionId, now_ms: u64) {
        self.roll(now_ms);
        self.regions.remove(region);
    }

    /// The pool's current state.
    pub fn stats(&self) -> RegionFairPoolStats {
        RegionFairPoolStats {
            window: self.window,
            limit: self.limit,
            total_granted: self.regions.values().map(|m| m.granted).sum(),
            regions: self
                .regions
                .iter()
                .map(|(id, m)| (id.clone(), *m))
                .collect(),
        }
    }

    fn roll(&mut self, now_ms: u64) {
        let stale = match self.window {
            Some(w) => now_ms >= w.end_ms,
            None => true,
        };
        if stale {
            self.window = Some(WindowBounds::containing(now_ms, self.window_ms));
            self.regions.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn region(s: &str) -> RegionId {
        RegionId::new(s).unwrap()
    }

    /// The golden vector of the reference pool (L = 100, one window).
    pub(crate) const GOLDEN: [(&str, u64, u64, u64); 10] = [
        ("us", 3, 10, 10),
        ("eu", 1, 40, 25),
        ("us", 3, 80, 75),
        ("ap", 2, 30, 0),
        ("eu", 1, 5, 25),
        ("us", 3, 200, 75),
        ("ap", 2, 60, 0),
        ("eu", 1, 100, 25),
        ("us", 3, 100, 75),
        ("ap", 2, 100, 0),
    ];

    #[test]
    fn golden_vector() {
        let t0 = 1_699_999_980_000;
        let mut pool = RegionFairPool::new(100, 60_000).unwrap();
        for (name, weight, want, expected) in GOLDEN {
            assert_eq!(
                pool.grant(&region(name), weight, want, t0).unwrap(),
                expected,
                "{name} w{weight} want {want}"
            );
        }
        assert_eq!(pool.stats().total_granted, 100);
    }

    #[test]
    fn zero_weight_is_refused() {
        let mut pool = RegionFairPool::new(10, 1000).unwrap();
        assert_eq!(
            pool.grant(&region("a"), 0, 5, 0),
            Err(FairPoolError::ZeroWeight)
        );
        assert!(pool.stats().regions.is_empty());
    }

    #[test]
    fn window_roll_clears_grants() {
        let mut pool = RegionFairPool::new(10, 1000).unwrap();
        assert_eq!(pool.grant(&region("a"), 1, 10, 10).unwrap(), 10);
        assert_eq!(pool.grant(&region("b"), 1, 10, 999).unwrap(), 0);
        assert_eq!(pool.grant(&region("b"), 1, 10, 1000).unwrap(), 10);
    }

    #[test]
    fn release_returns_the_grant_to_the_pool() {
        let mut pool = RegionFairPool::new(10, 1000).unwrap();
        assert_eq!(pool.grant(&region("a"), 1, 10, 0).unwrap(), 10);
        pool.release(&region("a"), 1);
        assert_eq!(pool.grant(&region("b"), 1, 10, 2).unwrap(), 10);
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let asker = PoolMember {
            weight: u64::MAX,
            granted: 0,
        };
        let others = [PoolMember {
            weight: u64::MAX,
            granted: 0,
        }; 3];
        let g = next_grant(u64::MAX, asker, u64::MAX, others);
        assert_eq!(g, u64::MAX - 3 * (u64::MAX / 4));
    }

    proptest! {
        /// Σ granted ≤ L, every total is monotonic, and each call returns at
        /// most `max(want_total, previous total)`.
        #[test]
        fn pool_is_safe_and_monotonic(
            limit in 1u64..500,
            calls in proptest::collection::vec((0usize..4, 1u64..10, 0u64..600), 1..60),
        ) {
            let names = ["a", "b", "c", "d"];
            let mut pool = RegionFairPool::new(limit, 1000).unwrap();
            let mut last = BTreeMap::new();
            for (r, weight, want) in calls {
                let id = region(names[r]);
                let before = *last.get(&r).unwrap_or(&0u64);
                let now = pool.grant(&id, weight, want, 0).unwrap();
                prop_assert!(now >= before);
                prop_assert!(now <= want.max(before));
                last.insert(r, now);
                prop_assert!(pool.stats().total_granted <= limit);
            }
        }

        /// Grants and retirements in any order: Σ granted ≤ L, a grant never
        /// lowers a total, a retirement lowers it to exactly what is kept.
        #[test]
        fn retiring_keeps_the_pool_safe(
            limit in 1u64..500,
            calls in proptest::collection::vec(
                (0usize..4, 1u64..10, 0u64..600, any::<bool>(), 0u64..100), 1..80),
        ) {
            let names = ["a", "b", "c", "d"];
            let mut pool = RegionFairPool::new(limit, 1000).unwrap();
            for (r, weight, want, retire_it, keep_pct) in calls {
                let id = region(names[r]);
                let before = pool.stats().regions.iter()
                    .find(|(name, _)| *name == id).map_or(0, |(_, m)| m.granted);
                if retire_it {
                    let keep = before * keep_pct / 100;
                    // A stale view is refused and changes nothing.
                    prop_assert_eq!(pool.retire(&id, before + 1, keep, 0), None);
                    prop_assert_eq!(pool.retire(&id, before, keep, 0), Some(before - keep));
                    let member = pool.stats().regions.iter()
                        .find(|(name, _)| *name == id).map(|(_, m)| *m);
                    if let Some(member) = member {
                        prop_assert_eq!(member, PoolMember { weight: 0, granted: keep });
                    }
                } else {
                    let now = pool.grant(&id, weight, want, 0).unwrap();
                    prop_assert!(now >= before);
                    prop_assert!(now <= want.max(before));
                }
                prop_assert!(pool.stats().total_granted <= limit);
            }
        }

        /// Every region joins, then asks for its demand round after round;
        /// a region whose demand is met retires keeping it. The regions end
        /// within a few tokens of the flat weighted water-fill of the
        /// demand: what the satisfied regions did not need went to the
        /// others by weight.
        #[test]
        fn retiring_satisfied_regions_reaches_the_water_fill(
            limit in 1u64..2000,
            regions in proptest::collection::vec((1u64..10, 0u64..1500), 2..6),
        ) {
            let names: Vec<RegionId> =
                (0..regions.len()).map(|i| region(&format!("r{i}"))).collect();
            let mut pool = RegionFairPool::new(limit, 1000).unwrap();
            for (i, (weight, _)) in regions.iter().enumerate() {
                pool.grant(&names[i], *weight, 0, 0).unwrap();
            }
            let mut granted = vec![0u64; regions.len()];
            let mut retired = vec![false; regions.len()];
            for _round in 0..4 * regions.len() + 4 {
                for (i, (weight, demand)) in regions.iter().enumerate() {
                    if !retired[i] {
                        granted[i] = pool.grant(&names[i], *weight, *demand, 0).unwrap();
                    }
                }
                for (i, (_, demand)) in regions.iter().enumerate() {
                    if !retired[i] && granted[i] >= *demand {
                        prop_assert_eq!(pool.retire(&names[i], granted[i], *demand, 0), Some(0));
                        retired[i] = true;
                    }
                }
            }
            let claims: Vec<crate::water_fill::Claim> = regions
                .iter()
                .map(|(weight, demand)| crate::water_fill::Claim { weight: *weight, demand: *demand })
                .collect();
            let ideal = crate::water_fill::water_fill(limit, &claims);
            let total: u64 = granted.iter().sum();
            prop_assert!(total <= limit);
            let slack = regions.len() as u64 + 1;
            for i in 0..regions.len() {
                prop_assert!(
                    granted[i].abs_diff(ideal[i]) <= slack,
                    "region {} got {} vs water-fill {} (limit {}, {:?})",
                    i, granted[i], ideal[i], limit, regions
                );
            }
            let demand: u64 = regions.iter().map(|(_, d)| d).sum();
            prop_assert!(total + slack >= demand.min(limit));
        }

        /// The standing is exact: asking for the ceiling grants exactly
        /// it, and asking for more grants no more; a guarantee nobody
        /// encroaches on is within the ceiling.
        #[test]
        fn standing_predicts_the_grant(
            limit in 1u64..1000,
            members in proptest::collection::vec((0u64..10, 0u64..400), 0..5),
            asker_weight in 1u64..10,
            asker_granted in 0u64..400,
            extra in 0u64..500,
        ) {
            let others: Vec<PoolMember> = members
                .iter()
                .map(|(weight, granted)| PoolMember { weight: *weight, granted: *granted })
                .collect();
            let asker = PoolMember { weight: asker_weight, granted: asker_granted };
            let s = standing(limit, asker, others.clone());
            prop_assert!(s.ceiling >= asker_granted);
            prop_assert_eq!(next_grant(limit, asker, s.ceiling, others.clone()), s.ceiling);
            prop_assert_eq!(next_grant(limit, asker, s.ceiling + extra, others.clone()), s.ceiling);
            // With no retired region and every other region holding at most
            // its guarantee, the asker's guarantee is within its reach.
            let total_weight: u128 = others.iter().map(|m| u128::from(m.weight)).sum::<u128>()
                + u128::from(asker_weight);
            let within = others.iter().all(|m| {
                m.weight > 0 && m.granted <= guarantee(limit, m.weight, total_weight)
            });
            if within {
                prop_assert!(s.ceiling >= s.guarantee);
            }
        }

        /// A region asking alone first gets min(want, L); a region whose
        /// guarantee is untouched by others gets at least min(want, g).
        #[test]
        fn guarantee_is_reserved_for_active_regions(
            limit in 1u64..1000,
            w_a in 1u64..10,
            w_b in 1u64..10,
            want_a in 0u64..2000,
        ) {
            let mut pool = RegionFairPool::new(limit, 1000).unwrap();
            // b joins first with want 0: it only reserves its guarantee.
            prop_assert_eq!(pool.grant(&region("b"), w_b, 0, 0).unwrap(), 0);
            let got_a = pool.grant(&region("a"), w_a, want_a, 0).unwrap();
            let g_b = guarantee(limit, w_b, u128::from(w_a + w_b));
            prop_assert_eq!(got_a, want_a.min(limit - g_b));
            // b can still take its guarantee.
            prop_assert!(pool.grant(&region("b"), w_b, g_b, 0).unwrap() >= g_b);
        }
    }
}
