//! Client sessions for exactly-once effects.
//!
//! A command carrying a [`RequestId`] `(client, seq)` from an authenticated
//! caller is executed once; its outcome is stored, with the command's
//! fingerprint, in the session `(caller, client)`, and a retry with the same
//! id returns that outcome without touching anything else. Refusals are
//! stored too, so a retry sees the same answer even if the cause went away.
//!
//! # Rules (DESIGN §7a)
//! - **Scoped to the caller.** Sessions are keyed by `(principal, client
//!   id)`: two callers never share a session, whatever client ids they pick.
//! - **One id, one request.** A retry whose fingerprint (command kind, key,
//!   region, amounts) differs from the first request's is refused
//!   ([`SessionLookup::Reused`]) and nothing is executed.
//! - **Never twice.** A session keeps the outcomes of its last
//!   [`MAX_RESPONSES_PER_SESSION`] sequence numbers and remembers
//!   `floor_seq` (one past the highest it dropped); an id below the floor is
//!   refused as expired ([`SessionLookup::Expired`]). A session is opened
//!   only by a request with `seq <= SESSION_OPENING_SEQS`; a higher seq for
//!   a session the coordinator does not hold (it expired) is refused as
//!   expired too, never executed as new.
//! - **No eviction.** A full table refuses to *open* sessions
//!   ([`SessionLookup::Exhausted`]) instead of evicting one: an
//!   authenticated principal may hold at most [`MAX_SESSIONS_PER_PRINCIPAL`]
//!   sessions, the whole table [`MAX_SESSIONS`]. So no caller can make the
//!   coordinator forget another caller's outcomes.
//! - **Retention.** Each stored outcome keeps its session until the
//!   coordinator clock reaches `retain_until_ms = max(window end of the
//!   outcome, applied_at + SESSION_MIN_RETAIN_MS)`; then the session expires.
//!   A request id may therefore be retried for at least
//!   [`SESSION_MIN_RETAIN_MS`] after its first execution. A retry later than
//!   that is refused as expired, except an opening seq
//!   (`<= SESSION_OPENING_SEQS`) of a session that expired whole, which is
//!   indistinguishable from a new client's first request: clients must not
//!   retry past the retention (the client crate gives up after seconds).
//!   Harmless for Δ either way: a grant is counted however often it is asked.
//! - **Sessions move with their slots** (ADR 0027). Each stored outcome
//!   records the hash slot of its command's key. When a group releases
//!   slots it copies every live session into the move
//!   ([`Sessions::moving`]): its name, floor and retention, and the
//!   outcomes of keys in the moved slots. The new owner merges them
//!   ([`Sessions::put_moved`]) before it serves a key of those slots, so
//!   it answers every id as the old owner would: the first answer for a
//!   kept id, expired below the floor, never a second execution.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::outcome::{Outcome, PoolGrantOutcome};
use crate::ids::{ClientId, RequestId};
use crate::principal::Principal;
use crate::shard::Slot;

/// Outcomes kept per client session.
pub const MAX_RESPONSES_PER_SESSION: usize = 64;
/// Client sessions kept at most, over all callers.
pub const MAX_SESSIONS: usize = 16_384;
/// Client sessions one authenticated principal may hold. On a plaintext
/// (`--insecure`) listener every caller is `Anonymous` and only
/// [`MAX_SESSIONS`] applies.
pub const MAX_SESSIONS_PER_PRINCIPAL: usize = 1_024;
/// Minimum coordinator time an outcome keeps its session alive, in ms.
pub const SESSION_MIN_RETAIN_MS: u64 = 60_000;
/// A session the coordinator does not hold may be opened by a request whose
/// seq is at most this (concurrent first requests of one client may arrive
/// out of order); a higher seq is refused as expired.
pub const SESSION_OPENING_SEQS: u64 = MAX_RESPONSES_PER_SESSION as u64;

