//! What the store persists, the keys it persists it under, and the format
//! version of each record (see [`crate::codec`]), with the readers of older
//! versions (formats 2 and 3 of entries and snapshots, upgraded on read).

use leasehold_core::coordinator::format_v2::{CoordinatorStateV2, ProposalV2};
use leasehold_core::coordinator::format_v3::CoordinatorStateV3;
use leasehold_core::coordinator::format_v6::CoordinatorStateV6;
use leasehold_core::coordinator::format_v7::CoordinatorStateV7;
use leasehold_core::coordinator::format_v8::CoordinatorStateV8;
use leasehold_core::coordinator::sharding::SessionsPart;
use leasehold_core::coordinator::{Command, CoordinatorState, Proposal};
use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::codec::{CodecError, Persisted};
use crate::types::{
    Entry, EntryPayload, LogId, Membership, NodeId, SnapshotMeta, StoredMembership, Vote,
};

/// [`Keyspace::LogMeta`](crate::Keyspace::LogMeta) key of the vote.
pub(crate) const VOTE_KEY: &[u8] = b"vote";
/// [`Keyspace::LogMeta`](crate::Keyspace::LogMeta) key of the committed log id.
pub(crate) const COMMITTED_KEY: &[u8] = b"committed";
/// [`Keyspace::LogMeta`](crate::Keyspace::LogMeta) key of the last purged log id.
pub(crate) const LAST_PURGED_KEY: &[u8] = b"last_purged";
/// [`Keyspace::StateMachine`](crate::Keyspace::StateMachine) key of the current snapshot.
pub(crate) const SNAPSHOT_KEY: &[u8] = b"snapshot";

/// [`Keyspace::Log`](crate::Keyspace::Log) key of the entry at `index`:
/// big-endian, so byte order is index order.
pub(crate) fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl Persisted for Entry {
    const KIND: &'static str = "raft log entry";
    /// 2: lease, reconcile and pool-grant commands carry their caller.
    /// 3: policies carry the shadow flag; 2 is read and upgraded.
    /// 4: the `PoolJoinNext` command (a last variant, so a format-3 entry
    /// decodes as it is; an older build refuses a format-4 entry as of an
    /// unknown version instead of misreading it).
    /// 5: the sharding commands (`ChangePlacement`, `BecomeShard`,
    /// `AcquireSlots`: last variants, so a format-4 entry decodes as it is).
    /// 6: `ReleaseSlots` (a shard other than 0 gives up slots; a last
    /// variant, so format-3 to -5 entries decode as they are).
    /// 7: `AcquireSessions` (a move's client sessions, merged before its
    /// keys; a last variant). A format-5 or -6 entry decodes as it is,
    /// each `AcquireSlots` in it read after an `AcquireSessions` of no
    /// sessions: such a move carried none, and its keys go on as before.
    const FORMAT_VERSION: u32 = 7;

    fn decode_version(version: u32, body: &[u8]) -> Result<Self, CodecError> {
        match version {
            2 => decode_body::<EntryV2>(Self::KIND, body).map(Entry::from),
            3 | 4 => decode_body(Self::KIND, body),
            5 | 6 => decode_body(Self::KIND, body).map(acquisitions_without_sessions),
            _ => decode_current(version, body),
        }
    }
}

/// An entry of format 5 or 6 as format 7 reads it: each move part it
/// acquires follows the move's (empty) sessions, which format 7 requires
/// before any key of a move.
fn acquisitions_without_sessions(mut entry: Entry) -> Entry {
    if let EntryPayload::Normal(proposal) = &entry.payload {
        let acquires = |command: &Command| matches!(command, Command::AcquireSlots(_));
        if proposal.commands.iter().any(acquires) {
            let mut commands = Vec::with_capacity(proposal.commands.len() + 1);
            for command in &proposal.commands {
                if let Command::AcquireSlots(part) = command {
                    commands.push(Command::AcquireSessions(SessionsPart::none(
                        part.id, part.slots,
                    )));
                }
                commands.push(command.clone());
            }
            let upgraded = Proposal {
                stamp_ms: proposal.stamp_ms,
                commands,
            };
            entry.payload = EntryPayload::Normal(upgraded.into());
        }
    }
    entry
}

