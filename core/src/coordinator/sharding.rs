//! Shards in the replicated state (ADR 0025): which keys a group serves,
//! the placement the meta group keeps, and how keys change hands.
//!
//! Every Raft group applies the same [`super::CoordinatorState`]; its
//! [`Sharding`] part says what the group is:
//!
//! - **The meta group** (shard 0, the group of a cluster never sharded):
//!   it holds the [`Placement`] (`None` until its first change: every slot
//!   is shard 0's) and serves the keys the placement gives shard 0.
//! - **Another shard**: after [`Command::BecomeShard`], the group serves
//!   only the slots it has acquired, and nothing before its first
//!   acquisition.
//!
//! # How keys change hands
//! A placement change that moves slots ([`Command::ChangePlacement`])
//! numbers each move ([`MoveId`]) and records it in the meta group's
//! [`Sharding::outgoing`]. The source then **releases** the slots: it
//! takes the window state of every key in them out of its table and
//! keeps it, frozen, as an [`Outgoing`] move, and from then on refuses
//! those keys (`NotOwner`).
//!
//! - Out of shard 0 the release is the placement change itself (the meta
//!   group holds both), in the same apply.
//! - Out of another shard it is an entry of the source's own log
//!   ([`Command::ReleaseSlots`], proposed by its leader once it sees the
//!   move in the placement); until then the source serves the slots as
//!   before. A source releases only slots it wholly owns: a shard still
//!   acquiring them releases after its acquisition ends.
//!
//! The new owner refuses the keys until it has applied every part of the
//! released move ([`Command::AcquireSlots`], in order, each part a run of
//! keys, read from a replica of the source): then it owns the slots, with
//! every window, tombstone and floor the keys had. So at every log
//! position at most one group admits in a key's window, and the window it
//! admits in carries every grant made before: **Σ granted per (key,
//! window) stays within the limit across a move**.
//!
//! The new owner's leader reads the parts from a replica of the source it
//! hosts, so a move out of a shard other than 0 goes to a shard whose
//! replicas are all the source's (a split on the same members, as
//! CockroachDB splits a range; the new shard's replicas may move
//! afterwards with `SetReplicas`). Shard 0 is on every member, so a move
//! out of it goes anywhere. Slots do not move back into shard 0.
//!
//! A move's frozen keys are dropped from the source once they expire (a
//! key whose tombstone has expired carries nothing a new window needs);
//! the move's record stays, so an owner that acquires late acquires an
//! empty move and serves from then on.
//!
//! **Exactly-once across a move** (ADR 0027): the release also copies
//! the source's client sessions into the move — each session's name,
//! floor and retention, with its answers about keys of the moved slots
//! (a session records each answer's slot). The new owner merges
//! them ([`Command::AcquireSessions`], in parts, before any key part: a
//! key part is refused until the sessions are complete), so whatever the
//! old owner would answer for a request id about a moved key, the new
//! owner answers the same: the first answer for a kept id, expired below
//! the floor, never a second execution. A `NotOwner` refusal is never
//! recorded in a session (nothing was executed): a resend of the same id
//! to the owner is answered there.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::Command;
pub use super::moves::{AcquirePart, MoveId, PlacementChange, SessionsPart};
use super::sessions::MovedSession;
use super::windows::{MovedFloors, MovedKey};
use crate::ids::Key;
use crate::policy::Policy;
use crate::shard::{slot_of, Placement, PlacementV8, ShardId, Slot, SlotMove, SLOTS};

/// Most bytes (as [`MovedKey::size_bound`] counts them) of the keys one [`Command::AcquireSlots`] carries
/// (one key above it travels alone).
///
/// [`Command::AcquireSlots`]: super::Command::AcquireSlots
pub const MAX_ACQUIRE_PART_BYTES: usize = 64 * 1024;

/// A set of hash slots (a bitmap of [`SLOTS`] bits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotSet {
    words: Vec<u64>,
}

const SLOT_WORDS: usize = SLOTS as usize / 64;

impl Default for SlotSet {
    fn default() -> Self {
        SlotSet {
            words: vec![0; SLOT_WORDS],
        }
    }
}

impl SlotSet {
    /// Whether `slot` is in the set.
    pub fn contains(&self, slot: Slot) -> bool {
        let slot = usize::from(slot);
        self.words
            .get(slot / 64)
            .is_some_and(|word| word & (1 << (slot % 64)) != 0)
    }

    /// Adds the slots `start..end` (clamped to the slot range).
    pub fn insert_range(&mut self, start: u32, end: u32) {
        self.words.resize(SLOT_WORDS, 0);
        for slot in start..end.min(u32::from(SLOTS)) {
            let slot = slot as usize;
            self.words[slot / 64] |= 1 << (slot % 64);
        }
    }

    /// Removes the slots `start..end`.
    pub fn remove_range(&mut self, start: u32, end: u32) {
        self.words.resize(SLOT_WORDS, 0);
        for slot in start..end.min(u32::from(SLOTS)) {
            let slot = slot as usize;
            self.words[slot / 64] &= !(1 << (slot % 64));
        }
    }