/// What a request id means for the session table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SessionLookup {
    /// A retry: return this outcome, change nothing.
    Replay(Outcome),
    /// The id first named a request with another fingerprint: refuse.
    Reused,
    /// Older than anything the session still remembers, or of a session
    /// that expired: refuse, never execute.
    Expired,
    /// The caller may not open another session: refuse.
    Exhausted,
    /// Not seen: execute and record.
    New,
}

/// `(caller, client id)`: the name of one session.
type SessionName = (Principal, ClientId);

/// The first answer to one request id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The request's [`super::Command::fingerprint`].
    fingerprint: u64,
    /// The hash slot of the request's key (`None`: recorded by storage
    /// format 8 or earlier, which kept none; such an answer moves with
    /// every move, as it may be of any key).
    slot: Option<Slot>,
    outcome: Outcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    /// seq → first answer, the most recent [`MAX_RESPONSES_PER_SESSION`].
    responses: BTreeMap<u64, Response>,
    /// Requests with `seq < floor_seq` are expired.
    floor_seq: u64,
    /// The session lives while the clock is below this.
    retain_until_ms: u64,
}

impl Session {
    fn empty() -> Self {
        Session {
            responses: BTreeMap::new(),
            floor_seq: 0,
            retain_until_ms: 0,
        }
    }

    /// Keeps the [`MAX_RESPONSES_PER_SESSION`] highest seqs, raising the
    /// floor past each dropped one.
    fn trim(&mut self) {
        while self.responses.len() > MAX_RESPONSES_PER_SESSION {
            if let Some((dropped_seq, _)) = self.responses.pop_first() {
                self.floor_seq = self.floor_seq.max(dropped_seq.saturating_add(1));
            }
        }
    }
}

/// One session as a move of slots carries it to the new owner: what the
/// old owner would answer for any of its ids about a key of the move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MovedSession {
    caller: Principal,
    client: ClientId,
    /// The old owner's floor: an id below it may have been executed there.
    floor_seq: u64,
    retain_until_ms: u64,
    /// The answers about keys of the move (and those of unknown slot).
    responses: Vec<(u64, Response)>,
}

impl MovedSession {
    /// Bytes its encoding takes at most (a bound: Rust's debug text of an
    /// answer is longer than its compact encoding).
    pub fn size_bound(&self) -> usize {
        const FIXED: usize = 64;
        FIXED
            + format!("{:?}{}", self.caller, self.client).len()
            + self
                .responses
                .iter()
                .map(|(_, response)| FIXED + format!("{:?}", response.outcome).len())
                .sum::<usize>()
    }

    /// Until when the old owner keeps it.
    pub fn retain_until_ms(&self) -> u64 {
        self.retain_until_ms
    }
}

/// All client sessions, with an expiry index and per-caller counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Sessions {
    by_name: BTreeMap<SessionName, Session>,
    /// `(retain_until_ms, session)` for every session.
    expiry: BTreeSet<(u64, SessionName)>,
    /// Sessions held per principal.
    per_principal: BTreeMap<Principal, u64>,
}

impl Sessions {
    /// Every cached pool grant answers an increment of 0 from now on (see
    /// [`super::CoordinatorState::zero_cached_increments`]).
    pub(super) fn zero_cached_increments(&mut self) {
        for session in self.by_name.values_mut() {
            for response in session.responses.values_mut() {
                let outcome = &mut response.outcome;
                let upgraded = std::mem::replace(outcome, Outcome::PolicySet).upgraded();
                *outcome = match upgraded {
                    Outcome::PoolGrant(grant) => Outcome::PoolGrant(PoolGrantOutcome {
                        granted_increment: 0,
                        ..grant
                    }),
                    other => other,
                };
            }
        }
    }
}

