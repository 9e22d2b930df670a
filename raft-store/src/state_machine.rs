//! The replicated coordinator state machine: openraft's `RaftStateMachine` +
//! `RaftSnapshotBuilder` around [`CoordinatorState::apply`].
//!
//! Persistence model ("persistent snapshot"): `apply` changes memory only;
//! every built or installed snapshot is written and flushed before openraft
//! learns of it (and so before any log entry it covers is purged). On
//! restart the state machine is the latest snapshot and openraft re-applies
//! the committed log entries after it. Nothing acknowledged is lost because
//! the log entries themselves are durable before they are acknowledged; the
//! snapshot policy bounds how many entries a restart replays.
//!
//! Reads for the API go through [`StateReader`] (a shared handle that stays
//! valid after the store is handed to openraft).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use leasehold_core::coordinator::{CoordinatorState, ProposalResult};
use openraft::storage::RaftStateMachine;
use openraft::{ErrorSubject, ErrorVerb, OptionalSend, RaftSnapshotBuilder};

use crate::codec::{decode, encode};
use crate::engine::{Keyspace, StorageEngine};
use crate::error::{OrStorageError, StoreError};
use crate::records::{retired_by, SnapshotEnvelope, StoredSnapshot, SNAPSHOT_KEY};
use crate::types::{
    Entry, EntryPayload, LogId, NodeId, Snapshot, SnapshotMeta, StorageError, StoredMembership,
    TypeConfig,
};

/// The in-memory state machine: the coordinator state and how far it got.
#[derive(Debug, Default)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: CoordinatorState,
}

impl Applied {
    /// The applied state of `envelope`, and its retired member ids.
    fn from_envelope(envelope: SnapshotEnvelope) -> (Self, BTreeSet<NodeId>) {
        let applied = Self {
            last_applied: envelope.last_applied,
            membership: envelope.membership,
            state: envelope.state,
        };
        (applied, envelope.retired_members)
    }
}

type SharedApplied = Arc<RwLock<Applied>>;

/// Member ids a committed membership change removed, ever: part of the
/// applied state, but under a lock of its own so that the Raft transport,
/// which checks it on every message, never waits for `apply`. Written only
/// while the applied state's write lock is held, so a snapshot (taken
/// under its read lock) sees both as of the same entry.
type SharedRetired = Arc<RwLock<BTreeSet<NodeId>>>;

fn read_retired(retired: &SharedRetired) -> RwLockReadGuard<'_, BTreeSet<NodeId>> {
    retired.read().unwrap_or_else(PoisonError::into_inner)
}

fn read_lock(applied: &SharedApplied) -> RwLockReadGuard<'_, Applied> {
    applied.read().unwrap_or_else(PoisonError::into_inner)
}

fn write_lock(applied: &SharedApplied) -> RwLockWriteGuard<'_, Applied> {
    applied.write().unwrap_or_else(PoisonError::into_inner)
}

/// Read access to the applied coordinator state, for serving reads after
/// openraft's read index (`Raft::ensure_linearizable`) has been reached.
#[derive(Clone)]
pub struct StateReader {
    applied: SharedApplied,
    retired: SharedRetired,
    snapshot: Arc<SnapshotStats>,
    placement: Arc<tokio::sync::watch::Sender<u64>>,
}

/// The size and time of the member's stored snapshot.
#[derive(Debug, Default)]
pub struct SnapshotStats {
    /// Encoded bytes of the stored snapshot (0: none).
    bytes: AtomicU64,
    /// When it was stored by this process, or loaded at start.
    stored_at: Mutex<Option<std::time::Instant>>,
}

impl SnapshotStats {
    fn stored(&self, bytes: usize) {
        self.bytes.store(bytes as u64, Ordering::Relaxed);
        *self
            .stored_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(std::time::Instant::now());
    }

    /// Encoded bytes of the stored snapshot (0 when there is none).
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Time since the snapshot was stored (built or installed) by this
    /// process, or since the process loaded it at start; `None` without one.
    pub fn age(&self) -> Option<std::time::Duration> {
        self.stored_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map(|at| at.elapsed())
    }
}

impl Debug for StateReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateReader")
            .field("last_applied", &self.last_applied())
            .finish_non_exhaustive()
    }
}

