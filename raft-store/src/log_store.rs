//! The Raft log and vote: openraft's `RaftLogReader` + `RaftLogStorage` over
//! a [`StorageEngine`].
//!
//! Durability rule: every write that openraft treats as persisted (vote,
//! appended entries, truncation, purge) is flushed before the call returns
//! or, for appends, before the `LogFlushed` callback is called. The
//! committed log id is a recovery hint and rides along with the next flush.
//!
//! Appends are written (not yet durable) before `append` returns; the flush
//! is either made right there ([`FlushMode::Inline`], deterministic, for
//! simulations) or by a flusher thread ([`FlushMode::Background`], on a
//! real disk). In the background the Raft core does not wait for the disk:
//! a leader sends the entries to its followers while its own flush runs, so
//! the leader's and a follower's flush overlap instead of adding up, and
//! appends that arrive during a flush share the next one. Callbacks are
//! called in append order, each after a flush that began after its write.
//!
//! Reads of the log's tail — the state machine applying committed entries,
//! the leader replicating to each follower — are answered from the newest
//! appended entries kept in memory ([`RecentEntries`], bounded by
//! [`RECENT_ENTRIES_BYTES`]) instead of being read back and decoded.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftLogReader};

use crate::codec::{decode, encode, Persisted};
use crate::engine::{Keyspace, StorageEngine, WriteBatch};
use crate::error::{OrStorageError, StoreError};
use crate::recent_entries::RecentEntries;
use crate::records::{log_key, COMMITTED_KEY, LAST_PURGED_KEY, VOTE_KEY};
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use leasehold_core::metrics::Histogram;

/// Most encoded bytes of the newest entries kept in memory for readers of
/// the log's tail: about 80 ms of writes at full speed (≈ 130 k leases/s
/// of ≈ 100 encoded bytes each), more than the distance between the append
/// point and the apply point or a healthy follower. Decoded, the entries
/// take several times their encoded size (every key, region and caller is
/// its own allocation): 4 MiB encoded added ~28 MiB of RSS under load. A
/// follower further behind is sent entries read from the engine.
pub const RECENT_ENTRIES_BYTES: usize = 1 << 20;

/// Where appended entries are flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    /// In `append` itself, before it returns (deterministic: simulations).
    Inline,
    /// On a flusher thread; `append` returns once the entries are written.
    Background,
}

/// The Raft log, vote and committed pointer of one coordinator member.
/// Cloning shares the same storage (clones serve as log readers).
#[derive(Clone)]
pub struct LogStore {
    engine: Arc<dyn StorageEngine>,
    /// How long each flush of the log to disk took (appends, votes,
    /// truncations), in microseconds.
    flush_latency: Arc<Histogram>,
    /// The flusher thread ([`FlushMode::Background`]).
    flusher: Option<Arc<Flusher>>,
    /// The newest appended entries, shared with every reader.
    recent: Arc<std::sync::Mutex<RecentEntries<Entry>>>,
}

/// The flusher thread and its queue. Dropped with the last clone of the
/// store: the queue closes and the drop waits for the thread, so the
/// engine is released (and can be opened again) when the store is gone.
struct Flusher {
    queue: Option<std::sync::mpsc::Sender<LogFlushed<TypeConfig>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Flushes `engine` for every batch of waiting appends, then answers their
/// callbacks in order.
fn run_flusher(
    engine: Arc<dyn StorageEngine>,
    flush_latency: Arc<Histogram>,
    waiting: std::sync::mpsc::Receiver<LogFlushed<TypeConfig>>,
) {
    while let Ok(first) = waiting.recv() {
        let mut callbacks = vec![first];
        callbacks.extend(waiting.try_iter());
        let started = std::time::Instant::now();
        let result = engine.flush();
        flush_latency.record_duration(started.elapsed());
        for callback in callbacks {
            callback.log_io_completed(match &result {
                Ok(()) => Ok(()),
                Err(error) => Err(io::Error::other(error.to_string())),
            });
        }
    }
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore").finish_non_exhaustive()
    }
}

fn index_bound(bound: Bound<&u64>) -> Bound<[u8; 8]> {
    match bound {
        Bound::Included(index) => Bound::Included(log_key(*index)),
        Bound::Excluded(index) => Bound::Excluded(log_key(*index)),
        Bound::Unbounded => Bound::Unbounded,
    }
}

