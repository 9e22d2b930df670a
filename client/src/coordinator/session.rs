//! Client sessions for exactly-once retries.
//!
//! The coordinator remembers the last responses of each client session
//! (a bounded window of sequence numbers) and refuses a request id older
//! than that window. So a client with many concurrent callers must not let
//! one slow request fall behind many newer ones of the same session. The
//! [`SessionPool`] hands each logical request a session of its own for its
//! whole life, retries included: one request in flight per session, sequence
//! numbers in order. Sessions are reused, so their number follows the peak
//! concurrency. Each shard (Raft group) keeps sessions of its own, so the
//! pool keeps its sessions by shard: a session's seqs all go to one group.
//!
//! A group forgets a session (`SESSION_EXPIRED`) when it held no outcome
//! of it for a minute (the client was idle), or never opens it when the
//! session's first requests never reached it (refused before they ran, as
//! while a shard forms): it opens a session only at one of its first seqs.
//! Such a session is useless from then on, so it is retired
//! ([`SessionGuard::retire`]) and a new one opened
//! ([`SessionPool::open_in`]); the client's own session of caller-managed
//! ids is renewed under a new name ([`SessionPool::renew_manual`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use leasehold_proto::v1::RequestId;

/// One session: its id and next sequence number.
#[derive(Debug)]
struct Session {
    client_id: String,
    next_seq: u64,
}

/// The sessions of one client, by shard: every Raft group (shard) keeps
/// its own sessions (a session's seqs go to one group), so a session
/// serves one shard's requests and the manual sequence runs per shard.
#[derive(Debug)]
pub(crate) struct SessionPool {
    client_id: String,
    manual: Mutex<ManualSession>,
    idle: Mutex<HashMap<u32, Vec<Session>>>,
    opened: AtomicU64,
    renewed: AtomicU64,
}

/// The client's own session, for caller-managed ids: its name (the client
/// id until a group forgets it) and next seq per shard.
#[derive(Debug)]
struct ManualSession {
    name: String,
    renewals: u64,
    next_seq_by_shard: HashMap<u32, u64>,
}

impl ManualSession {
    fn next(&mut self, shard: u32) -> RequestId {
        let seq = self.next_seq_by_shard.entry(shard).or_insert(1);
        let id = RequestId {
            client_id: self.name.clone(),
            seq: *seq,
        };
        *seq += 1;
        id
    }
}

impl SessionPool {
    /// A pool whose session ids start with `client_id`.
    pub(crate) fn new(client_id: String) -> Self {
        Self {
            manual: Mutex::new(ManualSession {
                name: client_id.clone(),
                renewals: 0,
                next_seq_by_shard: HashMap::new(),
            }),
            client_id,
            idle: Mutex::new(HashMap::new()),
            opened: AtomicU64::new(0),
            renewed: AtomicU64::new(0),
        }
    }

    /// The client id (the first name of the session of
    /// [`manual_request_id`](Self::manual_request_id)).
    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    /// How many sessions were opened.
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// How many sessions a group had forgotten were replaced (pooled
    /// sessions retired, the client's own session renamed).
    pub(crate) fn renewed(&self) -> u64 {
        self.renewed.load(Ordering::Relaxed)
    }

    fn manual(&self) -> std::sync::MutexGuard<'_, ManualSession> {
        self.manual.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next id of the client's own session, for callers managing retries.
    pub(crate) fn manual_request_id(&self) -> RequestId {
        self.manual().next(0)
    }

    /// The next id of the client's own session in `shard`'s group.
    pub(crate) fn manual_request_id_in(&self, shard: u32) -> RequestId {
        self.manual().next(shard)
    }

