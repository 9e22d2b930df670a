//! An exhaustive model check of the move protocol (ADR 0025, ADR 0027):
//! keys travel from the meta group (shard 0) to shard 1 by a split of
//! shard 0, and the last quarter of the slots on to shard 2 by a split of
//! shard 1 that shard 1 releases in its own log, while two clients send
//! new request ids about those keys and resend old ones to any group.
//! Every reachable state of a small world is visited (stateright's
//! breadth-first checker) and must keep exactly-once across the moves: no
//! request id runs twice; every answer to an id is the answer its first
//! owner gave, or `SESSION_EXPIRED` once a session may have dropped it;
//! `Σ granted ≤ L` in each key's window, summed over every group; one
//! group at a time serves each key.
//!
//! The model drives the real rules. Each Raft group is one
//! [`CoordinatorState`] (a replicated state machine: a leader change does
//! not change its state, it only loses the messages in flight and makes
//! their senders resend them, which loss and duplication cover), and every
//! step applies a real command to it: the placement changes, shard 1's
//! `ReleaseSlots`, the parts of each move as the leader's driver makes them
//! ([`Outgoing::next_part`] of the source's frozen move at the target's
//! `Arrival`), the clients' leases. The parts travel through a network
//! that loses them (a part never delivered), duplicates them (a part
//! delivered stays in flight and may arrive again), delays and reorders
//! them (any part in flight may arrive next, however stale). Pointed at
//! the rule before ADR 0027 — the driver sends [`SessionsPart::none`]
//! where the move's sessions belong, so the new owner knows nothing of the
//! clients — the checker finds an id run twice.
//!
//! Three keys, one per [`Place`]: one stays in shard 0, one moves to shard
//! 1 and stays there, one moves to shard 1 and then to shard 2. Before the
//! model starts the meta group executed client `c`'s seqs 1..=64 (a full
//! session: 1, 2 and 64 lease the key that moves twice, the others the
//! key that stays) and client `d`'s seq 1 (the key that moves twice).
//! Each new seq leases a token: `c`'s 65, 66, … of the key that moves
//! twice and of the key that stays in shard 1 in turn, `d`'s 2 and 3 the
//! same. Executing one of `c`'s new seqs pushes its seq 1 below the floor
//! of the session that executes it, and of every session a move copies
//! from there; two push seq 2 below it; 64 stays kept. `d`'s session is
//! short: its new owner must not open it afresh at a resent old seq. The
//! clients send any of these ids to any group the placement names, at any
//! step, as often as they like: a client that does not know the placement
//! changed, one that follows a `NOT_OWNER` hint, one whose answer was
//! lost. A request and its delivery are one step (the request is the same
//! whenever it arrives), and every answer a group gives is judged, whether
//! or not its client reads it.
//!
//! The worlds: the split of shard 0 with `c`'s new seqs 65..=67; both
//! splits with 65..=67, and with 65..=69; the rule before ADR 0027 on the
//! split of shard 0, and on the split of shard 1 alone.

mod coordinator_support;

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use coordinator_support::{counter, key, region, request};
use leasehold_core::coordinator::sharding::{MoveId, Outgoing, PlacementChange, SessionsPart};
use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, LeaseGrant, Outcome, ShardingOutcome,
};
use leasehold_core::principal::Principal;
use leasehold_core::shard::{slot_of, ShardId, SlotMove, SLOTS};
use stateright::{Checker, Model, Path, Property};

/// Each key's limit: the old ids of the key that moves twice hold 4 of
/// it, the new seqs may take the rest (not all of them get a token).
const LIMIT: u64 = 6;
/// Long enough that no window ends in the model.
const WINDOW_MS: u64 = 600_000;
/// Every proposal's stamp: no time passes, nothing expires.
const STAMP_MS: u64 = 1_000;
/// The seqs client `c` leased before the model starts: a full session.
const SESSION_FULL: u64 = 64;

/// The three groups: the meta group (shard 0), shard 1, shard 2.
const A: usize = 0;
const B: usize = 1;
const C: usize = 2;

