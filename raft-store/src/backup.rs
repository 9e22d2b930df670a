//! Backups of the coordinator state, and new clusters started from a state:
//! a backup file (`leasehold snapshot save` / `restore`), or the state a
//! survivor holds after its quorum is lost for good (`leasehold
//! force-new-cluster`).
//!
//! # The backup file
//! `LHBACKUP` · file format (u32, big-endian, [`BACKUP_FILE_FORMAT`]) ·
//! body length (u64, big-endian) · body: the [`SnapshotEnvelope`] as the
//! store encodes a snapshot (versioned, [`crate::codec`]) · CRC-32 of every
//! byte before it (u32, big-endian). The checksum finds corruption; it does
//! not authenticate (keep backups where only operators can write).
//!
//! # A new cluster from a state
//! [`write_new_cluster`] writes a member's store holding the state as its
//! snapshot and nothing else: one voter (that member), every other id the
//! state knew retired (their certificates are never heard again), and the
//! windows the source cluster may have granted in after the state was
//! taken sealed ([`CoordinatorState::seal_after_restore`]). The member then
//! starts as the leader of a one-member cluster, which grows back by the
//! usual add-learner and change-membership.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogReader, RaftLogStorage, RaftStateMachine};

use crate::codec::{decode, encode};
use crate::engine::{EngineError, Keyspace, SegmentEngine, StorageEngine, WriteBatch};
use crate::error::StoreError;
use crate::records::{
    SnapshotEnvelope, StoredSnapshot, COMMITTED_KEY, LAST_PURGED_KEY, SNAPSHOT_KEY, VOTE_KEY,
};
use crate::types::{LogId, Membership, Node, NodeId, SnapshotMeta, StoredMembership, Vote};
use crate::{open_data_dir, STORE_DIR};

/// First bytes of a backup file.
pub const BACKUP_MAGIC: &[u8; 8] = b"LHBACKUP";
/// The layout of the backup file around the body (the body carries its own
/// format version).
pub const BACKUP_FILE_FORMAT: u32 = 1;
/// Bytes before the body: magic, file format, body length.
const HEADER_BYTES: usize = 8 + 4 + 8;

/// The bytes of a backup file holding `envelope` (see the module doc).
pub fn backup_bytes(envelope: &SnapshotEnvelope) -> Result<Vec<u8>, StoreError> {
    let body = encode(envelope)?;
    let mut bytes = Vec::with_capacity(HEADER_BYTES + body.len() + 4);
    bytes.extend_from_slice(BACKUP_MAGIC);
    bytes.extend_from_slice(&BACKUP_FILE_FORMAT.to_be_bytes());
    bytes.extend_from_slice(&(body.len() as u64).to_be_bytes());
    bytes.extend_from_slice(&body);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    Ok(bytes)
}

/// Why a file is not a backup this build can read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackupFileError {
    /// It does not start with [`BACKUP_MAGIC`].
    #[error("not a Leasehold backup (it does not start with LHBACKUP)")]
    NotABackup,
    /// A file format this build does not know.
    #[error("backup file format {0}; this build reads format {BACKUP_FILE_FORMAT}")]
    UnknownFormat(u32),
    /// Shorter or longer than its header says.
    #[error("the backup is {actual} bytes, its header says {expected}: truncated or extended")]
    WrongLength {
        /// Bytes the header implies.
        expected: u64,
        /// Bytes read.
        actual: u64,
    },
    /// The checksum does not match.
    #[error("the backup's checksum does not match (stored {stored:08x}, computed {computed:08x}): it is corrupt")]
    Corrupt {
        /// The CRC-32 stored in the file.
        stored: u32,
        /// The CRC-32 of what was read.
        computed: u32,
    },
    /// The body does not decode (an unknown snapshot format included).
    #[error("the backup's state does not decode: {0}")]
    Body(String),
}

/// Reads a backup file's bytes back into the state it holds, checking its
/// magic, format, length and checksum first.
pub fn read_backup(bytes: &[u8]) -> Result<SnapshotEnvelope, BackupFileError> {
    if bytes.len() < HEADER_BYTES || &bytes[..8] != BACKUP_MAGIC {
        return Err(BackupFileError::NotABackup);
    }
    let format = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if format != BACKUP_FILE_FORMAT {
        return Err(BackupFileError::UnknownFormat(format));
    }
    let body_len = u64::from_be_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let expected = body_len.saturating_add((HEADER_BYTES + 4) as u64);
    if expected != bytes.len() as u64 {
        return Err(BackupFileError::WrongLength {
            expected,
            actual: bytes.len() as u64,
        });
    }
    let (covered, stored) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_be_bytes(stored.try_into().expect("4 bytes"));
    let computed = crc32fast::hash(covered);
    if stored != computed {
        return Err(BackupFileError::Corrupt { stored, computed });
    }
    decode(&covered[HEADER_BYTES..]).map_err(|e| BackupFileError::Body(e.to_string()))
}

