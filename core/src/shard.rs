//! Where keys live when the coordinator runs many Raft groups (shards):
//! every key hashes to one of [`SLOTS`] fixed hash slots, and a versioned
//! [`Placement`] says which shard owns each slot and which members
//! replicate each shard. ADR 0025.
//!
//! This module is the pure placement; what a group serves and how a move's
//! parts are released and acquired, in the replicated state, is
//! [`crate::coordinator::sharding`]; a member's hosting and routing of
//! shards are `leasehold_node::coordinator::shard`.
//!
//! - **A key's slot never changes**: `slot_of(key)` is MurmurHash3 x64-128
//!   (seed 0) of the key's UTF-8 bytes, its first 64-bit half modulo
//!   [`SLOTS`] — computable by any client from the key alone (Python's
//!   `mmh3.hash64(key, 0, signed=False)[0] % 16384`). Growing and
//!   balancing move *slots* between shards; keys never rehash.
//! - **One shard is the default**: [`Placement::meta`] puts every slot on
//!   shard 0 — the meta group, replicated by every member of the cluster
//!   (its Raft membership, so the placement names no replicas for it) —
//!   the layout of a cluster that has never been sharded.
//! - **Every change is checked and versioned**: a change that would leave
//!   a slot without an owning shard, a shard without replicas, or name a
//!   shard that does not exist is refused with a [`PlacementError`] and
//!   leaves the placement as it was; an accepted one raises the version
//!   by one, so a router holding an older version knows it is stale.
//!
//! Laws (property-tested below): every slot is owned by exactly one shard
//! of the placement after any sequence of changes; refused changes change
//! nothing; the version counts the accepted changes; a split leaves the
//! split shard and the new one each about half the slots it had.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fair_throttle::murmur3::murmur3_x64_128;

/// How many hash slots keys are spread over (fixed forever: changing it
/// would move every key).
pub const SLOTS: u16 = 16_384;

/// The most shards a placement holds.
pub const MAX_SHARDS: usize = 1_024;

/// One of the [`SLOTS`] hash slots.
pub type Slot = u16;

/// A member of the coordinator cluster (its Raft node id).
pub type MemberId = u64;

/// A shard: one Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ShardId(pub u32);

/// The hash slot of `key`.
pub fn slot_of(key: &str) -> Slot {
    let (h1, _) = murmur3_x64_128(key.as_bytes(), 0);
    (h1 % u64::from(SLOTS)) as Slot
}

