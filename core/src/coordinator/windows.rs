//! The window table: per key, the live window record and the end of the last
//! window created, with a deadline index so collection is deterministic and
//! costs only what it collects.
//!
//! # Window creation rule
//! A key's window is created on first touch at clock `now`: the aligned window
//! `[floor(now / w)·w, floor(now / w)·w + w)` of the governing policy's
//! `window_ms = w`, except that its start is raised to the end of the key's
//! previous window when the aligned start would be earlier (possible only
//! after a `window_ms` change). Law: **a key's window starts strictly
//! increase and its windows never overlap in time**, so `(key, start)` names
//! exactly one window ever (two windows sharing a label could pool their
//! admissions, or let a late reconcile of the old one credit the new one).
//!
//! To keep that law after a record is collected, the key keeps a tombstone
//! (`last_end_ms`) for its own *retention*: the window length of its last
//! window, raised by every policy change that gives the key a longer window
//! while the entry exists. Once `now ≥ last_end_ms + retention`, every
//! aligned window of a length `≤ retention` that contains `now` starts after
//! `last_end_ms` anyway, so the tombstone is dropped: a key's tombstone lives
//! as long as its own window, not the longest window of any policy (a daily
//! policy elsewhere does not keep a minute key's tombstone for a day).
//!
//! A window *longer* than the dropped tombstone's retention can only come
//! from a later policy change that lengthened the key's window. Each such
//! change (a `SetPolicy` or `DeletePolicy` after which the window governing
//! a prefix is longer than before) files a **growth floor** for that prefix:
//! `floor = forgotten_end_ms` (the largest `last_end_ms` of any tombstone
//! dropped so far, so at least the end of every dropped window of a key under
//! the prefix) valid until `change time + new window length`. A key with no
//! entry starts its new window no earlier than the growth floors of its
//! prefixes. Proof sketch: a key dropped at `D ≥ E + retention` (E its last
//! end) that later opens a window of length `w' > retention` at `t < E + w'`
//! (otherwise alignment alone puts the start after E) had its governing
//! window cross from below `w'` to at least `w'` after `D`; the last such
//! crossing at `T ≥ D` filed a floor `≥ E` for a prefix of the key, valid
//! until at least `T + w' > E + w' > t`. With unchanged window lengths no
//! floor is filed and nothing bites; after a window length grows, the first
//! windows of keys under that prefix may start at the floor instead of their
//! aligned start (shortened, never overlapping an earlier window).
//!
//! # The next window
//! A `fair` key's window right after its live one may be opened early, in
//! the live window's last quarter, by a pool join for it
//! ([`super::pool`]'s `PoolJoinNext`): the record is kept beside the live
//! one ([`WindowTable::next_or_create`]) with the bounds the creation rule
//! gives at the live window's end — so it starts exactly there — and
//! becomes the live window when that one ends (on collection, or on the
//! first touch after it). The key's tombstone then names the next window's
//! end. The law above holds: the next window starts where the live one
//! ends, and no third window opens before both have ended.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::region_uses::RegionUses;
use crate::ids::{Key, RegionId};
use crate::policy::{Policy, PolicyKind, PolicyTable};
use crate::shadow::ShadowTally;
use crate::window::WindowBounds;

/// One region's use of one window.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct RegionUse {
    /// Total granted to the region in the window (lease grants plus pool grants).
    pub granted: u64,
    /// Total credited back by the region.
    pub returned: u64,
    /// Whether a non-empty reconcile from this region was already applied.
    pub reconciled: bool,
    /// The region's latest pool weight (0 until it calls `PoolGrant`).
    pub pool_weight: u64,
}

/// The accounting of one live window of one key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct WindowRecord {
    /// The window's bounds, fixed at creation.
    pub bounds: WindowBounds,
    /// Effective limit: the policy limit at creation, lowered (never raised)
    /// by later policy changes.
    pub limit: u64,
    /// The governing policy's kind, refreshed on policy changes.
    pub kind: PolicyKind,
    /// Σ granted over regions.
    pub granted: u64,
    /// Σ credited back over regions.
    pub returned: u64,
    /// Per-region use, sorted by region.
    pub regions: RegionUses<RegionUse>,
    /// What a shadow policy handed out beyond what it admits, in this window.
    pub shadow: ShadowTally,
}

