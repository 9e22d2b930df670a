//! The static-split baseline: every region gets a fixed share of the limit
//! and admits from it locally, with no coordination at all.
//!
//! The shares come from [`leasehold_core::static_partition`], the one rule
//! every process uses: with `K` regions and limit `L`, the region of rank
//! `i` in sorted region order gets `floor(L/K) + (i < L mod K ? 1 : 0)`.
//! The shares sum to exactly `L`, so the baseline never over-admits
//! (Δ = 0), but a busy region is capped at its share while idle regions
//! strand theirs — the utilisation cost that leasing removes. Ranking by
//! sorted id makes every participant compute the same split whatever order
//! it lists the regions in. Windows here are epoch-aligned on the local
//! [`WallClock`]; the baseline exists for comparison only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use leasehold_core::ids::{Key, RegionId};
use leasehold_core::static_partition as core_partition;
use leasehold_core::window::WindowBounds;

use crate::decision::{allowed, denied, Admission, Decision};
use crate::error::{ClientError, ConfigError};
use crate::limiter::lock;
use crate::transport::WallClock;

/// Splits `limit` over `regions` by the core rule
/// ([`leasehold_core::static_partition::static_partition`]): even shares,
/// the remainder one token each to the first regions in sorted order.
/// Returns `(region, share)` pairs in sorted region order; the shares sum
/// to `limit`.
///
/// Errors: no regions, a duplicate region, or fewer tokens than regions
/// (some region would get nothing).
pub fn split(limit: u64, regions: &[RegionId]) -> Result<Vec<(RegionId, u64)>, ConfigError> {
    let mut shares: Vec<(RegionId, u64)> = core_partition::static_partition(limit, regions)
        .map_err(|e| ConfigError(e.to_string()))?
        .into_iter()
        .map(|slice| (slice.region, slice.tokens))
        .collect();
    shares.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(shares)
}

/// One region's static share of a limit, enforced locally per key.
pub struct StaticPartition {
    share: u64,
    window_ms: u64,
    clock: Arc<dyn WallClock>,
    max_keys: usize,
    used: Mutex<HashMap<String, (u64, u64)>>,
}

impl std::fmt::Debug for StaticPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticPartition")
            .field("share", &self.share)
            .field("window_ms", &self.window_ms)
            .finish_non_exhaustive()
    }
}

impl StaticPartition {
    /// `region`'s share of `limit` per `window_ms` window, out of `regions`.
    pub fn new(
        limit: u64,
        window_ms: u64,
        regions: &[RegionId],
        region: &RegionId,
        clock: Arc<dyn WallClock>,
    ) -> Result<Self, ConfigError> {
        if window_ms == 0 {
            return Err(ConfigError("window_ms must be positive".into()));
        }
        let share = split(limit, regions)?
            .into_iter()
            .find(|(r, _)| r == region)
            .map(|(_, share)| share)
            .ok_or_else(|| {
                ConfigError(format!(
                    "region {region} is not among the partition's regions"
                ))
            })?;
        Ok(StaticPartition {
            share,
            window_ms,
            clock,
            max_keys: 100_000,
            used: Mutex::new(HashMap::new()),
        })
    }

    /// This region's tokens per window.
    pub fn share(&self) -> u64 {
        self.share
    }

    /// Decides locally whether `cost` tokens of `key` may be spent.
    pub fn check(&self, key: &str, cost: u64) -> Result<Decision, ClientError> {
        self.check_labelled(key, cost).map(|a| a.decision)
    }