/// Why a placement change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The shard is not in the placement.
    #[error("shard {0} does not exist")]
    NoSuchShard(ShardId),
    /// The shard exists already.
    #[error("shard {0} exists already")]
    ShardExists(ShardId),
    /// A shard needs at least one replica.
    #[error("shard {0} needs at least one replica")]
    NoReplicas(ShardId),
    /// Shard 0's replicas are the cluster's members (its Raft membership):
    /// changed by adding and removing members, never in the placement.
    #[error("shard 0 is replicated by every member of the cluster; add or remove members instead")]
    MetaReplicas,
    /// The slot range is empty or past the last slot.
    #[error("slot range {start}..{end} is not within 0..{SLOTS} or is empty")]
    BadSlotRange {
        /// First slot.
        start: u32,
        /// One past the last slot.
        end: u32,
    },
    /// A shard that still owns slots cannot be removed.
    #[error("shard {shard} still owns {slots} slots")]
    ShardOwnsSlots {
        /// The shard.
        shard: ShardId,
        /// How many slots it owns.
        slots: u32,
    },
    /// A shard with fewer than two slots cannot be split.
    #[error("shard {shard} owns {slots} slots: too few to split")]
    TooFewSlotsToSplit {
        /// The shard.
        shard: ShardId,
        /// How many slots it owns.
        slots: u32,
    },
    /// The placement holds [`MAX_SHARDS`] shards already.
    #[error("a placement holds at most {MAX_SHARDS} shards")]
    TooManyShards,
    /// Every slot of the range is the shard's already: nothing would move.
    #[error("shard {shard} owns every slot of {start}..{end} already: nothing to move")]
    NothingToMove {
        /// First slot.
        start: u32,
        /// One past the last slot.
        end: u32,
        /// The shard named as the new owner.
        shard: ShardId,
    },
    /// The shard has these replicas already.
    #[error("shard {0} has these replicas already: nothing to change")]
    SameReplicas(ShardId),
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Slots `start..end` changing owner from shard `from` to shard `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotMove {
    /// First slot.
    pub start: u32,
    /// One past the last slot.
    pub end: u32,
    /// The owner before.
    pub from: ShardId,
    /// The owner after.
    pub to: ShardId,
}

/// The replica that forms `shard`'s group (its first leader, as a rule):
/// the `shard % n`-th of its `n` replicas in id order, so shards on the
/// same members start with their leaders spread over them. `None` when
/// there is no replica.
pub fn forming_replica(shard: ShardId, replicas: &BTreeSet<MemberId>) -> Option<MemberId> {
    let n = u32::try_from(replicas.len()).ok().filter(|n| *n > 0)?;
    replicas.iter().nth((shard.0 % n) as usize).copied()
}

/// Which shard owns each slot and which members replicate each shard, at
/// a version. Shard 0 always exists and names no replicas: every member
/// of the cluster replicates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    version: u64,
    /// Slot ownership as runs: `start → shard` owns `start..` up to the
    /// next run's start (the first run starts at slot 0).
    runs: BTreeMap<Slot, ShardId>,
    replicas: BTreeMap<ShardId, BTreeSet<MemberId>>,
    /// The replicas each shard past 0 was created with (storage format
    /// 9): its group is formed by their [`forming_replica`] with them as
    /// voters, whatever its replicas became since — a member a replica
    /// change adds joins the group it finds, and never forms one.
    founding: BTreeMap<ShardId, BTreeSet<MemberId>>,
}

/// A placement as storage format 8 kept it (no founding replicas): read
/// with each shard's replicas then as its founding ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementV8 {
    version: u64,
    runs: BTreeMap<Slot, ShardId>,
    replicas: BTreeMap<ShardId, BTreeSet<MemberId>>,
}

impl From<PlacementV8> for Placement {
    fn from(old: PlacementV8) -> Self {
        let founding = old
            .replicas
            .iter()
            .filter(|(shard, _)| **shard != ShardId(0))
            .map(|(shard, replicas)| (*shard, replicas.clone()))
            .collect();
        Placement {
            version: old.version,
            runs: old.runs,
            replicas: old.replicas,
            founding,
        }
    }
}

impl Placement {
    /// One shard (0, the meta group) owning every slot: the placement of a
    /// cluster never sharded (version 0).
    pub fn meta() -> Self {
        Placement {
            version: 0,
            runs: BTreeMap::from([(0, ShardId(0))]),
            replicas: BTreeMap::from([(ShardId(0), BTreeSet::new())]),
            founding: BTreeMap::new(),
        }
    }

    /// The replicas `shard` was created with (see the field's doc); `None`
    /// for shard 0 and shards not in the placement.
    pub fn founding_replicas(&self, shard: ShardId) -> Option<&BTreeSet<MemberId>> {
        self.founding.get(&shard)
    }

    /// Whether `shard` is in the placement.
    pub fn has_shard(&self, shard: ShardId) -> bool {
        self.replicas.contains_key(&shard)
    }

    /// The version: raised by one by every accepted change.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The shard owning `slot`.
    pub fn shard_of_slot(&self, slot: Slot) -> ShardId {
        self.runs
            .range(..=slot)
            .next_back()
            .map_or(ShardId(0), |(_, shard)| *shard)
    }

    /// The shard owning `key`.
    pub fn shard_of(&self, key: &str) -> ShardId {
        self.shard_of_slot(slot_of(key))
    }

    /// The members replicating `shard` (empty for shard 0: every member).
    pub fn replicas(&self, shard: ShardId) -> Option<&BTreeSet<MemberId>> {
        self.replicas.get(&shard)
    }

    /// Every shard, in id order.
    pub fn shards(&self) -> impl Iterator<Item = ShardId> + '_ {
        self.replicas.keys().copied()
    }

    /// The slot runs `(start, end, shard)`, in slot order.
    pub fn runs(&self) -> Vec<(Slot, u32, ShardId)> {
        let mut runs = Vec::with_capacity(self.runs.len());
        let mut iter = self.runs.iter().peekable();
        while let Some((&start, &shard)) = iter.next() {
            let end = iter
                .peek()
                .map_or(u32::from(SLOTS), |(&next, _)| u32::from(next));
            runs.push((start, end, shard));
        }
        runs
    }

    /// How many slots `shard` owns.
    pub fn slot_count(&self, shard: ShardId) -> u32 {
        self.runs()
            .into_iter()
            .filter(|(_, _, owner)| *owner == shard)
            .map(|(start, end, _)| end - u32::from(start))
            .sum()
    }

    /// Adds an empty shard replicated by `members`.
    pub fn add_shard(
        &mut self,
        shard: ShardId,
        members: impl IntoIterator<Item = MemberId>,
    ) -> Result<(), PlacementError> {
        if self.replicas.contains_key(&shard) {
            return Err(PlacementError::ShardExists(shard));
        }
        if self.replicas.len() >= MAX_SHARDS {
            return Err(PlacementError::TooManyShards);
        }
        let members: BTreeSet<MemberId> = members.into_iter().collect();
        if members.is_empty() {
            return Err(PlacementError::NoReplicas(shard));
        }
        self.founding.insert(shard, members.clone());
        self.replicas.insert(shard, members);
        self.version += 1;
        Ok(())
    }

    /// Replaces the members replicating `shard`.
    pub fn set_replicas(
        &mut self,
        shard: ShardId,
        members: impl IntoIterator<Item = MemberId>,
    ) -> Result<(), PlacementError> {
        let members: BTreeSet<MemberId> = members.into_iter().collect();
        if shard == ShardId(0) {
            return Err(PlacementError::MetaReplicas);
        }
        let Some(current) = self.replicas.get_mut(&shard) else {
            return Err(PlacementError::NoSuchShard(shard));
        };
        if members.is_empty() {
            return Err(PlacementError::NoReplicas(shard));
        }
        if *current == members {
            return Err(PlacementError::SameReplicas(shard));
        }
        *current = members;
        self.version += 1;
        Ok(())
    }

    /// Gives the slots `start..end` to `shard`.
    pub fn move_slots(
        &mut self,
        start: u32,
        end: u32,
        shard: ShardId,
    ) -> Result<(), PlacementError> {
        if !(start < end && end <= u32::from(SLOTS)) {
            return Err(PlacementError::BadSlotRange { start, end });
        }
        if !self.replicas.contains_key(&shard) {
            return Err(PlacementError::NoSuchShard(shard));
        }
        let already = self
            .runs()
            .into_iter()
            .filter(|(run_start, run_end, _)| u32::from(*run_start) < end && start < *run_end)
            .all(|(_, _, owner)| owner == shard);
        if already {
            return Err(PlacementError::NothingToMove { start, end, shard });
        }
        let (start, end_slot) = (start as Slot, end);
        // The owner just past the range keeps its slots from `end` on.
        let after = (end_slot < u32::from(SLOTS)).then(|| self.shard_of_slot(end_slot as Slot));
        let inside: Vec<Slot> = self
            .runs
            .range(start..)
            .map(|(&s, _)| s)
            .take_while(|&s| u32::from(s) < end_slot)
            .collect();
        for s in inside {
            self.runs.remove(&s);
        }
        self.runs.insert(start, shard);
        if let Some(after) = after {
            self.runs.entry(end_slot as Slot).or_insert(after);
        }
        self.coalesce();
        self.version += 1;
        Ok(())
    }

    /// Moves the upper half of `shard`'s slots (by count, in slot order)
    /// to the new shard `into`, replicated by `members`: one change.
    pub fn split(
        &mut self,
        shard: ShardId,
        into: ShardId,
        members: impl IntoIterator<Item = MemberId>,
    ) -> Result<(), PlacementError> {
        if !self.replicas.contains_key(&shard) {
            return Err(PlacementError::NoSuchShard(shard));
        }
        let owned = self.slot_count(shard);
        if owned < 2 {
            return Err(PlacementError::TooFewSlotsToSplit {
                shard,
                slots: owned,
            });
        }
        let mut staged = self.clone();
        staged.add_shard(into, members)?;
        let mut keep = owned / 2;
        for (start, end, owner) in self.runs() {
            if owner != shard {
                continue;
            }
            let length = end - u32::from(start);
            if keep >= length {
                keep -= length;
                continue;
            }
            staged.move_slots(u32::from(start) + keep, end, into)?;
            keep = 0;
        }
        staged.version = self.version + 1;
        *self = staged;
        Ok(())
    }

    /// Removes `shard`, which must own no slot and not be shard 0.
    pub fn remove_shard(&mut self, shard: ShardId) -> Result<(), PlacementError> {
        if shard == ShardId(0) {
            return Err(PlacementError::MetaReplicas);
        }
        if !self.replicas.contains_key(&shard) {
            return Err(PlacementError::NoSuchShard(shard));
        }
        let slots = self.slot_count(shard);
        if slots > 0 {
            return Err(PlacementError::ShardOwnsSlots { shard, slots });
        }
        self.replicas.remove(&shard);
        self.founding.remove(&shard);
        self.version += 1;
        Ok(())
    }

    /// The slot ranges whose owner differs between `self` and `after`, as
    /// `(start, end, owner here, owner there)`, in slot order, adjacent
    /// ranges of the same pair merged.
    pub fn moves_to(&self, after: &Placement) -> Vec<SlotMove> {
        let mut starts: BTreeSet<u32> = self.runs.keys().map(|&s| u32::from(s)).collect();
        starts.extend(after.runs.keys().map(|&s| u32::from(s)));
        let mut moves: Vec<SlotMove> = Vec::new();
        let bounds: Vec<u32> = starts.into_iter().chain([u32::from(SLOTS)]).collect();
        for pair in bounds.windows(2) {
            let (start, end) = (pair[0], pair[1]);
            let (from, to) = (
                self.shard_of_slot(start as Slot),
                after.shard_of_slot(start as Slot),
            );
            if from == to {
                continue;
            }
            match moves.last_mut() {
                Some(last) if last.end == start && last.from == from && last.to == to => {
                    last.end = end;
                }
                _ => moves.push(SlotMove {
                    start,
                    end,
                    from,
                    to,
                }),
            }
        }
        moves
    }

    /// Merges adjacent runs of the same shard.
    fn coalesce(&mut self) {
        let mut previous: Option<ShardId> = None;
        let mut redundant = Vec::new();
        for (&start, &shard) in &self.runs {
            if previous == Some(shard) {
                redundant.push(start);
            }
            previous = Some(shard);
        }
        for start in redundant {
            self.runs.remove(&start);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_keys_slot_is_pinned_forever() {
        // Golden values, as Python's `mmh3.hash64(key, 0, signed=False)[0]
        // % 16384` computes them: a change here moves keys between shards.
        assert_eq!(slot_of(""), 0);
        assert_eq!(slot_of("demo/api"), 6_360);
        assert_eq!(slot_of("tenant:acme/llm"), 2_264);
        assert_eq!(slot_of("k"), 13_746);
    }

    #[test]
    fn shards_on_the_same_members_are_formed_by_each_in_turn() {
        let replicas: BTreeSet<MemberId> = [4, 7, 9].into();
        let formers: Vec<_> = (1..=6)
            .map(|s| forming_replica(ShardId(s), &replicas))
            .collect();
        assert_eq!(
            formers,
            [Some(7), Some(9), Some(4), Some(7), Some(9), Some(4)]
        );
        assert_eq!(forming_replica(ShardId(5), &BTreeSet::new()), None);
    }

    #[test]
    fn slots_spread_keys_evenly() {
        let mut counts = vec![0u32; 64];
        for i in 0..64_000 {
            counts[(slot_of(&format!("user:{i}")) / 256) as usize] += 1;
        }
        // 1 000 expected per group of 256 slots.
        assert!(
            counts.iter().all(|&c| (850..=1_150).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn one_shard_is_the_default_and_owns_every_key() {
        let mut p = Placement::meta();
        assert_eq!(p.version(), 0);
        assert_eq!(p.shard_of("anything"), ShardId(0));
        assert_eq!(p.slot_count(ShardId(0)), u32::from(SLOTS));
        assert_eq!(
            p.set_replicas(ShardId(0), [1]),
            Err(PlacementError::MetaReplicas)
        );
        assert_eq!(p, Placement::meta());
    }

    #[test]
    fn a_split_halves_a_shard_and_refusals_change_nothing() {
        let mut p = Placement::meta();
        p.split(ShardId(0), ShardId(1), [4, 5, 6]).unwrap();
        assert_eq!(p.version(), 1);
        assert_eq!(p.slot_count(ShardId(0)), 8_192);
        assert_eq!(p.slot_count(ShardId(1)), 8_192);
        assert_eq!(
            p.runs(),
            vec![(0, 8_192, ShardId(0)), (8_192, 16_384, ShardId(1))]
        );
        let before = p.clone();
        for refused in [
            p.clone().split(ShardId(9), ShardId(2), [1]),
            p.clone().split(ShardId(0), ShardId(1), [1]),
            p.clone().move_slots(5, 5, ShardId(1)),
            p.clone().move_slots(0, 16_385, ShardId(1)),
            p.clone().remove_shard(ShardId(1)),
            p.clone().set_replicas(ShardId(1), []),
        ] {
            assert!(refused.is_err());
        }
        assert!(p.remove_shard(ShardId(0)).is_err());
        assert_eq!(p, before, "refused changes leave it as it was");
        p.move_slots(0, 8_192, ShardId(1)).unwrap();
        assert_eq!(
            p.remove_shard(ShardId(0)),
            Err(PlacementError::MetaReplicas),
            "shard 0, the meta group, stays even when it owns no slot"
        );
        assert_eq!(p.shard_of("anything"), ShardId(1));
        assert_eq!(p.version(), 2);
    }

    #[derive(Debug, Clone)]
    enum Change {
        Add(u32, Vec<MemberId>),
        Replicas(u32, Vec<MemberId>),
        Move(u32, u32, u32),
        Split(u32, u32),
        Remove(u32),
    }

    fn change() -> impl Strategy<Value = Change> {
        let shard = 0u32..6;
        let members = proptest::collection::vec(1u64..8, 0..4);
        prop_oneof![
            (shard.clone(), members.clone()).prop_map(|(s, m)| Change::Add(s, m)),
            (shard.clone(), members.clone()).prop_map(|(s, m)| Change::Replicas(s, m)),
            (0u32..16_500, 0u32..16_500, shard.clone()).prop_map(|(a, b, s)| Change::Move(a, b, s)),
            (shard.clone(), shard.clone()).prop_map(|(a, b)| Change::Split(a, b)),
            shard.prop_map(Change::Remove),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn every_slot_has_exactly_one_existing_owner_whatever_the_changes(
            changes in proptest::collection::vec(change(), 0..40),
        ) {
            let mut p = Placement::meta();
            let mut accepted = 0u64;
            for c in changes {
                let before = p.clone();
                let owned_before = |s: u32| before.slot_count(ShardId(s));
                let result = match &c {
                    Change::Add(s, m) => p.add_shard(ShardId(*s), m.clone()),
                    Change::Replicas(s, m) => p.set_replicas(ShardId(*s), m.clone()),
                    Change::Move(a, b, s) => p.move_slots(*a, *b, ShardId(*s)),
                    Change::Split(a, b) => p.split(ShardId(*a), ShardId(*b), [1]),
                    Change::Remove(s) => p.remove_shard(ShardId(*s)),
                };
                match result {
                    Ok(()) => accepted += 1,
                    Err(_) => prop_assert_eq!(&p, &before, "refused {:?} changed it", c),
                }
                prop_assert_eq!(p.version(), accepted);
                // Runs tile 0..SLOTS, adjacent runs differ, owners exist.
                let runs = p.runs();
                prop_assert_eq!(runs.first().map(|r| r.0), Some(0));
                prop_assert_eq!(runs.last().map(|r| r.1), Some(u32::from(SLOTS)));
                for pair in runs.windows(2) {
                    prop_assert_eq!(pair[0].1, u32::from(pair[1].0));
                    prop_assert_ne!(pair[0].2, pair[1].2);
                }
                let total: u32 = p.shards().map(|s| p.slot_count(s)).sum();
                prop_assert_eq!(total, u32::from(SLOTS));
                for (_, _, owner) in &runs {
                    let replicas = p.replicas(*owner);
                    prop_assert!(replicas.is_some());
                    prop_assert!(*owner == ShardId(0) || replicas.is_some_and(|r| !r.is_empty()));
                }
                prop_assert!(p.has_shard(ShardId(0)), "shard 0 always exists");
                // The moves between two placements name exactly the slots
                // whose owner differs, with both owners.
                let moves = before.moves_to(&p);
                for slot in (0..SLOTS).step_by(97).chain([SLOTS - 1]) {
                    let moved = moves
                        .iter()
                        .find(|m| m.start <= u32::from(slot) && u32::from(slot) < m.end);
                    let (from, to) = (before.shard_of_slot(slot), p.shard_of_slot(slot));
                    match moved {
                        Some(m) => prop_assert_eq!((m.from, m.to), (from, to)),
                        None => prop_assert_eq!(from, to),
                    }
                }
                if let (Change::Split(a, b), Ok(())) = (&c, &result) {
                    let had = owned_before(*a);
                    prop_assert_eq!(p.slot_count(ShardId(*a)), had / 2);
                    prop_assert_eq!(p.slot_count(ShardId(*b)), had - had / 2);
                }
            }
        }
    }
}
