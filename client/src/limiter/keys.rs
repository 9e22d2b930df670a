//! The per-key state of a leased limiter and the bounded table holding it.
//!
//! The table is split into shards by the key's hash, each behind a
//! reader-writer lock: a check with credits held takes one shard's read lock
//! for its lookup and nothing else, so checks of different keys seldom touch
//! the same cache line. Inserts and removals (slow paths only) are also
//! serialised by one writer mutex, which keeps the key count and eviction
//! exact. A key is hashed once per lookup: the shard and the bucket both come
//! from the same 64-bit hash.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::future::{BoxFuture, Shared};
use tokio::time::Instant;

use super::credit_lane::CreditLane;
use super::lock;
use crate::error::ClientError;
use crate::sizing::KeySizer;
use crate::wallet::CreditWallet;

/// How many entries are sampled to pick an eviction victim when the table
/// is full (sampled LRU: constant cost per insert, even under a key flood).
const EVICTION_SAMPLE: usize = 32;

/// Shards of the table (a power of two).
const SHARDS: usize = 16;

/// Where the shard index is taken from in a key's hash: bits the bucket
/// index (low bits) and the bucket tag (top 7 bits) of a shard's map do not
/// use for any realistic table size.
const SHARD_SHIFT: u32 = 40;

/// What a finished refill reports to every check that waited on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RefillReport {
    /// Tokens the backend granted.
    pub granted: u64,
    /// Tokens actually credited (0 when the grant was dropped).
    pub credited: u64,
    /// The key's limit in the grant's window.
    pub limit: u64,
    /// The grant's window end, coordinator epoch ms.
    pub window_end_ms: u64,
    /// The backend's retry hint for an empty grant (0 = none).
    pub retry_after_ms: u64,
    /// The grant's local deadline.
    pub deadline: Instant,
}

/// A refill in flight, awaited by every check that needs it.
pub(crate) type PendingRefill = Shared<BoxFuture<'static, Result<RefillReport, ClientError>>>;

/// One key's state, behind a mutex that is never held across an await.
pub(crate) struct KeyState {
    /// The key's credits, except those lent to the cell's [`CreditLane`].
    pub wallet: CreditWallet<Instant>,
    pub pending: Option<PendingRefill>,
    pub sizer: KeySizer,
    /// How much of `wallet.totals().expired` was already counted in stats.
    pub expired_reported: u64,
    /// After an empty grant: shortages are denied locally until this
    /// instant (the grant's retry hint) instead of asking again.
    pub empty_until: Option<(Instant, RefillReport)>,
}

/// A key's cell, shared between checks and refill tasks: the lock-free
/// credits a check spends first, then the key, then the mutex-guarded rest.
pub(crate) struct KeyCell {
    pub lane: CreditLane,
    pub key: Box<str>,
    pub state: Mutex<KeyState>,
}

/// The bounded, sharded map of key cells.
pub(crate) struct KeyTable {
    /// foldhash, seeded per table: a fraction of SipHash's cost on the
    /// check path, and still not predictable by whoever chooses the keys.
    hasher: foldhash::fast::RandomState,
    shards: Box<[Shard]>,
    /// Held by inserts and removals; counts the keys.
    writer: Mutex<usize>,
    max_keys: usize,
}

/// One shard, on cache lines of its own.
#[repr(align(128))]
#[derive(Default)]
struct Shard {
    cells: RwLock<ShardCells>,
}

/// The cells of one shard, by the full 64-bit hash of their key.
#[derive(Default)]
struct ShardCells {
    by_hash: HashMap<u64, Arc<KeyCell>, PrehashedKeys>,
    /// Cells whose key's hash equals that of another key already in
    /// `by_hash` (rare: both hashes are 64 bits).
    colliding: Vec<Arc<KeyCell>>,
}

impl ShardCells {
    #[inline]
    fn find(&self, hash: u64, key: &str) -> Option<&Arc<KeyCell>> {
        if let Some(cell) = self.by_hash.get(&hash) {
            if *cell.key == *key {
                return Some(cell);
            }
        }
        if self.colliding.is_empty() {
            return None;
        }
        self.colliding.iter().find(|cell| *cell.key == *key)
    }

    fn insert(&mut self, hash: u64, cell: Arc<KeyCell>) {
        match self.by_hash.entry(hash) {
            std::collections::hash_map::Entry::Occupied(_) => self.colliding.push(cell),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(cell);
            }
        }
    }

    /// Removes `cell` (by identity); whether it was here.
    fn remove(&mut self, hash: u64, cell: &Arc<KeyCell>) -> bool {
        if self
            .by_hash
            .get(&hash)
            .is_some_and(|c| Arc::ptr_eq(c, cell))
        {
            self.by_hash.remove(&hash);
            return true;
        }
        let before = self.colliding.len();
        self.colliding.retain(|c| !Arc::ptr_eq(c, cell));
        self.colliding.len() != before
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<KeyCell>> {
        self.by_hash.values().chain(self.colliding.iter())
    }
}

