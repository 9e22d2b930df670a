//! An in-memory [`StorageEngine`] that models power loss, for simulations.
//!
//! A [`PowerLossDisk`] is the "hardware": it outlives a simulated process.
//! A process opens it with [`PowerLossDisk::open_engine`]; writes land in a
//! volatile view and become durable only at [`StorageEngine::flush`].
//! [`PowerLossDisk::crash`] throws away every write that is not durable and
//! fences off every engine opened before the crash (their calls fail with
//! [`EngineError::Crashed`]), so a restarted process sees exactly what had
//! been flushed.
//!
//! [`PowerLossOptions::acknowledge_before_durable`] turns the disk into one
//! that lies about its write cache: `flush` returns at once and the writes it
//! should have covered only become durable at the *next* flush. Every
//! acknowledgement the store sends is then one step ahead of the disk — the
//! weakened mode the chaos suite must be able to catch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{
    is_empty_range, EngineError, KeyRange, KeyValue, Keyspace, StorageEngine, WriteBatch, WriteOp,
};

/// Fault-injection settings of a [`PowerLossDisk`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerLossOptions {
    /// Weakened mode: `flush` acknowledges before the data is durable (the
    /// data becomes durable one flush later). Off for a correct disk.
    pub acknowledge_before_durable: bool,
}

type Contents = BTreeMap<Keyspace, BTreeMap<Vec<u8>, Vec<u8>>>;

#[derive(Debug, Default)]
struct DiskState {
    /// Bumped by every crash; engines from older generations are fenced.
    generation: u64,
    options: PowerLossOptions,
    /// What survives a crash.
    durable: Contents,
    /// What reads see: `durable` plus the writes below.
    current: Contents,
    /// Applied since the last flush.
    unflushed: Vec<WriteOp>,
    /// Flushed but, in weakened mode, not yet durable.
    write_cache: Vec<WriteOp>,
    flushes: u64,
    crashes: u64,
}

fn apply_op(contents: &mut Contents, op: WriteOp) {
    match op {
        WriteOp::Insert {
            keyspace,
            key,
            value,
        } => {
            contents.entry(keyspace).or_default().insert(key, value);
        }
        WriteOp::Remove { keyspace, key } => {
            if let Some(keys) = contents.get_mut(&keyspace) {
                keys.remove(&key);
            }
        }
    }
}

/// A simulated disk shared by the successive incarnations of one process.
/// Cloning shares the same disk.
#[derive(Debug, Clone, Default)]
pub struct PowerLossDisk {
    state: Arc<Mutex<DiskState>>,
}

impl PowerLossDisk {
    /// A blank, correct disk.
    pub fn new() -> Self {
        Self::default()
    }

    /// A blank disk with the given fault-injection settings.
    pub fn with_options(options: PowerLossOptions) -> Self {
        let disk = Self::new();
        disk.set_options(options);
        disk
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes the fault-injection settings from now on.
    pub fn set_options(&self, options: PowerLossOptions) {
        self.lock().options = options;
    }

    /// The current fault-injection settings.
    pub fn options(&self) -> PowerLossOptions {
        self.lock().options
    }

    /// Opens the disk for a (re)started process.
    pub fn open_engine(&self) -> PowerLossEngine {
        let generation = self.lock().generation;
        PowerLossEngine {
            disk: self.clone(),
            generation,
        }
    }

    /// Power loss: discards every write that is not durable and fences
    /// every engine opened so far.
    pub fn crash(&self) {
        let mut state = self.lock();
        state.current = state.durable.clone();
        state.unflushed.clear();
        state.write_cache.clear();
        state.generation += 1;
        state.crashes += 1;
    }

    /// Writes a crash would lose right now.
    pub fn volatile_writes(&self) -> usize {
        let state = self.lock();
        state.unflushed.len() + state.write_cache.len()
    }

    /// Number of `flush` calls so far.
    pub fn flush_count(&self) -> u64 {
        self.lock().flushes
    }

    /// Number of crashes so far.
    pub fn crash_count(&self) -> u64 {
        self.lock().crashes
    }
}

/// One process's handle on a [`PowerLossDisk`].
#[derive(Debug, Clone)]
pub struct PowerLossEngine {
    disk: PowerLossDisk,
    generation: u64,
}

impl PowerLossEngine {
    /// The disk under this engine.
    pub fn disk(&self) -> &PowerLossDisk {
        &self.disk
    }

    fn live_state(&self) -> Result<MutexGuard<'_, DiskState>, EngineError> {
        let state = self.disk.lock();
        if state.generation == self.generation {
            Ok(state)
        } else {
            Err(EngineError::Crashed)
        }
    }

    fn read<T>(
        &self,
        keyspace: Keyspace,
        f: impl FnOnce(&BTreeMap<Vec<u8>, Vec<u8>>) -> T,
    ) -> Result<T, EngineError> {
        let state = self.live_state()?;
        let empty = BTreeMap::new();
        Ok(f(state.current.get(&keyspace).unwrap_or(&empty)))
    }
}

fn cloned((key, value): (&Vec<u8>, &Vec<u8>)) -> KeyValue {
    (key.clone(), value.clone())
}

impl StorageEngine for PowerLossEngine {
    fn get(&self, keyspace: Keyspace, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.read(keyspace, |keys| keys.get(key).cloned())
    }

    fn range(&self, keyspace: Keyspace, range: KeyRange<'_>) -> Result<Vec<KeyValue>, EngineError> {
        if is_empty_range(&range) {
            return Ok(Vec::new());
        }
        self.read(keyspace, |keys| {
            keys.range::<[u8], _>(range).map(cloned).collect()
        })
    }

    fn first(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        self.read(keyspace, |keys| keys.iter().next().map(cloned))
    }

    fn last(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        self.read(keyspace, |keys| keys.iter().next_back().map(cloned))
    }

    fn apply_batch(&self, batch: WriteBatch) -> Result<(), EngineError> {
        let mut state = self.live_state()?;
        for op in batch.ops() {
            apply_op(&mut state.current, op.clone());
            state.unflushed.push(op.clone());
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), EngineError> {
        let mut guard = self.live_state()?;
        let state = &mut *guard;
        state.flushes += 1;
        let now_durable = if state.options.acknowledge_before_durable {
            let newly_cached = std::mem::take(&mut state.unflushed);
            std::mem::replace(&mut state.write_cache, newly_cached)
        } else {
            let mut ops = std::mem::take(&mut state.write_cache);
            ops.append(&mut state.unflushed);
            ops
        };
        for op in now_durable {
            apply_op(&mut state.durable, op);
        }
        Ok(())
    }
}
