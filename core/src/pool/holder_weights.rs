//! The leader's memory of each *holder*'s weight in a `fair` key's window,
//! so that a region served by several escrow nodes at once weighs, in the
//! pool's max-min, the sum of what its nodes declare — once per node,
//! however often a node restarts.
//!
//! A holder ([`Holder`]) is who declares a weight for its region:
//! - **a named node** ([`Holder::Node`]): an escrow node that sends the
//!   name it keeps across restarts (`PoolGrantRequest.node`: its pod or
//!   host name), qualified by the caller's principal. A restart, a crash
//!   loop or a rolling update of that node replaces its declaration
//!   instead of adding one: the new process is the same holder.
//! - **a process** ([`Holder::Process`]): a caller that names no node, by
//!   its session (`PoolGrantRequest.holder`, a fresh one per process
//!   start): each start of it is a holder of its own (as before ADR 0022's
//!   amendment; an older escrow node).
//! - **the anonymous holder** ([`Holder::Anonymous`]): a region's calls
//!   naming neither.
//!
//! Each holder declares the weight of the tenants it serves, split by its
//! share of each tenant's demand (the demand board counts each holder's
//! report apart, see [`super::demand_board`]), so the region's weight is
//! the sum over its holders: what one process serving all of them would
//! declare. The replicated command carries that sum as its
//! `region_weight` ([`super::desk::PoolDesk::plan`] writes it in), so the
//! state machine stays deterministic and knows nothing of holders. What a
//! region *holds* stays counted per replicated total, whoever holds it:
//! none of this touches Δ.
//!
//! A holder's weight counts from its call until the window ends; a release
//! or a retired join by it sets it to 0 (that holder stops reserving; the
//! region's other holders do not). A named node that died and does not
//! come back keeps its weight to the window's end, as its holding stays
//! spent.
//!
//! A hint, not state: the leader's memory only, never replicated, never a
//! bound on admissions (Δ rests on the replicated totals alone). After a
//! leader change the sum starts again from the holders that call. Bounded:
//! at most [`MAX_HOLDER_WINDOWS`] (key, window) entries (the oldest window
//! goes first) and [`MAX_HOLDERS_PER_REGION`] holders per region of one
//! window (the one that called least recently goes first).

use std::collections::BTreeMap;

use crate::ids::{ClientId, Key, RegionId};
use crate::principal::Principal;

/// Most (key, window) entries kept.
pub const MAX_HOLDER_WINDOWS: usize = 16_384;
/// Most holders remembered per region of one window.
pub const MAX_HOLDERS_PER_REGION: usize = 16;
/// Most regions remembered per window (as the replicated window record).
pub const MAX_HOLDER_REGIONS: usize = 64;

/// Who declares a region's weight and demand (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Holder {
    /// A node that names itself: the same holder across its restarts.
    Node {
        /// The caller's principal (one principal's names never replace
        /// another's).
        principal: Principal,
        /// The name the node keeps across restarts.
        name: ClientId,
    },
    /// A process that names no node, by its session id: a new holder at
    /// each start.
    Process(ClientId),
    /// A region's calls that name neither.
    Anonymous,
}

impl Holder {
    /// The holder of a call by `principal` naming node `node` (if any) from
    /// session `session` (if any): the node when named, else the session,
    /// else the region's anonymous holder.
    pub fn of(principal: &Principal, node: Option<ClientId>, session: Option<ClientId>) -> Self {
        match (node, session) {
            (Some(name), _) => Holder::Node {
                principal: principal.clone(),
                name,
            },
            (None, Some(session)) => Holder::Process(session),
            (None, None) => Holder::Anonymous,
        }
    }
}

/// One holder's declared weight and the order of its latest call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Declared {
    weight: u64,
    /// A counter of declarations: larger is more recent.
    turn: u64,
}

type Entry = BTreeMap<RegionId, BTreeMap<Holder, Declared>>;

