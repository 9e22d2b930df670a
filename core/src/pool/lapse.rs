//! The lapse of the region fair pool's reserves in a window's last eighth:
//! which regions the leader retires, keeping all they hold, before it
//! proposes a late ask.
//!
//! The pool reserves each active region's guarantee whatever it holds
//! ([`crate::pool::fair_pool`]), so that a region asking later in the window
//! still finds its share. Late in the window the reserve mostly protects
//! nothing: a region that needed its share has asked for it by then, and
//! one whose guarantee grew as others retired does not hear of it before
//! its next call. A reserve nobody takes is lost to the window. So in the
//! window's last `1 / RESERVES_LAPSE_SHARE` (coordinator time) the leader,
//! before proposing a grant that asks beyond the asker's ceiling while
//! other regions reserve more than they hold, proposes in the same group a
//! `PoolRelease` for every other region still of weight ≥ 1, keeping all
//! it holds ([`lapsing_reserves`]): each of them holds exactly what it
//! held and reserves nothing more (its weight drops to 0, as for any
//! retirement), and the ask may take everything no region holds. A region retired so that asks again
//! rejoins with its weight and gets what is still free — the price of the
//! lapse: in the last eighth, what is not held goes to whoever asks first.
//!
//! This uses only commands every member applies already (a retirement
//! keeping its whole total), so it changes nothing replicated and needs
//! no upgrade order; the pool's own rule still bounds every grant, so no
//! lapse can grant past `L`. A release that meets a total changed since
//! the view was read is refused as stale and changes nothing.
//!
//! Laws (property-tested below): after the listed regions retire, the
//! asker's ceiling is everything no other region holds; no region's total
//! changes; only regions of weight ≥ 1 are listed; nothing is listed
//! before the last eighth, when the ask does not go beyond the asker's
//! ceiling, or when that ceiling is already all no other region holds.

use crate::coordinator::{Command, PoolView};
use crate::ids::{Key, RegionId};
use crate::pool::fair_pool::{standing, PoolMember};
use crate::principal::Principal;
use crate::window::WindowBounds;

/// Reserves lapse in the last `1 / RESERVES_LAPSE_SHARE` of a window.
pub const RESERVES_LAPSE_SHARE: u64 = 8;

/// Whether a pool's reserves lapse at coordinator time `now_ms` in
/// `window`: its last [`RESERVES_LAPSE_SHARE`]-th.
pub fn reserves_lapse(window: WindowBounds, now_ms: u64) -> bool {
    let length = window.end_ms.saturating_sub(window.start_ms);
    now_ms < window.end_ms && now_ms >= window.end_ms - length / RESERVES_LAPSE_SHARE
}

/// The regions to retire, each with the total it keeps (all it holds),
/// before `region` asks `view`'s pool for `want_total` with
/// `region_weight` at coordinator time `now_ms`: in the window's last
/// eighth, when the ask goes beyond the asker's ceiling and the other
/// regions reserve more than they hold, every other region of weight ≥ 1
/// (retiring one that holds at least its guarantee changes no one's
/// ceiling, and one left out would see its guarantee grow as the others
/// retire). Empty otherwise, and under a shadow policy (which grants
/// beyond the fair total anyway).
pub fn lapsing_reserves(
    view: &PoolView,
    region: &RegionId,
    region_weight: u64,
    want_total: u64,
    now_ms: u64,
) -> Vec<(RegionId, u64)> {
    if view.shadow || !reserves_lapse(view.bounds, now_ms) {
        return Vec::new();
    }
    let own = view
        .regions
        .iter()
        .find(|(id, _)| id == region)
        .map_or(PoolMember::default(), |(_, member)| *member);
    let asker = PoolMember {
        weight: region_weight.max(1),
        granted: own.granted,
    };
    let others = view
        .regions
        .iter()
        .filter(|(id, _)| id != region)
        .map(|(_, member)| *member);
    let ceiling = standing(view.limit, asker, others.clone()).ceiling;
    let others_hold = others.fold(0u64, |sum, m| sum.saturating_add(m.granted));
    let unheld = own.granted.max(view.limit.saturating_sub(others_hold));
    if want_total <= ceiling || ceiling >= unheld {
        return Vec::new();
    }
    view.regions
        .iter()
        .filter(|(id, member)| id != region && member.weight > 0)
        .map(|(id, member)| (id.clone(), member.granted))
        .collect()
}

