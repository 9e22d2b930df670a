//! What a move of slots carries on the log (ADR 0025, ADR 0027): its
//! name ([`MoveId`]), the placement change that makes it
//! ([`PlacementChange`]) and the parts the new owner applies — client
//! sessions first ([`SessionsPart`]), then keys ([`AcquirePart`]). The
//! payload types of the sharding commands; what they do to a group's
//! state is [`super::sharding`] and `slot_moves`.

use serde::{Deserialize, Serialize};

use super::sessions::MovedSession;
use super::windows::{MovedFloors, MovedKey};
use crate::shard::{MemberId, ShardId, SlotMove};

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

/// One part of a move, as the new owner applies it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquirePart {
    /// The move.
    pub id: MoveId,
    /// Its slots and shards.
    pub slots: SlotMove,
    /// The number of the part's first key within the move.
    pub first_key: u64,
    pub(super) keys: Vec<MovedKey>,
    /// The floors (first part only).
    pub(super) floors: Option<MovedFloors>,
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
    pub(super) sessions: Vec<MovedSession>,
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
