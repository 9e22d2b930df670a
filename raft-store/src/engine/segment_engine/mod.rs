//! [`SegmentEngine`]: the production [`StorageEngine`] — an append-only file
//! of write batches with one `fdatasync` per flush, an in-memory index, and
//! large values in files of their own.
//!
//! # Why not a general-purpose store
//! The Raft store needs very little: append a batch of log entries, make it
//! durable, read recent entries back, drop old ones, and now and then
//! replace one large value (the snapshot). Every acknowledged lease waits
//! for a flush on two members, so a flush should cost what the disk costs
//! — one `write` at apply time and one `fdatasync` — and nothing should be
//! rewritten on a commit. ADR 0012 has the measurements against sled.
//!
//! # On disk (one directory)
//! - `segment-NNNNNNNNNNNNNNNNNNNN.log` — the live segment: an 8-byte header
//!   (`LHSEG` + format version), then records. A record is
//!   `payload length: u32 LE | crc32 of payload: u32 LE | payload`; a payload
//!   is one [`WriteBatch`], so a batch is applied whole or not at all.
//! - `LOCK` — locked while an engine has the directory open (one engine
//!   per directory, across processes).
//! - `blob-NNNNNNNNNNNNNNNNNNNN.bin` — a value of at least
//!   [`SegmentOptions::blob_min_bytes`] (a snapshot), written once; the record that inserts
//!   it names it with its length and crc32.
//!
//! # Durability
//! [`StorageEngine::apply_batch`] writes the record (page cache only);
//! [`StorageEngine::flush`] syncs the blobs written since the last flush,
//! the directory, then the segment. On open the segment is replayed up to
//! the first record that is short, fails its crc or names a blob that is
//! missing or fails its crc, and cut there: a torn tail is never followed,
//! and every record before it was complete. A write that fails (disk full)
//! is cut off again before the call returns, so the file never holds a
//! torn record followed by good ones.
//!
//! # Bounded disk
//! Removed and replaced values leave dead records behind. At a flush, when
//! the segment has grown past twice its live records plus
//! [`SegmentOptions::compaction_slack_bytes`], or a blob has died (a new snapshot replaced
//! the old one), the live records are written to a new segment
//! (`.tmp`, synced, renamed, directory synced) and the old segment and dead
//! blobs are deleted. The directory therefore holds the latest snapshot
//! plus at most about twice the live log, and each byte is rewritten by
//! compaction about once.
//!
//! # Memory
//! The index keeps every key; values up to
//! [`SegmentOptions::inline_max_bytes`] (log
//! metadata, entries of a lightly loaded log) are kept in memory too, larger
//! ones are read back from the segment or their blob on demand.
//!
//! # Layout
//! - `record`: the segment's header and record format, encoded and decoded.
//! - `directory`: the directory's files (names, `LOCK`, synced writes, blobs).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

mod directory;
mod record;

use directory::{
    blob_name, corrupt, io_error, lock_directory, open_whole_blob, parse_id, remove_if_present,
    segment_name, sync_directory, write_synced,
};
use record::{
    decode_payload, keyspace_code, PayloadWriter, RecordedValue, HEADER, MAX_RECORD_BYTES,
    RECORD_HEADER_BYTES,
};

use super::{
    is_empty_range, EngineError, KeyRange, KeyValue, Keyspace, StorageEngine, WriteBatch, WriteOp,
};

/// Where a [`SegmentEngine`] keeps values, and when it compacts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentOptions {
    /// Values of at most this many bytes are kept in memory as well as on
    /// disk.
    pub inline_max_bytes: usize,
    /// Values of at least this many bytes go to a blob file of their own.
    pub blob_min_bytes: usize,
    /// Dead bytes a segment may hold beyond twice its live ones before it
    /// is compacted.
    pub compaction_slack_bytes: u64,
}

impl Default for SegmentOptions {
    fn default() -> Self {
        Self {
            inline_max_bytes: 4 * 1024,
            blob_min_bytes: 256 * 1024,
            compaction_slack_bytes: 1024 * 1024,
        }
    }
}