/// The commands that lapse the reserves before `region` asks `key`'s
/// pool `view` for `want_total` with `region_weight` at coordinator time
/// `now_ms`: for each region of [`lapsing_reserves`], a `PoolRelease` of
/// `view`'s window keeping its whole total, proposed by `caller` (the
/// leader). Propose them in one group with the grant, before it.
pub fn lapse_commands(
    view: &PoolView,
    key: &Key,
    region: &RegionId,
    region_weight: u64,
    want_total: u64,
    now_ms: u64,
    caller: &Principal,
) -> Vec<Command> {
    lapsing_reserves(view, region, region_weight, want_total, now_ms)
        .into_iter()
        .map(|(other, total)| Command::PoolRelease {
            key: key.clone(),
            region: other,
            from_total: total,
            keep_total: total,
            window_start_ms: view.bounds.start_ms,
            request_id: None,
            caller: caller.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::fair_pool::retire;
    use proptest::prelude::*;

    fn region(i: usize) -> RegionId {
        RegionId::new(format!("r{i}")).expect("valid region")
    }

    fn view(limit: u64, members: &[(u64, u64)]) -> PoolView {
        PoolView {
            bounds: WindowBounds {
                start_ms: 1_000,
                end_ms: 2_000,
            },
            limit,
            shadow: false,
            regions: members
                .iter()
                .enumerate()
                .map(|(i, (weight, granted))| {
                    (
                        region(i),
                        PoolMember {
                            weight: *weight,
                            granted: *granted,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn the_last_eighth_is_when_reserves_lapse() {
        let window = WindowBounds {
            start_ms: 1_000,
            end_ms: 2_000,
        };
        assert!(!reserves_lapse(window, 1_874));
        assert!(reserves_lapse(window, 1_875));
        assert!(reserves_lapse(window, 1_999));
        assert!(!reserves_lapse(window, 2_000));
    }

    #[test]
    fn a_late_ask_at_the_ceiling_lapses_the_reserves_held_by_no_one() {
        // L = 600: r0 (weight 1) holds 222 and asks for more; r1 (weight 1)
        // holds 150 of a 222 guarantee; r2 and r3 retired keeping 157.
        let pool = view(600, &[(1, 222), (1, 150), (0, 126), (0, 31)]);
        assert_eq!(
            lapsing_reserves(&pool, &region(0), 1, 300, 1_905),
            vec![(region(1), 150)]
        );
        // As commands: r1 retires keeping its 150, in this window.
        let key = Key::new("k").expect("valid key");
        assert_eq!(
            lapse_commands(
                &pool,
                &key,
                &region(0),
                1,
                300,
                1_905,
                &Principal::Member(1)
            ),
            vec![Command::PoolRelease {
                key: key.clone(),
                region: region(1),
                from_total: 150,
                keep_total: 150,
                window_start_ms: 1_000,
                request_id: None,
                caller: Principal::Member(1),
            }]
        );
        // Not before the last eighth; not for an ask within the ceiling.
        assert!(lapsing_reserves(&pool, &region(0), 1, 300, 1_874).is_empty());
        assert!(lapsing_reserves(&pool, &region(0), 1, 222, 1_905).is_empty());
        // Not when every other region holds at least its guarantee.
        let held = view(600, &[(1, 222), (1, 222), (0, 126), (0, 30)]);
        assert!(lapsing_reserves(&held, &region(0), 1, 300, 1_905).is_empty());
        // Not under a shadow policy.
        let shadow = PoolView {
            shadow: true,
            ..pool
        };
        assert!(lapsing_reserves(&shadow, &region(0), 1, 300, 1_905).is_empty());
    }

    proptest! {
        #[test]
        fn after_the_lapse_a_late_ask_may_take_all_no_other_region_holds(
            limit in 1u64..2_000,
            members in prop::collection::vec((0u64..5, 0u64..800), 1..6),
            asker_weight in 1u64..5,
            want_total in 0u64..2_500,
            at in 0u64..1_000,
        ) {
            // Totals as a pool could hold them: Σ ≤ L.
            let mut left = limit;
            let members: Vec<(u64, u64)> = members
                .into_iter()
                .map(|(weight, granted)| {
                    let granted = granted.min(left);
                    left -= granted;
                    (weight, granted)
                })
                .collect();
            let pool = view(limit, &members);
            let asker = region(0);
            let own = pool.regions[0].1;
            let asking = PoolMember { weight: asker_weight, granted: own.granted };
            let ceiling = |pool: &PoolView| {
                standing(limit, asking, pool.regions[1..].iter().map(|(_, m)| *m)).ceiling
            };
            let others_hold: u64 = pool.regions[1..].iter().map(|(_, m)| m.granted).sum();
            let unheld = own.granted.max(limit - others_hold);
            let lapsing = lapsing_reserves(&pool, &asker, asker_weight, want_total, 1_000 + at);
            let lapses = at >= 875 && want_total > ceiling(&pool) && ceiling(&pool) < unheld;
            prop_assert_eq!(!lapsing.is_empty(), lapses);
            // Apply the retirements as the pool does.
            let mut after = pool.clone();
            for (id, keep) in &lapsing {
                prop_assert!(*id != asker);
                let slot = after.regions.iter_mut().find(|(r, _)| r == id).expect("listed");
                prop_assert!(slot.1.weight > 0, "a retired region is not listed");
                slot.1 = retire(slot.1, *keep, *keep).expect("its current total");
            }
            for ((_, b), (_, a)) in pool.regions.iter().zip(&after.regions) {
                prop_assert_eq!(b.granted, a.granted, "no total changes");
            }
            if lapses {
                prop_assert_eq!(ceiling(&after), unheld);
            }
        }
    }
}