impl Sessions {
    /// Classifies a request id of `caller` for a command with `fingerprint`.
    pub fn lookup(&self, caller: &Principal, id: &RequestId, fingerprint: u64) -> SessionLookup {
        let name = (caller.clone(), id.client.clone());
        let Some(session) = self.by_name.get(&name) else {
            if id.seq > SESSION_OPENING_SEQS {
                return SessionLookup::Expired;
            }
            if !self.may_open(caller) {
                return SessionLookup::Exhausted;
            }
            return SessionLookup::New;
        };
        if let Some(response) = session.responses.get(&id.seq) {
            return if response.fingerprint == fingerprint {
                SessionLookup::Replay(response.outcome.clone())
            } else {
                SessionLookup::Reused
            };
        }
        if id.seq < session.floor_seq {
            return SessionLookup::Expired;
        }
        SessionLookup::New
    }

    fn may_open(&self, caller: &Principal) -> bool {
        if self.by_name.len() >= MAX_SESSIONS {
            return false;
        }
        *caller == Principal::Anonymous
            || self.per_principal.get(caller).copied().unwrap_or(0)
                < MAX_SESSIONS_PER_PRINCIPAL as u64
    }

    /// Stores the outcome of a newly executed request (one that
    /// [`lookup`](Self::lookup) classified as [`SessionLookup::New`])
    /// about a key of `slot`.
    pub fn record(
        &mut self,
        caller: &Principal,
        id: &RequestId,
        fingerprint: u64,
        slot: Option<Slot>,
        outcome: &Outcome,
        retain_until_ms: u64,
    ) {
        let name = (caller.clone(), id.client.clone());
        let (session, opened) = self.open(&name);
        session.responses.insert(
            id.seq,
            Response {
                fingerprint,
                slot,
                outcome: outcome.clone(),
            },
        );
        session.trim();
        self.retain(name, opened, retain_until_ms);
    }

    /// The session `name`, opened empty (and counted for its caller) if
    /// the table does not hold it; `true` when just opened.
    fn open(&mut self, name: &SessionName) -> (&mut Session, bool) {
        let opened = !self.by_name.contains_key(name);
        if opened {
            *self.per_principal.entry(name.0.clone()).or_insert(0) += 1;
        }
        let session = self
            .by_name
            .entry(name.clone())
            .or_insert_with(Session::empty);
        (session, opened)
    }

    /// Keeps the session `name` at least until `retain_until_ms`, filing
    /// it in the expiry index (touched only when its expiry moves: the
    /// commands of one proposal share a clock, so a session's requests in
    /// one batch usually keep it where it is).
    fn retain(&mut self, name: SessionName, opened: bool, retain_until_ms: u64) {
        let Some(session) = self.by_name.get_mut(&name) else {
            return;
        };
        let filed_until = session.retain_until_ms;
        session.retain_until_ms = filed_until.max(retain_until_ms);
        if opened || session.retain_until_ms != filed_until {
            let mut filed = (filed_until, name);
            if !opened {
                self.expiry.remove(&filed);
            }
            filed.0 = session.retain_until_ms;
            self.expiry.insert(filed);
        }
    }

    /// Every session as a move of the slots `in_move` carries it: its
    /// name, floor and retention, with the answers about keys of those
    /// slots (and those of unknown slot). Every session, even one with no
    /// such answer: an id below its floor may have been about a moved key,
    /// and the new owner must know the session to tell a resend of an id
    /// it never executed from an id of a session that expired.
    pub fn moving(&self, in_move: impl Fn(Slot) -> bool) -> Vec<MovedSession> {
        self.by_name
            .iter()
            .map(|((caller, client), session)| MovedSession {
                caller: caller.clone(),
                client: client.clone(),
                floor_seq: session.floor_seq,
                retain_until_ms: session.retain_until_ms,
                responses: session
                    .responses
                    .iter()
                    .filter(|(_, response)| response.slot.is_none_or(&in_move))
                    .map(|(seq, response)| (*seq, response.clone()))
                    .collect(),
            })
            .collect()
    }

