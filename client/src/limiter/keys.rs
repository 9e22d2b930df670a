//! The per-key state of a leased limiter and the bounded table holding it.
//!
//! The table is split into shards by the key's hash, each behind a
//! reader-writer lock: a check with credits held takes one shard's read lock
//! for its lookup and nothing else, so checks of different keys seldom touch
//! the same cache line. Inserts and removals (slow paths only) are also
//! serialised by one writer mutex, which keeps the key count and eviction
//! exact. A key is hashed once per lookup: the shard and the bucket both come
//! from the same 64-bit hash (and, in front of the table, the set of the
//! checking thread's cache of recent cells, `recent_cells`).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// A key's cell, shared between checks and refill tasks, laid out in the
/// order a check reads it (`repr(C)`): the lock-free credits on their own
/// cache line, then its table's id and the key as lookups compare them on
/// the next, then the rest.
#[repr(C)]
pub(crate) struct KeyCell {
    pub lane: CreditLane,
    /// The id of the table the cell was made for.
    table: u64,
    /// The table's hash of the key.
    hash: u64,
    lookup_key: InlineKey,
    /// Set once the cell has left its table: its lane is drained and never
    /// lent to again (see [`KeyCell::retire`]).
    retired: AtomicBool,
    pub key: Box<str>,
    pub state: Mutex<KeyState>,
}

impl KeyCell {
    fn new(table: u64, hash: u64, key: &str, lane: CreditLane, state: KeyState) -> Self {
        KeyCell {
            lane,
            table,
            hash,
            lookup_key: InlineKey::new(key),
            retired: AtomicBool::new(false),
            key: key.into(),
            state: Mutex::new(state),
        }
    }

    /// The id of the table this cell was made for.
    #[inline]
    pub(crate) fn table(&self) -> u64 {
        self.table
    }

    /// Whether this is the cell of `key` (hashed `hash`) in table `table`.
    #[inline(always)]
    pub(crate) fn is_for_in(&self, table: u64, hash: u64, key: &str) -> bool {
        self.hash == hash && self.table == table && self.is_for(key)
    }

    /// Marks the cell as out of its table. Call with its state mutex held,
    /// before draining its lane for the last time.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Whether the cell has left its table.
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Whether this is the cell of `key`.
    #[inline(always)]
    pub(crate) fn is_for(&self, key: &str) -> bool {
        let key = key.as_bytes();
        match self.lookup_key.bytes() {
            Some(held) => same_bytes(held, key),
            None => same_bytes(self.key.as_bytes(), key),
        }
    }
}

/// Bytes of a key its cell holds inline: with the length, the cell's
/// table id and the key's hash, one cache line.
const INLINE_KEY_BYTES: usize = 46;

/// A key of at most [`INLINE_KEY_BYTES`] (most keys) copied into its cell,
/// so that a lookup compares it without reading the key's own allocation.
#[repr(C)]
struct InlineKey {
    /// The key's length; more than [`INLINE_KEY_BYTES`] when the key is
    /// longer (its bytes are then not held).
    len: u16,
    bytes: [u8; INLINE_KEY_BYTES],
}

impl InlineKey {
    fn new(key: &str) -> Self {
        let mut bytes = [0; INLINE_KEY_BYTES];
        if let Some(prefix) = bytes.get_mut(..key.len()) {
            prefix.copy_from_slice(key.as_bytes());
        }
        InlineKey {
            len: u16::try_from(key.len()).unwrap_or(u16::MAX),
            bytes,
        }
    }

    /// The key's bytes, if it is short enough to be held.
    #[inline]
    fn bytes(&self) -> Option<&[u8]> {
        self.bytes.get(..usize::from(self.len))
    }
}