/// Where a key's slot takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Place {
    /// It stays in shard 0 (the lower half of the slots).
    Staying,
    /// To shard 1 with the split of shard 0, where it stays (the third
    /// quarter).
    ToShardOne,
    /// To shard 1, then on to shard 2 with the split of shard 1 (the
    /// last quarter).
    ToShardTwo,
}

/// A request id a client sends: a lease of 1 token of the key at `place`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Id {
    client: &'static str,
    seq: u64,
    place: Place,
}

const fn id(client: &'static str, seq: u64, place: Place) -> Id {
    Id { client, seq, place }
}

/// What the meta group executed before the model starts: client `c`
/// leased seqs 1..=64 (a full session: 1, 2 and 64 of the key that moves
/// twice, the others of a key that stays), client `d` seq 1 (of the key
/// that moves twice).
fn history() -> Vec<Id> {
    let full = (1..=SESSION_FULL).map(|seq| {
        let place = if [1, 2, SESSION_FULL].contains(&seq) {
            Place::ToShardTwo
        } else {
            Place::Staying
        };
        id("c", seq, place)
    });
    full.chain([id("d", 1, Place::ToShardTwo)]).collect()
}

/// What a move carries of the source's client sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SessionRule {
    /// The move's own sessions part (ADR 0027).
    Carried,
    /// [`SessionsPart::none`] in its place: the protocol before ADR 0027,
    /// where the new owner knew nothing of the sessions.
    Dropped,
    /// The same, for the move out of shard 1 alone (what shard 1 copies at
    /// its release must reach shard 2 as well).
    DroppedOnTheSecondMove,
}

/// A small world, checked exhaustively.
struct MoveModel {
    rule: SessionRule,
    /// 1: the split of shard 0 only; 2: then the split of shard 1.
    moves: u8,
    /// The ids the clients send: old ones (of [`history`]) and new ones.
    ids: Vec<Id>,
    /// The key at each [`Place`] (in its order).
    keys: [String; 3],
    /// [`history`].
    history: Vec<Id>,
    /// What each command did to each group state it was applied to (the
    /// rules are deterministic: a world's step reuses what another world's
    /// identical step computed).
    applied: Applied,
}

/// Per (group state, command): the state after it and the outcome.
type Applied = Mutex<HashMap<(u64, Vec<u8>), Vec<(Group, Group, Outcome)>>>;

/// One group's replicated state with its postcard encoding, through which
/// it is compared, and a digest of that, through which it is hashed
/// (`CoordinatorState` is not `Hash`; the encoding is faithful, so both
/// agree with the state's own equality). Shared between worlds until a
/// step changes it.
#[derive(Clone)]
struct Group {
    state: Arc<CoordinatorState>,
    encoded: Arc<Vec<u8>>,
    digest: u64,
}

impl Group {
    fn new(state: CoordinatorState) -> Self {
        let encoded = postcard::to_allocvec(&state).expect("the state encodes");
        let mut hasher = DefaultHasher::new();
        encoded.hash(&mut hasher);
        Group {
            state: Arc::new(state),
            encoded: Arc::new(encoded),
            digest: hasher.finish(),
        }
    }

    /// Applies one single-command proposal stamped [`STAMP_MS`].
    fn apply(&mut self, command: Command) -> Outcome {
        let mut state = (*self.state).clone();
        let outcome = coordinator_support::run(&mut state, STAMP_MS, command);
        *self = Group::new(state);
        outcome
    }

    fn owns(&self, key_name: &str) -> bool {
        self.state.owns(&key(key_name))
    }
}

impl PartialEq for Group {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest && self.encoded == other.encoded
    }
}

impl Eq for Group {}

impl Hash for Group {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.digest.hash(state);
    }
}

/// What a counterexample shows of a group.
impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sharding = self.state.sharding();
        f.debug_struct("Group")
            .field("shard", &sharding.shard().0)
            .field("placement_version", &sharding.placement_version())
            .field("owned_slots", &sharding.owned_slots())
            .field("moves_out", &sharding.outgoing().keys().collect::<Vec<_>>())
            .field("client_sessions", &self.state.client_sessions())
            .finish()
    }
}

/// A move part in flight: its target group and the command's encoding.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Part {
    into: usize,
    encoded: Vec<u8>,
}

