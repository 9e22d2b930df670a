//! The measurement of `raft-store/examples/many_logs.rs` on the
//! `raft-log` crate (ADR 0026): G groups each append log entries and make
//! them durable, laid out two ways:
//!
//! - **a log per group**: G `RaftLog`s in G directories; each group's
//!   writer appends its batch and flushes its own log (G fsyncs per round,
//!   in parallel);
//! - **one shared log**: one `RaftLog`; each round one writer appends
//!   every group's batch (each entry naming its group) and flushes once.
//!
//! Prints entries made durable per second and flushes per second for
//! G = 1, 2, 4, 8, 16, in the table layout of `many_logs`.
//!
//! `cargo run --release --manifest-path raft-store/compare-raft-log/Cargo.toml -- [SECONDS] [ENTRY_BYTES] [BATCH] [FLUSH_WAIT_US]`
//! (defaults: 3 s per run, 256-byte entries, 32 entries per group per
//! round, and raft-log's own group-commit wait: its flush worker waits up
//! to 1 ms for more writes before it syncs; 0 syncs at once, as the
//! segment engine does).

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use raft_log::api::raft_log_writer::RaftLogWriter;
use raft_log::api::types::Types;
use raft_log::{Config, RaftLog};

#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Entries;

impl Types for Entries {
    /// (term, index).
    type LogId = (u64, u64);
    /// The entry's bytes (a group's name first in the shared log).
    type LogPayload = String;
    type Vote = (u64, u64);
    type UserData = String;
    type Callback = SyncSender<io::Result<()>>;

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.1
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        payload.len() as u64
    }
}

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn open(dir: &std::path::Path) -> RaftLog<Entries> {
    let mut config = Config::new(dir.to_str().expect("a UTF-8 path"));
    if let Some(wait_us) = std::env::args().nth(4).and_then(|a| a.parse().ok()) {
        config.wal.flush_batch_wait = Some(Duration::from_micros(wait_us));
    }
    RaftLog::open(Arc::new(config)).expect("open")
}

/// Makes everything appended durable, waiting for it.
fn flush(log: &mut RaftLog<Entries>) {
    let (done, flushed) = sync_channel(1);
    log.flush(true, Some(done)).expect("flush");
    flushed.recv().expect("a flush answer").expect("durable");
}

/// A log per group: (entries durable per s, flushes per s).
fn per_group(groups: u64, seconds: u64, entry: &str, count: u64) -> (f64, f64) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let stop = Arc::new(AtomicBool::new(false));
    let (entries, flushes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let threads: Vec<_> = (0..groups)
        .map(|group| {
            let dir = root.path().join(format!("group-{group}"));
            std::fs::create_dir_all(&dir).expect("a group directory");
            let mut log = open(&dir);
            let (stop, entries, flushes) = (stop.clone(), entries.clone(), flushes.clone());
            let entry = entry.to_string();
            std::thread::spawn(move || {
                let mut next = 1;
                while !stop.load(Ordering::Relaxed) {
                    let batch: Vec<_> = (next..next + count)
                        .map(|index| ((1, index), entry.clone()))
                        .collect();
                    next += count;
                    log.append(batch).expect("append");
                    flush(&mut log);
                    entries.fetch_add(count, Ordering::Relaxed);
                    flushes.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("writer");
    }
    let elapsed = started.elapsed().as_secs_f64();
    (
        entries.load(Ordering::Relaxed) as f64 / elapsed,
        flushes.load(Ordering::Relaxed) as f64 / elapsed,
    )
}

/// One shared log, one flush per round for every group.
fn shared(groups: u64, seconds: u64, entry: &str, count: u64) -> (f64, f64) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let mut log = open(root.path());
    let (mut entries, mut flushes, mut next) = (0u64, 0u64, 1u64);
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    while Instant::now() < until {
        let mut batch = Vec::with_capacity((groups * count) as usize);
        for group in 0..groups {
            for _ in 0..count {
                batch.push(((1, next), format!("{group:08}{entry}")));
                next += 1;
            }
        }
        log.append(batch).expect("append");
        flush(&mut log);
        entries += groups * count;
        flushes += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    (entries as f64 / elapsed, flushes as f64 / elapsed)
}

fn main() {
    let seconds = arg(1, 3);
    let entry = "Z".repeat(arg(2, 256) as usize);
    let count = arg(3, 32).max(1);
    println!(
        "| groups | raft-log, a log per group: entries/s | flushes/s | raft-log, one shared log: entries/s | flushes/s | shared ÷ per group |"
    );
    println!("|---|---|---|---|---|---|");
    for groups in [1, 2, 4, 8, 16] {
        let (a, a_sync) = per_group(groups, seconds, &entry, count);
        let (b, b_sync) = shared(groups, seconds, &entry, count);
        println!(
            "| {groups} | {a:.0} | {a_sync:.0} | {b:.0} | {b_sync:.0} | {:.2}× |",
            b / a.max(1.0)
        );
    }
}