impl WindowRecord {
    fn new(bounds: WindowBounds, policy: &Policy, limit: u64) -> Self {
        WindowRecord {
            bounds,
            limit,
            kind: policy.kind,
            granted: 0,
            returned: 0,
            regions: RegionUses::new(),
            shadow: ShadowTally::default(),
        }
    }

    /// Tokens currently out: `granted − returned` (never negative since each
    /// region returns at most what it was granted).
    pub fn outstanding(&self) -> u64 {
        self.granted.saturating_sub(self.returned)
    }

    /// What a counter lease may still take: `limit − outstanding`, saturating.
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.outstanding())
    }
}

/// One key's entry: its live window (if any) and its tombstone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KeyWindows {
    live: Option<WindowRecord>,
    /// End of the last window created for this key.
    last_end_ms: u64,
    /// How long the tombstone outlives `last_end_ms`: the length of the last
    /// window, raised by later policy changes that lengthen the key's window.
    retention_ms: u64,
    /// The deadline under which this key is filed in the index.
    deadline_ms: u64,
}

impl KeyWindows {
    /// When the tombstone may be dropped.
    fn tombstone_expiry_ms(&self) -> u64 {
        self.last_end_ms.saturating_add(self.retention_ms)
    }
}

/// A lower bound on new window starts of keys under a prefix whose window
/// length grew (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct GrowthFloor {
    /// No new window of a key without an entry starts before this.
    floor_ms: u64,
    /// The floor is dropped once the clock reaches this.
    until_ms: u64,
}

/// One key's whole window state as it moves from one shard to another:
/// its entry (live window, tombstone) and its next window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedKey {
    key: Key,
    entry: KeyWindows,
    next: Option<WindowRecord>,
}

impl MovedKey {
    /// The key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// An upper bound of its encoded size, in bytes: the key, each
    /// record's regions at their longest encoding, and the fixed fields.
    pub fn size_bound(&self) -> usize {
        const FIXED: usize = 128;
        const PER_REGION: usize = 48;
        let record = |r: &WindowRecord| {
            FIXED
                + r.regions
                    .iter()
                    .map(|(region, _)| region.as_str().len() + PER_REGION)
                    .sum::<usize>()
        };
        FIXED
            + self.key.as_str().len()
            + self.entry.live.as_ref().map_or(0, record)
            + self.next.as_ref().map_or(0, record)
    }

    /// When nothing of it matters any more: its tombstone's expiry (after
    /// its live and next windows have ended).
    pub fn expires_ms(&self) -> u64 {
        let next_end = self.next.as_ref().map_or(0, |r| r.bounds.end_ms);
        self.entry.tombstone_expiry_ms().max(next_end)
    }
}

/// What every key of a table must respect even without an entry: carried
/// with moved keys (see [`WindowTable::put_floors`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedFloors {
    forgotten_end_ms: u64,
    growth_floors: Vec<(String, GrowthFloor)>,
    restored_at_ms: u64,
}

impl MovedFloors {
    /// When the floors stop mattering: the last growth floor's end. (The
    /// forgotten end and the restore seal are kept for good.)
    pub fn growth_floors_until_ms(&self) -> u64 {
        self.growth_floors
            .iter()
            .map(|(_, f)| f.until_ms)
            .max()
            .unwrap_or(0)
    }
}

/// All keys' windows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct WindowTable {
    /// Each entry shared with the state's copies until it changes
    /// (`Arc::make_mut`): a snapshot's copy costs the map, not the records.
    keys: BTreeMap<Key, Arc<KeyWindows>>,
    /// `(deadline_ms, key)`: a live window's end, or a tombstone's expiry.
    deadlines: BTreeSet<(u64, Key)>,
    /// Largest `last_end_ms` of any dropped tombstone (monotonic).
    forgotten_end_ms: u64,
    /// Growth floors by policy prefix; one per prefix (merged by maximum).
    growth_floors: BTreeMap<String, GrowthFloor>,
    /// Each key's next window, opened early (see the module doc); only
    /// for keys whose live window has not ended. (Storage format 4.)
    next: BTreeMap<Key, Arc<WindowRecord>>,
    /// When this state was last restored onto a new cluster, from a backup
    /// or from a survivor of a lost quorum (0: never): see [`seals`].
    /// (Last: storage format 7.)
    restored_at_ms: u64,
}

