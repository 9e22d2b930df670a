//! Laws of the storage seam, checked against a plain ordered-map model for
//! both engines, plus the power-loss semantics of [`PowerLossDisk`].

use std::collections::BTreeMap;
use std::ops::Bound;

use proptest::prelude::*;

use super::*;

type Model = BTreeMap<Keyspace, BTreeMap<Vec<u8>, Vec<u8>>>;

#[derive(Debug, Clone)]
enum Step {
    Batch(Vec<WriteOp>),
    Flush,
    Crash,
}

fn keyspace() -> impl Strategy<Value = Keyspace> {
    prop::sample::select(Keyspace::ALL.to_vec())
}

fn small_key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..4, 0..3)
}

fn write_op() -> impl Strategy<Value = WriteOp> {
    prop_oneof![
        3 => (keyspace(), small_key(), prop::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(keyspace, key, value)| WriteOp::Insert { keyspace, key, value }),
        1 => (keyspace(), small_key()).prop_map(|(keyspace, key)| WriteOp::Remove { keyspace, key }),
    ]
}

fn step(with_crash: bool) -> impl Strategy<Value = Step> {
    let crash_weight = if with_crash { 1 } else { 0 };
    prop_oneof![
        6 => prop::collection::vec(write_op(), 1..4).prop_map(Step::Batch),
        2 => Just(Step::Flush),
        crash_weight => Just(Step::Crash),
    ]
}

fn bound() -> impl Strategy<Value = Bound<Vec<u8>>> {
    prop_oneof![
        small_key().prop_map(Bound::Included),
        small_key().prop_map(Bound::Excluded),
        Just(Bound::Unbounded),
    ]
}

fn apply_to_model(model: &mut Model, ops: &[WriteOp]) {
    for op in ops {
        match op {
            WriteOp::Insert {
                keyspace,
                key,
                value,
            } => {
                model
                    .entry(*keyspace)
                    .or_default()
                    .insert(key.clone(), value.clone());
            }
            WriteOp::Remove { keyspace, key } => {
                model.entry(*keyspace).or_default().remove(key);
            }
        }
    }
}

fn batch_of(ops: &[WriteOp]) -> WriteBatch {
    let mut batch = WriteBatch::new();
    for op in ops {
        match op.clone() {
            WriteOp::Insert {
                keyspace,
                key,
                value,
            } => batch.insert(keyspace, key, value),
            WriteOp::Remove { keyspace, key } => batch.remove(keyspace, key),
        }
    }
    batch
}

