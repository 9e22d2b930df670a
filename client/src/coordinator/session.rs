//! Client sessions for exactly-once retries.
//!
//! The coordinator remembers the last responses of each client session
//! (a bounded window of sequence numbers) and refuses a request id older
//! than that window. So a client with many concurrent callers must not let
//! one slow request fall behind many newer ones of the same session. The
//! [`SessionPool`] hands each logical request a session of its own for its
//! whole life, retries included: one request in flight per session, sequence
//! numbers in order. Sessions are reused, so their number follows the peak
//! concurrency.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use leasehold_proto::v1::RequestId;

/// One session: its id and next sequence number.
#[derive(Debug)]
struct Session {
    client_id: String,
    next_seq: u64,
}

/// The sessions of one client.
#[derive(Debug)]
pub(crate) struct SessionPool {
    client_id: String,
    manual_seq: AtomicU64,
    idle: Mutex<Vec<Session>>,
    opened: AtomicU64,
}

impl SessionPool {
    /// A pool whose session ids start with `client_id`.
    pub(crate) fn new(client_id: String) -> Self {
        Self {
            client_id,
            manual_seq: AtomicU64::new(1),
            idle: Mutex::new(Vec::new()),
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

    /// A session for one logical request; it returns to the pool when dropped.
    pub(crate) fn checkout(&self) -> SessionGuard<'_> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let session = idle.unwrap_or_else(|| {
            let n = self.opened.fetch_add(1, Ordering::Relaxed);
            Session {
                client_id: format!("{}-s{n}", self.client_id),
                next_seq: 1,
            }
        });
        SessionGuard {
            pool: self,
            session: Some(session),
        }
    }
}

/// A checked-out session.
pub(crate) struct SessionGuard<'a> {
    pool: &'a SessionPool,
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
            None => self.pool.manual_request_id(),
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