/// Whether a window starting at `start_ms`, of a policy whose windows last
/// `window_ms`, is sealed by a restore at `restored_at_ms` (0: none): it
/// starts before `restored_at_ms + window_ms`.
///
/// The cluster the state came from may have granted, after the state was
/// taken and before the restore, in any window live then — and, for a
/// `fair` key, in the window after it (joined ahead in the live one's last
/// quarter): every such window starts before `restored_at_ms + window_ms`
/// when `restored_at_ms` is no earlier than that cluster's last clock. A
/// sealed window grants nothing more (its limit is 0); returns are still
/// credited. So no window ever admits grants from both clusters, and Σ
/// granted per window stays within L across a restore, at the cost of the
/// rest of each key's current window and its next one.
pub fn seals(restored_at_ms: u64, start_ms: u64, window_ms: u64) -> bool {
    restored_at_ms != 0 && start_ms < restored_at_ms.saturating_add(window_ms)
}

impl WindowTable {
    /// Records that, at `now_ms`, a policy change moved the window length
    /// governing keys under `prefix` from `before` to `after` (`None`: no
    /// policy). A longer window files a growth floor for the prefix.
    pub fn on_window_length_change(
        &mut self,
        prefix: &str,
        before: Option<u64>,
        after: Option<u64>,
        now_ms: u64,
    ) {
        let Some(after) = after else {
            return;
        };
        if after <= before.unwrap_or(0) || self.forgotten_end_ms == 0 {
            return;
        }
        let until_ms = now_ms.saturating_add(after);
        let floor = self
            .growth_floors
            .entry(prefix.to_string())
            .or_insert(GrowthFloor {
                floor_ms: 0,
                until_ms: 0,
            });
        floor.floor_ms = floor.floor_ms.max(self.forgotten_end_ms);
        floor.until_ms = floor.until_ms.max(until_ms);
    }

    /// The largest growth floor of a prefix of `key` still valid at `now_ms`.
    fn growth_floor(&self, key: &Key, now_ms: u64) -> u64 {
        let key = key.as_str();
        (0..=key.len())
            .filter(|&end| key.is_char_boundary(end))
            .filter_map(|end| self.growth_floors.get(&key[..end]))
            .filter(|floor| floor.until_ms > now_ms)
            .map(|floor| floor.floor_ms)
            .max()
            .unwrap_or(0)
    }

    /// The key's live window at `now_ms`, if one exists: the live record,
    /// or — once that has ended, before a collection rolled it — the next
    /// window when `now_ms` lies in it.
    pub fn live(&self, key: &Key, now_ms: u64) -> Option<&WindowRecord> {
        let live = self
            .keys
            .get(key)?
            .live
            .as_ref()
            .filter(|r| r.bounds.end_ms > now_ms);
        live.or_else(|| {
            self.next
                .get(key)
                .map(|r| &**r)
                .filter(|r| r.bounds.start_ms <= now_ms && r.bounds.end_ms > now_ms)
        })
    }

    /// The key's next window (opened early, see the module doc), if any.
    pub fn next(&self, key: &Key) -> Option<&WindowRecord> {
        self.next.get(key).map(|r| &**r)
    }

    /// The key's next window, mutable, if any (copied first if a copy of
    /// the state shares it).
    pub fn next_mut(&mut self, key: &Key) -> Option<&mut WindowRecord> {
        self.next.get_mut(key).map(Arc::make_mut)
    }

    /// Makes the key's next window its live one when the live one has
    /// ended and `now_ms` lies in the next (what a collection at `now_ms`
    /// does for this key).
    fn roll(&mut self, key: &Key, now_ms: u64) {
        let Some(entry) = self.keys.get(key) else {
            return;
        };
        if entry
            .live
            .as_ref()
            .is_some_and(|r| r.bounds.end_ms > now_ms)
        {
            return;
        }
        let due = self
            .next
            .get(key)
            .is_some_and(|r| r.bounds.start_ms <= now_ms && r.bounds.end_ms > now_ms);
        if !due {
            return;
        }
        let Some(next) = self.next.remove(key) else {
            return;
        };
        let Some(entry) = self.keys.get_mut(key).map(Arc::make_mut) else {
            return;
        };
        self.deadlines.remove(&(entry.deadline_ms, key.clone()));
        self.deadlines.insert((next.bounds.end_ms, key.clone()));
        entry.deadline_ms = next.bounds.end_ms;
        entry.live = Some(Arc::unwrap_or_clone(next));
    }

