//! The sharding commands applied to a group's state (ADR 0025, the moves
//! described in [`super::sharding`]): placement changes, a group becoming
//! a shard, and slot moves — a release, then the new owner's acquisition
//! of the move's sessions and keys — with the ownership check every key
//! command passes first.

use super::command::Command;
use super::moves::{AcquirePart, MoveId, PlacementChange, SessionsPart};
use super::outcome::{CommandError, Outcome, ShardingOutcome};
use super::sessions::MovedSession;
use super::sharding::{Arrival, Outgoing, Sharding};
use super::state::CoordinatorState;
use super::windows::MovedKey;
use crate::ids::Key;
use crate::shard::{slot_of, Placement, ShardId, SlotMove};

impl Outgoing {
    /// The move `slots` with the window state of its keys taken out of
    /// `state`'s table.
    pub(super) fn take(state: &mut CoordinatorState, slots: SlotMove) -> Outgoing {
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
