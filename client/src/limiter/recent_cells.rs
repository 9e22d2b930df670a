//! Each thread's cache of the key cells it checked lately, so that a check
//! with credits held finds its key's cell without taking the table's shard
//! lock (whose read acquire and release are two atomic read-modify-writes
//! on a cache line every checking thread shares).
//!
//! The cache is set-associative: [`SETS`] sets of [`WAYS`] cells, the set
//! chosen by the key's table hash, the newest cell first in its set. A
//! thread that checks keys allocates it on its first check (32 KiB) and
//! holds up to [`SETS`] × [`WAYS`] cells alive, which may include cells
//! that have since left their table: such a cell is *retired* (its lane
//! drained and never lent to again, see `Inner::retire_cell`), so a check
//! that finds it cannot spend there, looks in the table instead, and
//! replaces it. Cells of every limiter the thread checks share the cache
//! (each cell knows its table).

use std::cell::RefCell;
use std::sync::Arc;

use super::keys::KeyCell;

/// Sets in a thread's cache (a power of two).
const SETS: usize = 1024;
/// Cells per set.
const WAYS: usize = 4;
/// Where the set index is taken from in a key's hash (bits the table's
/// shard index does not use).
const SET_SHIFT: u32 = 16;

/// The ways of one set, newest first: half a cache line. A cell keeps its
/// table id and its key's hash next to the key, so a lookup reads the set
/// and, in the common case, the newest way's cell.
#[repr(align(32))]
#[derive(Default)]
struct Set([Option<Arc<KeyCell>>; WAYS]);

thread_local! {
    static RECENT: RefCell<Vec<Set>> = const { RefCell::new(Vec::new()) };
}

/// The index of `hash`'s set.
#[inline]
fn set_index(hash: u64) -> usize {
    (hash >> SET_SHIFT) as usize & (SETS - 1)
}

/// Runs `f` on this thread's cached cell of `key` in table `table` (whose
/// hash of it is `hash`); `None` when none is cached.
#[inline]
pub(crate) fn with_cached<R>(
    table: u64,
    hash: u64,
    key: &str,
    f: impl FnOnce(&Arc<KeyCell>) -> R,
) -> Option<R> {
    RECENT
        .try_with(|recent| {
            let sets = recent.try_borrow().ok()?;
            let cell = sets
                .get(set_index(hash))?
                .0
                .iter()
                .flatten()
                .find(|cell| cell.is_for_in(table, hash, key))?;
            Some(f(cell))
        })
        .ok()
        .flatten()
}

/// Files `cell` (of key `key`, hash `hash`) as the newest of its set,
/// replacing any cell of the same key and table, else the set's oldest.
pub(crate) fn remember(hash: u64, key: &str, cell: Arc<KeyCell>) {
    let _ = RECENT.try_with(|recent| {
        let Ok(mut sets) = recent.try_borrow_mut() else {
            return;
        };
        if sets.is_empty() {
            sets.resize_with(SETS, Set::default);
        }
        let Some(Set(set)) = sets.get_mut(set_index(hash)) else {
            return;
        };
        let table = cell.table();
        let same = set
            .iter()
            .position(|slot| slot.as_ref().is_some_and(|c| c.is_for_in(table, hash, key)));
        // The way to reuse: the same key's, else the oldest; the ways before
        // it move one down.
        let reused = same.unwrap_or(WAYS - 1);
        set[..=reused].rotate_right(1);
        set[0] = Some(cell);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::keys::KeyTable;

    /// Keys whose hashes fall in one set of the cache.
    fn keys_in_one_set(table: &KeyTable, count: usize) -> Vec<(String, u64)> {
        let mut found: Vec<(String, u64)> = Vec::new();
        let mut set = None;
        for i in 0.. {
            let key = format!("key-{i}");
            let hash = table.hash(&key);
            let this_set = set_index(hash);
            if *set.get_or_insert(this_set) == this_set {
                found.push((key, hash));
                if found.len() == count {
                    break;
                }
            }
        }
        found
    }

    #[test]
    fn a_set_keeps_its_newest_cells_and_one_cell_per_key() {
        std::thread::spawn(|| {
            let table = KeyTable::new(100);
            let keys = keys_in_one_set(&table, WAYS + 1);
            let cells: Vec<_> = keys
                .iter()
                .map(|(key, _)| table.insert_for_test(key))
                .collect();
            for ((key, hash), cell) in keys.iter().zip(&cells).take(WAYS) {
                remember(*hash, key, Arc::clone(cell));
            }
            for ((key, hash), cell) in keys.iter().zip(&cells).take(WAYS) {
                let found = with_cached(table.id(), *hash, key, Arc::clone);
                assert!(found.is_some_and(|c| Arc::ptr_eq(&c, cell)), "{key} cached");
            }
            // Re-filing a key moves it to the front without a second copy.
            remember(keys[0].1, &keys[0].0, Arc::clone(&cells[0]));
            // One more key pushes out the oldest, which is now keys[1].
            let (key, hash) = &keys[WAYS];
            remember(*hash, key, Arc::clone(&cells[WAYS]));
            assert!(with_cached(table.id(), keys[1].1, &keys[1].0, |_| ()).is_none());
            for i in [0, 2, 3, WAYS] {
                assert!(
                    with_cached(table.id(), keys[i].1, &keys[i].0, |_| ()).is_some(),
                    "{} still cached",
                    keys[i].0
                );
            }
            // Another table's lookup of the same key finds nothing.
            let other = KeyTable::new(100);
            assert!(with_cached(other.id(), keys[0].1, &keys[0].0, |_| ()).is_none());
        })
        .join()
        .expect("cache test thread");
    }
}