/// Where a value lives.
#[derive(Debug, Clone)]
enum Stored {
    /// In memory (and in the segment).
    Inline(Arc<[u8]>),
    /// In the segment at `offset`, `len` bytes.
    InSegment { offset: u64, len: u32 },
    /// In blob file `id` (kept open: a reader holding it can finish even
    /// if a compaction deletes the file meanwhile).
    Blob {
        id: u64,
        len: u64,
        crc: u32,
        file: Arc<File>,
    },
}

/// Bytes a live value accounts for in a compacted segment.
fn live_bytes(key: &[u8], stored: &Stored) -> u64 {
    let value = match stored {
        Stored::Inline(bytes) => bytes.len() as u64,
        Stored::InSegment { len, .. } => u64::from(*len),
        Stored::Blob { .. } => 20,
    };
    // Tag, keyspace, two lengths, and a share of the record framing.
    key.len() as u64 + value + 10 + RECORD_HEADER_BYTES
}

struct Inner {
    /// The open `LOCK` file, locked exclusively while this engine lives.
    _lock: File,
    options: SegmentOptions,
    dir: PathBuf,
    segment_id: u64,
    segment: Arc<File>,
    /// Bytes in the segment file (all records written so far).
    segment_len: u64,
    /// Bytes the live values would take in a compacted segment.
    live_segment_bytes: u64,
    index: [BTreeMap<Vec<u8>, Stored>; 3],
    next_blob_id: u64,
    /// Blobs written since the last flush (not yet synced).
    unsynced_blobs: Vec<Arc<File>>,
    /// Blobs no longer referenced; deleted by the next compaction.
    dead_blobs: Vec<u64>,
    /// Set when a failed write could not be cut off again: every call fails.
    poisoned: bool,
    /// Compactions done (for tests and measurements).
    compactions: u64,
}

/// The append-only segment engine on a directory. Cloning shares it.
#[derive(Clone)]
pub struct SegmentEngine {
    inner: Arc<Mutex<Inner>>,
    /// Serialises flushes: a compaction must not name a blob that another
    /// flush has taken out of the unsynced list but not yet synced.
    flushing: Arc<Mutex<()>>,
}

impl std::fmt::Debug for SegmentEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentEngine").finish_non_exhaustive()
    }
}

/// Counters of a [`SegmentEngine`] (for tests and measurements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentStats {
    /// Bytes in the live segment file.
    pub segment_bytes: u64,
    /// Bytes the live values take in a compacted segment.
    pub live_segment_bytes: u64,
    /// Compactions since the engine was opened.
    pub compactions: u64,
}

