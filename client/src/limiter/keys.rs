//! The per-key state of a leased limiter and the bounded table holding it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, Shared};
use tokio::time::Instant;

use crate::error::ClientError;
use crate::sizing::KeySizer;
use crate::wallet::CreditWallet;

/// How many entries are sampled to pick an eviction victim when the table
/// is full (sampled LRU: constant cost per insert, even under a key flood).
const EVICTION_SAMPLE: usize = 32;

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
    pub wallet: CreditWallet<Instant>,
    pub pending: Option<PendingRefill>,
    pub sizer: KeySizer,
    pub last_use: Instant,
    /// How much of `wallet.totals().expired` was already counted in stats.
    pub expired_reported: u64,
    /// After an empty grant: shortages are denied locally until this
    /// instant (the grant's retry hint) instead of asking again.
    pub empty_until: Option<(Instant, RefillReport)>,
}

/// A key's state cell, shared between checks and refill tasks.
pub(crate) struct KeyCell {
    pub state: Mutex<KeyState>,
}

/// The bounded map of key cells.
pub(crate) struct KeyTable {
    /// foldhash, seeded per table: a fraction of SipHash's cost on the
    /// check path, and still not predictable by whoever chooses the keys.
    cells: HashMap<String, Arc<KeyCell>, foldhash::fast::RandomState>,
    max_keys: usize,
}

impl KeyTable {
    pub(crate) fn new(max_keys: usize) -> Self {
        KeyTable {
            cells: HashMap::default(),
            max_keys,
        }
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<KeyCell>> {
        self.cells.get(key).cloned()
    }

    /// The cell of `key`, created with `fresh` when absent. When the table
    /// is full, the least recently used of a sample of keys without a
    /// refill in flight is dropped first (its credits are forfeited).
    pub(crate) fn get_or_insert(
        &mut self,
        key: &str,
        fresh: impl FnOnce() -> KeyState,
    ) -> Arc<KeyCell> {
        if let Some(cell) = self.cells.get(key) {
            return Arc::clone(cell);
        }
        if self.cells.len() >= self.max_keys {
            self.evict_one();
        }
        let cell = Arc::new(KeyCell {
            state: Mutex::new(fresh()),
        });
        self.cells.insert(key.to_string(), Arc::clone(&cell));
        cell
    }

    fn evict_one(&mut self) {
        let victim = self
            .cells
            .iter()
            .take(EVICTION_SAMPLE)
            .filter_map(|(k, cell)| {
                let state = cell.state.try_lock().ok()?;
                state.pending.is_none().then(|| (state.last_use, k.clone()))
            })
            .min()
            .map(|(_, k)| k)
            .or_else(|| self.cells.keys().next().cloned());
        if let Some(k) = victim {
            self.cells.remove(&k);
        }
    }

    /// Every (key, cell) pair, for sweeps.
    pub(crate) fn snapshot(&self) -> Vec<(String, Arc<KeyCell>)> {
        self.cells
            .iter()
            .map(|(k, c)| (k.clone(), Arc::clone(c)))
            .collect()
    }

    /// Removes `key` if its cell is still `cell` (not replaced meanwhile).
    pub(crate) fn remove_if_same(&mut self, key: &str, cell: &Arc<KeyCell>) {
        if self.cells.get(key).is_some_and(|c| Arc::ptr_eq(c, cell)) {
            self.cells.remove(key);
        }
    }
}