impl Part {
    fn new(into: usize, command: &Command) -> Self {
        Part {
            into,
            encoded: postcard::to_allocvec(command).expect("a part encodes"),
        }
    }

    fn command(&self) -> Command {
        postcard::from_bytes(&self.encoded).expect("a part decodes")
    }
}

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let into = self.into;
        match self.command() {
            Command::AcquireSessions(part) => write!(
                f,
                "sessions of move {} from {} into group {into} (last: {}, {} bytes)",
                part.id,
                part.first,
                part.last,
                self.encoded.len()
            ),
            Command::AcquireSlots(part) => write!(
                f,
                "{} keys of move {} from {} into group {into} (last: {})",
                part.key_count(),
                part.id,
                part.first_key,
                part.last
            ),
            other => write!(f, "{other:?}"),
        }
    }
}

/// A lease grant, as a hashable value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Grant {
    granted: u64,
    limit: u64,
    window_start_ms: u64,
    window_end_ms: u64,
    coordinator_now_ms: u64,
}

impl From<&LeaseGrant> for Grant {
    fn from(grant: &LeaseGrant) -> Self {
        Grant {
            granted: grant.granted,
            limit: grant.limit,
            window_start_ms: grant.window_start_ms,
            window_end_ms: grant.window_end_ms,
            coordinator_now_ms: grant.coordinator_now_ms,
        }
    }
}

/// An answer about a request id (a `NOT_OWNER` refusal says nothing about
/// the id: "not executed here, resend the same id to the owner").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Reply {
    Granted(Grant),
    Expired,
    /// Anything else (no other answer is right in this model).
    Other(String),
}

/// An answer that is not the one the id's first owner gave.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Misanswer {
    id: Id,
    group: usize,
    reply: Reply,
    /// The answer of the id's first execution (if it has run).
    first: Option<Reply>,
}

/// What the `sometimes` properties look for, once seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Seen {
    /// The last owner, serving the key, answered a resend from its
    /// session.
    LastOwnerReplayed,
    /// A new owner answered an old id `SESSION_EXPIRED`.
    NewOwnerExpiredAnOldId,
    /// The last owner answered the kept old id its first answer.
    LastOwnerReplayedTheKeptId,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    groups: [Group; 3],
    /// The move parts in flight (a part delivered stays: it may arrive
    /// again).
    parts: BTreeSet<Part>,
    /// Per id of [`MoveModel::ids`], how often a group executed it (an
    /// old id once before the model starts).
    executions: Vec<u8>,
    /// Per id, the answer of its first execution.
    first: Vec<Option<Reply>>,
    /// Per id that has not run, the group that answered it
    /// `SESSION_EXPIRED` (no execution may follow).
    refused_before_running: Vec<Option<usize>>,
    /// The first answer that contradicts the first owner's.
    misanswered: Option<Misanswer>,
    seen: BTreeSet<Seen>,
    /// The oracle: per key (by [`Place`]), Σ granted over every
    /// execution in every group (all in one window).
    admitted: [u64; 3],
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Step {
    /// The operator proposes the split of shard 0 into shard 1 to the
    /// meta group.
    SplitShardZero,
    /// The operator proposes the split of shard 1 into shard 2 to the
    /// meta group (once the first is applied): the meta group records the
    /// move, shard 1 releases it.
    SplitShardOne,
    /// Shard 1's leader, seeing the move in the placement, proposes its
    /// `ReleaseSlots` (refused until it owns every slot of it).
    Release,
    /// The driver of the move into `into` sends its next part.
    Drive { into: usize },
    /// A part in flight arrives.
    Deliver(Part),
    /// A client's request `id` reaches `group`.
    Send { id: Id, group: usize },
}

/// The first key `k<i>` whose slot `wanted` accepts.
fn fixture_key(wanted: impl Fn(u16) -> bool) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| wanted(slot_of(k)))
        .expect("some key")
}

fn lease(key_name: &str, id: Id) -> Command {
    Command::Lease {
        key: key(key_name),
        region: region("eu"),
        tokens: 1,
        request_id: Some(request(id.client, id.seq)),
        caller: Principal::Anonymous,
    }
}