    /// The key's next window, opened under `policy` if there is none yet:
    /// it starts where the live window at `now_ms` ends (the creation rule
    /// at that instant). `None` when the key has no live window at `now_ms`.
    pub fn next_or_create(
        &mut self,
        key: &Key,
        policy: &Policy,
        now_ms: u64,
    ) -> Option<&mut WindowRecord> {
        self.roll(key, now_ms);
        let live_end = self
            .keys
            .get(key)?
            .live
            .as_ref()
            .filter(|r| r.bounds.end_ms > now_ms)?
            .bounds
            .end_ms;
        if !self.next.contains_key(key) {
            let bounds = self.next_bounds(key, policy.window_ms, live_end);
            let opening_limit = self.opening_limit(&bounds, policy);
            let entry = Arc::make_mut(self.keys.get_mut(key)?);
            entry.last_end_ms = bounds.end_ms;
            entry.retention_ms = policy.window_ms;
            let record = WindowRecord::new(bounds, policy, opening_limit);
            self.next.insert(key.clone(), Arc::new(record));
        }
        self.next.get_mut(key).map(Arc::make_mut)
    }

    /// The key's live window at `now_ms`, mutable. Callers collect garbage
    /// first, so a record present here is live.
    pub fn live_mut(&mut self, key: &Key, now_ms: u64) -> Option<&mut WindowRecord> {
        self.roll(key, now_ms);
        let live = self.keys.get(key)?.live.as_ref()?;
        if live.bounds.end_ms <= now_ms {
            return None;
        }
        Arc::make_mut(self.keys.get_mut(key)?).live.as_mut()
    }

    /// The bounds a window created for `key` at `now_ms` under a policy with
    /// `window_ms` gets (the creation rule of the module doc).
    pub fn next_bounds(&self, key: &Key, window_ms: u64, now_ms: u64) -> WindowBounds {
        let aligned = WindowBounds::containing(now_ms, window_ms);
        // A key with an entry knows its own last end; one without falls back
        // on the growth floors of its prefixes.
        let floor = match self.keys.get(key) {
            Some(entry) => entry.last_end_ms,
            None => self.growth_floor(key, now_ms),
        };
        // Floors are ends of windows that are over, so they are <= now_ms
        // (the `min` only guards that), and the window still contains now_ms.
        let floor = floor.min(now_ms);
        WindowBounds {
            start_ms: aligned.start_ms.max(floor),
            end_ms: aligned.end_ms,
        }
    }

    /// The key's live window at `now_ms`, created under `policy` if there is none.
    ///
    /// Every admission goes through here, so the common case — the key has a
    /// live window — costs two lookups and no copy of the key; the key is
    /// copied only when a window opens.
    pub fn live_or_create(&mut self, key: &Key, policy: &Policy, now_ms: u64) -> &mut WindowRecord {
        // (No roll here: `apply` collects at `now_ms` first, which makes an
        // ended live window's next one live.)
        if self
            .keys
            .get(key)
            .and_then(|entry| entry.live.as_ref())
            .is_none_or(|r| r.bounds.end_ms <= now_ms)
        {
            return self.open_window(key, policy, now_ms);
        }
        self.keys
            .get_mut(key)
            .and_then(|entry| Arc::make_mut(entry).live.as_mut())
            .expect("a live window was found just above and nothing has removed it")
    }

    /// Opens a window for `key` at `now_ms` under `policy` (the creation
    /// rule of the module doc), replacing an ended one or a tombstone.
    fn open_window(&mut self, key: &Key, policy: &Policy, now_ms: u64) -> &mut WindowRecord {
        let bounds = self.next_bounds(key, policy.window_ms, now_ms);
        let limit = self.opening_limit(&bounds, policy);
        let entry = Arc::make_mut(self.keys.entry(key.clone()).or_insert_with(|| {
            Arc::new(KeyWindows {
                live: None,
                last_end_ms: 0,
                retention_ms: 0,
                deadline_ms: 0,
            })
        }));
        self.deadlines.remove(&(entry.deadline_ms, key.clone()));
        self.deadlines.insert((bounds.end_ms, key.clone()));
        entry.deadline_ms = bounds.end_ms;
        entry.last_end_ms = bounds.end_ms;
        entry.retention_ms = policy.window_ms;
        entry.live.insert(WindowRecord::new(bounds, policy, limit))
    }