/// What a state holds, for `snapshot save` / `inspect` and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSummary {
    /// The last log entry the state reflects (`None`: an empty state).
    pub last_log_id: Option<LogId>,
    /// Voters of the membership it was taken under.
    pub voters: Vec<NodeId>,
    /// Every id retired from its cluster.
    pub retired: Vec<NodeId>,
    /// The state-machine clock.
    pub clock_ms: u64,
    /// When the state was last restored (0: never).
    pub restored_at_ms: u64,
    /// Live windows at its clock.
    pub live_windows: u64,
    /// Policies.
    pub policies: u64,
}

impl StateSummary {
    /// The summary of `envelope`.
    pub fn of(envelope: &SnapshotEnvelope) -> StateSummary {
        let state = &envelope.state;
        StateSummary {
            last_log_id: envelope.last_applied,
            voters: envelope.membership.membership().voter_ids().collect(),
            retired: envelope.retired_members.iter().copied().collect(),
            clock_ms: state.now_ms(),
            restored_at_ms: state.restored_at_ms(),
            live_windows: state.live_windows(),
            policies: state.policies().len() as u64,
        }
    }
}

/// Where a new cluster's state comes from (it decides which ids it may use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateOrigin {
    /// A backup: the new cluster's member must have an id the state never
    /// knew, so no member of the old cluster can be heard by the new one.
    Backup,
    /// The store of a surviving member of a cluster whose quorum is lost:
    /// it keeps its own id.
    Survivor,
}

/// Why a new cluster could not be written.
#[derive(Debug, thiserror::Error)]
pub enum NewClusterError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The data directory already holds a store (a restore never
    /// overwrites one).
    #[error("{0} already holds a Raft store; restore into an empty data directory")]
    StoreExists(PathBuf),
    /// The survivor's data directory holds no store.
    #[error("{0} holds no Raft store")]
    NoStore(PathBuf),
    /// The id was a member of the state's cluster (a backup needs a new one).
    #[error(
        "member id {0} belongs to the cluster the backup was taken from (a member or a \
         retired one); give the restored member a new id and its own certificate"
    )]
    IdInUse(NodeId),
    /// A survivor's id is not in its own membership.
    #[error("member {0} is not a member of the cluster its store holds")]
    NotAMember(NodeId),
    /// The state has no log position (a backup of a cluster never
    /// initialised).
    #[error("the state is empty (taken before the cluster was initialised)")]
    EmptyState,
}

/// What [`write_new_cluster`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCluster {
    /// The state's position, now the new cluster's first.
    pub last_log_id: LogId,
    /// The seal: windows starting before `restored_at_ms + window length`
    /// grant nothing more.
    pub restored_at_ms: u64,
    /// Every id the new cluster refuses for good.
    pub retired: BTreeSet<NodeId>,
    /// Where the survivor's previous store was kept (`Survivor` only).
    pub previous_store: Option<PathBuf>,
}

