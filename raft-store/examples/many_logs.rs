//! What many Raft groups on one member cost the disk (ADR 0025): G groups
//! each append log entries and make them durable, laid out two ways on
//! the segment engine:
//!
//! - **a store per group**: G engines in G directories; each group's
//!   writer appends its batch and flushes its own engine (G fsyncs per
//!   round, in parallel);
//! - **one shared store**: one engine; each round one writer appends every
//!   group's batch (keys prefixed by the group) and flushes once (group
//!   commit: one fsync per round for all groups).
//!
//! Prints entries made durable per second and fsyncs per second for
//! G = 1, 2, 4, 8, 16.
//!
//! `cargo run --release -p leasehold-raft-store --example many_logs -- [SECONDS] [ENTRY_BYTES] [BATCH]`
//! (defaults: 3 s per run, 256-byte entries, 32 entries per group per round).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold_raft_store::engine::{Keyspace, SegmentEngine, StorageEngine, WriteBatch};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// One group's batch of `batch` entries from index `first`.
fn append(batch: &mut WriteBatch, group: u64, first: u64, count: u64, entry: &[u8]) {
    for index in first..first + count {
        let mut key = group.to_be_bytes().to_vec();
        key.extend_from_slice(&index.to_be_bytes());
        batch.insert(Keyspace::Log, key, entry.to_vec());
    }
}

/// A store per group: (entries durable per s, fsyncs per s).
fn per_group(groups: u64, seconds: u64, entry: &[u8], count: u64) -> (f64, f64) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let stop = Arc::new(AtomicBool::new(false));
    let (entries, fsyncs) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let threads: Vec<_> = (0..groups)
        .map(|group| {
            let engine =
                SegmentEngine::open(root.path().join(format!("group-{group}"))).expect("open");
            let (stop, entries, fsyncs) = (stop.clone(), entries.clone(), fsyncs.clone());
            let entry = entry.to_vec();
            std::thread::spawn(move || {
                let mut next = 0;
                while !stop.load(Ordering::Relaxed) {
                    let mut batch = WriteBatch::new();
                    append(&mut batch, group, next, count, &entry);
                    next += count;
                    engine.apply_batch(batch).expect("append");
                    engine.flush().expect("flush");
                    entries.fetch_add(count, Ordering::Relaxed);
                    fsyncs.fetch_add(1, Ordering::Relaxed);
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
        fsyncs.load(Ordering::Relaxed) as f64 / elapsed,
    )
}

/// One shared store, one flush per round for every group.
fn shared(groups: u64, seconds: u64, entry: &[u8], count: u64) -> (f64, f64) {
    let root = tempfile::tempdir().expect("a temporary directory");
    let engine = SegmentEngine::open(root.path()).expect("open");
    let (mut entries, mut fsyncs, mut next) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    while Instant::now() < until {
        let mut batch = WriteBatch::new();
        for group in 0..groups {
            append(&mut batch, group, next, count, entry);
        }
        next += count;
        engine.apply_batch(batch).expect("append");
        engine.flush().expect("flush");
        entries += groups * count;
        fsyncs += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    (entries as f64 / elapsed, fsyncs as f64 / elapsed)
}

fn main() {
    let seconds = arg(1, 3);
    let entry = vec![0x5a_u8; arg(2, 256) as usize];
    let count = arg(3, 32).max(1);
    println!(
        "| groups | a store per group: entries/s | fsyncs/s | one shared store: entries/s | fsyncs/s | shared ÷ per group |"
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
