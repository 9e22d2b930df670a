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
//! (`last_end_ms`) until `now ≥ last_end_ms + max_window_ms_seen`, where
//! `max_window_ms_seen` is the largest `window_ms` of any policy set so far:
//! until the window length grows, every aligned window containing `now` then
//! starts after `last_end_ms` anyway. Because it may grow later, a dropped
//! tombstone raises one table-wide floor, `forgotten_end_ms`, and every new
//! window starts no earlier than it. With unchanged window lengths the floor
//! never bites (aligned starts are already past it); after a window length
//! grows, the first windows of keys may start at the floor instead of their
//! aligned start (shortened, never overlapping an earlier window).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{Key, RegionId};
use crate::policy::{Policy, PolicyKind, PolicyTable};
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
    pub regions: BTreeMap<RegionId, RegionUse>,
}

impl WindowRecord {
    fn new(bounds: WindowBounds, policy: &Policy) -> Self {
        WindowRecord {
            bounds,
            limit: policy.limit,
            kind: policy.kind,
            granted: 0,
            returned: 0,
            regions: BTreeMap::new(),
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
    /// The deadline under which this key is filed in the index.
    deadline_ms: u64,
}

/// All keys' windows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct WindowTable {
    keys: BTreeMap<Key, KeyWindows>,
    /// `(deadline_ms, key)`: a live window's end, or a tombstone's expiry.
    deadlines: BTreeSet<(u64, Key)>,
    /// Largest `window_ms` of any policy ever set (monotonic).
    max_window_ms_seen: u64,
    /// Largest `last_end_ms` of any dropped tombstone: no window starts before it.
    forgotten_end_ms: u64,
}

impl WindowTable {
    /// Records that a policy with this window length exists (or existed).
    pub fn note_window_ms(&mut self, window_ms: u64) {
        self.max_window_ms_seen = self.max_window_ms_seen.max(window_ms);
    }

    /// The key's live window at `now_ms`, if one exists.
    pub fn live(&self, key: &Key, now_ms: u64) -> Option<&WindowRecord> {
        self.keys
            .get(key)?
            .live
            .as_ref()
            .filter(|r| r.bounds.end_ms > now_ms)
    }

    /// The key's live window at `now_ms`, mutable. Callers collect garbage
    /// first, so a record present here is live.
    pub fn live_mut(&mut self, key: &Key, now_ms: u64) -> Option<&mut WindowRecord> {
        self.keys
            .get_mut(key)?
            .live
            .as_mut()
            .filter(|r| r.bounds.end_ms > now_ms)
    }

    /// The bounds a window created for `key` at `now_ms` under a policy with
    /// `window_ms` gets (the creation rule of the module doc).
    pub fn next_bounds(&self, key: &Key, window_ms: u64, now_ms: u64) -> WindowBounds {
        let aligned = WindowBounds::containing(now_ms, window_ms);
        let key_floor = self.keys.get(key).map_or(0, |entry| entry.last_end_ms);
        // Both floors are ends of windows that are over, so they are <= now_ms
        // (the `min` only guards that), and the window still contains now_ms.
        let floor = key_floor.max(self.forgotten_end_ms).min(now_ms);
        WindowBounds {
            start_ms: aligned.start_ms.max(floor),
            end_ms: aligned.end_ms,
        }
    }

    /// The key's live window at `now_ms`, created under `policy` if there is none.
    pub fn live_or_create(&mut self, key: &Key, policy: &Policy, now_ms: u64) -> &mut WindowRecord {
        let new_bounds = match self.live(key, now_ms) {
            Some(_) => None,
            None => Some(self.next_bounds(key, policy.window_ms, now_ms)),
        };
        let entry = self.keys.entry(key.clone()).or_insert(KeyWindows {
            live: None,
            last_end_ms: 0,
            deadline_ms: 0,
        });
        if let Some(bounds) = new_bounds {
            self.deadlines.remove(&(entry.deadline_ms, key.clone()));
            self.deadlines.insert((bounds.end_ms, key.clone()));
            entry.deadline_ms = bounds.end_ms;
            entry.last_end_ms = bounds.end_ms;
            entry.live = Some(WindowRecord::new(bounds, policy));
        }
        // `live` is Some here: either it was live already or it was just set.
        let fallback = WindowBounds::containing(now_ms, policy.window_ms);
        entry
            .live
            .get_or_insert_with(|| WindowRecord::new(fallback, policy))
    }

    /// Applies the limit-change rule after the policy table changed: every
    /// live window of a key that still has a governing policy gets
    /// `limit = min(limit, governing limit)` and the governing kind. Keys
    /// left without a policy keep their window unchanged until it ends.
    pub fn on_policies_changed(&mut self, policies: &PolicyTable) {
        for (key, entry) in self.keys.iter_mut() {
            let Some(record) = entry.live.as_mut() else {
                continue;
            };
            if let Some(policy) = policies.lookup(key.as_str()) {
                record.limit = record.limit.min(policy.limit);
                record.kind = policy.kind;
            }
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
            let Some(entry) = self.keys.get_mut(&key) else {
                continue;
            };
            if entry.live.take().is_some() {
                collected += 1;
            }
            let tombstone_expiry = entry.last_end_ms.saturating_add(self.max_window_ms_seen);
            if tombstone_expiry <= now_ms {
                self.forgotten_end_ms = self.forgotten_end_ms.max(entry.last_end_ms);
                self.keys.remove(&key);
            } else {
                entry.deadline_ms = tombstone_expiry;
                self.deadlines.insert((tombstone_expiry, key));
            }
        }
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
}