/// A log entry of format 2 (the layout of openraft's `Entry` around a
/// format-2 proposal); upgraded on read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EntryV2 {
    log_id: LogId,
    payload: EntryPayloadV2,
}

/// openraft's `EntryPayload` variants, in order, around a format-2 proposal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum EntryPayloadV2 {
    Blank,
    Normal(ProposalV2),
    Membership(Membership),
}

impl From<EntryV2> for Entry {
    fn from(old: EntryV2) -> Self {
        let payload = match old.payload {
            EntryPayloadV2::Blank => EntryPayload::Blank,
            EntryPayloadV2::Normal(proposal) => {
                EntryPayload::Normal(Proposal::from(proposal).into())
            }
            EntryPayloadV2::Membership(membership) => EntryPayload::Membership(membership),
        };
        Entry {
            log_id: old.log_id,
            payload,
        }
    }
}

/// Decodes `body` as `T` (any version's layout), with `kind` in errors.
fn decode_body<T: DeserializeOwned>(kind: &'static str, body: &[u8]) -> Result<T, CodecError> {
    postcard::from_bytes(body).map_err(|source| CodecError::Malformed { kind, source })
}

/// Decodes the current version of `T`; any other version is unknown.
fn decode_current<T: Persisted>(version: u32, body: &[u8]) -> Result<T, CodecError> {
    if version != T::FORMAT_VERSION {
        return Err(CodecError::UnknownVersion {
            kind: T::KIND,
            found: version,
            supported: T::FORMAT_VERSION,
        });
    }
    decode_body(T::KIND, body)
}

impl Persisted for Vote {
    const KIND: &'static str = "raft vote";
    const FORMAT_VERSION: u32 = 1;
}

impl Persisted for LogId {
    const KIND: &'static str = "raft log id";
    const FORMAT_VERSION: u32 = 1;
}

/// The bytes of a state-machine snapshot: everything needed to rebuild the
/// state machine as of `last_applied`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotEnvelope {
    /// The last log entry reflected in `state`.
    pub last_applied: Option<LogId>,
    /// The last membership applied at or before `last_applied`.
    pub membership: StoredMembership,
    /// The coordinator state.
    pub state: CoordinatorState,
    /// Every member id a membership change has removed from the cluster
    /// (never accepted again; see [`retired_by`]).
    pub retired_members: BTreeSet<NodeId>,
}

/// The member ids that leave the cluster when membership `before` is
/// replaced by `after`: the nodes (voters and learners) of `before` that
/// are not nodes of `after`.
pub fn retired_by(before: &Membership, after: &Membership) -> BTreeSet<NodeId> {
    let remaining: BTreeSet<NodeId> = after.nodes().map(|(id, _)| *id).collect();
    before
        .nodes()
        .map(|(id, _)| *id)
        .filter(|id| !remaining.contains(id))
        .collect()
}

impl Persisted for SnapshotEnvelope {
    const KIND: &'static str = "state-machine snapshot";
    /// 2: sessions are keyed by (caller, client id) and store fingerprints.
    /// 3: policies carry the shadow flag, windows and the state count
    /// would-deny decisions.
    /// 4: a `fair` key may hold its next window beside its live one; 2 and
    /// 3 are read and upgraded.
    /// 5: a pool grant's cached outcome carries the increment it granted
    /// (a last variant of the outcome, so a format-4 snapshot decodes as
    /// it is; its cached pool grants replay with an increment of 0); an
    /// older build refuses a format-5 snapshot as of an unknown version.
    /// 6: the record of retired member ids; 5 is read with none recorded.
    /// 7: the window table records when the state was restored (windows
    /// sealed by a restore); 4 to 6 are read as never restored.
    /// 8: the group's part in a sharded cluster (its placement and moves,
    /// or the slots it owns); 7 is read as the meta group of a cluster
    /// never sharded.
    /// 9: sessions move with their slots (each kept answer records its
    /// key's slot, a move carries the source's sessions and an arrival how
    /// far they are merged) and the placement keeps each shard's founding
    /// replicas; 8 is read with answers of unknown slot, moves without
    /// sessions and the replicas then as the founding ones.
    const FORMAT_VERSION: u32 = 9;

