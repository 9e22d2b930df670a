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

use super::command::{Command, CommandError, Outcome, ShardingOutcome};
use super::sessions::MovedSession;
use super::state::CoordinatorState;
use super::windows::{MovedFloors, MovedKey};
use crate::ids::Key;
use crate::policy::Policy;
use crate::shard::{slot_of, MemberId, Placement, PlacementV8, ShardId, Slot, SlotMove, SLOTS};

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

/// Names a move of slots: the placement version that made it and its rank
/// among that change's moves.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
pub struct MoveId {
    /// The placement version the change raised the placement to.
    pub version: u64,
    /// Its rank among the change's moves (slot order).
    pub index: u32,
}

impl std::fmt::Display for MoveId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.version, self.index)
    }
}

/// A change of the placement, proposed to the meta group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlacementChange {
    /// Add an empty shard replicated by these members.
    AddShard {
        /// The new shard's id (not 0).
        shard: ShardId,
        /// Its replicas (member ids).
        replicas: Vec<MemberId>,
    },
    /// Replace a shard's replicas.
    SetReplicas {
        /// The shard (not 0).
        shard: ShardId,
        /// Its replicas.
        replicas: Vec<MemberId>,
    },
    /// Remove a shard that owns no slot.
    RemoveShard {
        /// The shard (not 0).
        shard: ShardId,
    },
    /// Give the slots `start..end` to `to`.
    MoveSlots {
        /// First slot.
        start: u32,
        /// One past the last slot.
        end: u32,
        /// The new owner.
        to: ShardId,
    },
    /// Move the upper half of `shard`'s slots to the new shard `into`,
    /// replicated by `replicas`.
    Split {
        /// The shard split.
        shard: ShardId,
        /// The new shard.
        into: ShardId,
        /// Its replicas.
        replicas: Vec<MemberId>,
    },
}