/// A new group that became `shard`, with the policy.
fn new_shard(shard: u32) -> Group {
    let mut group = CoordinatorState::default();
    let became = Command::BecomeShard {
        shard: ShardId(shard),
    };
    coordinator_support::run(&mut group, STAMP_MS, became);
    coordinator_support::run(&mut group, STAMP_MS, counter("k", LIMIT, WINDOW_MS));
    Group::new(group)
}

fn split(shard: u32, into: u32, expected_version: u64) -> Command {
    Command::ChangePlacement {
        expected_version,
        change: PlacementChange::Split {
            shard: ShardId(shard),
            into: ShardId(into),
            // Shard 1's own replicas: a move out of it goes to a shard on
            // them.
            replicas: vec![1, 2, 3],
        },
    }
}

fn reply_of(outcome: &Outcome) -> Option<Reply> {
    match outcome {
        Outcome::Rejected(CommandError::NotOwner(_)) => None,
        Outcome::Lease(grant) => Some(Reply::Granted(grant.into())),
        Outcome::Rejected(CommandError::SessionExpired(_)) => Some(Reply::Expired),
        other => Some(Reply::Other(format!("{other:?}"))),
    }
}

/// The move out of shard `from` into shard `to` that `group` holds.
fn move_in(group: &Group, from: u32, to: u32) -> Option<(MoveId, Outgoing)> {
    group
        .state
        .sharding()
        .outgoing()
        .iter()
        .find(|(_, m)| m.slots.from == ShardId(from) && m.slots.to == ShardId(to))
        .map(|(id, m)| (*id, m.clone()))
}

impl MoveModel {
    /// Applies `command` to `group` (see [`MoveModel::applied`]).
    fn apply(&self, group: &mut Group, command: Command) -> Outcome {
        let key = (
            group.digest,
            postcard::to_allocvec(&command).expect("a command encodes"),
        );
        if let Some(known) = self.applied.lock().expect("not poisoned").get(&key) {
            if let Some((_, after, outcome)) = known.iter().find(|(before, ..)| before == group) {
                *group = after.clone();
                return outcome.clone();
            }
        }
        let before = group.clone();
        if command.request().is_some() {
            // What tells an execution from a replay (see `send`).
            let mut ticked = before.clone();
            ticked.apply(Command::Tick);
            assert_eq!(
                ticked, before,
                "a proposal carrying nothing changes nothing"
            );
        }
        let outcome = group.apply(command);
        let mut applied = self.applied.lock().expect("not poisoned");
        let known = applied.entry(key).or_default();
        known.push((before, group.clone(), outcome.clone()));
        outcome
    }

    fn index_of(&self, id: Id) -> usize {
        self.ids
            .iter()
            .position(|i| *i == id)
            .expect("a tracked id")
    }

    fn key_at(&self, place: Place) -> &str {
        &self.keys[place as usize]
    }

    /// The group that serves the key that moves twice once every move is
    /// done.
    fn last_owner(&self) -> usize {
        usize::from(self.moves)
    }

    /// Whether a session may have dropped `id`: 64 higher seqs of its
    /// client have run (a session keeps the 64 highest it holds, and
    /// every one it holds ran somewhere).
    fn droppable(&self, world: &World, id: Id) -> bool {
        let above = |other: &Id| other.client == id.client && other.seq > id.seq;
        let old = self.history.iter().filter(|other| above(other)).count();
        let new = self
            .ids
            .iter()
            .zip(&world.executions)
            .filter(|(other, runs)| above(other) && **runs > 0 && !self.history.contains(other))
            .count();
        (old + new) as u64 >= SESSION_FULL
    }

    /// The driver's next part of the move into `into`, once the source
    /// has released it and until the target has all of it.
    fn next_part(&self, world: &World, into: usize) -> Option<Part> {
        let (source, from) = if into == B { (A, 0) } else { (B, 1) };
        let (id, outgoing) = move_in(&world.groups[source], from, into as u32)?;
        let arrival = world.groups[into].state.sharding().arrival(id);
        if arrival.complete {
            return None;
        }
        let dropped = match self.rule {
            SessionRule::Carried => false,
            SessionRule::Dropped => true,
            SessionRule::DroppedOnTheSecondMove => into == C,
        };
        let command = if dropped && !arrival.sessions_complete {
            Command::AcquireSessions(SessionsPart::none(id, outgoing.slots))
        } else {
            outgoing.next_part(id, arrival)
        };
        Some(Part::new(into, &command))
    }