    fn decode_version(version: u32, body: &[u8]) -> Result<Self, CodecError> {
        match version {
            8 => decode_body::<SnapshotEnvelopeV8>(Self::KIND, body).map(|old| SnapshotEnvelope {
                last_applied: old.last_applied,
                membership: old.membership,
                state: old.state.into(),
                retired_members: old.retired_members,
            }),
            7 => decode_body::<SnapshotEnvelopeV7>(Self::KIND, body).map(|old| SnapshotEnvelope {
                last_applied: old.last_applied,
                membership: old.membership,
                state: old.state.into(),
                retired_members: old.retired_members,
            }),
            6 => decode_body::<SnapshotEnvelopeV6>(Self::KIND, body).map(|old| SnapshotEnvelope {
                last_applied: old.last_applied,
                membership: old.membership,
                state: old.state.into(),
                retired_members: old.retired_members,
            }),
            5 => decode_body::<SnapshotEnvelopeV5>(Self::KIND, body).map(|old| SnapshotEnvelope {
                last_applied: old.last_applied,
                membership: old.membership,
                state: old.state.into(),
                retired_members: BTreeSet::new(),
            }),
            4 => decode_body::<SnapshotEnvelopeV5>(Self::KIND, body)
                .map(|old| upgraded(old.last_applied, old.membership, old.state.into())),
            2 => decode_body::<SnapshotEnvelopeV2>(Self::KIND, body)
                .map(|old| upgraded(old.last_applied, old.membership, old.state.into())),
            3 => decode_body::<SnapshotEnvelopeV3>(Self::KIND, body)
                .map(|old| upgraded(old.last_applied, old.membership, old.state.into())),
            _ => decode_current(version, body),
        }
    }
}

/// A snapshot of an older format, upgraded: its state as read, with the
/// pool grants its session cache recorded answering an increment of 0 (it
/// recorded none before format 5).
fn upgraded(
    last_applied: Option<LogId>,
    membership: StoredMembership,
    mut state: CoordinatorState,
) -> SnapshotEnvelope {
    state.zero_cached_increments();
    SnapshotEnvelope {
        last_applied,
        membership,
        state,
        retired_members: BTreeSet::new(),
    }
}

/// A snapshot of format 4 or 5 (no record of retired members); upgraded
/// on read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotEnvelopeV5 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: CoordinatorStateV6,
}

/// A snapshot of format 6 (its state never restored); upgraded on read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotEnvelopeV6 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: CoordinatorStateV6,
    retired_members: BTreeSet<NodeId>,
}

/// A snapshot of format 8 (sessions stayed behind when slots moved);
/// upgraded on read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotEnvelopeV8 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: CoordinatorStateV8,
    retired_members: BTreeSet<NodeId>,
}

/// A snapshot of format 7 (before shards); upgraded on read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotEnvelopeV7 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: CoordinatorStateV7,
    retired_members: BTreeSet<NodeId>,
}

/// A snapshot of format 2; upgraded on read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotEnvelopeV2 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: CoordinatorStateV2,
}

/// A snapshot of format 3; upgraded on read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotEnvelopeV3 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: CoordinatorStateV3,
}

/// The current snapshot as kept on disk: openraft's metadata plus the
/// encoded [`SnapshotEnvelope`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredSnapshot {
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: Vec<u8>,
}

impl Persisted for StoredSnapshot {
    const KIND: &'static str = "stored snapshot";
    const FORMAT_VERSION: u32 = 1;
}

#[cfg(test)]
mod decode_fuzz {
    //! Every persisted record decodes arbitrary or corrupted bytes into a
    //! value or a typed error, never a panic.

    use std::collections::{BTreeMap, BTreeSet};

    use leasehold_core::coordinator::Command;
    use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
    use leasehold_core::principal::Principal;
    use openraft::{CommittedLeaderId, EntryPayload, Membership};
    use proptest::prelude::*;