/// A move of slots: in the meta group the record of every move the
/// placement made; in the source (the meta group for moves out of shard
/// 0) the window state the keys had when it released them, until it
/// expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outgoing {
    /// The slots, and the shards they moved between.
    pub slots: SlotMove,
    keys: Vec<MovedKey>,
    floors: MovedFloors,
    /// When the keys, floors and sessions stop mattering (then they are
    /// dropped).
    expires_ms: u64,
    /// The source's client sessions as of the release, with their answers
    /// about the moved keys (storage format 9): the new owner merges them
    /// before it serves a key of the move.
    sessions: Vec<MovedSession>,
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
    /// The move `slots` with the window state of its keys taken out of
    /// `state`'s table.
    fn take(state: &mut CoordinatorState, slots: SlotMove) -> Outgoing {
        let in_move = |key: &Key| {
            let slot = u32::from(slot_of(key.as_str()));
            slots.start <= slot && slot < slots.end
        };
        let (keys, floors) = state.windows.take_keys(in_move);
        let sessions = state
            .sessions
            .moving(|slot| slots.start <= u32::from(slot) && u32::from(slot) < slots.end);
        let expires_ms = keys
            .iter()
            .map(MovedKey::expires_ms)
            .chain([floors.growth_floors_until_ms()])
            .chain(sessions.iter().map(MovedSession::retain_until_ms))
            .max()
            .unwrap_or(0);
        Outgoing {
            slots,
            keys,
            floors,
            expires_ms,
            sessions,
        }
    }

    /// The meta group's record of a move out of another shard (whose keys
    /// that shard releases).
    fn record(slots: SlotMove) -> Outgoing {
        Outgoing {
            slots,
            keys: Vec::new(),
            floors: MovedFloors::default(),
            expires_ms: 0,
            sessions: Vec::new(),
        }
    }

    /// The command that takes the move `id` one part further into a shard
    /// where it stands at `arrival`: its sessions first
    /// ([`Command::AcquireSessions`]), then its keys
    /// ([`Command::AcquireSlots`]).
    pub fn next_part(&self, id: MoveId, arrival: Arrival) -> Command {
        if arrival.sessions_complete {
            Command::AcquireSlots(self.part(id, arrival.acquired_keys))
        } else {
            Command::AcquireSessions(self.sessions_part(id, arrival.acquired_sessions))
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

/// One part of a move, as the new owner applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquirePart {
    /// The move.
    pub id: MoveId,
    /// Its slots and shards.
    pub slots: SlotMove,
    /// The number of the part's first key within the move.
    pub first_key: u64,
    keys: Vec<MovedKey>,
    /// The floors (first part only).
    floors: Option<MovedFloors>,
    /// Whether this part ends the move.
    pub last: bool,
}

impl AcquirePart {
    /// How many keys the part carries.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

/// One part of a move's client sessions, as the new owner applies it
/// (before any of the move's keys: [`Command::AcquireSessions`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionsPart {
    /// The move.
    pub id: MoveId,
    /// Its slots and shards.
    pub slots: SlotMove,
    /// The number of the part's first session within the move.
    pub first: u64,
    sessions: Vec<MovedSession>,
    /// Whether this part ends the move's sessions.
    pub last: bool,
}

impl SessionsPart {
    /// The whole of a move that carries no sessions: what an entry of
    /// storage format 6 or earlier, which acquired keys alone, reads as
    /// before each of its key parts.
    pub fn none(id: MoveId, slots: SlotMove) -> Self {
        SessionsPart {
            id,
            slots,
            first: 0,
            sessions: Vec::new(),
            last: true,
        }
    }
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
    placement: Option<Placement>,
    /// Meta group: every move the placement made (with the keys of those
    /// out of shard 0); another shard: the moves it released.
    outgoing: BTreeMap<MoveId, Outgoing>,
    /// Another shard: its id (`None`: this group is the meta group).
    shard: Option<ShardId>,
    /// Another shard: the slots it owns.
    owned: SlotSet,
    /// Another shard: moves into it, by move.
    arrivals: BTreeMap<MoveId, Arrival>,
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

/// Why the move `slots`, out of a shard other than 0, cannot be made in
/// `after` (the placement it would make): slots go back into shard 0
/// never, and into another shard only when every replica of it is a
/// replica of the source (its leader reads the move from its replica of
/// the source).
fn unmovable(after: &Placement, slots: &SlotMove) -> Option<String> {
    if slots.to == ShardId(0) {
        return Some(format!(
            "slots {}..{} would move from shard {} back into shard 0: slots leave shard 0, \
             they do not return to it",
            slots.start, slots.end, slots.from.0
        ));
    }
    let source = after.replicas(slots.from)?;
    let target = after.replicas(slots.to)?;
    (!target.is_subset(source)).then(|| {
        format!(
            "slots {}..{} would move from shard {} (replicas {source:?}) to shard {} (replicas \
             {target:?}): a move out of a shard other than 0 goes to a shard on its replicas \
             (split on the same members, then move the new shard's replicas)",
            slots.start, slots.end, slots.from.0, slots.to.0
        )
    })
}

fn refused(message: String) -> Outcome {
    Outcome::Rejected(CommandError::Placement(message))
}

impl CoordinatorState {
    /// Whether this group serves `key` now (see [`Sharding::owns`]).
    pub fn owns(&self, key: &Key) -> bool {
        self.sharding.owns(key)
    }

    /// This group's part in a sharded cluster.
    pub fn sharding(&self) -> &Sharding {
        &self.sharding
    }

    /// Runs `execute` if this group serves `key`, else refuses `NotOwner`.
    pub(super) fn if_owned(
        &mut self,
        key: &Key,
        execute: impl FnOnce(&mut Self) -> Outcome,
    ) -> Outcome {
        if self.sharding.owns(key) {
            return execute(self);
        }
        self.not_owner(key)
    }

    /// The refusal of a command about `key`, which this group does not
    /// serve (nothing executed: the owner answers it).
    pub(super) fn not_owner(&self, key: &Key) -> Outcome {
        Outcome::Rejected(CommandError::NotOwner(format!(
            "shard {} does not serve key \"{key}\" (slot {}); ask the placement for its owner",
            self.sharding.shard().0,
            slot_of(key.as_str())
        )))
    }

    /// [`super::Command::ChangePlacement`] (see the module doc).
    pub(super) fn change_placement(
        &mut self,
        expected_version: u64,
        change: &PlacementChange,
    ) -> Outcome {
        if let Some(shard) = self.sharding.shard {
            return refused(format!(
                "shard {} is not the meta group: placement changes go to shard 0",
                shard.0
            ));
        }
        let before = self.sharding.placement();
        if before.version() != expected_version {
            return refused(format!(
                "the placement is at version {}, not {expected_version}: read it again",
                before.version()
            ));
        }
        let mut after = before.clone();
        let applied = match change {
            PlacementChange::AddShard { shard, replicas } => {
                after.add_shard(*shard, replicas.iter().copied())
            }
            PlacementChange::SetReplicas { shard, replicas } => {
                after.set_replicas(*shard, replicas.iter().copied())
            }
            PlacementChange::RemoveShard { shard } => after.remove_shard(*shard),
            PlacementChange::MoveSlots { start, end, to } => after.move_slots(*start, *end, *to),
            PlacementChange::Split {
                shard,
                into,
                replicas,
            } => after.split(*shard, *into, replicas.iter().copied()),
        };
        if let Err(e) = applied {
            return refused(e.to_string());
        }
        let moves = before.moves_to(&after);
        for slots in moves.iter().filter(|m| m.from != ShardId(0)) {
            if let Some(message) = unmovable(&after, slots) {
                return refused(message);
            }
        }
        for (index, slots) in moves.into_iter().enumerate() {
            let id = MoveId {
                version: after.version(),
                index: u32::try_from(index).unwrap_or(u32::MAX),
            };
            let outgoing = if slots.from == ShardId(0) {
                Outgoing::take(self, slots)
            } else {
                Outgoing::record(slots)
            };
            self.sharding.outgoing.insert(id, outgoing);
        }
        let version = after.version();
        self.sharding.placement = Some(after);
        Outcome::Sharding(ShardingOutcome::PlacementChanged { version })
    }

    /// [`super::Command::BecomeShard`]: a new group becomes `shard`; only
    /// a group that holds nothing yet (no placement, no key, no move).
    pub(super) fn become_shard(&mut self, shard: ShardId) -> Outcome {
        if self.sharding.shard == Some(shard) {
            return Outcome::Sharding(ShardingOutcome::BecameShard { shard });
        }
        if shard == ShardId(0) {
            return refused("shard 0 is the meta group; no group becomes it".into());
        }
        let pristine = self.sharding == Sharding::default() && self.windows.key_count() == 0;
        if !pristine {
            return refused(format!(
                "this group holds state (it is shard {}): it cannot become shard {}",
                self.sharding.shard().0,
                shard.0
            ));
        }
        self.sharding.shard = Some(shard);
        Outcome::Sharding(ShardingOutcome::BecameShard { shard })
    }

    /// [`super::Command::ReleaseSlots`]: a shard other than 0 gives up the
    /// slots of the move `id`, taking their keys' window state out of its
    /// table (see the module doc). Only the move's source, and only once
    /// it owns every slot of it; a release already made answers again.
    pub(super) fn release_slots(&mut self, id: MoveId, slots: SlotMove) -> Outcome {
        if let Some(released) = self.sharding.outgoing.get(&id) {
            return Outcome::Sharding(ShardingOutcome::Released {
                keys: released.keys.len() as u64,
            });
        }
        if slots.from == ShardId(0) || self.sharding.shard != Some(slots.from) {
            return refused(format!(
                "this group is shard {}, not shard {}: it releases nothing of move {id}",
                self.sharding.shard().0,
                slots.from.0
            ));
        }
        if !self.sharding.owned.contains_range(slots.start, slots.end) {
            return refused(format!(
                "shard {} does not own every slot of {}..{} yet: it releases them once it does",
                slots.from.0, slots.start, slots.end
            ));
        }
        let outgoing = Outgoing::take(self, slots);
        let keys = outgoing.keys.len() as u64;
        self.sharding.owned.remove_range(slots.start, slots.end);
        self.sharding.outgoing.insert(id, outgoing);
        Outcome::Sharding(ShardingOutcome::Released { keys })
    }

    /// [`super::Command::AcquireSlots`]: applies one part of a move into
    /// this shard. A part that does not start where the move stands
    /// changes nothing and answers where it stands.
    pub(super) fn acquire_slots(&mut self, part: &AcquirePart) -> Outcome {
        if self.sharding.shard != Some(part.slots.to) {
            return refused(format!(
                "this group is shard {}, not shard {}: it acquires nothing of move {}",
                self.sharding.shard().0,
                part.slots.to.0,
                part.id
            ));
        }
        let arrival = self.sharding.arrivals.entry(part.id).or_default();
        // The move's sessions first: once a key of the move is served, an
        // id the old owner answered must be answered as it did.
        let ready = arrival.sessions_complete;
        if ready && !arrival.complete && arrival.acquired_keys == part.first_key {
            self.windows.put_keys(part.keys.clone());
            if let Some(floors) = &part.floors {
                self.windows.put_floors(floors.clone());
            }
            arrival.acquired_keys += part.keys.len() as u64;
            if part.last {
                arrival.complete = true;
                self.sharding
                    .owned
                    .insert_range(part.slots.start, part.slots.end);
            }
        }
        let arrival = *arrival;
        Outcome::Sharding(ShardingOutcome::Acquired {
            acquired_keys: arrival.acquired_keys,
            complete: arrival.complete,
        })
    }

    /// [`super::Command::AcquireSessions`]: merges one part of a move's
    /// client sessions into this shard's (before any of its keys). A part
    /// that does not start where the move's sessions stand changes
    /// nothing and answers where they stand.
    pub(super) fn acquire_sessions(&mut self, part: &SessionsPart) -> Outcome {
        if self.sharding.shard != Some(part.slots.to) {
            return refused(format!(
                "this group is shard {}, not shard {}: it acquires nothing of move {}",
                self.sharding.shard().0,
                part.slots.to.0,
                part.id
            ));
        }
        let now_ms = self.now_ms;
        let arrival = self.sharding.arrivals.entry(part.id).or_default();
        if !arrival.sessions_complete && arrival.acquired_sessions == part.first {
            self.sessions.put_moved(&part.sessions, now_ms);
            arrival.acquired_sessions += part.sessions.len() as u64;
            arrival.sessions_complete = part.last;
        }
        let arrival = *arrival;
        Outcome::Sharding(ShardingOutcome::AcquiredSessions {
            acquired_sessions: arrival.acquired_sessions,
            complete: arrival.sessions_complete,
        })
    }
}