    /// The move out of shard 1 the meta group records, while shard 1 has
    /// not released it.
    fn to_release(&self, world: &World) -> Option<(MoveId, SlotMove)> {
        let (id, recorded) = move_in(&world.groups[A], 1, 2)?;
        let released = world.groups[B]
            .state
            .sharding()
            .outgoing()
            .contains_key(&id);
        (!released).then_some((id, recorded.slots))
    }

    /// Whether a client may reach `group`: the meta group always, a
    /// shard once the placement names it.
    fn reachable(&self, world: &World, group: usize) -> bool {
        group as u64 <= world.groups[A].state.sharding().placement_version()
    }

    /// A client's request `id` reaches `group`: applied, and its answer
    /// judged.
    fn send(&self, world: &mut World, id: Id, group: usize) {
        let index = self.index_of(id);
        // Executed: the request changed the group's state. A new id is
        // recorded in its session whatever it grants (even 0 tokens),
        // while a replay, a refusal as expired and a `NOT_OWNER` refusal
        // (never recorded) change nothing; nor does a proposal carrying
        // nothing (no time passes: checked on every group state a request
        // reaches).
        let before = world.groups[group].clone();
        let outcome = self.apply(&mut world.groups[group], lease(self.key_at(id.place), id));
        let executed = world.groups[group] != before;
        let Some(reply) = reply_of(&outcome) else {
            return;
        };
        if executed {
            world.executions[index] = world.executions[index].saturating_add(1);
            if let Outcome::Lease(grant) = &outcome {
                world.admitted[id.place as usize] += grant.granted;
            }
            if world.first[index].is_none() {
                world.first[index] = Some(reply.clone());
                // An id refused as expired runs nowhere afterwards.
                if let Some(refused_by) = world.refused_before_running[index] {
                    world.misanswered.get_or_insert(Misanswer {
                        id,
                        group: refused_by,
                        reply: Reply::Expired,
                        first: Some(reply.clone()),
                    });
                }
            }
        }
        let first = world.first[index].clone();
        let expired = reply == Reply::Expired;
        let right = match &first {
            Some(first) => *first == reply || (expired && self.droppable(world, id)),
            None => expired,
        };
        if first.is_none() && expired {
            world.refused_before_running[index].get_or_insert(group);
        }
        if !right {
            world.misanswered.get_or_insert(Misanswer {
                id,
                group,
                reply: reply.clone(),
                first: first.clone(),
            });
        }
        let last = self.last_owner();
        if group == last
            && id.place == Place::ToShardTwo
            && !executed
            && matches!(reply, Reply::Granted(_))
            && world.groups[group].owns(self.key_at(id.place))
        {
            world.seen.insert(Seen::LastOwnerReplayed);
        }
        if self.history.contains(&id) && group != A && expired {
            world.seen.insert(Seen::NewOwnerExpiredAnOldId);
        }
        let kept = id == self::id("c", SESSION_FULL, Place::ToShardTwo);
        if kept && group == last && first == Some(reply) {
            world.seen.insert(Seen::LastOwnerReplayedTheKeptId);
        }
    }
}