    /// Merges sessions a move carried here (see [`moving`](Self::moving)):
    /// each answer this table lacks is kept, the floor is the higher of
    /// the two, and the retention the later. A session already past its
    /// retention at `now_ms` is skipped (the old owner would have dropped
    /// it). Sessions merged in count for their caller but are never
    /// refused for the quota: the old owner held them within it.
    pub fn put_moved(&mut self, moved: &[MovedSession], now_ms: u64) {
        for incoming in moved {
            if incoming.retain_until_ms <= now_ms {
                continue;
            }
            let name = (incoming.caller.clone(), incoming.client.clone());
            let (session, opened) = self.open(&name);
            for (seq, response) in &incoming.responses {
                session
                    .responses
                    .entry(*seq)
                    .or_insert_with(|| response.clone());
            }
            session.floor_seq = session.floor_seq.max(incoming.floor_seq);
            session.trim();
            self.retain(name, opened, incoming.retain_until_ms);
        }
    }

    /// Drops every session whose `retain_until_ms <= now_ms`; returns how many.
    pub fn collect(&mut self, now_ms: u64) -> u64 {
        let mut collected = 0;
        while let Some((until, _)) = self.expiry.first() {
            if *until > now_ms {
                break;
            }
            if let Some((_, name)) = self.expiry.pop_first() {
                self.by_name.remove(&name);
                if let Some(count) = self.per_principal.get_mut(&name.0) {
                    *count = count.saturating_sub(1);
                    if *count == 0 {
                        self.per_principal.remove(&name.0);
                    }
                }
                collected += 1;
            }
        }
        collected
    }

    /// Every kept answer of unknown slot (see
    /// [`super::CoordinatorState::with_answers_of_unknown_slot`]).
    pub(super) fn forget_slots(&mut self) {
        for session in self.by_name.values_mut() {
            for response in session.responses.values_mut() {
                response.slot = None;
            }
        }
    }

    /// Number of sessions held.
    pub fn len(&self) -> u64 {
        self.by_name.len() as u64
    }
}

/// The session table as storage formats 2 to 8 wrote it (answers without
/// their key's slot); read from an older snapshot and upgraded
/// ([`From`]): its answers move with every move, as they may be of any key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SessionsV8 {
    by_name: BTreeMap<SessionName, SessionV8>,
    expiry: BTreeSet<(u64, SessionName)>,
    per_principal: BTreeMap<Principal, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SessionV8 {
    responses: BTreeMap<u64, (u64, Outcome)>,
    floor_seq: u64,
    retain_until_ms: u64,
}

