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
    manual_seq: AtomicU64,
    manual_seq_by_shard: Mutex<HashMap<u32, u64>>,
    idle: Mutex<HashMap<u32, Vec<Session>>>,
    opened: AtomicU64,
}

impl SessionPool {
    /// A pool whose session ids start with `client_id`.
    pub(crate) fn new(client_id: String) -> Self {
        Self {
            client_id,
            manual_seq: AtomicU64::new(1),
            manual_seq_by_shard: Mutex::new(HashMap::new()),
            idle: Mutex::new(HashMap::new()),
            opened: AtomicU64::new(0),
        }
    }

    /// The client id (also the session of [`manual_request_id`](Self::manual_request_id)).
    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    /// How many sessions were opened.
    pub(crate) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// The next id of the client's own session, for callers managing retries.
    pub(crate) fn manual_request_id(&self) -> RequestId {
        RequestId {
            client_id: self.client_id.clone(),
            seq: self.manual_seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The next id of the client's own session in `shard`'s group (shard
    /// 0: [`manual_request_id`](Self::manual_request_id)).
    pub(crate) fn manual_request_id_in(&self, shard: u32) -> RequestId {
        if shard == 0 {
            return self.manual_request_id();
        }
        let mut seqs = self
            .manual_seq_by_shard
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let seq = seqs.entry(shard).or_insert(1);
        let id = RequestId {
            client_id: self.client_id.clone(),
            seq: *seq,
        };
        *seq += 1;
        id
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
        let session = idle.unwrap_or_else(|| {
            let n = self.opened.fetch_add(1, Ordering::Relaxed);
            Session {
                client_id: format!("{}-s{n}", self.client_id),
                next_seq: 1,
            }
        });
        SessionGuard {
            pool: self,
            shard,
            session: Some(session),
        }
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
}