fn as_ref_bound(bound: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match bound {
        Bound::Included(key) => Bound::Included(key.as_slice()),
        Bound::Excluded(key) => Bound::Excluded(key.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// Asserts that every read of `engine` agrees with `model`.
fn assert_reads_match(
    engine: &dyn StorageEngine,
    model: &Model,
    probe: &(Bound<Vec<u8>>, Bound<Vec<u8>>),
) -> Result<(), TestCaseError> {
    let empty = BTreeMap::new();
    for keyspace in Keyspace::ALL {
        let expected = model.get(&keyspace).unwrap_or(&empty);
        let all: Vec<KeyValue> = expected
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let unbounded = (Bound::Unbounded, Bound::Unbounded);
        prop_assert_eq!(&engine.range(keyspace, unbounded).expect("range"), &all);
        prop_assert_eq!(engine.first(keyspace).expect("first"), all.first().cloned());
        prop_assert_eq!(engine.last(keyspace).expect("last"), all.last().cloned());
        let range = (as_ref_bound(&probe.0), as_ref_bound(&probe.1));
        let in_probe: Vec<KeyValue> = if is_empty_range(&range) {
            Vec::new()
        } else {
            expected
                .range::<[u8], _>(range)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        prop_assert_eq!(
            engine.range(keyspace, range).expect("probe range"),
            in_probe
        );
        for key in [vec![], vec![0], vec![1, 2]] {
            prop_assert_eq!(
                engine.get(keyspace, &key).expect("get"),
                expected.get(&key).cloned()
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Reads see every applied batch; a crash leaves exactly what was
    /// flushed; engines opened before a crash are fenced.
    #[test]
    fn power_loss_engine_keeps_exactly_the_flushed_writes(
        steps in prop::collection::vec(step(true), 1..40),
        probe in (bound(), bound()),
    ) {
        let disk = PowerLossDisk::new();
        let mut engine = disk.open_engine();
        let (mut current, mut durable) = (Model::new(), Model::new());
        for step in steps {
            match step {
                Step::Batch(ops) => {
                    engine.apply_batch(batch_of(&ops)).expect("apply");
                    apply_to_model(&mut current, &ops);
                }
                Step::Flush => {
                    engine.flush().expect("flush");
                    durable = current.clone();
                }
                Step::Crash => {
                    disk.crash();
                    prop_assert!(matches!(engine.get(Keyspace::Log, b""), Err(EngineError::Crashed)));
                    prop_assert!(matches!(engine.flush(), Err(EngineError::Crashed)));
                    engine = disk.open_engine();
                    current = durable.clone();
                }
            }
            assert_reads_match(&engine, &current, &probe)?;
        }
    }

    /// The weakened disk lags one flush behind: a crash loses what the last
    /// flush claimed to have made durable.
    #[test]
    fn weakened_disk_loses_the_last_acknowledged_flush(
        steps in prop::collection::vec(step(true), 1..40),
    ) {
        let disk = PowerLossDisk::with_options(PowerLossOptions { acknowledge_before_durable: true });
        let mut engine = disk.open_engine();
        let (mut current, mut cached, mut durable) = (Model::new(), Model::new(), Model::new());
        let probe = (Bound::Unbounded, Bound::Unbounded);
        for step in steps {
            match step {
                Step::Batch(ops) => {
                    engine.apply_batch(batch_of(&ops)).expect("apply");
                    apply_to_model(&mut current, &ops);
                }
                Step::Flush => {
                    engine.flush().expect("flush");
                    durable = std::mem::replace(&mut cached, current.clone());
                }
                Step::Crash => {
                    disk.crash();
                    engine = disk.open_engine();
                    current = durable.clone();
                    cached = durable.clone();
                }
            }
            assert_reads_match(&engine, &current, &probe)?;
        }
    }

    /// sled agrees with the model for every read, and what was flushed is
    /// there after reopening the directory.
    #[cfg(feature = "migrate-sled")]
    #[test]
    fn sled_engine_matches_the_model(
        steps in prop::collection::vec(step(false), 1..25),
        probe in (bound(), bound()),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut model = Model::new();
        {
            let engine = SledEngine::open(dir.path()).expect("open");
            for step in steps {
                match step {
                    Step::Batch(ops) => {
                        engine.apply_batch(batch_of(&ops)).expect("apply");
                        apply_to_model(&mut model, &ops);
                    }
                    Step::Flush | Step::Crash => engine.flush().expect("flush"),
                }
                assert_reads_match(&engine, &model, &probe)?;
            }
            engine.flush().expect("flush");
        }
        let reopened = SledEngine::open(dir.path()).expect("reopen");
        assert_reads_match(&reopened, &model, &probe)?;
    }
}

#[test]
fn unflushed_writes_are_counted_and_vanish_on_crash() {
    let disk = PowerLossDisk::new();
    let engine = disk.open_engine();
    engine
        .insert(Keyspace::LogMeta, b"kept", vec![1])
        .expect("insert");
    engine.flush().expect("flush");
    engine
        .insert(Keyspace::LogMeta, b"lost", vec![2])
        .expect("insert");
    assert_eq!(disk.volatile_writes(), 1);
    disk.crash();
    let engine = disk.open_engine();
    assert_eq!(
        engine.get(Keyspace::LogMeta, b"kept").expect("get"),
        Some(vec![1])
    );
    assert_eq!(engine.get(Keyspace::LogMeta, b"lost").expect("get"), None);
    assert_eq!((disk.volatile_writes(), disk.crash_count()), (0, 1));
}

/// Thresholds small enough that the generated values take every path:
/// inline (≤ 1 byte), in the segment (2 bytes), blob files (≥ 3 bytes), and
/// compactions every few dozen bytes of dead records.
const TINY: SegmentOptions = SegmentOptions {
    inline_max_bytes: 1,
    blob_min_bytes: 3,
    compaction_slack_bytes: 64,
};

fn files_in(dir: &std::path::Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("readable directory")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(prefix))
        })
        .collect();
    files.sort();
    files
}

/// Where a simulated power cut tears the unsynced tail of a file: a
/// fraction (in 1/65 536ths) of the unsynced bytes survives.
fn surviving(from: u64, to: u64, fraction: u16) -> u64 {
    from + (to - from) * u64::from(fraction) / 65_536
}

#[derive(Debug, Clone)]
enum DiskStep {
    Batch(Vec<WriteOp>),
    Flush,
    /// Power cut: each unsynced file keeps a prefix of its unsynced bytes;
    /// `flip` also damages one surviving unsynced byte of the segment.
    PowerCut {
        keep: u16,
        flip: Option<u16>,
    },
}

fn disk_step() -> impl Strategy<Value = DiskStep> {
    prop_oneof![
        6 => prop::collection::vec(write_op(), 1..4).prop_map(DiskStep::Batch),
        2 => Just(DiskStep::Flush),
        1 => (any::<u16>(), prop::option::of(any::<u16>()))
            .prop_map(|(keep, flip)| DiskStep::PowerCut { keep, flip }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The segment engine agrees with the model for every read, across
    /// compactions, and after reopening the directory.
    #[test]
    fn segment_engine_matches_the_model(
        steps in prop::collection::vec(step(false), 1..40),
        probe in (bound(), bound()),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut model = Model::new();
        {
            let engine = SegmentEngine::open_with(dir.path(), TINY).expect("open");
            for step in steps {
                match step {
                    Step::Batch(ops) => {
                        engine.apply_batch(batch_of(&ops)).expect("apply");
                        apply_to_model(&mut model, &ops);
                    }
                    Step::Flush | Step::Crash => {
                        engine.flush().expect("flush");
                        let stats = engine.stats();
                        prop_assert!(
                            stats.segment_bytes <= 2 * stats.live_segment_bytes + TINY.compaction_slack_bytes,
                            "a flush leaves the segment compacted: {:?}", stats
                        );
                    }
                }
                assert_reads_match(&engine, &model, &probe)?;
            }
            engine.flush().expect("flush");
        }
        let reopened = SegmentEngine::open_with(dir.path(), TINY).expect("reopen");
        assert_reads_match(&reopened, &model, &probe)?;
        // Exactly one segment, and no blob but the live ones.
        prop_assert_eq!(files_in(dir.path(), "segment-").len(), 1);
        let live_blobs = Keyspace::ALL
            .iter()
            .flat_map(|keyspace| model.get(keyspace).into_iter().flat_map(|tree| tree.values()))
            .filter(|value| value.len() >= TINY.blob_min_bytes)
            .count();
        prop_assert_eq!(files_in(dir.path(), "blob-").len(), live_blobs);
    }

    /// A power cut keeps every flushed batch and, of the batches applied
    /// since, a prefix — each whole or not at all — however the unsynced
    /// tails of the segment and the blob files are torn or damaged.
    #[test]
    fn segment_engine_keeps_the_flushed_batches_and_a_prefix_of_the_rest(
        steps in prop::collection::vec(disk_step(), 1..40),
    ) {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut engine = SegmentEngine::open_with(dir.path(), TINY).expect("open");
        let probe = (Bound::Unbounded, Bound::Unbounded);
        let mut durable = Model::new();
        let mut pending: Vec<Vec<WriteOp>> = Vec::new();
        let mut synced_segment_bytes = engine.stats().segment_bytes;
        let mut synced_blobs = files_in(dir.path(), "blob-");
        for step in steps {
            match step {
                DiskStep::Batch(ops) => {
                    engine.apply_batch(batch_of(&ops)).expect("apply");
                    pending.push(ops);
                }
                DiskStep::Flush => {
                    engine.flush().expect("flush");
                    for ops in pending.drain(..) {
                        apply_to_model(&mut durable, &ops);
                    }
                    synced_segment_bytes = engine.stats().segment_bytes;
                    synced_blobs = files_in(dir.path(), "blob-");
                }
                DiskStep::PowerCut { keep, flip } => {
                    drop(engine);
                    let segment = files_in(dir.path(), "segment-").pop().expect("a segment");
                    let file = std::fs::OpenOptions::new().read(true).write(true).open(&segment).expect("segment opens");
                    let written = file.metadata().expect("metadata").len();
                    let kept = surviving(synced_segment_bytes, written, keep);
                    file.set_len(kept).expect("truncate");
                    if let (Some(flip), true) = (flip, kept > synced_segment_bytes) {
                        use std::os::unix::fs::FileExt;
                        let at = surviving(synced_segment_bytes, kept - 1, flip);
                        let mut byte = [0u8];
                        file.read_exact_at(&mut byte, at).expect("read");
                        file.write_all_at(&[byte[0] ^ 0x5a], at).expect("write");
                    }
                    for blob in files_in(dir.path(), "blob-") {
                        if !synced_blobs.contains(&blob) {
                            let file = std::fs::OpenOptions::new().write(true).open(&blob).expect("blob opens");
                            let len = file.metadata().expect("metadata").len();
                            file.set_len(surviving(0, len, keep)).expect("truncate");
                        }
                    }
                    engine = SegmentEngine::open_with(dir.path(), TINY).expect("reopens after a power cut");
                    // The recovered state is the flushed one plus some prefix
                    // of the pending batches.
                    let mut candidate = durable.clone();
                    let mut matched = assert_reads_match(&engine, &candidate, &probe).is_ok();
                    for ops in &pending {
                        if matched {
                            break;
                        }
                        apply_to_model(&mut candidate, ops);
                        matched = assert_reads_match(&engine, &candidate, &probe).is_ok();
                    }
                    prop_assert!(matched, "the recovered store is the flushed state plus a prefix of the later batches");
                    durable = candidate;
                    pending.clear();
                    synced_segment_bytes = engine.stats().segment_bytes;
                    synced_blobs = files_in(dir.path(), "blob-");
                }
            }
        }
    }
}

#[test]
fn compaction_replaces_the_segment_and_deletes_dead_blobs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = SegmentEngine::open_with(dir.path(), TINY).expect("open");
    for round in 0..200u32 {
        let mut batch = WriteBatch::new();
        batch.insert(Keyspace::Log, round.to_be_bytes(), vec![7, 7]);
        batch.insert(
            Keyspace::StateMachine,
            b"snapshot".as_slice(),
            round.to_le_bytes().to_vec(),
        );
        if round >= 10 {
            batch.remove(Keyspace::Log, (round - 10).to_be_bytes());
        }
        engine.apply_batch(batch).expect("apply");
        engine.flush().expect("flush");
        assert_eq!(
            files_in(dir.path(), "blob-").len(),
            1,
            "only the live snapshot's blob is kept"
        );
        assert_eq!(files_in(dir.path(), "segment-").len(), 1);
    }
    let stats = engine.stats();
    assert!(
        stats.compactions >= 199,
        "each replaced blob compacts: {stats:?}"
    );
    assert!(stats.segment_bytes <= 2 * stats.live_segment_bytes + TINY.compaction_slack_bytes);
    drop(engine);
    let reopened = SegmentEngine::open_with(dir.path(), TINY).expect("reopen");
    let log = reopened
        .range(Keyspace::Log, (Bound::Unbounded, Bound::Unbounded))
        .expect("range");
    assert_eq!(log.len(), 10);
    assert_eq!(log[0].0, 190u32.to_be_bytes().to_vec());
    assert_eq!(
        reopened
            .get(Keyspace::StateMachine, b"snapshot")
            .expect("get"),
        Some(199u32.to_le_bytes().to_vec())
    );
}

#[test]
fn a_segment_of_an_unknown_format_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(SegmentEngine::open(dir.path()).expect("open"));
    let segment = files_in(dir.path(), "segment-").pop().expect("a segment");
    std::fs::write(&segment, b"LHSEG\0\0\x09").expect("write");
    let error = SegmentEngine::open(dir.path()).expect_err("an unknown format version is refused");
    assert!(error.to_string().contains("header"), "{error}");
}

#[test]
fn one_engine_at_a_time_holds_a_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = SegmentEngine::open(dir.path()).expect("open");
    first
        .insert(Keyspace::LogMeta, b"vote", vec![1])
        .expect("insert");
    first.flush().expect("flush");
    let path = dir.path().to_path_buf();
    let opened_at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let second = {
        let opened_at = opened_at.clone();
        std::thread::spawn(move || {
            let engine = SegmentEngine::open(&path).expect("opens once the first lets go");
            *opened_at.lock().expect("lock") = Some(std::time::Instant::now());
            engine
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        opened_at.lock().expect("lock").is_none(),
        "the second open waits"
    );
    let released = std::time::Instant::now();
    drop(first);
    let second = second.join().expect("second open");
    assert!(opened_at.lock().expect("lock").expect("opened") >= released);
    assert_eq!(
        second.get(Keyspace::LogMeta, b"vote").expect("get"),
        Some(vec![1])
    );
}
