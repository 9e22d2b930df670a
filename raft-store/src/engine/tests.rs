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
