//! [`StorageEngine`] on sled 0.34 — the only place sled is used.
//!
//! All keyspaces live in sled's default tree, each behind a one-byte key
//! prefix, so one sled batch covers several keyspaces atomically. Background
//! flushing is off (`flush_every_ms(None)`): data is durable exactly when
//! [`StorageEngine::flush`] (sled's blocking `flush`) returns.

use std::ops::Bound;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{
    is_empty_range, EngineError, KeyRange, KeyValue, Keyspace, StorageEngine, WriteBatch, WriteOp,
};

/// A sled database opened on a directory.
#[derive(Debug, Clone)]
pub struct SledEngine {
    db: sled::Db,
}

/// How long [`SledEngine::open`] waits for sled's directory lock.
pub const LOCK_WAIT: Duration = Duration::from_secs(5);
const LOCK_RETRY_PAUSE: Duration = Duration::from_millis(5);

/// Whether sled failed to open because another handle holds the directory
/// lock (sled 0.34 reports it only as an I/O error with this message).
fn is_lock_conflict(error: &sled::Error) -> bool {
    matches!(error, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

fn backend(error: sled::Error) -> EngineError {
    EngineError::Backend(Box::new(error))
}

fn prefix_of(keyspace: Keyspace) -> u8 {
    match keyspace {
        Keyspace::Log => 1,
        Keyspace::LogMeta => 2,
        Keyspace::StateMachine => 3,
    }
}

fn prefixed(keyspace: Keyspace, key: &[u8]) -> Vec<u8> {
    let mut full = Vec::with_capacity(key.len() + 1);
    full.push(prefix_of(keyspace));
    full.extend_from_slice(key);
    full
}

fn unprefixed(entry: (sled::IVec, sled::IVec)) -> KeyValue {
    let (key, value) = entry;
    (key.get(1..).unwrap_or_default().to_vec(), value.to_vec())
}

impl SledEngine {
    /// Opens (creating if needed) the database in directory `path`.
    ///
    /// sled releases its directory lock from a background thread some time
    /// after the previous handle in this process is dropped, so a lock
    /// conflict is retried for up to [`LOCK_WAIT`] before it is reported.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, EngineError> {
        let config = sled::Config::new().path(path).flush_every_ms(None);
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            match config.open() {
                Ok(db) => return Ok(Self { db }),
                Err(error) if is_lock_conflict(&error) && Instant::now() < deadline => {
                    std::thread::sleep(LOCK_RETRY_PAUSE);
                }
                Err(error) => return Err(backend(error)),
            }
        }
    }

    /// Bytes sled reports using on disk (for measurements).
    pub fn size_on_disk(&self) -> Result<u64, EngineError> {
        self.db.size_on_disk().map_err(backend)
    }

    fn whole_keyspace(keyspace: Keyspace) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
        let prefix = prefix_of(keyspace);
        (
            Bound::Included(vec![prefix]),
            Bound::Excluded(vec![prefix + 1]),
        )
    }
}

impl StorageEngine for SledEngine {
    fn get(&self, keyspace: Keyspace, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let value = self.db.get(prefixed(keyspace, key)).map_err(backend)?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn range(&self, keyspace: Keyspace, range: KeyRange<'_>) -> Result<Vec<KeyValue>, EngineError> {
        if is_empty_range(&range) {
            return Ok(Vec::new());
        }
        let (whole_start, whole_end) = Self::whole_keyspace(keyspace);
        let start = match range.0 {
            Bound::Included(key) => Bound::Included(prefixed(keyspace, key)),
            Bound::Excluded(key) => Bound::Excluded(prefixed(keyspace, key)),
            Bound::Unbounded => whole_start,
        };
        let end = match range.1 {
            Bound::Included(key) => Bound::Included(prefixed(keyspace, key)),
            Bound::Excluded(key) => Bound::Excluded(prefixed(keyspace, key)),
            Bound::Unbounded => whole_end,
        };
        self.db
            .range::<Vec<u8>, _>((start, end))
            .map(|entry| entry.map(unprefixed).map_err(backend))
            .collect()
    }

    fn first(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        let mut entries = self.db.range::<Vec<u8>, _>(Self::whole_keyspace(keyspace));
        entries
            .next()
            .transpose()
            .map(|e| e.map(unprefixed))
            .map_err(backend)
    }

    fn last(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        let mut entries = self.db.range::<Vec<u8>, _>(Self::whole_keyspace(keyspace));
        entries
            .next_back()
            .transpose()
            .map(|e| e.map(unprefixed))
            .map_err(backend)
    }

    fn apply_batch(&self, batch: WriteBatch) -> Result<(), EngineError> {
        let mut sled_batch = sled::Batch::default();
        for op in batch.ops() {
            match op {
                WriteOp::Insert {
                    keyspace,
                    key,
                    value,
                } => sled_batch.insert(prefixed(*keyspace, key), value.as_slice()),
                WriteOp::Remove { keyspace, key } => sled_batch.remove(prefixed(*keyspace, key)),
            }
        }
        self.db.apply_batch(sled_batch).map_err(backend)
    }

    fn flush(&self) -> Result<(), EngineError> {
        self.db.flush().map(|_bytes| ()).map_err(backend)
    }
}
