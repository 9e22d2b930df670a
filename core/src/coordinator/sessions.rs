//! Client sessions for exactly-once effects.
//!
//! A command carrying a [`RequestId`] `(client, seq)` is executed once; its
//! outcome is stored in the client's session and a retry with the same id
//! returns that outcome without touching anything else. Refusals are stored
//! too, so a retry sees the same answer even if the cause went away.
//!
//! # Bounds
//! - A session keeps the outcomes of its last [`MAX_RESPONSES_PER_SESSION`]
//!   sequence numbers. When an older one is dropped, the session remembers
//!   `floor_seq` (one past the highest dropped seq); a request below it is
//!   refused as too old instead of being executed again.
//! - Each stored outcome keeps its session alive until the coordinator clock
//!   reaches `retain_until_ms = max(window end of the outcome,
//!   applied_at + SESSION_MIN_RETAIN_MS)`. A session whose every outcome is
//!   past that point is dropped. A retry arriving after that is executed as a
//!   new request: harmless for Δ, because whatever the first execution granted
//!   belongs to a window that has ended (its credits are dead and a reconcile
//!   of it is forfeit).
//! - At most [`MAX_SESSIONS`] sessions are held; opening one more evicts the
//!   session closest to expiry (smallest `retain_until_ms`, then client id).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::command::Outcome;
use crate::ids::{ClientId, RequestId};

/// Outcomes kept per client session.
pub const MAX_RESPONSES_PER_SESSION: usize = 64;
/// Client sessions kept at most.
pub const MAX_SESSIONS: usize = 16_384;
/// Minimum coordinator time an outcome keeps its session alive, in ms.
pub const SESSION_MIN_RETAIN_MS: u64 = 60_000;

/// What a request id means for the session table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SessionLookup {
    /// A retry: return this outcome, change nothing.
    Replay(Outcome),
    /// Older than anything the session still remembers: refuse.
    TooOld,
    /// Not seen: execute and record.
    New,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    /// seq → outcome, the most recent [`MAX_RESPONSES_PER_SESSION`].
    responses: BTreeMap<u64, Outcome>,
    /// Requests with `seq < floor_seq` are too old.
    floor_seq: u64,
    /// The session lives while the clock is below this.
    retain_until_ms: u64,
}

/// All client sessions, with an expiry index.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Sessions {
    by_client: BTreeMap<ClientId, Session>,
    /// `(retain_until_ms, client)` for every session.
    expiry: BTreeSet<(u64, ClientId)>,
}

impl Sessions {
    /// Classifies a request id.
    pub fn lookup(&self, id: &RequestId) -> SessionLookup {
        let Some(session) = self.by_client.get(&id.client) else {
            return SessionLookup::New;
        };
        if let Some(outcome) = session.responses.get(&id.seq) {
            return SessionLookup::Replay(outcome.clone());
        }
        if id.seq < session.floor_seq {
            return SessionLookup::TooOld;
        }
        SessionLookup::New
    }

    /// Stores the outcome of a newly executed request.
    pub fn record(&mut self, id: &RequestId, outcome: &Outcome, retain_until_ms: u64) {
        if !self.by_client.contains_key(&id.client) && self.by_client.len() >= MAX_SESSIONS {
            if let Some((_, client)) = self.expiry.pop_first() {
                self.by_client.remove(&client);
            }
        }
        let session = self.by_client.entry(id.client.clone()).or_insert(Session {
            responses: BTreeMap::new(),
            floor_seq: 0,
            retain_until_ms: 0,
        });
        self.expiry
            .remove(&(session.retain_until_ms, id.client.clone()));
        session.responses.insert(id.seq, outcome.clone());
        while session.responses.len() > MAX_RESPONSES_PER_SESSION {
            if let Some((dropped_seq, _)) = session.responses.pop_first() {
                session.floor_seq = session.floor_seq.max(dropped_seq.saturating_add(1));
            }
        }
        session.retain_until_ms = session.retain_until_ms.max(retain_until_ms);
        self.expiry
            .insert((session.retain_until_ms, id.client.clone()));
    }

    /// Drops every session whose `retain_until_ms <= now_ms`; returns how many.
    pub fn collect(&mut self, now_ms: u64) -> u64 {
        let mut collected = 0;
        while let Some((until, _)) = self.expiry.first() {
            if *until > now_ms {
                break;
            }
            if let Some((_, client)) = self.expiry.pop_first() {
                self.by_client.remove(&client);
                collected += 1;
            }
        }
        collected
    }

    /// Number of sessions held.
    pub fn len(&self) -> u64 {
        self.by_client.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::command::CommandError;

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

    #[test]
    fn replay_returns_the_first_outcome() {
        let mut sessions = Sessions::default();
        assert_eq!(sessions.lookup(&id("c", 1)), SessionLookup::New);
        sessions.record(&id("c", 1), &outcome(7), 100);
        assert_eq!(
            sessions.lookup(&id("c", 1)),
            SessionLookup::Replay(outcome(7))
        );
        assert_eq!(
            sessions.lookup(&id("c", 0)),
            SessionLookup::New,
            "out-of-order seq not yet seen is new"
        );
        assert_eq!(sessions.lookup(&id("d", 1)), SessionLookup::New);
    }

    #[test]
    fn dropped_seqs_are_too_old() {
        let mut sessions = Sessions::default();
        let n = MAX_RESPONSES_PER_SESSION as u64 + 3;
        for seq in 0..n {
            sessions.record(&id("c", seq), &outcome(seq), 100);
        }
        for seq in 0..3 {
            assert_eq!(sessions.lookup(&id("c", seq)), SessionLookup::TooOld);
        }
        assert_eq!(
            sessions.lookup(&id("c", 3)),
            SessionLookup::Replay(outcome(3))
        );
        assert_eq!(sessions.lookup(&id("c", n)), SessionLookup::New);
    }

    #[test]
    fn sessions_expire_when_every_outcome_is_past_retention() {
        let mut sessions = Sessions::default();
        sessions.record(&id("a", 1), &outcome(1), 100);
        sessions.record(&id("a", 2), &outcome(2), 300);
        sessions.record(
            &id("b", 1),
            &Outcome::Rejected(CommandError::NoPolicy("k".into())),
            200,
        );
        assert_eq!(sessions.collect(199), 0);
        assert_eq!(sessions.collect(200), 1);
        assert_eq!(sessions.lookup(&id("b", 1)), SessionLookup::New);
        assert_eq!(
            sessions.lookup(&id("a", 1)),
            SessionLookup::Replay(outcome(1))
        );
        assert_eq!(sessions.collect(300), 1);
        assert_eq!(sessions.len(), 0);
    }

    #[test]
    fn session_count_is_bounded_by_evicting_closest_to_expiry() {
        let mut sessions = Sessions::default();
        for i in 0..MAX_SESSIONS as u64 {
            sessions.record(&id(&format!("c{i}"), 0), &outcome(0), 1_000 + i);
        }
        sessions.record(&id("late", 0), &outcome(0), 5);
        assert_eq!(sessions.len(), MAX_SESSIONS as u64);
        assert_eq!(
            sessions.lookup(&id("c0", 0)),
            SessionLookup::New,
            "closest to expiry was evicted"
        );
        assert_eq!(
            sessions.lookup(&id("late", 0)),
            SessionLookup::Replay(outcome(0))
        );
    }
}