    /// Whether every slot of `start..end` is in the set.
    pub fn contains_range(&self, start: u32, end: u32) -> bool {
        (start..end).all(|slot| u16::try_from(slot).is_ok_and(|slot| self.contains(slot)))
    }

    /// How many slots the set holds.
    pub fn len(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// Whether the set holds no slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A move of slots: in the meta group the record of every move the
/// placement made; in the source (the meta group for moves out of shard
/// 0) the window state the keys had when it released them, until it
/// expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outgoing {
    /// The slots, and the shards they moved between.
    pub slots: SlotMove,
    pub(super) keys: Vec<MovedKey>,
    pub(super) floors: MovedFloors,
    /// When the keys, floors and sessions stop mattering (then they are
    /// dropped).
    pub(super) expires_ms: u64,
    /// The source's client sessions as of the release, with their answers
    /// about the moved keys (storage format 9): the new owner merges them
    /// before it serves a key of the move.
    pub(super) sessions: Vec<MovedSession>,
}

/// A move as storage format 8 kept it (no sessions); read as a move
/// carrying none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct OutgoingV8 {
    slots: SlotMove,
    keys: Vec<MovedKey>,
    floors: MovedFloors,
    expires_ms: u64,
}

impl From<OutgoingV8> for Outgoing {
    fn from(old: OutgoingV8) -> Self {
        Outgoing {
            slots: old.slots,
            keys: old.keys,
            floors: old.floors,
            expires_ms: old.expires_ms,
            sessions: Vec::new(),
        }
    }
}

impl Outgoing {
    /// The meta group's record of a move out of another shard (whose keys
    /// that shard releases).
    pub(super) fn record(slots: SlotMove) -> Outgoing {
        Outgoing {
            slots,
            keys: Vec::new(),
            floors: MovedFloors::default(),
            expires_ms: 0,
            sessions: Vec::new(),
        }
    }

    /// How many client sessions the move still carries.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The part of this move's sessions that starts at session number
    /// `first`: the sessions from there up to [`MAX_ACQUIRE_PART_BYTES`]
    /// (at least one), and whether it is the last. From past its sessions
    /// (none, or dropped once expired between two parts) it is an empty,
    /// last part that starts at `first`.
    pub fn sessions_part(&self, id: MoveId, first: u64) -> SessionsPart {
        let (start, end) = part_range(&self.sessions, first, MovedSession::size_bound);
        SessionsPart {
            id,
            slots: self.slots,
            first,
            sessions: self.sessions[start..end].to_vec(),
            last: end == self.sessions.len(),
        }
    }

    /// How many keys the move still carries.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The part of this move that starts at key number `first_key`: the
    /// keys from there up to [`MAX_ACQUIRE_PART_BYTES`] encoded (at least
    /// one), the floors with the first part, and whether it is the last.
    /// From past its keys (none left, or dropped once expired between two
    /// parts) it is an empty, last part that starts at `first_key`, so the
    /// owner completes the move wherever it stood.
    pub fn part(&self, id: MoveId, first_key: u64) -> AcquirePart {
        let (start, end) = part_range(&self.keys, first_key, MovedKey::size_bound);
        AcquirePart {
            id,
            slots: self.slots,
            first_key,
            keys: self.keys[start..end].to_vec(),
            floors: (start == 0).then(|| self.floors.clone()),
            last: end == self.keys.len(),
        }
    }
}

/// The range of `items` one part starting at item number `first` carries:
/// from there up to [`MAX_ACQUIRE_PART_BYTES`] as `size` counts them (at
/// least one item), empty from past the last item.
fn part_range<T>(items: &[T], first: u64, size: impl Fn(&T) -> usize) -> (usize, usize) {
    let start = usize::try_from(first)
        .unwrap_or(usize::MAX)
        .min(items.len());
    let mut end = start;
    let mut bytes = 0usize;
    while let Some(item) = items.get(end) {
        let item_size = size(item);
        if end > start && bytes.saturating_add(item_size) > MAX_ACQUIRE_PART_BYTES {
            break;
        }
        bytes = bytes.saturating_add(item_size);
        end += 1;
    }
    (start, end)
}

/// How far a move into this shard has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Arrival {
    /// Keys acquired so far (the next part starts there).
    pub acquired_keys: u64,
    /// Every part applied: the slots are this shard's.
    pub complete: bool,
    /// Sessions acquired so far (storage format 9).
    pub acquired_sessions: u64,
    /// Every session part applied: key parts may follow.
    pub sessions_complete: bool,
}

/// How far a move had come, as storage format 8 kept it: it acquires
/// keys without sessions (its source recorded none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ArrivalV8 {
    acquired_keys: u64,
    complete: bool,
}

impl From<ArrivalV8> for Arrival {
    fn from(old: ArrivalV8) -> Self {
        Arrival {
            acquired_keys: old.acquired_keys,
            complete: old.complete,
            acquired_sessions: 0,
            sessions_complete: true,
        }
    }
}