/// See the module doc.
#[derive(Debug, Default, Clone)]
pub struct HolderWeights {
    entries: BTreeMap<(u64, Key), Entry>,
    turn: u64,
}

impl HolderWeights {
    /// Records that `holder` of `region` declares `weight` in `key`'s
    /// window starting at `window_start_ms`, and returns the region's
    /// weight there: the sum over its holders (at least `weight`). Beyond
    /// the bounds (see the module doc) the region's weight is `weight`
    /// alone, as if no other holder were known.
    pub fn declare(
        &mut self,
        key: &Key,
        window_start_ms: u64,
        region: &RegionId,
        holder: &Holder,
        weight: u64,
    ) -> u64 {
        self.set(key, window_start_ms, region, holder, weight)
            .map_or(weight, |sum| sum.max(weight))
    }

    /// Records that `holder` of `region` stopped reserving in `key`'s
    /// window starting at `window_start_ms` (it released, or joined
    /// retired): its weight is 0 there. Returns the region's weight now:
    /// the sum over its other holders.
    pub fn retire(
        &mut self,
        key: &Key,
        window_start_ms: u64,
        region: &RegionId,
        holder: &Holder,
    ) -> u64 {
        self.set(key, window_start_ms, region, holder, 0)
            .unwrap_or(0)
    }

    /// The region's weight as its holders declared it, if any did.
    pub fn region_weight(&self, key: &Key, window_start_ms: u64, region: &RegionId) -> Option<u64> {
        let holders = self
            .entries
            .get(&(window_start_ms, key.clone()))?
            .get(region)?;
        Some(sum(holders))
    }

    /// (key, window) entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn set(
        &mut self,
        key: &Key,
        window_start_ms: u64,
        region: &RegionId,
        holder: &Holder,
        weight: u64,
    ) -> Option<u64> {
        let id = (window_start_ms, key.clone());
        if !self.entries.contains_key(&id) && self.entries.len() >= MAX_HOLDER_WINDOWS {
            // The oldest window goes first; one older than every kept
            // window is not kept at all.
            let oldest = self.entries.keys().next()?.clone();
            if oldest > id {
                return None;
            }
            self.entries.remove(&oldest);
        }
        let entry = self.entries.entry(id).or_default();
        if !entry.contains_key(region) && entry.len() >= MAX_HOLDER_REGIONS {
            return None;
        }
        let holders = entry.entry(region.clone()).or_default();
        if !holders.contains_key(holder) && holders.len() >= MAX_HOLDERS_PER_REGION {
            let stalest = holders
                .iter()
                .min_by_key(|(_, declared)| declared.turn)
                .map(|(holder, _)| holder.clone());
            if let Some(stalest) = stalest {
                holders.remove(&stalest);
            }
        }
        self.turn += 1;
        holders.insert(
            holder.clone(),
            Declared {
                weight,
                turn: self.turn,
            },
        );
        Some(sum(holders))
    }
}