impl SegmentEngine {
    /// Opens (creating if needed) the engine in directory `dir`, replaying
    /// the live segment and cutting off a torn tail.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, EngineError> {
        Self::open_with(dir, SegmentOptions::default())
    }

    /// [`SegmentEngine::open`] with other thresholds (tests use tiny ones to
    /// exercise every path with small values).
    pub fn open_with(dir: impl AsRef<Path>, options: SegmentOptions) -> Result<Self, EngineError> {
        let dir = dir.as_ref().to_path_buf();
        fs::create_dir_all(&dir).map_err(io_error)?;
        let lock = lock_directory(&dir)?;
        let (mut segments, mut blobs) = (Vec::new(), Vec::new());
        for entry in fs::read_dir(&dir).map_err(io_error)? {
            let entry = entry.map_err(io_error)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                fs::remove_file(entry.path()).map_err(io_error)?;
            } else if let Some(id) = parse_id(&name, "segment-", ".log") {
                segments.push(id);
            } else if let Some(id) = parse_id(&name, "blob-", ".bin") {
                blobs.push(id);
            }
        }
        segments.sort_unstable();
        // A segment is renamed into place only once complete and synced, so
        // the newest one holds everything; older ones are leftovers of a
        // compaction cut short after the rename.
        let segment_id = segments.last().copied().unwrap_or(1);
        for old in segments.iter().filter(|id| **id != segment_id) {
            fs::remove_file(dir.join(segment_name(*old))).map_err(io_error)?;
        }
        let path = dir.join(segment_name(segment_id));
        if segments.is_empty() {
            write_synced(&dir, &path, HEADER)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error)?;
        let mut inner = Inner {
            _lock: lock,
            options,
            dir: dir.clone(),
            segment_id,
            segment: Arc::new(file),
            segment_len: 0,
            live_segment_bytes: HEADER.len() as u64,
            index: Default::default(),
            next_blob_id: blobs.iter().max().map_or(1, |max| max + 1),
            unsynced_blobs: Vec::new(),
            dead_blobs: Vec::new(),
            poisoned: false,
            compactions: 0,
        };
        inner.replay()?;
        if !inner.dead_blobs.is_empty() {
            // Records in the segment still name blobs that later records
            // replaced: rewrite the segment before those blobs may go.
            inner.compact()?;
        }
        // Blobs no record names: written for a batch that never became
        // durable, or left dead by a compaction cut short.
        let live: HashSet<u64> = inner
            .index
            .iter()
            .flat_map(|tree| tree.values())
            .filter_map(|stored| match stored {
                Stored::Blob { id, .. } => Some(*id),
                _ => None,
            })
            .collect();
        for id in blobs.into_iter().filter(|id| !live.contains(id)) {
            remove_if_present(&dir.join(blob_name(id)))?;
        }
        Ok(Self {
            inner: Arc::new(Mutex::new(inner)),
            flushing: Arc::new(Mutex::new(())),
        })
    }

    fn lock(&self) -> Result<MutexGuard<'_, Inner>, EngineError> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.poisoned {
            return Err(corrupt(
                "an earlier write failed and could not be cut off; reopen the store",
            ));
        }
        Ok(inner)
    }

    /// Sizes and compaction count.
    pub fn stats(&self) -> SegmentStats {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        SegmentStats {
            segment_bytes: inner.segment_len,
            live_segment_bytes: inner.live_segment_bytes,
            compactions: inner.compactions,
        }
    }

    /// Finds entries of `keyspace` with `find`, returning them with the
    /// segment their offsets refer to (taken under the same lock, so a
    /// compaction in between cannot move them). Values are read after the
    /// lock is released.
    fn lookup(
        &self,
        keyspace: Keyspace,
        find: impl FnOnce(&BTreeMap<Vec<u8>, Stored>) -> Vec<(Vec<u8>, Stored)>,
    ) -> Result<Vec<KeyValue>, EngineError> {
        let (entries, segment) = {
            let inner = self.lock()?;
            let entries = find(&inner.index[usize::from(keyspace_code(keyspace))]);
            (entries, inner.segment.clone())
        };
        entries
            .into_iter()
            .map(|(key, stored)| Ok((key, read_value(&segment, stored)?)))
            .collect()
    }
}

/// Reads the value of `stored`; `segment` is the segment its offset refers
/// to.
fn read_value(segment: &File, stored: Stored) -> Result<Vec<u8>, EngineError> {
    match stored {
        Stored::Inline(bytes) => Ok(bytes.to_vec()),
        Stored::InSegment { offset, len } => {
            let mut value = vec![0; len as usize];
            segment
                .read_exact_at(&mut value, offset)
                .map_err(io_error)?;
            Ok(value)
        }
        Stored::Blob { len, file, .. } => {
            let mut value = vec![0; len as usize];
            file.read_exact_at(&mut value, 0).map_err(io_error)?;
            Ok(value)
        }
    }
}

impl Inner {
    fn tree(&mut self, keyspace: Keyspace) -> &mut BTreeMap<Vec<u8>, Stored> {
        &mut self.index[usize::from(keyspace_code(keyspace))]
    }

    /// Replaces (or removes) `key`'s stored value, keeping the live byte
    /// count and the dead blobs.
    fn set(&mut self, keyspace: Keyspace, key: &[u8], stored: Option<Stored>) {
        let added = stored.as_ref().map_or(0, |s| live_bytes(key, s));
        let old = match stored {
            Some(stored) => self.tree(keyspace).insert(key.to_vec(), stored),
            None => self.tree(keyspace).remove(key),
        };
        if let Some(old) = old {
            self.live_segment_bytes -= live_bytes(key, &old);
            if let Stored::Blob { id, .. } = old {
                self.dead_blobs.push(id);
            }
        }
        self.live_segment_bytes += added;
    }