impl StateReader {
    /// The applied state's placement version (ADR 0025), changing when an
    /// applied entry or an installed snapshot changes it.
    pub fn placement_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.placement.subscribe()
    }

    /// Runs `f` on the current coordinator state. Holds a read lock for the
    /// duration of `f`, which blocks `apply`: keep `f` short and never await
    /// inside it.
    pub fn read<T>(&self, f: impl FnOnce(&CoordinatorState) -> T) -> T {
        f(&read_lock(&self.applied).state)
    }

    /// Runs `f` on the current coordinator state and the last log id
    /// applied to it, both under one read lock (same rules as
    /// [`read`](Self::read)).
    pub fn read_applied<T>(&self, f: impl FnOnce(&CoordinatorState, Option<LogId>) -> T) -> T {
        let applied = read_lock(&self.applied);
        f(&applied.state, applied.last_applied)
    }

    /// The last log id applied to the state `read` sees.
    pub fn last_applied(&self) -> Option<LogId> {
        read_lock(&self.applied).last_applied
    }

    /// The last applied membership configuration.
    pub fn membership(&self) -> StoredMembership {
        read_lock(&self.applied).membership.clone()
    }

    /// Every member id a committed membership change has removed from the
    /// cluster (replicated, kept in snapshots): never to be accepted again.
    pub fn retired_members(&self) -> BTreeSet<NodeId> {
        read_retired(&self.retired).clone()
    }

    /// Whether member `id` was removed from the cluster by a committed
    /// membership change.
    pub fn is_retired(&self, id: NodeId) -> bool {
        read_retired(&self.retired).contains(&id)
    }

    /// The applied state as a snapshot's contents: state, last applied log
    /// id, membership and retired ids, all as of one moment (a copy of the
    /// whole state, taken under the read lock).
    pub fn envelope(&self) -> SnapshotEnvelope {
        let applied = read_lock(&self.applied);
        SnapshotEnvelope {
            last_applied: applied.last_applied,
            membership: applied.membership.clone(),
            state: applied.state.clone(),
            retired_members: read_retired(&self.retired).clone(),
        }
    }

    /// The size and age of the stored snapshot.
    pub fn snapshot(&self) -> &SnapshotStats {
        &self.snapshot
    }
}

/// Whether storing a snapshot may replace one that covers more of the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replace {
    /// Keep the stored snapshot if it is newer (snapshots built locally).
    UnlessNewerStored,
    /// Always replace (snapshots installed from the leader).
    Always,
}

/// Persists snapshots; shared by the state machine and its builders.
#[derive(Clone)]
struct SnapshotStore {
    engine: Arc<dyn StorageEngine>,
    /// Serialises "compare with the stored snapshot, then replace it".
    replace_lock: Arc<Mutex<()>>,
    next_id: Arc<AtomicU64>,
    stats: Arc<SnapshotStats>,
}

impl SnapshotStore {
    fn load(&self) -> Result<Option<StoredSnapshot>, StoreError> {
        match self.engine.get(Keyspace::StateMachine, SNAPSHOT_KEY)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }

    /// Stores `snapshot` durably. With [`Replace::UnlessNewerStored`] it is
    /// skipped when a snapshot covering more of the log is already stored (a
    /// slow builder must not roll the snapshot back); an installed snapshot
    /// always replaces the stored one, as openraft requires.
    fn store_durably(&self, snapshot: &StoredSnapshot, replace: Replace) -> Result<(), StoreError> {
        let _serialised = self
            .replace_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if replace == Replace::UnlessNewerStored {
            if let Some(stored) = self.load()? {
                if stored.meta.last_log_id > snapshot.meta.last_log_id {
                    return Ok(());
                }
            }
        }
        let encoded = encode(snapshot)?;
        let bytes = encoded.len();
        self.engine
            .insert(Keyspace::StateMachine, SNAPSHOT_KEY, encoded)?;
        self.engine.flush()?;
        self.stats.stored(bytes);
        Ok(())
    }

    fn snapshot_id(&self, last_applied: Option<LogId>) -> String {
        let sequence = self.next_id.fetch_add(1, Ordering::Relaxed);
        match last_applied {
            Some(log_id) => format!(
                "{}-{}-{}-{sequence}",
                log_id.leader_id.term, log_id.leader_id.node_id, log_id.index
            ),
            None => format!("none-{sequence}"),
        }
    }
}

fn into_openraft(snapshot: StoredSnapshot) -> Snapshot {
    Snapshot {
        meta: snapshot.meta,
        snapshot: Box::new(Cursor::new(snapshot.data)),
    }
}

/// The coordinator state machine of one member. Cloning shares it.
#[derive(Clone)]
pub struct StateMachineStore {
    applied: SharedApplied,
    retired: SharedRetired,
    snapshots: SnapshotStore,
    /// The applied state's placement version, sent when it changes (an
    /// apply or an installed snapshot): what hosts shards waits on it
    /// instead of waking at every entry.
    placement: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Debug for StateMachineStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("last_applied", &self.last_applied())
            .finish_non_exhaustive()
    }
}

impl StateMachineStore {
    /// Restores the state machine from the latest stored snapshot (blank if
    /// there is none).
    pub(crate) fn open(engine: Arc<dyn StorageEngine>) -> Result<Self, StoreError> {
        let snapshots = SnapshotStore {
            engine,
            replace_lock: Arc::new(Mutex::new(())),
            next_id: Arc::new(AtomicU64::new(0)),
            stats: Arc::default(),
        };
        let (applied, retired) = match snapshots.engine.get(Keyspace::StateMachine, SNAPSHOT_KEY)? {
            Some(bytes) => {
                let stored: StoredSnapshot = decode(&bytes)?;
                snapshots.stats.stored(bytes.len());
                Applied::from_envelope(decode(&stored.data)?)
            }
            None => (Applied::default(), BTreeSet::new()),
        };
        let placement = applied.state.sharding().placement_version();
        Ok(Self {
            applied: Arc::new(RwLock::new(applied)),
            retired: Arc::new(RwLock::new(retired)),
            snapshots,
            placement: Arc::new(tokio::sync::watch::channel(placement).0),
        })
    }