impl Model for MoveModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        let mut meta = CoordinatorState::default();
        coordinator_support::run(&mut meta, STAMP_MS, counter("k", LIMIT, WINDOW_MS));
        let mut executions = vec![0; self.ids.len()];
        let mut first = vec![None; self.ids.len()];
        let mut admitted = [0; 3];
        for old in self.history.iter().copied() {
            let outcome =
                coordinator_support::run(&mut meta, STAMP_MS, lease(self.key_at(old.place), old));
            let Outcome::Lease(grant) = &outcome else {
                panic!("{old:?}: {outcome:?}");
            };
            admitted[old.place as usize] += grant.granted;
            if let Some(index) = self.ids.iter().position(|i| *i == old) {
                executions[index] = 1;
                first[index] = reply_of(&outcome);
            }
        }
        let groups = [Group::new(meta), new_shard(1), new_shard(2)];
        vec![World {
            groups,
            parts: BTreeSet::new(),
            executions,
            first,
            refused_before_running: vec![None; self.ids.len()],
            misanswered: None,
            seen: BTreeSet::new(),
            admitted,
        }]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Step>) {
        let version = world.groups[A].state.sharding().placement_version();
        if version == 0 {
            actions.push(Step::SplitShardZero);
        }
        if version == 1 && self.moves == 2 {
            actions.push(Step::SplitShardOne);
        }
        if self.to_release(world).is_some() {
            actions.push(Step::Release);
        }
        for into in [B, C] {
            if let Some(part) = self.next_part(world, into) {
                if !world.parts.contains(&part) {
                    actions.push(Step::Drive { into });
                }
            }
        }
        for part in &world.parts {
            actions.push(Step::Deliver(part.clone()));
        }
        for id in &self.ids {
            for group in [A, B, C] {
                if self.reachable(world, group) {
                    actions.push(Step::Send { id: *id, group });
                }
            }
        }
    }

    fn next_state(&self, last: &World, step: Step) -> Option<World> {
        let mut world = last.clone();
        match step {
            Step::SplitShardZero => {
                self.apply(&mut world.groups[A], split(0, 1, 0));
            }
            Step::SplitShardOne => {
                self.apply(&mut world.groups[A], split(1, 2, 1));
            }
            Step::Release => {
                let (id, slots) = self.to_release(&world)?;
                self.apply(&mut world.groups[B], Command::ReleaseSlots { id, slots });
            }
            Step::Drive { into } => {
                let part = self.next_part(&world, into)?;
                world.parts.insert(part);
            }
            Step::Deliver(part) => {
                let outcome = self.apply(&mut world.groups[part.into], part.command());
                assert!(
                    matches!(
                        outcome,
                        Outcome::Sharding(
                            ShardingOutcome::Acquired { .. }
                                | ShardingOutcome::AcquiredSessions { .. }
                        )
                    ),
                    "a part is applied, or answers where its move stands: {outcome:?}"
                );
            }
            Step::Send { id, group } => self.send(&mut world, id, group),
        }
        Some(world)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no request id runs twice",
                |_: &MoveModel, world: &World| world.executions.iter().all(|runs| *runs <= 1),
            ),
            Property::always(
                "every resent id is answered as its first owner answered",
                |_: &MoveModel, world: &World| world.misanswered.is_none(),
            ),
            Property::always(
                "no window admits more than L",
                |_: &MoveModel, world: &World| world.admitted.iter().all(|a| *a <= LIMIT),
            ),
            Property::always(
                "one group at a time serves each key",
                |model: &MoveModel, world: &World| {
                    model.keys.iter().all(|k| {
                        let serving = world.groups.iter().filter(|g| g.owns(k));
                        serving.count() <= 1
                    })
                },
            ),
            Property::sometimes(
                "the last owner serves the key and answers a resend",
                |_: &MoveModel, world: &World| world.seen.contains(&Seen::LastOwnerReplayed),
            ),
            Property::sometimes(
                "a new owner answers an old id SESSION_EXPIRED",
                |_: &MoveModel, world: &World| world.seen.contains(&Seen::NewOwnerExpiredAnOldId),
            ),
            Property::sometimes(
                "the last owner answers the kept old id its first answer",
                |_: &MoveModel, world: &World| {
                    world.seen.contains(&Seen::LastOwnerReplayedTheKeptId)
                },
            ),
        ]
    }
}

/// The shortest path to a state that breaks `property` (stateright keeps
/// the last it met): searched deeper and deeper, up to `max_depth` steps.
fn shortest(
    model: impl Fn() -> MoveModel,
    property: &'static str,
    max_depth: usize,
) -> Option<Path<World, Step>> {
    (2..=max_depth + 1).find_map(|depth| {
        model()
            .checker()
            .threads(2)
            .target_max_depth(depth)
            .spawn_bfs()
            .join()
            .discovery(property)
    })
}