    use super::*;
    use crate::codec::{decode, encode};

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(3, 1), index)
    }

    fn lease_entry() -> Entry {
        Entry {
            log_id: log_id(7),
            payload: EntryPayload::Normal(
                Proposal {
                    stamp_ms: 1_000,
                    commands: vec![
                        Command::Lease {
                            key: Key::new("k").unwrap(),
                            region: RegionId::new("eu").unwrap(),
                            tokens: 5,
                            request_id: Some(RequestId {
                                client: ClientId::new("c").unwrap(),
                                seq: 1,
                            }),
                            caller: Principal::Region(RegionId::new("eu").unwrap()),
                        },
                        Command::Tick,
                    ],
                }
                .into(),
            ),
        }
    }

    fn membership_entry() -> Entry {
        let voters: BTreeSet<u64> = [1, 2, 3].into_iter().collect();
        let nodes: BTreeMap<u64, openraft::BasicNode> = voters
            .iter()
            .map(|id| (*id, openraft::BasicNode::new(format!("n{id}:7000"))))
            .collect();
        Entry {
            log_id: log_id(1),
            payload: EntryPayload::Membership(Membership::new(vec![voters], nodes)),
        }
    }

    /// Encodings of one valid value of every persisted type.
    fn valid_records() -> Vec<Vec<u8>> {
        let snapshot = SnapshotEnvelope {
            last_applied: Some(log_id(7)),
            membership: StoredMembership::default(),
            state: CoordinatorState::default(),
            retired_members: [4, 9].into(),
        };
        vec![
            encode(&lease_entry()).unwrap(),
            encode(&membership_entry()).unwrap(),
            encode(&Vote::new(3, 1)).unwrap(),
            encode(&log_id(9)).unwrap(),
            encode(&snapshot).unwrap(),
        ]
    }

    /// Decodes `bytes` as every persisted type; only errors are allowed to come back.
    fn decode_as_everything(bytes: &[u8]) {
        let _ = decode::<Entry>(bytes);
        let _ = decode::<Vote>(bytes);
        let _ = decode::<LogId>(bytes);
        let _ = decode::<SnapshotEnvelope>(bytes);
        let _ = decode::<StoredSnapshot>(bytes);
    }

    fn membership_of(voters: &[u64], learners: &[u64]) -> crate::types::Membership {
        let voters: BTreeSet<u64> = voters.iter().copied().collect();
        let nodes: BTreeMap<u64, openraft::BasicNode> = voters
            .iter()
            .chain(learners)
            .map(|id| (*id, openraft::BasicNode::new(format!("n{id}:7000"))))
            .collect();
        Membership::new(vec![voters], nodes)
    }

    #[test]
    fn members_leaving_a_membership_retire_learners_included() {
        let before = membership_of(&[1, 2, 3], &[4, 5]);
        assert_eq!(
            super::retired_by(&before, &membership_of(&[1, 2, 5], &[6])),
            [3, 4].into()
        );
        assert!(super::retired_by(&before, &membership_of(&[1, 2, 3, 4, 5], &[])).is_empty());
        assert!(super::retired_by(&membership_of(&[], &[]), &before).is_empty());
    }

    #[test]
    fn a_format_5_snapshot_reads_with_no_member_retired() {
        let old = super::SnapshotEnvelopeV5 {
            last_applied: Some(log_id(7)),
            membership: StoredMembership::default(),
            state: CoordinatorStateV6::default(),
        };
        let mut bytes = postcard::to_stdvec(&5u32).unwrap();
        bytes.extend(postcard::to_stdvec(&old).unwrap());
        let read: SnapshotEnvelope = decode(&bytes).unwrap();
        assert_eq!(read.last_applied, Some(log_id(7)));
        assert!(read.retired_members.is_empty());
        let current = encode(&read).unwrap();
        assert_eq!(
            u32::from(current[0]),
            SnapshotEnvelope::FORMAT_VERSION,
            "written back in the current format"
        );
        assert_eq!(decode::<SnapshotEnvelope>(&current).unwrap(), read);
    }

    #[test]
    fn valid_records_round_trip() {
        let entry = lease_entry();
        assert_eq!(decode::<Entry>(&encode(&entry).unwrap()).unwrap(), entry);
        let membership = membership_entry();
        assert_eq!(
            decode::<Entry>(&encode(&membership).unwrap()).unwrap(),
            membership
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Arbitrary bytes never panic a decoder.
        #[test]
        fn arbitrary_bytes_are_refused_or_decoded(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            decode_as_everything(&bytes);
        }

        /// Valid records with bytes flipped, cut short or extended never
        /// panic a decoder; a cut-short record never decodes.
        #[test]
        fn corrupted_records_are_refused_or_decoded(
            which in 0usize..5,
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            tail in prop::collection::vec(any::<u8>(), 0..16),
        ) {
            let record = &valid_records()[which];
            let mut flipped = record.clone();
            for (at, byte) in &flips {
                let i = at.index(flipped.len());
                flipped[i] ^= byte;
            }
            decode_as_everything(&flipped);
            let short = &record[..cut.index(record.len())];
            decode_as_everything(short);
            if which == 0 {
                prop_assert!(decode::<Entry>(short).is_err(), "a truncated entry decoded");
            }
            let mut longer = record.clone();
            longer.extend_from_slice(&tail);
            decode_as_everything(&longer);
        }
    }
}