    /// Seals the windows a restore at `restored_at_ms` must not grant in
    /// ([`seals`]; a later restore moves the seal forward, never back):
    /// live and next records sealed now get limit 0, and so will every
    /// record created sealed later. A key's window length is its governing
    /// policy's (the record's own length without one).
    pub fn seal_after_restore(&mut self, restored_at_ms: u64, policies: &PolicyTable) {
        self.restored_at_ms = self.restored_at_ms.max(restored_at_ms);
        let at = self.restored_at_ms;
        let live = self
            .keys
            .iter_mut()
            .filter_map(|(key, entry)| Some((key, Arc::make_mut(entry).live.as_mut()?)));
        let next = self
            .next
            .iter_mut()
            .map(|(key, record)| (key, Arc::make_mut(record)));
        for (key, record) in live.chain(next) {
            let window_ms = policies
                .lookup(key.as_str())
                .map(|policy| policy.window_ms)
                .unwrap_or(record.bounds.end_ms.saturating_sub(record.bounds.start_ms));
            if seals(at, record.bounds.start_ms, window_ms) {
                record.limit = 0;
            }
        }
    }

    /// The limit a window with `bounds` opens with under `policy`: the
    /// policy's, or 0 when a restore seals it ([`seals`]).
    pub fn opening_limit(&self, bounds: &WindowBounds, policy: &Policy) -> u64 {
        if seals(self.restored_at_ms, bounds.start_ms, policy.window_ms) {
            0
        } else {
            policy.limit
        }
    }

    /// When the state was last restored (0: never).
    pub fn restored_at_ms(&self) -> u64 {
        self.restored_at_ms
    }

    /// Applies the limit-change rule after the policy table changed: every
    /// live window of a key that still has a governing policy gets
    /// `limit = min(limit, governing limit)` and the governing kind. Keys
    /// left without a policy keep their window unchanged until it ends.
    /// Every entry's tombstone retention grows to the governing window
    /// length if that is longer (see the module doc).
    pub fn on_policies_changed(&mut self, policies: &PolicyTable) {
        for (key, entry) in self.keys.iter_mut() {
            let Some(policy) = policies.lookup(key.as_str()) else {
                continue;
            };
            let entry = Arc::make_mut(entry);
            if policy.window_ms > entry.retention_ms {
                entry.retention_ms = policy.window_ms;
                if entry.live.is_none() {
                    // A tombstone is filed under its expiry: re-file it.
                    let expiry = entry.tombstone_expiry_ms();
                    self.deadlines.remove(&(entry.deadline_ms, key.clone()));
                    self.deadlines.insert((expiry, key.clone()));
                    entry.deadline_ms = expiry;
                }
            }
            let next = self.next.get_mut(key).map(Arc::make_mut);
            for record in entry.live.as_mut().into_iter().chain(next) {
                record.limit = record.limit.min(policy.limit);
                record.kind = policy.kind;
            }
        }
    }

    /// Removes and returns the window state of every key `moving` selects
    /// (its live window, tombstone and next window), with what every key
    /// of any prefix must also respect ([`MovedFloors`]): a shard handing
    /// those keys to another ([`super::sharding`]).
    pub fn take_keys(&mut self, moving: impl Fn(&Key) -> bool) -> (Vec<MovedKey>, MovedFloors) {
        let keys: Vec<Key> = self.keys.keys().filter(|k| moving(k)).cloned().collect();
        let mut moved = Vec::with_capacity(keys.len());
        for key in keys {
            let Some(entry) = self.keys.remove(&key) else {
                continue;
            };
            self.deadlines.remove(&(entry.deadline_ms, key.clone()));
            let next = self.next.remove(&key).map(Arc::unwrap_or_clone);
            moved.push(MovedKey {
                key,
                entry: Arc::unwrap_or_clone(entry),
                next,
            });
        }
        (moved, self.floors())
    }

    /// What keys with no entry must respect here: the growth floors, the
    /// end of every forgotten tombstone and the restore seal.
    pub fn floors(&self) -> MovedFloors {
        MovedFloors {
            forgotten_end_ms: self.forgotten_end_ms,
            growth_floors: self
                .growth_floors
                .iter()
                .map(|(prefix, floor)| (prefix.clone(), *floor))
                .collect(),
            restored_at_ms: self.restored_at_ms,
        }
    }