/// The bounded, sharded map of key cells.
pub(crate) struct KeyTable {
    /// This table's id, unique in the process (cells carry it, so that a
    /// thread's cache of recent cells can serve several limiters).
    id: u64,
    /// foldhash, seeded per table: a fraction of SipHash's cost on the
    /// check path, and still not predictable by whoever chooses the keys.
    hasher: foldhash::fast::RandomState,
    shards: [Shard; SHARDS],
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
            if cell.is_for(key) {
                return Some(cell);
            }
        }
        if self.colliding.is_empty() {
            return None;
        }
        self.colliding.iter().find(|cell| cell.is_for(key))
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
        static NEXT_TABLE_ID: AtomicU64 = AtomicU64::new(1);
        KeyTable {
            id: NEXT_TABLE_ID.fetch_add(1, Ordering::Relaxed),
            hasher: foldhash::fast::RandomState::default(),
            shards: std::array::from_fn(|_| Shard::default()),
            writer: Mutex::new(0),
            max_keys,
        }
    }

    /// This table's id.
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// The hash the table files `key` under.
    #[inline]
    pub(crate) fn hash(&self, key: &str) -> u64 {
        let mut hasher = self.hasher.build_hasher();
        hasher.write(key.as_bytes());
        hasher.finish()
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Shard {
        &self.shards[(hash >> SHARD_SHIFT) as usize & (SHARDS - 1)]
    }

    /// Runs `f` on the cell of `key` under its shard's read lock (no
    /// reference count is touched); `None` when the key is not in the table.
    #[inline]
    pub(crate) fn with_cell<R>(&self, key: &str, f: impl FnOnce(&Arc<KeyCell>) -> R) -> Option<R> {
        self.with_hashed_cell(self.hash(key), key, f)
    }

    /// [`with_cell`](Self::with_cell) for a key already hashed.
    #[inline]
    pub(crate) fn with_hashed_cell<R>(
        &self,
        hash: u64,
        key: &str,
        f: impl FnOnce(&Arc<KeyCell>) -> R,
    ) -> Option<R> {
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
        let cell = Arc::new(KeyCell::new(
            self.id,
            hash,
            key,
            CreditLane::new(now_ns),
            fresh(),
        ));
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
        let hash = victim.hash;
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
        let hash = cell.hash;
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

/// Whether two keys are equal. Keys of up to 32 bytes (most) are compared
/// as at most four machine words, inline; longer ones byte by byte.
#[inline(always)]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    // Two overlapping words cover the key: its first and its last `W` bytes.
    #[inline(always)]
    fn words<const W: usize>(a: &[u8], b: &[u8]) -> bool {
        let n = a.len();
        a[..W] == b[..W] && a[n - W..] == b[n - W..]
    }
    match n {
        0..=7 => a == b,
        8..=16 => words::<8>(a, b),
        17..=32 => words::<16>(a, b),
        _ => a == b,
    }
}

/// Read-locks a shard, recovering it if a writer panicked (every critical
/// section leaves the shard consistent).
#[inline]
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
impl KeyTable {
    /// The cell of `key`, made with an empty state when absent.
    pub(crate) fn insert_for_test(&self, key: &str) -> Arc<KeyCell> {
        self.get_or_insert(key, 0, tests::fresh_state).0
    }
}

/// Write-locks a shard (see [`read`]).
fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn fresh_state() -> KeyState {
        KeyState {
            wallet: CreditWallet::new(),
            pending: None,
            sizer: crate::sizing::LeaseSizing::Fixed(1).sizer(),
            expired_reported: 0,
            empty_until: None,
        }
    }

    /// A key of `len` bytes whose bytes depend on `seed`.
    fn key_of(len: usize, seed: u8) -> String {
        (0..len)
            .map(|i| char::from(b'a' + (seed.wrapping_add(i as u8) % 26)))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The word-wise comparison agrees with byte-wise equality for
        /// every length a word split treats differently, including keys
        /// that differ in one byte only.
        #[test]
        fn same_bytes_is_equality(
            a in proptest::collection::vec(any::<u8>(), 0..80),
            flip in any::<proptest::sample::Index>(),
            bit in 0u8..8,
            extend in any::<bool>(),
        ) {
            prop_assert!(same_bytes(&a, &a.clone()));
            let mut b = a.clone();
            if extend {
                b.push(0);
            } else if !b.is_empty() {
                let i = flip.index(b.len());
                b[i] ^= 1 << bit;
            }
            prop_assert_eq!(same_bytes(&a, &b), a == b);
        }
    }

    /// A check reads a cell's lane, then its table id and key: the two
    /// first cache lines of the cell.
    #[test]
    fn a_lookup_reads_two_cache_lines() {
        assert_eq!(std::mem::offset_of!(KeyCell, table), 64);
        assert_eq!(std::mem::offset_of!(KeyCell, hash), 72);
        assert_eq!(std::mem::offset_of!(KeyCell, lookup_key), 80);
        assert_eq!(std::mem::size_of::<InlineKey>(), 48);
    }

    /// Keys short enough to sit in their cell and longer ones (boxed) are
    /// each found in their own cell, and a key one byte away from a stored
    /// one finds nothing.
    #[test]
    fn every_key_is_found_in_its_own_cell_and_no_other() {
        let table = KeyTable::new(1_000);
        let lengths = [
            1,
            7,
            8,
            16,
            17,
            32,
            33,
            INLINE_KEY_BYTES,
            INLINE_KEY_BYTES + 1,
            256,
        ];
        let mut keys = Vec::new();
        for (seed, len) in lengths.into_iter().enumerate() {
            let key = key_of(len, seed as u8);
            table.get_or_insert(&key, 0, fresh_state);
            keys.push(key);
        }
        for key in &keys {
            let cell = table.get(key).expect("stored key");
            assert_eq!(&*cell.key, key.as_str());
            let mut near = key.clone().into_bytes();
            let last = near.len() - 1;
            near[last] = if near[last] == b'z' { b'y' } else { b'z' };
            let near = String::from_utf8(near).expect("ascii");
            if !keys.contains(&near) {
                assert!(table.get(&near).is_none(), "{near} is not stored");
            }
            let longer = format!("{key}x");
            if !keys.contains(&longer) {
                assert!(table.get(&longer).is_none(), "{longer} is not stored");
            }
        }
    }
}