#[cfg(test)]
mod entry_upgrade {
    //! A format-6 entry that acquires part of a move reads, in format 7,
    //! after the move's (empty) sessions: a log written before sessions
    //! moved replays to the state it reached.

    use leasehold_core::coordinator::sharding::PlacementChange;
    use leasehold_core::coordinator::{Command, CoordinatorState, Proposal};
    use leasehold_core::shard::ShardId;
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::codec::decode;

    fn split_move() -> Command {
        let mut meta = CoordinatorState::default();
        meta.apply(&Proposal {
            stamp_ms: 1,
            commands: vec![Command::ChangePlacement {
                expected_version: 0,
                change: PlacementChange::Split {
                    shard: ShardId(0),
                    into: ShardId(1),
                    replicas: vec![1],
                },
            }],
        });
        let (id, outgoing) = meta
            .sharding()
            .outgoing()
            .iter()
            .next()
            .map(|(id, m)| (*id, m.clone()))
            .expect("a move");
        Command::AcquireSlots(outgoing.part(id, 0))
    }

    fn entry(commands: Vec<Command>) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 5),
            payload: EntryPayload::Normal(
                Proposal {
                    stamp_ms: 10,
                    commands,
                }
                .into(),
            ),
        }
    }

    fn as_format(version: u32, entry: &Entry) -> Vec<u8> {
        let mut bytes = postcard::to_stdvec(&version).unwrap();
        bytes.extend(postcard::to_stdvec(entry).unwrap());
        bytes
    }

    #[test]
    fn a_format_6_acquisition_reads_after_the_moves_empty_sessions() {
        let acquire = split_move();
        let Command::AcquireSlots(part) = &acquire else {
            unreachable!()
        };
        let sessions = Command::AcquireSessions(SessionsPart::none(part.id, part.slots));
        for version in [5, 6] {
            let old = entry(vec![Command::Tick, acquire.clone()]);
            let read: Entry = decode(&as_format(version, &old)).unwrap();
            assert_eq!(
                read,
                entry(vec![Command::Tick, sessions.clone(), acquire.clone()])
            );
        }
        // Format 7 reads as written.
        let current = entry(vec![acquire.clone()]);
        assert_eq!(decode::<Entry>(&as_format(7, &current)).unwrap(), current);
        // And the upgraded entry acquires the part, as format 6 did.
        let mut shard = CoordinatorState::default();
        shard.apply(&Proposal {
            stamp_ms: 1,
            commands: vec![Command::BecomeShard { shard: ShardId(1) }],
        });
        let read: Entry = decode(&as_format(6, &entry(vec![acquire]))).unwrap();
        let EntryPayload::Normal(proposal) = &read.payload else {
            unreachable!()
        };
        shard.apply(proposal);
        assert_eq!(shard.sharding().owned_slots(), 8_192);
    }
}
