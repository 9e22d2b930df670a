//! The files of a segment engine's directory: their names, the `LOCK`
//! held while an engine has it open, writes made durable (synced files,
//! a synced directory), and blobs read back whole.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::engine::EngineError;

pub(super) fn io_error(error: io::Error) -> EngineError {
    EngineError::Backend(Box::new(error))
}

pub(super) fn corrupt(what: &str) -> EngineError {
    io_error(io::Error::new(io::ErrorKind::InvalidData, what.to_string()))
}

pub(super) fn segment_name(id: u64) -> String {
    format!("segment-{id:020}.log")
}

pub(super) fn blob_name(id: u64) -> String {
    format!("blob-{id:020}.bin")
}

pub(super) fn parse_id(name: &str, prefix: &str, suffix: &str) -> Option<u64> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

/// How long [`SegmentEngine::open`] waits for another holder of the
/// directory (a store being dropped in this process) to let go.
pub(super) const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Locks `dir/LOCK` exclusively: one engine per directory, across processes.
pub(super) fn lock_directory(dir: &Path) -> Result<File, EngineError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("LOCK"))
        .map_err(io_error)?;
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(fs::TryLockError::WouldBlock) => {
                return Err(io_error(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("another process holds the Raft store in {}", dir.display()),
                )))
            }
            Err(fs::TryLockError::Error(error)) => return Err(io_error(error)),
        }
    }
}

pub(super) fn remove_if_present(path: &Path) -> Result<(), EngineError> {
    match fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(io_error(error)),
        _ => Ok(()),
    }
}

pub(super) fn sync_directory(dir: &Path) -> Result<(), EngineError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error)
}

/// Writes `bytes` to a new file at `path` through a `.tmp` name, synced,
/// then renamed into place and the directory synced.
pub(super) fn write_synced(dir: &Path, path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let tmp = path.with_extension("tmp");
    let mut file = File::create(&tmp).map_err(io_error)?;
    file.write_all(bytes).map_err(io_error)?;
    file.sync_all().map_err(io_error)?;
    fs::rename(&tmp, path).map_err(io_error)?;
    sync_directory(dir)
}

/// Blob `id`, opened, if it exists with exactly `len` bytes and crc `crc`.
pub(super) fn open_whole_blob(dir: &Path, id: u64, len: u64, crc: u32) -> Option<Arc<File>> {
    let file = File::open(dir.join(blob_name(id))).ok()?;
    let mut bytes = vec![0; usize::try_from(len).ok()?];
    file.read_exact_at(&mut bytes, 0).ok()?;
    let whole = file.metadata().ok()?.len() == len && crc32fast::hash(&bytes) == crc;
    whole.then(|| Arc::new(file))
}
