//! [`StorageEngine`] on sled 0.34 — the only place sled is used.
//!
//! Each keyspace is its own sled tree. The split matters for disk use: sled
//! rewrites a whole page when it consolidates it, and a page that held the
//! snapshot beside the log metadata (rewritten on every commit) was written
//! again, snapshot and all, every few commits — the data directory grew by
//! hundreds of MB per minute (`tests/disk_bounded.rs` pins the bound). A
//! batch that touches one keyspace is one tree batch; a batch that spans
//! keyspaces (a purge: the last purged id with the removed entries) is one
//! multi-tree transaction, so it stays atomic.
//!
//! Background flushing is off (`flush_every_ms(None)`): data is durable
//! exactly when [`StorageEngine::flush`] (sled's blocking `flush`) returns.
//!
//! Data written by earlier builds, with every keyspace in sled's default
//! tree behind a one-byte key prefix, is moved into the trees when opened.

use std::path::Path;
use std::time::{Duration, Instant};

use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::Transactional;

use super::{
    is_empty_range, EngineError, KeyRange, KeyValue, Keyspace, StorageEngine, WriteBatch, WriteOp,
};

/// A sled database opened on a directory, one tree per keyspace.
#[derive(Debug, Clone)]
pub struct SledEngine {
    db: sled::Db,
    log: sled::Tree,
    log_meta: sled::Tree,
    state_machine: sled::Tree,
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

fn tree_name(keyspace: Keyspace) -> &'static [u8] {
    match keyspace {
        Keyspace::Log => b"raft-log",
        Keyspace::LogMeta => b"raft-log-meta",
        Keyspace::StateMachine => b"state-machine",
    }
}

/// The one-byte key prefix of each keyspace in the earlier single-tree
/// layout (read only to move old data).
fn legacy_prefix_of(keyspace: Keyspace) -> u8 {
    match keyspace {
        Keyspace::Log => 1,
        Keyspace::LogMeta => 2,
        Keyspace::StateMachine => 3,
    }
}

fn owned((key, value): (sled::IVec, sled::IVec)) -> KeyValue {
    (key.to_vec(), value.to_vec())
}

/// sled's page cache. The state machine lives in memory and is read from
/// sled only at start, so the cache only needs the log's recent pages and
/// the snapshot being written; at sled's default (1 GiB) a member holding
/// 100 k live windows used 269 MiB of RSS, at 128 MiB 158 MiB
/// (docs/benchmarks.md, "Memory and disk against live windows").
pub const CACHE_BYTES: u64 = 128 * 1024 * 1024;

impl SledEngine {
    /// Opens (creating if needed) the database in directory `path`.
    ///
    /// sled releases its directory lock from a background thread some time
    /// after the previous handle in this process is dropped, so a lock
    /// conflict is retried for up to [`LOCK_WAIT`] before it is reported.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, EngineError> {
        let config = sled::Config::new()
            .path(path)
            .flush_every_ms(None)
            .cache_capacity(CACHE_BYTES);
        let deadline = Instant::now() + LOCK_WAIT;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                Err(error) if is_lock_conflict(&error) && Instant::now() < deadline => {
                    std::thread::sleep(LOCK_RETRY_PAUSE);
                }
                Err(error) => return Err(backend(error)),
            }
        };
        let engine = Self {
            log: db.open_tree(tree_name(Keyspace::Log)).map_err(backend)?,
            log_meta: db
                .open_tree(tree_name(Keyspace::LogMeta))
                .map_err(backend)?,
            state_machine: db
                .open_tree(tree_name(Keyspace::StateMachine))
                .map_err(backend)?,
            db,
        };
        engine.move_single_tree_layout()?;
        Ok(engine)
    }

    /// Bytes sled reports using on disk (for measurements).
    pub fn size_on_disk(&self) -> Result<u64, EngineError> {
        self.db.size_on_disk().map_err(backend)
    }

    fn tree(&self, keyspace: Keyspace) -> &sled::Tree {
        match keyspace {
            Keyspace::Log => &self.log,
            Keyspace::LogMeta => &self.log_meta,
            Keyspace::StateMachine => &self.state_machine,
        }
    }

    /// Moves data of the earlier layout (every keyspace in the default tree
    /// behind a one-byte prefix) into the keyspace trees. Copy, flush, then
    /// clear, flush: a crash at any point leaves the data readable and the
    /// move is simply done again at the next open.
    fn move_single_tree_layout(&self) -> Result<(), EngineError> {
        let default_tree: &sled::Tree = &self.db;
        if default_tree.is_empty() {
            return Ok(());
        }
        for keyspace in Keyspace::ALL {
            let prefix = legacy_prefix_of(keyspace);
            let mut batch = sled::Batch::default();
            for entry in default_tree.scan_prefix([prefix]) {
                let (key, value) = entry.map_err(backend)?;
                batch.insert(&key[1..], value);
            }
            self.tree(keyspace).apply_batch(batch).map_err(backend)?;
        }
        self.db.flush().map_err(backend)?;
        default_tree.clear().map_err(backend)?;
        self.db.flush().map_err(backend)?;
        tracing::info!("moved the Raft store from the single-tree layout to one tree per keyspace");
        Ok(())
    }
}

impl StorageEngine for SledEngine {
    fn get(&self, keyspace: Keyspace, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let value = self.tree(keyspace).get(key).map_err(backend)?;
        Ok(value.map(|v| v.to_vec()))
    }