fn sum(holders: &BTreeMap<Holder, Declared>) -> u64 {
    holders.values().fold(0u64, |total, declared| {
        total.saturating_add(declared.weight)
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn key() -> Key {
        Key::new("p/k").expect("valid")
    }

    fn region(name: &str) -> RegionId {
        RegionId::new(name).expect("valid")
    }

    fn holder(name: &str) -> Holder {
        Holder::Process(ClientId::new(name).expect("valid"))
    }

    #[test]
    fn a_call_is_held_by_its_node_else_its_session_else_the_region() {
        let principal = Principal::Region(region("eu"));
        let name = ClientId::new("escrow-0").unwrap();
        let session = ClientId::new("c01").unwrap();
        assert_eq!(
            Holder::of(&principal, Some(name.clone()), Some(session.clone())),
            Holder::Node {
                principal: principal.clone(),
                name: name.clone()
            }
        );
        assert_eq!(
            Holder::of(&principal, None, Some(session.clone())),
            Holder::Process(session)
        );
        assert_eq!(Holder::of(&principal, None, None), Holder::Anonymous);
        // One name under two principals is two holders.
        assert_ne!(
            Holder::of(&principal, Some(name.clone()), None),
            Holder::of(&Principal::Anonymous, Some(name), None)
        );
    }

    #[test]
    fn a_named_node_restarting_weighs_once_and_a_process_restarting_weighs_again() {
        let mut weights = HolderWeights::default();
        let eu = region("eu");
        // A named node declares 2, restarts (a new session, the same
        // name) and declares 2 again, four more times: the region weighs 2.
        for session in 0..5 {
            let holder = Holder::of(
                &Principal::Anonymous,
                Some(ClientId::new("escrow-0").unwrap()),
                Some(ClientId::new(format!("c{session}")).unwrap()),
            );
            assert_eq!(weights.declare(&key(), 0, &eu, &holder, 2), 2);
        }
        // A process that names no node is a holder per start (an older
        // escrow node): its two starts weigh 2 + 2.
        let us = region("us");
        weights.declare(&key(), 0, &us, &holder("c0"), 2);
        assert_eq!(weights.declare(&key(), 0, &us, &holder("c1"), 2), 4);
    }

    #[test]
    fn a_region_weighs_the_sum_of_its_holders_and_a_retired_one_counts_zero() {
        let mut weights = HolderWeights::default();
        let eu = region("eu");
        assert_eq!(weights.declare(&key(), 0, &eu, &holder("a"), 3_000), 3_000);
        assert_eq!(weights.declare(&key(), 0, &eu, &holder("b"), 2_000), 5_000);
        // A holder's new declaration replaces its old one.
        assert_eq!(weights.declare(&key(), 0, &eu, &holder("a"), 1_000), 3_000);
        assert_eq!(weights.retire(&key(), 0, &eu, &holder("b")), 1_000);
        // Other regions and windows are apart.
        assert_eq!(
            weights.declare(&key(), 0, &region("us"), &holder("a"), 7),
            7
        );
        assert_eq!(weights.declare(&key(), 1_000, &eu, &holder("b"), 9), 9);
        assert_eq!(weights.region_weight(&key(), 0, &eu), Some(1_000));
        assert_eq!(weights.region_weight(&key(), 2_000, &eu), None);
    }

    #[test]
    fn beyond_its_holders_bound_the_least_recent_holder_goes() {
        let mut weights = HolderWeights::default();
        assert!(weights.is_empty());
        let eu = region("eu");
        for i in 0..MAX_HOLDERS_PER_REGION {
            weights.declare(&key(), 0, &eu, &holder(&format!("h{i:02}")), 1);
        }
        assert!(!weights.is_empty());
        // h00 calls again (weight 50): h01 is now the stalest.
        weights.declare(&key(), 0, &eu, &holder("h00"), 50);
        let others = MAX_HOLDERS_PER_REGION as u64 - 2;
        let sum = weights.declare(&key(), 0, &eu, &holder("new"), 100);
        assert_eq!(sum, 100 + 50 + others, "h01 went, not h00");
        // h01 was forgotten: declaring it again evicts the next stalest
        // (h02), never the recent h00.
        let again = weights.declare(&key(), 0, &eu, &holder("h01"), 1);
        assert_eq!(again, sum);
    }

    #[test]
    fn beyond_its_regions_bound_a_new_region_is_weighed_alone() {
        let mut weights = HolderWeights::default();
        for i in 0..MAX_HOLDER_REGIONS {
            weights.declare(&key(), 0, &region(&format!("r{i}")), &holder("a"), 1);
        }
        let full = region("one-too-many");
        weights.declare(&key(), 0, &full, &holder("a"), 7);
        assert_eq!(weights.declare(&key(), 0, &full, &holder("b"), 5), 5);
        assert_eq!(weights.region_weight(&key(), 0, &full), None);
        // A region it tracks is still summed.
        assert_eq!(
            weights.declare(&key(), 0, &region("r0"), &holder("b"), 2),
            3
        );
    }

    #[test]
    fn beyond_its_windows_bound_the_oldest_window_goes() {
        let mut weights = HolderWeights::default();
        let eu = region("eu");
        for start in 1..=MAX_HOLDER_WINDOWS as u64 {
            weights.declare(&key(), start, &eu, &holder("a"), 1);
        }
        assert_eq!(weights.len(), MAX_HOLDER_WINDOWS);
        // Older than every kept window: not kept, weighed alone.
        assert_eq!(weights.declare(&key(), 0, &eu, &holder("b"), 5), 5);
        assert_eq!(weights.region_weight(&key(), 0, &eu), None);
        // A newer window replaces the oldest.
        weights.declare(&key(), u64::MAX, &eu, &holder("a"), 1);
        assert_eq!(weights.len(), MAX_HOLDER_WINDOWS);
        assert_eq!(weights.region_weight(&key(), 1, &eu), None);
    }

    proptest! {
        /// Whatever the order of declarations, restarts and retirements, a
        /// region's weight is the sum over its named nodes of each one's
        /// latest declaration (0 once retired) — never more for a node
        /// that restarted — at least the declaring node's own weight.
        #[test]
        fn the_region_weight_sums_each_nodes_latest_declaration_across_restarts(
            calls in proptest::collection::vec(
                (0usize..4, 0usize..2, 0u64..5_000, 0u8..3),
                1..80,
            ),
        ) {
            let mut weights = HolderWeights::default();
            let regions = [region("eu"), region("us")];
            let mut latest = [[0u64; 4]; 2];
            let mut sessions = [0u32; 4];
            for (who, at, weight, action) in calls {
                // 0: declare, 1: restart then declare, 2: retire.
                if action == 1 {
                    sessions[who] += 1;
                }
                let name = ClientId::new(format!("escrow-{who}")).unwrap();
                let session = ClientId::new(format!("c{who}-{}", sessions[who])).unwrap();
                let held = Holder::of(&Principal::Anonymous, Some(name), Some(session));
                let answer = if action == 2 {
                    latest[at][who] = 0;
                    weights.retire(&key(), 0, &regions[at], &held)
                } else {
                    latest[at][who] = weight;
                    weights.declare(&key(), 0, &regions[at], &held, weight)
                };
                let expected: u64 = latest[at].iter().sum();
                prop_assert_eq!(answer, expected.max(if action == 2 { 0 } else { weight }));
                prop_assert_eq!(weights.region_weight(&key(), 0, &regions[at]), Some(expected));
            }
        }

        /// Whatever the order of declarations and retirements, a region's
        /// weight is the sum of its holders' latest declarations (0 once
        /// retired), at least the declaring holder's own weight.
        #[test]
        fn the_region_weight_is_the_sum_of_the_latest_declarations(
            calls in proptest::collection::vec((0usize..4, 0usize..2, 0u64..5_000, any::<bool>()), 1..60),
        ) {
            let mut weights = HolderWeights::default();
            let regions = [region("eu"), region("us")];
            let mut latest = [[0u64; 4]; 2];
            for (who, at, weight, retire) in calls {
                let name = holder(&format!("h{who}"));
                let answer = if retire {
                    latest[at][who] = 0;
                    weights.retire(&key(), 0, &regions[at], &name)
                } else {
                    latest[at][who] = weight;
                    weights.declare(&key(), 0, &regions[at], &name, weight)
                };
                let expected: u64 = latest[at].iter().sum();
                prop_assert_eq!(answer, expected);
                let floor = if retire { 0 } else { weight };
                prop_assert!(answer >= floor);
                prop_assert_eq!(weights.region_weight(&key(), 0, &regions[at]), Some(expected));
            }
        }
    }
}