    /// A group refused an id of the client's own session named `name` as
    /// of a session it does not hold: if that is still the session's
    /// name, the session is renamed (`<client id>-r<n>`, every seq from
    /// 1), so the next ids open a session again. Ids handed out before
    /// keep the old name (a retry of one is answered as before). Whether
    /// it renamed.
    pub(crate) fn renew_manual(&self, name: &str) -> bool {
        let mut manual = self.manual();
        if manual.name != name {
            return false;
        }
        manual.renewals += 1;
        manual.name = format!("{}-r{}", self.client_id, manual.renewals);
        manual.next_seq_by_shard.clear();
        self.renewed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// A session of shard 0's group for one logical request.
    #[cfg(test)]
    pub(crate) fn checkout(&self) -> SessionGuard<'_> {
        self.checkout_in(0)
    }

    /// A session of `shard`'s group for one logical request; it returns
    /// to the pool when dropped.
    pub(crate) fn checkout_in(&self, shard: u32) -> SessionGuard<'_> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&shard)
            .and_then(Vec::pop);
        match idle {
            Some(session) => SessionGuard {
                pool: self,
                shard,
                session: Some(session),
            },
            None => self.open_in(shard),
        }
    }

    /// A new session of `shard`'s group (its first id is seq 1, which any
    /// group opens), for one logical request; pooled when dropped.
    pub(crate) fn open_in(&self, shard: u32) -> SessionGuard<'_> {
        let n = self.opened.fetch_add(1, Ordering::Relaxed);
        SessionGuard {
            pool: self,
            shard,
            session: Some(Session {
                client_id: format!("{}-s{n}", self.client_id),
                next_seq: 1,
            }),
        }
    }
}

/// Sends one logical request in a pooled session of `shard`'s group:
/// `send` sends it under the id it is given. When the group answers that
/// it does not hold the session (`forgotten`: `SESSION_EXPIRED`), the
/// session is retired and the request goes once more at seq 1 of a new
/// session. That is still exactly-once: the refused id was never executed
/// (a group keeps a session's outcomes for at least a minute after the
/// last, `SESSION_MIN_RETAIN_MS`, while one id is retried for seconds),
/// and a new session's first seq is always opened.
pub(crate) async fn send_in_session<R, E, F, Fut>(
    pool: &SessionPool,
    shard: u32,
    forgotten: impl Fn(&E) -> bool,
    mut send: F,
) -> Result<R, E>
where
    F: FnMut(RequestId) -> Fut,
    Fut: std::future::Future<Output = Result<R, E>>,
{
    let mut session = pool.checkout_in(shard);
    match send(session.request_id()).await {
        Err(error) if forgotten(&error) => {
            tracing::debug!(
                shard,
                "session forgotten by its group; sending in a new one"
            );
            session.retire();
            let mut fresh = pool.open_in(shard);
            send(fresh.request_id()).await
        }
        answer => answer,
    }
}

/// A checked-out session.
pub(crate) struct SessionGuard<'a> {
    pool: &'a SessionPool,
    shard: u32,
    session: Option<Session>,
}