impl KeyTable {
    pub(crate) fn new(max_keys: usize) -> Self {
        KeyTable {
            hasher: foldhash::fast::RandomState::default(),
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            writer: Mutex::new(0),
            max_keys,
        }
    }

    #[inline]
    fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> SHARD_SHIFT) as usize & (SHARDS - 1)]
    }

    /// Runs `f` on the cell of `key` under its shard's read lock (no
    /// reference count is touched); `None` when the key is not in the table.
    #[inline]
    pub(crate) fn with_cell<R>(&self, key: &str, f: impl FnOnce(&Arc<KeyCell>) -> R) -> Option<R> {
        let hash = self.hash(key);
        let cells = read(&self.shard(hash).cells);
        cells.find(hash, key).map(f)
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<KeyCell>> {
        self.with_cell(key, Arc::clone)
    }

    /// The cell of `key`, created with `fresh` (lane last used at `now_ns`)
    /// when absent, and the cell evicted to make room, if any. When the
    /// table is full, the least recently used of a sample of keys without a
    /// refill in flight is dropped first (its credits are forfeited).
    pub(crate) fn get_or_insert(
        &self,
        key: &str,
        now_ns: u64,
        fresh: impl FnOnce() -> KeyState,
    ) -> (Arc<KeyCell>, Option<Arc<KeyCell>>) {
        if let Some(cell) = self.get(key) {
            return (cell, None);
        }
        let mut count = lock(&self.writer);
        let hash = self.hash(key);
        if let Some(cell) = read(&self.shard(hash).cells).find(hash, key) {
            return (Arc::clone(cell), None);
        }
        let mut evicted = None;
        if *count >= self.max_keys {
            evicted = self.evict_one(hash);
            if evicted.is_some() {
                *count -= 1;
            }
        }
        let cell = Arc::new(KeyCell {
            lane: CreditLane::new(now_ns),
            key: key.into(),
            state: Mutex::new(fresh()),
        });
        write(&self.shard(hash).cells).insert(hash, Arc::clone(&cell));
        *count += 1;
        (cell, evicted)
    }

    /// Removes a sampled least recently used cell, starting the sample at
    /// the shard of `hash`. Called with the writer mutex held.
    fn evict_one(&self, hash: u64) -> Option<Arc<KeyCell>> {
        let first = (hash >> SHARD_SHIFT) as usize;
        let mut sampled = 0;
        let mut oldest: Option<(u64, Arc<KeyCell>)> = None;
        let mut any: Option<Arc<KeyCell>> = None;
        for i in 0..SHARDS {
            if sampled >= EVICTION_SAMPLE {
                break;
            }
            let cells = read(&self.shards[(first + i) & (SHARDS - 1)].cells);
            for cell in cells.iter().take(EVICTION_SAMPLE - sampled) {
                sampled += 1;
                any.get_or_insert_with(|| Arc::clone(cell));
                let idle = cell
                    .state
                    .try_lock()
                    .is_ok_and(|state| state.pending.is_none());
                let last_use = cell.lane.last_use_ns();
                if idle && oldest.as_ref().is_none_or(|(t, _)| last_use < *t) {
                    oldest = Some((last_use, Arc::clone(cell)));
                }
            }
        }
        let victim = oldest.map(|(_, cell)| cell).or(any)?;
        let hash = self.hash(&victim.key);
        write(&self.shard(hash).cells)
            .remove(hash, &victim)
            .then_some(victim)
    }

    /// Every cell, for sweeps.
    pub(crate) fn snapshot(&self) -> Vec<Arc<KeyCell>> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            all.extend(read(&shard.cells).iter().cloned());
        }
        all
    }

    /// Removes `cell` if it is still in the table (not replaced meanwhile);
    /// whether it was removed.
    pub(crate) fn remove_if_same(&self, cell: &Arc<KeyCell>) -> bool {
        let mut count = lock(&self.writer);
        let hash = self.hash(&cell.key);
        let removed = write(&self.shard(hash).cells).remove(hash, cell);
        if removed {
            *count -= 1;
        }
        removed
    }
}

/// The hasher of a shard's map, whose keys are already foldhash hashes.
#[derive(Debug, Default, Clone, Copy)]
struct PrehashedKeys;

impl BuildHasher for PrehashedKeys {
    type Hasher = PrehashedKey;

    fn build_hasher(&self) -> PrehashedKey {
        PrehashedKey(0)
    }
}

/// Passes a `u64` hash through unchanged.
#[derive(Debug, Default)]
struct PrehashedKey(u64);

impl Hasher for PrehashedKey {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64`s are hashed here; fold anything else in anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

/// Read-locks a shard, recovering it if a writer panicked (every critical
/// section leaves the shard consistent).
#[inline]
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Write-locks a shard (see [`read`]).
fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