    /// Like [`check`](Self::check), with the admission's window label.
    pub fn check_labelled(&self, key: &str, cost: u64) -> Result<Admission, ClientError> {
        if cost == 0 {
            return Err(ClientError::InvalidInput("cost must be at least 1".into()));
        }
        let key = Key::new(key)?;
        let now = self.clock.now_ms();
        let window = WindowBounds::containing(now, self.window_ms);
        let mut used = lock(&self.used);
        if used.len() >= self.max_keys && !used.contains_key(key.as_str()) {
            used.retain(|_, (start, _)| *start == window.start_ms);
        }
        let entry = used
            .entry(key.as_str().to_string())
            .or_insert((window.start_ms, 0));
        if entry.0 != window.start_ms {
            *entry = (window.start_ms, 0);
        }
        let left = self.share - entry.1;
        if cost <= left {
            entry.1 += cost;
            Ok(Admission {
                decision: allowed(self.share, left - cost, window.end_ms),
                window_start_ms: Some(window.start_ms),
            })
        } else {
            let retry = window.remaining_lifetime_ms(now);
            Ok(Admission {
                decision: denied(self.share, left, window.end_ms, retry),
                window_start_ms: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn regions(n: usize) -> Vec<RegionId> {
        (0..n)
            .map(|i| RegionId::new(format!("r{i:02}")).expect("valid region"))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        /// Shares sum to the limit, differ by at most one, larger first.
        #[test]
        fn shares_sum_to_the_limit(n in 1usize..20, extra in 0u64..10_000) {
            let limit = n as u64 + extra;
            let shares = split(limit, &regions(n)).expect("valid split");
            prop_assert_eq!(shares.iter().map(|(_, s)| s).sum::<u64>(), limit);
            let max = shares.iter().map(|(_, s)| *s).max().unwrap_or(0);
            let min = shares.iter().map(|(_, s)| *s).min().unwrap_or(0);
            prop_assert!(max - min <= 1);
            prop_assert!(shares.windows(2).all(|p| p[0].1 >= p[1].1));
        }

        /// The split does not depend on the order regions are listed in.
        #[test]
        fn split_ignores_listing_order(n in 1usize..10, limit in 10u64..1000, seed in any::<u64>()) {
            let mut shuffled = regions(n);
            shuffled.rotate_left((seed % n as u64) as usize);
            shuffled.reverse();
            prop_assert_eq!(split(limit, &regions(n)), split(limit, &shuffled));
        }
    }

    #[test]
    fn shares_match_the_core_rule_whatever_the_listing_order() {
        let named: Vec<RegionId> = ["us", "eu", "ap"]
            .iter()
            .map(|n| RegionId::new(*n).expect("valid"))
            .collect();
        let shares = split(11, &named).expect("valid split");
        let expected: Vec<(RegionId, u64)> = [("ap", 4), ("eu", 4), ("us", 3)]
            .iter()
            .map(|(n, s)| (RegionId::new(*n).expect("valid"), *s))
            .collect();
        assert_eq!(shares, expected);
        for slice in core_partition::static_partition(11, &named).expect("valid") {
            let clock = Arc::new(FixedClock(std::sync::atomic::AtomicU64::new(0)));
            let p = StaticPartition::new(11, 1_000, &named, &slice.region, clock).expect("valid");
            assert_eq!(p.share(), slice.tokens, "{}", slice.region);
        }
        let stranger = RegionId::new("sa").expect("valid");
        let clock = Arc::new(FixedClock(std::sync::atomic::AtomicU64::new(0)));
        assert!(StaticPartition::new(11, 1_000, &named, &stranger, clock).is_err());
    }

    #[test]
    fn rejects_bad_partitions() {
        assert!(split(10, &[]).is_err());
        let dup = vec![
            RegionId::new("a").expect("valid"),
            RegionId::new("a").expect("valid"),
        ];
        assert!(split(10, &dup).is_err());
        assert!(split(2, &regions(3)).is_err());
    }

    struct FixedClock(std::sync::atomic::AtomicU64);
    impl WallClock for FixedClock {
        fn now_ms(&self) -> u64 {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[test]
    fn admits_exactly_the_share_per_window() {
        let clock = Arc::new(FixedClock(std::sync::atomic::AtomicU64::new(1_000)));
        let all = regions(3);
        let p = StaticPartition::new(10, 1_000, &all, &all[0], clock.clone()).expect("valid");
        assert_eq!(p.share(), 4);
        let admitted = (0..10)
            .filter(|_| p.check("k", 1).expect("valid").allowed)
            .count();
        assert_eq!(admitted, 4);
        let d = p.check("k", 1).expect("valid");
        assert!(!d.allowed && d.retry_after_ms >= 1);
        clock.0.store(2_000, std::sync::atomic::Ordering::SeqCst);
        assert!(p.check("k", 4).expect("valid").allowed);
        assert!(p.check("k", 0).is_err());
    }
}