    /// Takes in keys another shard handed over ([`Self::take_keys`]). A
    /// key this table already holds (it cannot, while each slot has one
    /// owner) keeps whichever entry ends later, so no window start ever
    /// goes back.
    pub fn put_keys(&mut self, moved: Vec<MovedKey>) {
        for MovedKey { key, entry, next } in moved {
            if let Some(held) = self.keys.get(&key) {
                if held.last_end_ms >= entry.last_end_ms {
                    continue;
                }
                self.deadlines.remove(&(held.deadline_ms, key.clone()));
            }
            self.deadlines.insert((entry.deadline_ms, key.clone()));
            match next {
                Some(next) => self.next.insert(key.clone(), Arc::new(next)),
                None => self.next.remove(&key),
            };
            self.keys.insert(key, Arc::new(entry));
        }
    }

    /// Merges floors handed over with moved keys: each is the larger of
    /// the two, so a key new here starts no earlier than it would have
    /// where it came from.
    pub fn put_floors(&mut self, floors: MovedFloors) {
        self.forgotten_end_ms = self.forgotten_end_ms.max(floors.forgotten_end_ms);
        self.restored_at_ms = self.restored_at_ms.max(floors.restored_at_ms);
        for (prefix, floor) in floors.growth_floors {
            let held = self.growth_floors.entry(prefix).or_insert(floor);
            held.floor_ms = held.floor_ms.max(floor.floor_ms);
            held.until_ms = held.until_ms.max(floor.until_ms);
        }
    }

    /// Drops every window whose end is `<= now_ms` and every expired
    /// tombstone; returns the number of window records dropped.
    pub fn collect(&mut self, now_ms: u64) -> u64 {
        let mut collected = 0;
        while let Some((deadline, key)) = self.deadlines.first().cloned() {
            if deadline > now_ms {
                break;
            }
            self.deadlines.remove(&(deadline, key.clone()));
            let Some(entry) = self.keys.get_mut(&key).map(Arc::make_mut) else {
                continue;
            };
            if entry.live.take().is_some() {
                collected += 1;
            }
            // The next window, opened early, becomes the live one.
            if let Some(next) = self.next.remove(&key) {
                if next.bounds.end_ms > now_ms {
                    entry.deadline_ms = next.bounds.end_ms;
                    self.deadlines.insert((next.bounds.end_ms, key));
                    entry.live = Some(Arc::unwrap_or_clone(next));
                    continue;
                }
                collected += 1;
            }
            let tombstone_expiry = entry.tombstone_expiry_ms();
            if tombstone_expiry <= now_ms {
                self.forgotten_end_ms = self.forgotten_end_ms.max(entry.last_end_ms);
                self.keys.remove(&key);
            } else {
                entry.deadline_ms = tombstone_expiry;
                self.deadlines.insert((tombstone_expiry, key));
            }
        }
        self.growth_floors
            .retain(|_, floor| floor.until_ms > now_ms);
        collected
    }

    /// Number of live window records.
    pub fn live_count(&self) -> u64 {
        self.keys.values().filter(|e| e.live.is_some()).count() as u64
    }

    /// Number of keys with any entry (live window or tombstone).
    pub fn key_count(&self) -> u64 {
        self.keys.len() as u64
    }

    /// Every key with a window live at `now_ms`, with that window, in key order.
    pub fn live_records(&self, now_ms: u64) -> impl Iterator<Item = (&Key, &WindowRecord)> {
        self.keys.iter().filter_map(move |(key, entry)| {
            entry
                .live
                .as_ref()
                .filter(|record| record.bounds.end_ms > now_ms)
                .map(|record| (key, record))
        })
    }