    /// Replays the segment into the index; cuts off everything from the
    /// first record that is incomplete or invalid.
    fn replay(&mut self) -> Result<(), EngineError> {
        let mut bytes = Vec::new();
        {
            let len = self.segment.metadata().map_err(io_error)?.len();
            bytes.resize(len as usize, 0);
            self.segment
                .read_exact_at(&mut bytes, 0)
                .map_err(io_error)?;
        }
        if bytes.len() < HEADER.len() || &bytes[..HEADER.len()] != HEADER {
            return Err(corrupt(
                "the segment file does not start with a known header (format version)",
            ));
        }
        let mut at = HEADER.len();
        let mut opened_blobs: HashMap<u64, Arc<File>> = HashMap::new();
        while let Some(header) = bytes.get(at..at + RECORD_HEADER_BYTES as usize) {
            let len = u32::from_le_bytes(header[..4].try_into().unwrap_or_default());
            let crc = u32::from_le_bytes(header[4..].try_into().unwrap_or_default());
            let start = at + RECORD_HEADER_BYTES as usize;
            let Some(payload) = (len <= MAX_RECORD_BYTES)
                .then(|| bytes.get(start..start + len as usize))
                .flatten()
            else {
                break;
            };
            if crc32fast::hash(payload) != crc {
                break;
            }
            let Some(ops) = decode_payload(payload, start as u64) else {
                break;
            };
            if !ops.iter().all(|op| match &op.value {
                Some((RecordedValue::Blob { id, len, crc }, _)) => {
                    opened_blobs.contains_key(id)
                        || open_whole_blob(&self.dir, *id, *len, *crc)
                            .map(|file| opened_blobs.insert(*id, file))
                            .is_some()
                }
                _ => true,
            }) {
                break;
            }
            for op in ops {
                let stored = op.value.map(|(value, offset)| match value {
                    RecordedValue::Bytes(bytes) if bytes.len() <= self.options.inline_max_bytes => {
                        Stored::Inline(bytes.into())
                    }
                    RecordedValue::Bytes(bytes) => Stored::InSegment {
                        offset,
                        len: bytes.len() as u32,
                    },
                    RecordedValue::Blob { id, len, crc } => Stored::Blob {
                        id,
                        len,
                        crc,
                        // Opened and checked just above.
                        file: opened_blobs[&id].clone(),
                    },
                });
                self.set(op.keyspace, op.key, stored);
            }
            at = start + len as usize;
        }
        if at < bytes.len() {
            tracing::warn!(
                cut_bytes = bytes.len() - at,
                "the Raft store's segment ends in an incomplete record (a write that was never \
                 acknowledged); cutting it off"
            );
            self.segment.set_len(at as u64).map_err(io_error)?;
            self.segment.sync_data().map_err(io_error)?;
        }
        self.segment_len = at as u64;
        Ok(())
    }

    /// Appends `record` at the end of the segment; on failure cuts the file
    /// back so no torn record stays in front of later ones.
    fn append(&mut self, record: &[u8]) -> Result<u64, EngineError> {
        let offset = self.segment_len;
        match self.segment.write_all_at(record, offset) {
            Ok(()) => {
                self.segment_len += record.len() as u64;
                Ok(offset)
            }
            Err(error) => {
                if self.segment.set_len(offset).is_err() {
                    self.poisoned = true;
                }
                Err(io_error(error))
            }
        }
    }