    /// Sends the applied state's placement version if it changed.
    fn note_placement(&self, state: &CoordinatorState) {
        let version = state.sharding().placement_version();
        self.placement.send_if_modified(|sent| {
            let changed = *sent != version;
            *sent = version;
            changed
        });
    }

    /// A read handle that stays valid after this store is moved into
    /// `Raft::new`.
    pub fn reader(&self) -> StateReader {
        StateReader {
            applied: self.applied.clone(),
            retired: self.retired.clone(),
            snapshot: self.snapshots.stats.clone(),
            placement: self.placement.clone(),
        }
    }

    /// Runs `f` on the current coordinator state (see [`StateReader::read`]).
    pub fn read<T>(&self, f: impl FnOnce(&CoordinatorState) -> T) -> T {
        f(&read_lock(&self.applied).state)
    }

    /// The last log id applied.
    pub fn last_applied(&self) -> Option<LogId> {
        read_lock(&self.applied).last_applied
    }

    /// The retired member ids, for writing: only while the applied state's
    /// write lock is held (see [`SharedRetired`]).
    fn retired_write(&self) -> RwLockWriteGuard<'_, BTreeSet<NodeId>> {
        self.retired.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The current state as a snapshot's contents (see
    /// [`StateReader::envelope`]).
    pub fn envelope(&self) -> SnapshotEnvelope {
        self.reader().envelope()
    }

    fn snapshot_of(&self, envelope: SnapshotEnvelope) -> Result<StoredSnapshot, StoreError> {
        let data = encode(&envelope)?;
        Ok(StoredSnapshot {
            meta: SnapshotMeta {
                last_log_id: envelope.last_applied,
                last_membership: envelope.membership,
                snapshot_id: self.snapshots.snapshot_id(envelope.last_applied),
            },
            data,
        })
    }

    fn install(&self, meta: &SnapshotMeta, data: Vec<u8>) -> Result<(), StoreError> {
        let envelope: SnapshotEnvelope = decode(&data)?;
        if envelope.last_applied != meta.last_log_id {
            return Err(StoreError::SnapshotMismatch {
                envelope: format!("{:?}", envelope.last_applied),
                meta: format!("{:?}", meta.last_log_id),
            });
        }
        let installed = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.snapshots.store_durably(&installed, Replace::Always)?;
        let mut applied = write_lock(&self.applied);
        *applied = Applied {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state: envelope.state,
        };
        *self.retired_write() = envelope.retired_members;
        self.note_placement(&applied.state);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let started = std::time::Instant::now();
        let envelope = self.envelope();
        let copied = started.elapsed();
        let snapshot = self
            .snapshot_of(envelope)
            .or_storage(ErrorSubject::Snapshot(None), ErrorVerb::Write)?;
        let encoded = started.elapsed();
        self.snapshots
            .store_durably(&snapshot, Replace::UnlessNewerStored)
            .or_storage(ErrorSubject::Snapshot(None), ErrorVerb::Write)?;
        // The copy holds the state's lock (applies wait for it): the
        // stall a snapshot puts on the group (docs/benchmarks.md, "What a
        // snapshot costs the callers").
        let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            meta = %snapshot.meta,
            bytes = snapshot.data.len(),
            copy_ms = ms(copied),
            encode_ms = ms(encoded.saturating_sub(copied)),
            total_ms = ms(started.elapsed()),
            "built snapshot"
        );
        Ok(into_openraft(snapshot))
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let applied = read_lock(&self.applied);
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ProposalResult>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut applied = write_lock(&self.applied);
        let mut results = Vec::new();
        for entry in entries {
            applied.last_applied = Some(entry.log_id);
            let result = match entry.payload {
                EntryPayload::Blank => ProposalResult::default(),
                EntryPayload::Normal(proposal) => applied.state.apply(&proposal),
                EntryPayload::Membership(membership) => {
                    let retired = retired_by(applied.membership.membership(), &membership);
                    self.retired_write().extend(retired);
                    applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                    ProposalResult::default()
                }
            };
            results.push(result);
        }
        self.note_placement(&applied.state);
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        tracing::info!(%meta, "installing snapshot");
        self.install(meta, snapshot.into_inner()).or_storage(
            ErrorSubject::Snapshot(Some(meta.signature())),
            ErrorVerb::Write,
        )
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let stored = self
            .snapshots
            .load()
            .or_storage(ErrorSubject::Snapshot(None), ErrorVerb::Read)?;
        Ok(stored.map(into_openraft))
    }
}