/// Checks `model` exhaustively (every property must hold, the `sometimes`
/// ones reached); returns the unique states visited. A property broken is
/// shown by its shortest counterexample.
fn run(model: impl Fn() -> MoveModel, what: &str) -> usize {
    let checker = model().checker().threads(2).spawn_bfs().join();
    let states = checker.unique_state_count();
    println!("{what}: {states} unique states");
    for property in model().properties() {
        let broken = property.expectation == stateright::Expectation::Always
            && checker.discovery(property.name).is_some();
        if broken {
            if let Some(path) = shortest(&model, property.name, 12) {
                println!(
                    "{what}: \"{}\" broken in {} steps: {:#?}\nlast state: {:#?}",
                    property.name,
                    path.clone().into_actions().len(),
                    path.clone().into_actions(),
                    path.last_state()
                );
            }
        }
    }
    checker.assert_properties();
    states
}

fn world(rule: SessionRule, moves: u8, ids: Vec<Id>) -> MoveModel {
    let quarter = SLOTS / 4;
    MoveModel {
        rule,
        moves,
        ids,
        keys: [
            fixture_key(|slot| slot < 2 * quarter),
            fixture_key(|slot| (2 * quarter..3 * quarter).contains(&slot)),
            fixture_key(|slot| slot >= 3 * quarter),
        ],
        history: history(),
        applied: Mutex::default(),
    }
}

/// The ids of both clients: `c`'s old 1, 2 (pushed below the floor by
/// one and two new seqs) and 64 (kept), its new 65..=`c_last`; `d`'s old 1
/// and new 2, 3. New seqs alternate between the key that moves twice and
/// the key that stays in shard 1.
fn ids(c_last: u64) -> Vec<Id> {
    use Place::{ToShardOne, ToShardTwo};
    let place = |seq: u64| {
        if seq.is_multiple_of(2) {
            ToShardOne
        } else {
            ToShardTwo
        }
    };
    let c_old = [1, 2, SESSION_FULL].map(|seq| id("c", seq, ToShardTwo));
    let c_new = (SESSION_FULL + 1..=c_last).map(|seq| id("c", seq, place(seq)));
    let d = [
        id("d", 1, ToShardTwo),
        id("d", 2, ToShardOne),
        id("d", 3, ToShardTwo),
    ];
    c_old.into_iter().chain(c_new).chain(d).collect()
}

#[test]
fn one_move_keeps_every_id_exactly_once() {
    let states = run(
        || world(SessionRule::Carried, 1, ids(67)),
        "the split of shard 0; c: 1, 2, 64, 65..=67; d: 1..=3",
    );
    assert!(states > 1_000, "the model explores: {states}");
}

#[test]
fn two_moves_keep_every_id_exactly_once() {
    run(
        || world(SessionRule::Carried, 2, ids(67)),
        "the splits of shard 0 and shard 1; c: 1, 2, 64, 65..=67; d: 1..=3",
    );
    let states = run(
        || world(SessionRule::Carried, 2, ids(69)),
        "the splits of shard 0 and shard 1; c: 1, 2, 64, 65..=69; d: 1..=3",
    );
    assert!(states > 100_000, "the model explores: {states}");
}

/// The rule before ADR 0027, pointed at by the checker: a move carries no
/// session, so the new owner opens a client's session at a resent old id
/// and runs it a second time; so it does when only shard 1's release
/// carries none into shard 2.
#[test]
fn the_rule_before_moved_sessions_runs_an_id_twice() {
    for (rule, moves, what) in [
        (SessionRule::Dropped, 1, "the split of shard 0"),
        (
            SessionRule::DroppedOnTheSecondMove,
            2,
            "the split of shard 1",
        ),
    ] {
        let model = || world(rule, moves, ids(67));
        let path = shortest(model, "no request id runs twice", 16)
            .unwrap_or_else(|| panic!("{what}: the old rule runs an id twice"));
        let last = path.last_state().clone();
        assert!(last.executions.iter().any(|runs| *runs > 1), "{last:?}");
        let steps = path.into_actions();
        println!(
            "the rule before moved sessions, {what}: an id runs twice in {} steps: {steps:?}",
            steps.len()
        );
    }
}