    /// Writes a blob file (not yet synced) and returns its id and handle.
    fn write_blob(&mut self, value: &[u8]) -> Result<(u64, Arc<File>), EngineError> {
        let id = self.next_blob_id;
        self.next_blob_id += 1;
        let path = self.dir.join(blob_name(id));
        let written = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut file| file.write_all(value).map(|()| file));
        match written {
            Ok(file) => {
                let file = Arc::new(file);
                self.unsynced_blobs.push(file.clone());
                Ok((id, file))
            }
            Err(error) => {
                let _ = fs::remove_file(&path);
                Err(io_error(error))
            }
        }
    }

    fn apply(&mut self, batch: WriteBatch) -> Result<(), EngineError> {
        let ops = batch.ops();
        if ops.is_empty() {
            return Ok(());
        }
        let mut writer = PayloadWriter::new(ops.len());
        // (keyspace, key, what to store; `InSegment` offsets are relative
        // to the payload until the record's place is known).
        let mut changes: Vec<(Keyspace, &[u8], Option<Stored>)> = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                WriteOp::Insert {
                    keyspace,
                    key,
                    value,
                } if value.len() >= self.options.blob_min_bytes => {
                    let (id, file) = self.write_blob(value)?;
                    let (len, crc) = (value.len() as u64, crc32fast::hash(value));
                    writer.insert_blob(*keyspace, key, id, len, crc);
                    let stored = Stored::Blob { id, len, crc, file };
                    changes.push((*keyspace, key, Some(stored)));
                }
                WriteOp::Insert {
                    keyspace,
                    key,
                    value,
                } => {
                    let at = writer.insert(*keyspace, key, value);
                    let stored = if value.len() <= self.options.inline_max_bytes {
                        Stored::Inline(value.as_slice().into())
                    } else {
                        Stored::InSegment {
                            offset: at as u64,
                            len: value.len() as u32,
                        }
                    };
                    changes.push((*keyspace, key, Some(stored)));
                }
                WriteOp::Remove { keyspace, key } => {
                    writer.remove(*keyspace, key);
                    changes.push((*keyspace, key, None));
                }
            }
        }
        let record = writer.into_record();
        if record.len() as u64 > u64::from(MAX_RECORD_BYTES) {
            return Err(io_error(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a write batch of {} bytes is larger than one record may be",
                    record.len()
                ),
            )));
        }
        let payload_start = self.append(&record)? + RECORD_HEADER_BYTES;
        for (keyspace, key, stored) in changes {
            let stored = stored.map(|stored| match stored {
                Stored::InSegment { offset, len } => Stored::InSegment {
                    offset: payload_start + offset,
                    len,
                },
                other => other,
            });
            self.set(keyspace, key, stored);
        }
        Ok(())
    }

    /// Whether the segment should be compacted now.
    fn wants_compaction(&self) -> bool {
        !self.dead_blobs.is_empty()
            || self.segment_len > 2 * self.live_segment_bytes + self.options.compaction_slack_bytes
    }

    /// Writes the live values to a new segment, switches to it, and deletes
    /// the old segment and the dead blobs. Called with blobs synced.
    fn compact(&mut self) -> Result<(), EngineError> {
        let next_id = self.segment_id + 1;
        let path = self.dir.join(segment_name(next_id));
        let tmp = path.with_extension("tmp");
        let mut out = Vec::with_capacity(self.live_segment_bytes as usize);
        out.extend_from_slice(HEADER);
        let mut index: [BTreeMap<Vec<u8>, Stored>; 3] = Default::default();
        // One record per keyspace chunk of up to 1 024 values.
        for keyspace in Keyspace::ALL {
            let slot = usize::from(keyspace_code(keyspace));
            let entries: Vec<(Vec<u8>, Stored)> = self.index[slot]
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for chunk in entries.chunks(1024) {
                let mut writer = PayloadWriter::new(chunk.len());
                let mut placed = Vec::with_capacity(chunk.len());
                for (key, stored) in chunk {
                    match stored {
                        Stored::Blob { id, len, crc, .. } => {
                            writer.insert_blob(keyspace, key, *id, *len, *crc);
                            placed.push((key.clone(), stored.clone()));
                        }
                        Stored::Inline(bytes) => {
                            writer.insert(keyspace, key, bytes);
                            placed.push((key.clone(), stored.clone()));
                        }
                        Stored::InSegment { offset, len } => {
                            let mut value = vec![0; *len as usize];
                            self.segment
                                .read_exact_at(&mut value, *offset)
                                .map_err(io_error)?;
                            let at = writer.insert(keyspace, key, &value);
                            placed.push((
                                key.clone(),
                                Stored::InSegment {
                                    offset: at as u64,
                                    len: *len,
                                },
                            ));
                        }
                    }
                }
                let payload_start = out.len() as u64 + RECORD_HEADER_BYTES;
                out.extend_from_slice(&writer.into_record());
                for (key, stored) in placed {
                    let stored = match stored {
                        Stored::InSegment { offset, len } => Stored::InSegment {
                            offset: payload_start + offset,
                            len,
                        },
                        other => other,
                    };
                    index[slot].insert(key, stored);
                }
            }
        }
        {
            let mut file = File::create(&tmp).map_err(io_error)?;
            file.write_all(&out).map_err(io_error)?;
            file.sync_all().map_err(io_error)?;
        }
        fs::rename(&tmp, &path).map_err(io_error)?;
        sync_directory(&self.dir)?;
        // The new segment is durable and complete: switch to it.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_error)?;
        let old = self.dir.join(segment_name(self.segment_id));
        self.segment = Arc::new(file);
        self.segment_id = next_id;
        self.segment_len = out.len() as u64;
        self.index = index;
        self.compactions += 1;
        fs::remove_file(old).map_err(io_error)?;
        for id in std::mem::take(&mut self.dead_blobs) {
            remove_if_present(&self.dir.join(blob_name(id)))?;
        }
        sync_directory(&self.dir)
    }
}