fn as_slice_bound(bound: &Bound<[u8; 8]>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

impl LogStore {
    /// A log store over `engine`; checks that what is already stored can be
    /// read by this build (unknown format versions fail here, typed).
    pub(crate) fn open(
        engine: Arc<dyn StorageEngine>,
        flush_mode: FlushMode,
    ) -> Result<Self, StoreError> {
        let flush_latency = Arc::new(Histogram::latency());
        let flusher = match flush_mode {
            FlushMode::Inline => None,
            FlushMode::Background => {
                let (queue, waiting) = std::sync::mpsc::channel();
                let (engine, flush_latency) = (engine.clone(), flush_latency.clone());
                let thread = std::thread::Builder::new()
                    .name("raft-log-flush".into())
                    .spawn(move || run_flusher(engine, flush_latency, waiting))
                    .map_err(|error| {
                        StoreError::from(crate::engine::EngineError::Backend(Box::new(error)))
                    })?;
                Some(Arc::new(Flusher {
                    queue: Some(queue),
                    thread: Some(thread),
                }))
            }
        };
        let store = Self {
            engine,
            flush_latency,
            flusher,
            recent: Arc::new(std::sync::Mutex::new(RecentEntries::new(
                RECENT_ENTRIES_BYTES,
            ))),
        };
        store.read_meta::<Vote>(VOTE_KEY)?;
        store.read_meta::<LogId>(COMMITTED_KEY)?;
        store.read_meta::<LogId>(LAST_PURGED_KEY)?;
        store.last_entry_log_id()?;
        if let Some((_, first)) = store.engine.first(Keyspace::Log)? {
            decode::<Entry>(&first)?;
        }
        Ok(store)
    }

    /// The flush (fsync) latencies of this log, in microseconds; shared by
    /// every clone.
    pub fn flush_latency(&self) -> Arc<Histogram> {
        self.flush_latency.clone()
    }

    /// Flushes the engine, timing it.
    fn flush(&self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        self.engine.flush()?;
        self.flush_latency.record_duration(started.elapsed());
        Ok(())
    }

    fn read_meta<T: Persisted>(&self, key: &[u8]) -> Result<Option<T>, StoreError> {
        match self.engine.get(Keyspace::LogMeta, key)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }

    fn last_entry_log_id(&self) -> Result<Option<LogId>, StoreError> {
        match self.engine.last(Keyspace::Log)? {
            Some((_, bytes)) => Ok(Some(decode::<Entry>(&bytes)?.log_id)),
            None => Ok(None),
        }
    }

    fn entries_in(&self, start: Bound<&u64>, end: Bound<&u64>) -> Result<Vec<Entry>, StoreError> {
        if let Some(entries) = self.recent_entries_in(start, end) {
            return Ok(entries);
        }
        let (start, end) = (index_bound(start), index_bound(end));
        let range = (as_slice_bound(&start), as_slice_bound(&end));
        self.engine
            .range(Keyspace::Log, range)?
            .iter()
            .map(|(_, bytes)| decode::<Entry>(bytes).map_err(StoreError::from))
            .collect()
    }

    /// The entries in the range from memory, if it holds all of them.
    fn recent_entries_in(&self, start: Bound<&u64>, end: Bound<&u64>) -> Option<Vec<Entry>> {
        let start = match start {
            Bound::Included(index) => *index,
            Bound::Excluded(index) => index.checked_add(1)?,
            Bound::Unbounded => 0,
        };
        let end = match end {
            Bound::Included(index) => index.checked_add(1)?,
            Bound::Excluded(index) => *index,
            Bound::Unbounded => return None,
        };
        self.recent().get(start, end)
    }

    /// The newest entries (a poisoned lock still holds a consistent window:
    /// every change to it is a whole push or pop).
    fn recent(&self) -> std::sync::MutexGuard<'_, RecentEntries<Entry>> {
        self.recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Removes every entry in the range, plus the extra writes in `batch`,
    /// atomically, then flushes.
    fn remove_entries_durably(
        &self,
        start: Bound<&u64>,
        end: Bound<&u64>,
        mut batch: WriteBatch,
    ) -> Result<(), StoreError> {
        let (start, end) = (index_bound(start), index_bound(end));
        for (key, _) in self.engine.range(
            Keyspace::Log,
            (as_slice_bound(&start), as_slice_bound(&end)),
        )? {
            batch.remove(Keyspace::Log, key);
        }
        self.engine.apply_batch(batch)?;
        self.flush()?;
        Ok(())
    }

    /// Writes `entries` (readable at once, durable after the next flush),
    /// then keeps them in memory for the readers of the tail; a failed
    /// write empties that memory.
    fn write_entries(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), StoreError> {
        let result = self.write_and_keep(entries);
        if result.is_err() {
            self.recent().clear();
        }
        result
    }

    fn write_and_keep(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), StoreError> {
        let mut batch = WriteBatch::new();
        let mut written = Vec::new();
        for entry in entries {
            let bytes = encode(&entry)?;
            let index = entry.log_id.index;
            written.push((index, bytes.len(), entry));
            batch.insert(Keyspace::Log, log_key(index), bytes);
        }
        self.engine.apply_batch(batch)?;
        self.recent().appended(written);
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.entries_in(range.start_bound(), range.end_bound())
            .or_storage(ErrorSubject::Logs, ErrorVerb::Read)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self
            .read_meta::<LogId>(LAST_PURGED_KEY)
            .or_storage(ErrorSubject::Logs, ErrorVerb::Read)?;
        let last_log_id = self
            .last_entry_log_id()
            .or_storage(ErrorSubject::Logs, ErrorVerb::Read)?
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let write = || -> Result<(), StoreError> {
            self.engine
                .insert(Keyspace::LogMeta, VOTE_KEY, encode(vote)?)?;
            self.flush()?;
            Ok(())
        };
        write().or_storage(ErrorSubject::Vote, ErrorVerb::Write)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.read_meta(VOTE_KEY)
            .or_storage(ErrorSubject::Vote, ErrorVerb::Read)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        let write = || -> Result<(), StoreError> {
            match committed {
                Some(log_id) => {
                    self.engine
                        .insert(Keyspace::LogMeta, COMMITTED_KEY, encode(&log_id)?)?
                }
                None => self.engine.remove(Keyspace::LogMeta, COMMITTED_KEY)?,
            }
            Ok(())
        };
        write().or_storage(ErrorSubject::Store, ErrorVerb::Write)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        self.read_meta(COMMITTED_KEY)
            .or_storage(ErrorSubject::Store, ErrorVerb::Read)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let written = self.write_entries(entries);
        let queue = self.flusher.as_ref().and_then(|f| f.queue.as_ref());
        let result = match (written, queue) {
            (Ok(()), Some(queue)) => match queue.send(callback) {
                Ok(()) => return Ok(()),
                Err(unsent) => {
                    let error = StoreError::from(crate::engine::EngineError::Backend(
                        "the log flusher thread has stopped".into(),
                    ));
                    (Err(error), unsent.0)
                }
            },
            (Ok(()), None) => (self.flush(), callback),
            (Err(error), _) => (Err(error), callback),
        };
        match result {
            (Ok(()), callback) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            (Err(error), callback) => {
                callback.log_io_completed(Err(io::Error::other(error.to_string())));
                Err(error.into_storage(ErrorSubject::Logs, ErrorVerb::Write))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "truncating the log from this entry on");
        self.recent().truncate_from(log_id.index);
        self.remove_entries_durably(
            Bound::Included(&log_id.index),
            Bound::Unbounded,
            WriteBatch::new(),
        )
        .or_storage(ErrorSubject::Logs, ErrorVerb::Delete)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        tracing::debug!(%log_id, "purging the log up to this entry");
        self.recent().purge_through(log_id.index);
        let mut batch = WriteBatch::new();
        let encoded = encode(&log_id).or_storage(ErrorSubject::Logs, ErrorVerb::Delete)?;
        batch.insert(Keyspace::LogMeta, LAST_PURGED_KEY, encoded);
        self.remove_entries_durably(Bound::Unbounded, Bound::Included(&log_id.index), batch)
            .or_storage(ErrorSubject::Logs, ErrorVerb::Delete)
    }
}