impl From<SessionsV8> for Sessions {
    fn from(old: SessionsV8) -> Self {
        let by_name = old
            .by_name
            .into_iter()
            .map(|(name, session)| {
                let responses = session
                    .responses
                    .into_iter()
                    .map(|(seq, (fingerprint, outcome))| {
                        (
                            seq,
                            Response {
                                fingerprint,
                                slot: None,
                                outcome,
                            },
                        )
                    })
                    .collect();
                let session = Session {
                    responses,
                    floor_seq: session.floor_seq,
                    retain_until_ms: session.retain_until_ms,
                };
                (name, session)
            })
            .collect();
        Sessions {
            by_name,
            expiry: old.expiry,
            per_principal: old.per_principal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::outcome::CommandError;
    use crate::ids::RegionId;
    use proptest::prelude::*;

    fn id(client: &str, seq: u64) -> RequestId {
        RequestId {
            client: ClientId::new(client).unwrap(),
            seq,
        }
    }

    fn outcome(n: u64) -> Outcome {
        Outcome::Ticked {
            collected_windows: n,
        }
    }

    fn region(name: &str) -> Principal {
        Principal::Region(RegionId::new(name).unwrap())
    }

    const ANON: Principal = Principal::Anonymous;

    #[test]
    fn replay_returns_the_first_outcome_only_for_the_same_request() {
        let mut sessions = Sessions::default();
        assert_eq!(sessions.lookup(&ANON, &id("c", 1), 9), SessionLookup::New);
        sessions.record(&ANON, &id("c", 1), 9, Some(0), &outcome(7), 100);
        assert_eq!(
            sessions.lookup(&ANON, &id("c", 1), 9),
            SessionLookup::Replay(outcome(7))
        );
        assert_eq!(
            sessions.lookup(&ANON, &id("c", 1), 10),
            SessionLookup::Reused,
            "same id, another request"
        );
        assert_eq!(
            sessions.lookup(&ANON, &id("c", 0), 9),
            SessionLookup::New,
            "out-of-order seq not yet seen is new"
        );
        assert_eq!(sessions.lookup(&ANON, &id("d", 1), 9), SessionLookup::New);
    }

    #[test]
    fn sessions_of_different_callers_never_meet() {
        let mut sessions = Sessions::default();
        sessions.record(&region("eu"), &id("c", 1), 9, Some(0), &outcome(7), 100);
        assert_eq!(
            sessions.lookup(&region("us"), &id("c", 1), 9),
            SessionLookup::New,
            "another principal with the same client id has its own session"
        );
        assert_eq!(sessions.lookup(&ANON, &id("c", 1), 9), SessionLookup::New);
    }

    #[test]
    fn dropped_seqs_are_expired() {
        let mut sessions = Sessions::default();
        let n = MAX_RESPONSES_PER_SESSION as u64 + 3;
        for seq in 0..n {
            sessions.record(&ANON, &id("c", seq), seq, Some(0), &outcome(seq), 100);
        }
        for seq in 0..3 {
            assert_eq!(
                sessions.lookup(&ANON, &id("c", seq), seq),
                SessionLookup::Expired
            );
        }
        assert_eq!(
            sessions.lookup(&ANON, &id("c", 3), 3),
            SessionLookup::Replay(outcome(3))
        );
        assert_eq!(sessions.lookup(&ANON, &id("c", n), n), SessionLookup::New);
    }

    #[test]
    fn an_expired_session_refuses_later_seqs_instead_of_executing_them() {
        let mut sessions = Sessions::default();
        sessions.record(&ANON, &id("c", 200), 1, Some(0), &outcome(1), 100);
        assert_eq!(sessions.collect(100), 1);
        assert_eq!(
            sessions.lookup(&ANON, &id("c", 200), 1),
            SessionLookup::Expired
        );
        assert_eq!(
            sessions.lookup(&ANON, &id("c", SESSION_OPENING_SEQS + 1), 1),
            SessionLookup::Expired
        );
        assert_eq!(
            sessions.lookup(&ANON, &id("c", SESSION_OPENING_SEQS), 1),
            SessionLookup::New
        );
    }

    #[test]
    fn sessions_expire_when_every_outcome_is_past_retention() {
        let mut sessions = Sessions::default();
        sessions.record(&ANON, &id("a", 1), 1, Some(0), &outcome(1), 100);
        sessions.record(&ANON, &id("a", 2), 2, Some(0), &outcome(2), 300);
        sessions.record(
            &ANON,
            &id("b", 1),
            1,
            Some(0),
            &Outcome::Rejected(CommandError::NoPolicy("k".into())),
            200,
        );
        assert_eq!(sessions.collect(199), 0);
        assert_eq!(sessions.collect(200), 1);
        assert_eq!(sessions.lookup(&ANON, &id("b", 1), 1), SessionLookup::New);
        assert_eq!(
            sessions.lookup(&ANON, &id("a", 1), 1),
            SessionLookup::Replay(outcome(1))
        );
        assert_eq!(sessions.collect(300), 1);
        assert_eq!(sessions.len(), 0);
        assert!(sessions.per_principal.is_empty());
    }

    #[test]
    fn a_full_principal_cannot_open_more_and_evicts_nobody() {
        let mut sessions = Sessions::default();
        let victim = region("us");
        sessions.record(&victim, &id("victim", 1), 1, Some(0), &outcome(1), 1_000);
        let flooder = region("eu");
        for i in 0..MAX_SESSIONS_PER_PRINCIPAL as u64 {
            let client = id(&format!("c{i}"), 1);
            assert_eq!(sessions.lookup(&flooder, &client, 1), SessionLookup::New);
            sessions.record(&flooder, &client, 1, Some(0), &outcome(0), 5);
        }
        assert_eq!(
            sessions.lookup(&flooder, &id("one-more", 1), 1),
            SessionLookup::Exhausted
        );
        assert_eq!(
            sessions.lookup(&flooder, &id("c0", 2), 1),
            SessionLookup::New,
            "a held session keeps working"
        );
        assert_eq!(
            sessions.lookup(&victim, &id("victim", 1), 1),
            SessionLookup::Replay(outcome(1))
        );
        assert_eq!(
            sessions.lookup(&victim, &id("v2", 1), 1),
            SessionLookup::New
        );
    }

    #[test]
    fn the_whole_table_is_bounded_without_eviction() {
        let mut sessions = Sessions::default();
        for i in 0..MAX_SESSIONS as u64 {
            sessions.record(
                &ANON,
                &id(&format!("c{i}"), 0),
                0,
                Some(0),
                &outcome(0),
                1_000 + i,
            );
        }
        assert_eq!(
            sessions.lookup(&ANON, &id("late", 0), 0),
            SessionLookup::Exhausted
        );
        assert_eq!(
            sessions.lookup(&ANON, &id("c0", 0), 0),
            SessionLookup::Replay(outcome(0)),
            "nothing was evicted"
        );
        assert_eq!(sessions.collect(1_000), 1);
        assert_eq!(
            sessions.lookup(&ANON, &id("late", 0), 0),
            SessionLookup::New
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Request {
            caller: u8,
            client: u8,
            seq: u64,
            fingerprint: u8,
        },
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            8 => (0u8..3, 0u8..4, 0u64..80, 0u8..2).prop_map(|(caller, client, seq, fingerprint)| {
                Step::Request { caller, client, seq, fingerprint }
            }),
            1 => (0u64..40_000).prop_map(Step::Advance),
        ]
    }

    proptest! {
        /// Against a model that remembers every executed id forever: an id
        /// is executed at most once while its session lives, a replay always
        /// returns the first outcome, and a changed fingerprint never replays;
        /// after every step the expiry index files each session exactly once,
        /// under its expiry, and the per-principal counts match the table.
        #[test]
        fn an_id_is_executed_at_most_once_within_retention(steps in prop::collection::vec(step(), 1..200)) {
            let callers = [Principal::Anonymous, region("eu"), region("us")];
            let mut sessions = Sessions::default();
            let mut now = 0u64;
            let mut executed: BTreeMap<(Principal, String, u64), (u64, u64, u64)> = BTreeMap::new();
            let mut counter = 0u64;
            for step in steps {
                match step {
                    Step::Advance(ms) => {
                        now += ms;
                        sessions.collect(now);
                    }
                    Step::Request { caller, client, seq, fingerprint } => {
                        let caller = callers[caller as usize].clone();
                        let client = format!("c{client}");
                        let key = (caller.clone(), client.clone(), seq);
                        let fingerprint = u64::from(fingerprint);
                        match sessions.lookup(&caller, &id(&client, seq), fingerprint) {
                            SessionLookup::New => {
                                if let Some((_, _, at)) = executed.get(&key) {
                                    prop_assert!(now >= at + SESSION_MIN_RETAIN_MS,
                                        "re-executed {:?} within retention", key);
                                }
                                counter += 1;
                                sessions.record(&caller, &id(&client, seq), fingerprint, Some(0), &outcome(counter), now + SESSION_MIN_RETAIN_MS);
                                executed.insert(key, (fingerprint, counter, now));
                            }
                            SessionLookup::Replay(o) => {
                                let (f, n, _) = executed.get(&key).copied().expect("replayed an id never executed");
                                prop_assert_eq!(f, fingerprint);
                                prop_assert_eq!(o, outcome(n));
                            }
                            SessionLookup::Reused => {
                                let (f, _, _) = executed.get(&key).copied().expect("reused an id never executed");
                                prop_assert_ne!(f, fingerprint);
                            }
                            SessionLookup::Expired | SessionLookup::Exhausted => {}
                        }
                    }
                }
                let filed: BTreeSet<(u64, SessionName)> = sessions
                    .by_name
                    .iter()
                    .map(|(name, session)| (session.retain_until_ms, name.clone()))
                    .collect();
                prop_assert_eq!(&sessions.expiry, &filed);
                let mut held: BTreeMap<Principal, u64> = BTreeMap::new();
                for (principal, _) in sessions.by_name.keys() {
                    *held.entry(principal.clone()).or_insert(0) += 1;
                }
                prop_assert_eq!(&sessions.per_principal, &held);
            }
        }
    }

    #[test]
    fn a_moved_session_answers_as_its_old_owner_and_merges_with_the_new_owners() {
        let mut old = Sessions::default();
        let n = MAX_RESPONSES_PER_SESSION as u64 + 10;
        for seq in 1..=n {
            // Odd seqs are about slot 1 (moving), even ones slot 2 (staying).
            let slot = if seq % 2 == 1 { 1 } else { 2 };
            old.record(&ANON, &id("c", seq), seq, Some(slot), &outcome(seq), 1_000);
        }
        let moved = old.moving(|slot| slot == 1);
        assert_eq!(moved.len(), 1);
        let mut new = Sessions::default();
        new.record(&ANON, &id("c", n + 1), 99, Some(1), &outcome(99), 2_000);
        new.put_moved(&moved, 0);
        // The old owner's kept answers about slot 1, its floor, and the
        // new owner's own answer.
        for seq in 1..=n {
            let expected = if seq < 11 {
                SessionLookup::Expired
            } else if seq % 2 == 1 {
                SessionLookup::Replay(outcome(seq))
            } else {
                SessionLookup::New
            };
            assert_eq!(new.lookup(&ANON, &id("c", seq), seq), expected, "seq {seq}");
        }
        assert_eq!(
            new.lookup(&ANON, &id("c", n + 1), 99),
            SessionLookup::Replay(outcome(99))
        );
        assert_eq!(new.len(), 1);
        assert_eq!(new.per_principal.get(&ANON), Some(&1));
        // Merging the same move again changes nothing; a session past its
        // retention is not merged.
        let before = new.clone();
        new.put_moved(&moved, 0);
        assert_eq!(new, before);
        let mut late = Sessions::default();
        late.put_moved(&moved, 1_000);
        assert_eq!(late.len(), 0);
        // Expiry is filed at the later retention.
        assert_eq!(new.collect(1_999), 0);
        assert_eq!(new.collect(2_000), 1);
    }

    #[test]
    fn a_session_with_no_moved_answer_still_moves_its_floor() {
        let mut old = Sessions::default();
        for seq in 1..=(MAX_RESPONSES_PER_SESSION as u64 + 5) {
            old.record(&ANON, &id("c", seq), seq, Some(2), &outcome(seq), 1_000);
        }
        let mut new = Sessions::default();
        new.put_moved(&old.moving(|slot| slot == 1), 0);
        assert_eq!(new.lookup(&ANON, &id("c", 3), 3), SessionLookup::Expired);
        assert_eq!(
            new.lookup(&ANON, &id("c", SESSION_OPENING_SEQS + 10), 1),
            SessionLookup::New,
            "the session is known: a seq above 64 is not refused as of an expired one"
        );
    }
}