    /// Keys starting with `prefix` that have a live window at `now_ms`, in
    /// key order, at most `max`; and how many such keys there are, counted
    /// up to `count_up_to` (so a huge prefix costs a bounded scan).
    pub fn live_keys_with_prefix(
        &self,
        prefix: &str,
        now_ms: u64,
        max: usize,
        count_up_to: usize,
    ) -> (Vec<Key>, usize) {
        use std::ops::Bound;
        let start = match Key::new(prefix) {
            Ok(first) => Bound::Included(first),
            Err(_) if prefix.is_empty() => Bound::Unbounded,
            // Longer than any key: no key starts with it.
            Err(_) => return (Vec::new(), 0),
        };
        let live = self
            .keys
            .range((start, Bound::Unbounded))
            .take_while(|(key, _)| key.as_str().starts_with(prefix))
            .filter(|(_, entry)| {
                entry
                    .live
                    .as_ref()
                    .is_some_and(|record| record.bounds.end_ms > now_ms)
            })
            .map(|(key, _)| key);
        let mut keys = Vec::new();
        let mut count = 0;
        for key in live.take(count_up_to.max(max)) {
            if keys.len() < max {
                keys.push(key.clone());
            }
            count += 1;
        }
        (keys, count)
    }
}

/// The window table as format 2 stored it, before windows counted shadow
/// decisions: read from old snapshots and upgraded (an empty tally).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct WindowTableV2 {
    keys: BTreeMap<Key, KeyWindowsV2>,
    deadlines: BTreeSet<(u64, Key)>,
    forgotten_end_ms: u64,
    growth_floors: BTreeMap<String, GrowthFloor>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct KeyWindowsV2 {
    live: Option<WindowRecordV2>,
    last_end_ms: u64,
    retention_ms: u64,
    deadline_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct WindowRecordV2 {
    bounds: WindowBounds,
    limit: u64,
    kind: PolicyKind,
    granted: u64,
    returned: u64,
    regions: BTreeMap<RegionId, RegionUse>,
}

/// A map of an earlier layout with each value behind its own `Arc`.
fn shared<V>(map: BTreeMap<Key, V>) -> BTreeMap<Key, Arc<V>> {
    map.into_iter()
        .map(|(key, value)| (key, Arc::new(value)))
        .collect()
}

impl From<WindowTableV2> for WindowTable {
    fn from(old: WindowTableV2) -> Self {
        let keys = old
            .keys
            .into_iter()
            .map(|(key, entry)| {
                let live = entry.live.map(|record| WindowRecord {
                    bounds: record.bounds,
                    limit: record.limit,
                    kind: record.kind,
                    granted: record.granted,
                    returned: record.returned,
                    regions: record.regions.into(),
                    shadow: ShadowTally::default(),
                });
                let entry = KeyWindows {
                    live,
                    last_end_ms: entry.last_end_ms,
                    retention_ms: entry.retention_ms,
                    deadline_ms: entry.deadline_ms,
                };
                (key, Arc::new(entry))
            })
            .collect();
        WindowTable {
            keys,
            deadlines: old.deadlines,
            forgotten_end_ms: old.forgotten_end_ms,
            growth_floors: old.growth_floors,
            next: BTreeMap::new(),
            restored_at_ms: 0,
        }
    }
}

/// The window table as format 3 stored it, before a key could hold its
/// next window beside the live one: read from old snapshots and upgraded
/// (no next windows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct WindowTableV3 {
    keys: BTreeMap<Key, KeyWindows>,
    deadlines: BTreeSet<(u64, Key)>,
    forgotten_end_ms: u64,
    growth_floors: BTreeMap<String, GrowthFloor>,
}

impl From<WindowTableV3> for WindowTable {
    fn from(old: WindowTableV3) -> Self {
        WindowTable {
            keys: shared(old.keys),
            deadlines: old.deadlines,
            forgotten_end_ms: old.forgotten_end_ms,
            growth_floors: old.growth_floors,
            next: BTreeMap::new(),
            restored_at_ms: 0,
        }
    }
}

/// The window table as formats 4 to 6 stored it, before a restore could
/// seal windows: read from old snapshots and upgraded (never restored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct WindowTableV6 {
    keys: BTreeMap<Key, KeyWindows>,
    deadlines: BTreeSet<(u64, Key)>,
    forgotten_end_ms: u64,
    growth_floors: BTreeMap<String, GrowthFloor>,
    next: BTreeMap<Key, WindowRecord>,
}

impl From<WindowTableV6> for WindowTable {
    fn from(old: WindowTableV6) -> Self {
        WindowTable {
            keys: shared(old.keys),
            deadlines: old.deadlines,
            forgotten_end_ms: old.forgotten_end_ms,
            growth_floors: old.growth_floors,
            next: shared(old.next),
            restored_at_ms: 0,
        }
    }
}