/// A group's part in a sharded cluster (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharding {
    /// Meta group: the placement (`None`: never changed, all slots shard 0's).
    pub(super) placement: Option<Placement>,
    /// Meta group: every move the placement made (with the keys of those
    /// out of shard 0); another shard: the moves it released.
    pub(super) outgoing: BTreeMap<MoveId, Outgoing>,
    /// Another shard: its id (`None`: this group is the meta group).
    pub(super) shard: Option<ShardId>,
    /// Another shard: the slots it owns.
    pub(super) owned: SlotSet,
    /// Another shard: moves into it, by move.
    pub(super) arrivals: BTreeMap<MoveId, Arrival>,
}

/// A group's part in a sharded cluster as storage format 8 kept it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ShardingV8 {
    placement: Option<PlacementV8>,
    outgoing: BTreeMap<MoveId, OutgoingV8>,
    shard: Option<ShardId>,
    owned: SlotSet,
    arrivals: BTreeMap<MoveId, ArrivalV8>,
}

impl From<ShardingV8> for Sharding {
    fn from(old: ShardingV8) -> Self {
        Sharding {
            placement: old.placement.map(Placement::from),
            outgoing: old
                .outgoing
                .into_iter()
                .map(|(id, outgoing)| (id, outgoing.into()))
                .collect(),
            shard: old.shard,
            owned: old.owned,
            arrivals: old
                .arrivals
                .into_iter()
                .map(|(id, arrival)| (id, arrival.into()))
                .collect(),
        }
    }
}

impl Sharding {
    /// Whether this group serves `key` now.
    pub fn owns(&self, key: &Key) -> bool {
        match (self.shard, &self.placement) {
            (None, None) => true,
            (None, Some(placement)) => placement.shard_of(key.as_str()) == ShardId(0),
            (Some(_), _) => self.owned.contains(slot_of(key.as_str())),
        }
    }

    /// The shard this group is (0: the meta group).
    pub fn shard(&self) -> ShardId {
        self.shard.unwrap_or(ShardId(0))
    }

    /// The placement (the meta group's; [`Placement::meta`] when never
    /// changed, and in other shards).
    pub fn placement(&self) -> Placement {
        self.placement.clone().unwrap_or_else(Placement::meta)
    }

    /// The shard the placement gives `key` (0 when never sharded: no hash
    /// is computed then).
    pub fn shard_of(&self, key: &str) -> ShardId {
        self.placement
            .as_ref()
            .map_or(ShardId(0), |placement| placement.shard_of(key))
    }

    /// The placement's version (0: never changed).
    pub fn placement_version(&self) -> u64 {
        self.placement.as_ref().map_or(0, Placement::version)
    }

    /// The meta group: every move the placement made; another shard: the
    /// moves it released. By move.
    pub fn outgoing(&self) -> &BTreeMap<MoveId, Outgoing> {
        &self.outgoing
    }

    /// How far the move `id` into this shard has come.
    pub fn arrival(&self, id: MoveId) -> Arrival {
        self.arrivals.get(&id).copied().unwrap_or_default()
    }

    /// The slots this group owns (another shard's).
    pub fn owned_slots(&self) -> u32 {
        match (self.shard, &self.placement) {
            (None, None) => u32::from(SLOTS),
            (None, Some(placement)) => placement.slot_count(ShardId(0)),
            (Some(_), _) => self.owned.len(),
        }
    }

    /// Drops the frozen keys of moves that have expired at `now_ms`.
    pub(super) fn collect(&mut self, now_ms: u64) {
        for outgoing in self.outgoing.values_mut() {
            let carries = !outgoing.keys.is_empty() || !outgoing.sessions.is_empty();
            if outgoing.expires_ms <= now_ms && carries {
                outgoing.keys = Vec::new();
                outgoing.floors = MovedFloors::default();
                outgoing.sessions = Vec::new();
            }
        }
    }
}

/// The commands that make a shard's policies those of the meta group:
/// `SetPolicy` for each policy missing or different there, `DeletePolicy`
/// for each prefix the meta group no longer has. Empty when they agree.
/// (Policies stay visible to every shard: each shard's leader proposes
/// these whenever its view of the meta group differs.)
pub fn policy_sync_commands(meta: &[Policy], shard: &[Policy]) -> Vec<Command> {
    let wanted: BTreeMap<&str, &Policy> = meta.iter().map(|p| (p.prefix.as_str(), p)).collect();
    let held: BTreeMap<&str, &Policy> = shard.iter().map(|p| (p.prefix.as_str(), p)).collect();
    let sets = wanted
        .iter()
        .filter(|(prefix, policy)| held.get(*prefix) != Some(*policy))
        .map(|(_, policy)| Command::SetPolicy((*policy).clone()));
    let deletes = held
        .keys()
        .filter(|prefix| !wanted.contains_key(*prefix))
        .map(|prefix| Command::DeletePolicy {
            prefix: (*prefix).to_string(),
        });
    sets.chain(deletes).collect()
}