impl SessionGuard<'_> {
    /// The next request id of this session.
    pub(crate) fn request_id(&mut self) -> RequestId {
        match self.session.as_mut() {
            Some(session) => {
                let id = RequestId {
                    client_id: session.client_id.clone(),
                    seq: session.next_seq,
                };
                session.next_seq += 1;
                id
            }
            None => self.pool.manual_request_id_in(self.shard),
        }
    }

    /// Drops the session for good (its group has forgotten it: see the
    /// module doc) instead of pooling it.
    pub(crate) fn retire(mut self) {
        if self.session.take().is_some() {
            self.pool.renewed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(self.shard)
                .or_default()
                .push(session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_reused_and_sequences_continue() {
        let pool = SessionPool::new("c".into());
        let first = {
            let mut guard = pool.checkout();
            (guard.request_id(), guard.request_id())
        };
        assert_eq!((first.0.seq, first.1.seq), (1, 2));
        let mut again = pool.checkout();
        let next = again.request_id();
        assert_eq!(
            (next.client_id.as_str(), next.seq),
            ("c-s0", 3),
            "the idle session is reused"
        );
        let mut concurrent = pool.checkout();
        assert_eq!(
            concurrent.request_id().client_id,
            "c-s1",
            "a concurrent request gets its own session"
        );
        assert_eq!(pool.opened(), 2);
        assert_eq!(pool.manual_request_id().client_id, "c");
    }

    #[test]
    fn a_retired_session_is_never_handed_out_again() {
        let pool = SessionPool::new("c".into());
        let mut first = pool.checkout_in(2);
        assert_eq!(first.request_id().client_id, "c-s0");
        first.retire();
        let mut next = pool.checkout_in(2);
        let id = next.request_id();
        assert_eq!((id.client_id.as_str(), id.seq), ("c-s1", 1));
        drop(next);
        let mut fresh = pool.open_in(2);
        assert_eq!(
            fresh.request_id().client_id,
            "c-s2",
            "open_in never reuses an idle session"
        );
        assert_eq!(pool.renewed(), 1);
    }

    #[test]
    fn the_own_session_is_renamed_once_per_forgotten_name() {
        let pool = SessionPool::new("c".into());
        let old = pool.manual_request_id_in(0);
        assert_eq!(pool.manual_request_id_in(3).seq, 1);
        assert_eq!(pool.manual_request_id_in(3).seq, 2);
        assert!(pool.renew_manual(&old.client_id));
        assert!(
            !pool.renew_manual(&old.client_id),
            "a second refusal of the old name renames nothing"
        );
        let renamed = pool.manual_request_id_in(3);
        assert_eq!((renamed.client_id.as_str(), renamed.seq), ("c-r1", 1));
        assert_eq!(pool.manual_request_id().seq, 1);
        assert!(pool.renew_manual("c-r1"));
        assert_eq!(pool.manual_request_id().client_id, "c-r2");
        assert_eq!(
            pool.client_id(),
            "c",
            "the client id (the pool holder) stays"
        );
        assert_eq!(pool.renewed(), 2);
    }

    /// The pool and [`send_in_session`] against the coordinator's own
    /// state machine (`leasehold-core`), whatever happens between them:
    /// requests lost before they arrive (a shard still forming, no
    /// leader), answers lost after they were executed (retried under the
    /// same id), ids drawn and never sent, and idle spells up to two
    /// minutes (past the session retention). Every id is executed at most
    /// once, and a request that reaches the coordinator is never refused
    /// for its session.
    mod against_the_state_machine {
        use std::cell::{Cell, RefCell};

        use leasehold_core::coordinator::{
            Command, CommandError, CoordinatorState, Outcome, Proposal,
        };
        use leasehold_core::ids::{ClientId, Key, RegionId};
        use leasehold_core::policy::Policy;
        use leasehold_core::principal::Principal;
        use proptest::prelude::*;

        use super::super::*;

        /// Tries of one id (the client's retry loop, in miniature).
        const TRIES: u32 = 3;

        #[derive(Debug, Clone)]
        enum Step {
            /// One logical request: its first `lost_before` tries never
            /// arrive; with `answer_lost`, the first answer to arrive is
            /// lost after the coordinator executed it.
            Request { lost_before: u32, answer_lost: bool },
            /// `ids` ids of `sessions` sessions held at once, never sent.
            Unsent { sessions: usize, ids: u64 },
            /// Nothing happens for this long.
            Idle { ms: u64 },
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                4 => (0..=4u32, any::<bool>()).prop_map(|(lost_before, answer_lost)| Step::Request { lost_before, answer_lost }),
                1 => (1..=3usize, 0..=80u64).prop_map(|(sessions, ids)| Step::Unsent { sessions, ids }),
                1 => (0..=120_000u64).prop_map(|ms| Step::Idle { ms }),
            ]
        }

        #[derive(Debug, PartialEq)]
        enum Failure {
            /// No try arrived.
            Unreached,
            /// The coordinator refused the request.
            Refused(CommandError),
        }

        struct Coordinator {
            state: CoordinatorState,
            now_ms: u64,
        }

        impl Coordinator {
            /// Applies a lease of 1 token under `id`; whether it granted
            /// anew (not a replay), and the outcome.
            fn lease(&mut self, id: &RequestId) -> (bool, Outcome) {
                self.now_ms += 1;
                let key = Key::new("k/1").unwrap();
                let granted = |state: &CoordinatorState, now| {
                    state.window_view(&key, now).map_or(0, |view| view.granted)
                };
                let before = granted(&self.state, self.now_ms);
                let command = Command::Lease {
                    key: key.clone(),
                    region: RegionId::new("r").unwrap(),
                    tokens: 1,
                    request_id: Some(leasehold_core::ids::RequestId {
                        client: ClientId::new(id.client_id.clone()).unwrap(),
                        seq: id.seq,
                    }),
                    caller: Principal::Anonymous,
                };
                let mut result = self.state.apply(&Proposal {
                    stamp_ms: self.now_ms,
                    commands: vec![command],
                });
                let outcome = result.outcomes.remove(0);
                (granted(&self.state, self.now_ms) > before, outcome)
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn ids_run_once_and_no_arriving_request_is_refused_for_its_session(
                steps in prop::collection::vec(step(), 1..120),
            ) {
                let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                let pool = SessionPool::new("c".into());
                let coordinator = RefCell::new(Coordinator {
                    state: CoordinatorState::default(),
                    now_ms: 1_000,
                });
                let set = coordinator.borrow_mut().state.apply(&Proposal {
                    stamp_ms: 1_000,
                    commands: vec![Command::SetPolicy(Policy::counter("k/", 1 << 40, 1_000))],
                });
                prop_assert!(!matches!(set.outcomes[0], Outcome::Rejected(_)), "{set:?}");
                let mut executed: std::collections::HashMap<(String, u64), u32> = Default::default();
                for step in steps {
                    match step {
                        Step::Idle { ms } => coordinator.borrow_mut().now_ms += ms,
                        Step::Unsent { sessions, ids } => {
                            let mut held: Vec<_> = (0..sessions).map(|_| pool.checkout_in(0)).collect();
                            for guard in &mut held {
                                for _ in 0..ids {
                                    guard.request_id();
                                }
                            }
                        }
                        Step::Request { lost_before, answer_lost } => {
                            let lost = Cell::new(lost_before);
                            let answer_lost = Cell::new(answer_lost);
                            let mut ran_anew: Vec<(String, u64)> = Vec::new();
                            let answer = runtime.block_on(send_in_session(
                                &pool,
                                0,
                                |failure: &Failure| {
                                    matches!(failure, Failure::Refused(CommandError::SessionExpired(_)))
                                },
                                |id| {
                                    let mut answer = Err(Failure::Unreached);
                                    for _ in 0..TRIES {
                                        if lost.get() > 0 {
                                            lost.set(lost.get() - 1);
                                            continue;
                                        }
                                        let (anew, outcome) = coordinator.borrow_mut().lease(&id);
                                        if anew {
                                            ran_anew.push((id.client_id.clone(), id.seq));
                                        }
                                        if answer_lost.replace(false) {
                                            continue;
                                        }
                                        answer = match outcome {
                                            Outcome::Lease(grant) => Ok(grant.granted),
                                            Outcome::Rejected(error) => Err(Failure::Refused(error)),
                                            other => panic!("a lease answered {other:?}"),
                                        };
                                        break;
                                    }
                                    std::future::ready(answer)
                                },
                            ));
                            for id in &ran_anew {
                                *executed.entry(id.clone()).or_default() += 1;
                            }
                            prop_assert!(
                                ran_anew.len() <= 1,
                                "one logical request ran under {ran_anew:?}"
                            );
                            if lost_before == 0 {
                                prop_assert_eq!(answer, Ok(1), "a request that arrived was refused");
                            }
                        }
                    }
                }
                prop_assert!(executed.values().all(|runs| *runs == 1), "{executed:?}");
            }
        }
    }
}