/// Writes into `data_dir` the store of member `id` at `addr`, the only
/// voter of a new cluster starting from `envelope`, with the windows of the
/// source cluster sealed as of `restored_at_ms` (no earlier than that
/// cluster's last clock: the caller's wall clock plus a margin for clock
/// skew). See the module doc.
///
/// `Backup`: `data_dir` must hold no store, and `id` must be new to the
/// state. `Survivor`: `id` must be in the state's membership; its store is
/// replaced (the previous one is renamed aside, `store.before-recovery-…`).
/// The new store is written beside and renamed into place, so a crash
/// leaves either the old store or the complete new one.
pub fn write_new_cluster(
    data_dir: &Path,
    mut envelope: SnapshotEnvelope,
    id: NodeId,
    addr: &str,
    restored_at_ms: u64,
    origin: StateOrigin,
) -> Result<NewCluster, NewClusterError> {
    let io = |error: std::io::Error| StoreError::from(EngineError::Backend(Box::new(error)));
    let last_log_id = envelope.last_applied.ok_or(NewClusterError::EmptyState)?;
    let old_members: BTreeSet<NodeId> = envelope
        .membership
        .membership()
        .nodes()
        .map(|(id, _)| *id)
        .collect();
    let store = data_dir.join(STORE_DIR);
    match origin {
        StateOrigin::Backup => {
            if old_members.contains(&id) || envelope.retired_members.contains(&id) {
                return Err(NewClusterError::IdInUse(id));
            }
            if store.exists() {
                return Err(NewClusterError::StoreExists(store));
            }
        }
        StateOrigin::Survivor => {
            if !old_members.contains(&id) {
                return Err(NewClusterError::NotAMember(id));
            }
            if !store.exists() {
                return Err(NewClusterError::NoStore(store));
            }
        }
    }
    envelope.state.seal_after_restore(restored_at_ms);
    let restored_at_ms = envelope.state.restored_at_ms();
    let mut retired = envelope.retired_members.clone();
    retired.extend(old_members.iter().copied().filter(|old| *old != id));
    envelope.retired_members = retired.clone();
    let membership = Membership::new(
        vec![BTreeSet::from([id])],
        BTreeMap::from([(id, Node::new(addr))]),
    );
    envelope.membership = StoredMembership::new(Some(last_log_id), membership);
    let stored = StoredSnapshot {
        meta: SnapshotMeta {
            last_log_id: Some(last_log_id),
            last_membership: envelope.membership.clone(),
            snapshot_id: format!(
                "restored-{}-{}-{}",
                last_log_id.leader_id.term, last_log_id.index, restored_at_ms
            ),
        },
        data: encode(&envelope).map_err(StoreError::from)?,
    };

    std::fs::create_dir_all(data_dir).map_err(io)?;
    let writing = data_dir.join(format!("{STORE_DIR}.restoring"));
    if writing.exists() {
        std::fs::remove_dir_all(&writing).map_err(io)?;
    }
    {
        let engine = SegmentEngine::open(&writing).map_err(StoreError::from)?;
        let mut batch = WriteBatch::new();
        let encoded = |value: Result<Vec<u8>, _>| value.map_err(StoreError::from);
        batch.insert(
            Keyspace::StateMachine,
            SNAPSHOT_KEY,
            encoded(encode(&stored))?,
        );
        let vote = Vote::new(last_log_id.leader_id.term, id);
        batch.insert(Keyspace::LogMeta, VOTE_KEY, encoded(encode(&vote))?);
        batch.insert(
            Keyspace::LogMeta,
            LAST_PURGED_KEY,
            encoded(encode(&last_log_id))?,
        );
        batch.insert(
            Keyspace::LogMeta,
            COMMITTED_KEY,
            encoded(encode(&last_log_id))?,
        );
        engine.apply_batch(batch).map_err(StoreError::from)?;
        engine.flush().map_err(StoreError::from)?;
    }
    let previous_store = if store.exists() {
        let aside = data_dir.join(format!("{STORE_DIR}.before-recovery-{restored_at_ms}"));
        std::fs::rename(&store, &aside).map_err(io)?;
        Some(aside)
    } else {
        None
    };
    std::fs::rename(&writing, &store).map_err(io)?;
    std::fs::File::open(data_dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io)?;
    Ok(NewCluster {
        last_log_id,
        restored_at_ms,
        retired,
        previous_store,
    })
}

/// The state a stopped member's store holds with every entry of its log
/// applied — committed or not, as far as it knows (a survivor of a lost
/// quorum cannot tell; the entries the lost members held beyond its log
/// are what a forced new cluster loses).
pub async fn survivor_state(data_dir: &Path) -> Result<SnapshotEnvelope, NewClusterError> {
    let store = data_dir.join(STORE_DIR);
    if !store.exists() {
        return Err(NewClusterError::NoStore(store));
    }
    let storage = |e: crate::StorageError| StoreError::from(EngineError::Backend(Box::new(e)));
    let (mut log_store, mut state_machine) = open_data_dir(data_dir)?;
    let log_state = log_store.get_log_state().await.map_err(storage)?;
    let applied = state_machine.last_applied().map_or(0, |id| id.index + 1);
    if let Some(last) = log_state.last_log_id {
        let mut next = applied.max(log_state.last_purged_log_id.map_or(0, |id| id.index + 1));
        while next <= last.index {
            let end = last.index.min(next + 1_023);
            let entries = log_store
                .try_get_log_entries(next..=end)
                .await
                .map_err(storage)?;
            state_machine.apply(entries).await.map_err(storage)?;
            next = end + 1;
        }
    }
    Ok(state_machine.envelope())
}