    fn range(&self, keyspace: Keyspace, range: KeyRange<'_>) -> Result<Vec<KeyValue>, EngineError> {
        if is_empty_range(&range) {
            return Ok(Vec::new());
        }
        self.tree(keyspace)
            .range::<&[u8], _>(range)
            .map(|entry| entry.map(owned).map_err(backend))
            .collect()
    }

    fn first(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        self.tree(keyspace)
            .first()
            .map(|e| e.map(owned))
            .map_err(backend)
    }

    fn last(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        self.tree(keyspace)
            .last()
            .map(|e| e.map(owned))
            .map_err(backend)
    }

    fn apply_batch(&self, batch: WriteBatch) -> Result<(), EngineError> {
        let mut per_keyspace: [sled::Batch; 3] = Default::default();
        let mut touched = [false; 3];
        for op in batch.ops() {
            let slot = match op {
                WriteOp::Insert { keyspace, .. } | WriteOp::Remove { keyspace, .. } => {
                    keyspace_slot(*keyspace)
                }
            };
            touched[slot] = true;
            match op {
                WriteOp::Insert { key, value, .. } => {
                    per_keyspace[slot].insert(key.as_slice(), value.as_slice())
                }
                WriteOp::Remove { key, .. } => per_keyspace[slot].remove(key.as_slice()),
            }
        }
        match touched.iter().filter(|t| **t).count() {
            0 => Ok(()),
            1 => {
                let slot = touched.iter().position(|t| *t).unwrap_or(0);
                let batch = std::mem::take(&mut per_keyspace[slot]);
                self.tree(Keyspace::ALL[slot])
                    .apply_batch(batch)
                    .map_err(backend)
            }
            _ => {
                let [log, meta, state] = &per_keyspace;
                (&self.log, &self.log_meta, &self.state_machine)
                    .transaction(|(log_tree, meta_tree, state_tree)| {
                        log_tree.apply_batch(log)?;
                        meta_tree.apply_batch(meta)?;
                        state_tree.apply_batch(state)?;
                        Ok::<(), ConflictableTransactionError<sled::Error>>(())
                    })
                    .map_err(|error| match error {
                        TransactionError::Abort(error) | TransactionError::Storage(error) => {
                            backend(error)
                        }
                    })
            }
        }
    }

    fn flush(&self) -> Result<(), EngineError> {
        self.db.flush().map(|_bytes| ()).map_err(backend)
    }
}

/// Index of `keyspace` in [`Keyspace::ALL`].
fn keyspace_slot(keyspace: Keyspace) -> usize {
    match keyspace {
        Keyspace::Log => 0,
        Keyspace::LogMeta => 1,
        Keyspace::StateMachine => 2,
    }
}

#[cfg(test)]
mod tests {
    use std::ops::Bound;

    use super::*;

    #[test]
    fn data_of_the_single_tree_layout_is_moved_into_the_keyspace_trees() {
        let dir = tempfile::tempdir().expect("temporary directory");
        {
            let db = sled::open(dir.path()).expect("sled opens");
            db.insert([1, 0, 0, 0, 0, 0, 0, 0, 7], b"entry 7".as_slice())
                .expect("insert");
            db.insert(b"\x02vote", b"vote".as_slice()).expect("insert");
            db.insert(b"\x03snapshot", b"snapshot".as_slice())
                .expect("insert");
            db.flush().expect("flush");
        }
        let read_back = |engine: &SledEngine| {
            (
                engine.range(Keyspace::Log, (Bound::Unbounded, Bound::Unbounded)),
                engine.get(Keyspace::LogMeta, b"vote"),
                engine.get(Keyspace::StateMachine, b"snapshot"),
            )
        };
        let engine = SledEngine::open(dir.path()).expect("old layout opens");
        let (log, vote, snapshot) = read_back(&engine);
        assert_eq!(
            log.expect("log readable"),
            vec![(vec![0, 0, 0, 0, 0, 0, 0, 7], b"entry 7".to_vec())]
        );
        assert_eq!(vote.expect("meta readable"), Some(b"vote".to_vec()));
        assert_eq!(
            snapshot.expect("snapshot readable"),
            Some(b"snapshot".to_vec())
        );
        drop(engine);
        // Opening again finds nothing left to move and the same data.
        let engine = SledEngine::open(dir.path()).expect("reopens");
        let (log, _, snapshot) = read_back(&engine);
        assert_eq!(log.expect("log readable").len(), 1);
        assert_eq!(
            snapshot.expect("snapshot readable"),
            Some(b"snapshot".to_vec())
        );
    }

    #[test]
    fn a_batch_across_keyspaces_is_applied_whole() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let engine = SledEngine::open(dir.path()).expect("opens");
        let mut batch = WriteBatch::new();
        batch.insert(Keyspace::Log, b"a".as_slice(), b"1".to_vec());
        batch.insert(Keyspace::LogMeta, b"b".as_slice(), b"2".to_vec());
        batch.remove(Keyspace::Log, b"a".as_slice());
        batch.insert(Keyspace::StateMachine, b"c".as_slice(), b"3".to_vec());
        engine.apply_batch(batch).expect("applies");
        assert_eq!(engine.get(Keyspace::Log, b"a").expect("reads"), None);
        assert_eq!(
            engine.get(Keyspace::LogMeta, b"b").expect("reads"),
            Some(b"2".to_vec())
        );
        assert_eq!(
            engine.get(Keyspace::StateMachine, b"c").expect("reads"),
            Some(b"3".to_vec())
        );
    }
}
