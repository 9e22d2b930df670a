//! What a simulation records: every admission of every client with its
//! window label, every acknowledged grant, the coordinator's final view of
//! each window, and the faults injected. The invariant checkers read only
//! this, so they can be unit-tested on synthetic histories.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// One allowed decision of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Which client (index).
    pub client: usize,
    /// Tokens spent.
    pub cost: u64,
    /// The window the spent credits were granted in.
    pub window_start_ms: u64,
    /// Simulated real time of the admission, epoch ms.
    pub at_ms: u64,
}

/// One grant the coordinator acknowledged to a caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckedGrant {
    /// Tokens granted.
    pub granted: u64,
    /// The window of the grant.
    pub window_start_ms: u64,
    /// Simulated time the caller received the acknowledgement, epoch ms.
    pub at_ms: u64,
}

/// A linearizable read of one window's counters on the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowObservation {
    /// The window read.
    pub window_start_ms: u64,
    /// Simulated time the read was sent, epoch ms: every grant acknowledged
    /// before it must be counted.
    pub read_at_ms: u64,
    /// Σ granted in the window.
    pub granted: u64,
}

/// One reply the coordinator gave to a request id (a request may be sent
/// more than once: retries and deliberate duplicates reuse its id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedReply {
    /// The request id, rendered (`client/seq`).
    pub request_id: String,
    /// The effect the reply reports, rendered (tokens granted and window).
    pub reply: String,
}

/// A recorded run of one scenario for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// L of the key (constant over the run).
    pub limit: u64,
    /// Window length of the key.
    pub window_ms: u64,
    /// Every admission.
    pub admissions: Vec<Admission>,
    /// Every acknowledged grant.
    pub acked_grants: Vec<AckedGrant>,
    /// Replies to requests sent more than once.
    pub replies: Vec<RecordedReply>,
    /// Coordinator reads of windows while they were live.
    pub observations: Vec<WindowObservation>,
    /// Simulated time at which the last fault healed, epoch ms.
    pub healed_at_ms: Option<u64>,
    /// How far behind simulated real time the coordinator's clock may run
    /// (members whose clocks run slow), ms: a window's end on the
    /// coordinator's timeline falls up to this much later in real time.
    pub coordinator_lag_ms: u64,
    /// Simulated end of the load, epoch ms.
    pub load_end_ms: u64,
    /// Human-readable log of injected faults.
    pub faults: Vec<String>,
    /// Operator actions (membership changes) that never completed before
    /// the load ended.
    pub unfinished: Vec<String>,
}

impl History {
    /// Σ admitted tokens per window start.
    pub fn admitted_per_window(&self) -> BTreeMap<u64, u64> {
        let mut sums = BTreeMap::new();
        for a in &self.admissions {
            *sums.entry(a.window_start_ms).or_insert(0) += a.cost;
        }
        sums
    }
}

/// A shared, clonable recorder that simulated hosts write into.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    inner: Arc<Mutex<History>>,
}

impl Recorder {
    /// A recorder for a key of limit `limit` and window `window_ms`.
    pub fn new(limit: u64, window_ms: u64) -> Self {
        let history = History {
            limit,
            window_ms,
            ..History::default()
        };
        Recorder {
            inner: Arc::new(Mutex::new(history)),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut History) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Records an admission.
    pub fn admit(&self, admission: Admission) {
        self.with(|h| h.admissions.push(admission));
    }

    /// Records an acknowledged grant.
    pub fn acked(&self, grant: AckedGrant) {
        self.with(|h| h.acked_grants.push(grant));
    }

    /// Records a reply to a request id.
    pub fn reply(&self, reply: RecordedReply) {
        self.with(|h| h.replies.push(reply));
    }

    /// Records a read of a window on the coordinator.
    pub fn observe(&self, observation: WindowObservation) {
        self.with(|h| h.observations.push(observation));
    }

    /// Records a fault.
    pub fn fault(&self, what: String) {
        self.with(|h| h.faults.push(what));
    }

    /// Records when the last fault healed.
    pub fn healed(&self, at_ms: u64) {
        self.with(|h| h.healed_at_ms = Some(at_ms));
    }

    /// Records an operator action that never completed.
    pub fn unfinished(&self, what: String) {
        self.with(|h| h.unfinished.push(what));
    }

    /// Records the end of the load.
    pub fn load_ended(&self, at_ms: u64) {
        self.with(|h| h.load_end_ms = at_ms);
    }

    /// A copy of the history so far.
    pub fn snapshot(&self) -> History {
        self.with(|h| h.clone())
    }
}