fn owned_entry((key, stored): (&Vec<u8>, &Stored)) -> (Vec<u8>, Stored) {
    (key.clone(), stored.clone())
}

impl StorageEngine for SegmentEngine {
    fn get(&self, keyspace: Keyspace, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        let found = self.lookup(keyspace, |tree| {
            tree.get_key_value(key)
                .map(owned_entry)
                .into_iter()
                .collect()
        })?;
        Ok(found.into_iter().next().map(|(_, value)| value))
    }

    fn range(&self, keyspace: Keyspace, range: KeyRange<'_>) -> Result<Vec<KeyValue>, EngineError> {
        if is_empty_range(&range) {
            return Ok(Vec::new());
        }
        self.lookup(keyspace, |tree| {
            tree.range::<[u8], _>(range).map(owned_entry).collect()
        })
    }

    fn first(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        let found = self.lookup(keyspace, |tree| {
            tree.first_key_value()
                .map(owned_entry)
                .into_iter()
                .collect()
        })?;
        Ok(found.into_iter().next())
    }

    fn last(&self, keyspace: Keyspace) -> Result<Option<KeyValue>, EngineError> {
        let found = self.lookup(keyspace, |tree| {
            tree.last_key_value().map(owned_entry).into_iter().collect()
        })?;
        Ok(found.into_iter().next())
    }

    fn apply_batch(&self, batch: WriteBatch) -> Result<(), EngineError> {
        self.lock()?.apply(batch)
    }

    fn flush(&self) -> Result<(), EngineError> {
        let _one_flush_at_a_time = self.flushing.lock().unwrap_or_else(PoisonError::into_inner);
        // Sync outside the lock so readers and writers are not held up by
        // the disk; what was written before this call is what gets synced.
        let (blobs, segment, dir) = {
            let mut inner = self.lock()?;
            let blobs = std::mem::take(&mut inner.unsynced_blobs);
            (blobs, inner.segment.clone(), inner.dir.clone())
        };
        if !blobs.is_empty() {
            for blob in &blobs {
                blob.sync_data().map_err(io_error)?;
            }
            sync_directory(&dir)?;
        }
        segment.sync_data().map_err(io_error)?;
        let mut inner = self.lock()?;
        if inner.wants_compaction() {
            // Blobs written since (by a concurrent apply) must be durable
            // before a compacted segment names them.
            for blob in std::mem::take(&mut inner.unsynced_blobs) {
                blob.sync_data().map_err(io_error)?;
            }
            inner.compact()?;
        }
        Ok(())
    }
}
