//! What a simulation records: every admission of every client with its
//! key and window label, every acknowledged grant, the coordinator's final
//! view of each window, what hostile clients tried and were answered, and
//! the faults injected. The invariant checkers read only this, so they can
//! be unit-tested on synthetic histories.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

/// The key every honest client spends from (utilisation, liveness and the
/// coordinator reads are about it).
pub const SHARED_KEY: &str = "chaos/budget";

/// One allowed decision of one client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Which client (index; hostile clients count on from
    /// [`HOSTILE_CLIENT_BASE`]).
    pub client: usize,
    /// The key whose budget was spent.
    pub key: &'static str,
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

/// Client indices of hostile clients start here (honest ones below it).
pub const HOSTILE_CLIENT_BASE: usize = 1_000;

/// What a hostile client may be answered, by what it sent before under the
/// same request id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// The id was never answered before: any answer is allowed.
    Fresh,
    /// The id was answered before for exactly this request: the same answer
    /// (rendered here), or a refusal as expired.
    ReplayOf(String),
    /// The id was answered before for another request (other key, region or
    /// amount): only a refusal (`REQUEST_ID_REUSED`, or `SESSION_EXPIRED`).
    Refusal,
}

/// How the coordinator answered one hostile request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// Executed (or replayed): the effect, rendered (`granted@window`).
    Answered(String),
    /// Refused with this gRPC code and `leasehold-reason` (empty if none).
    Refused {
        /// The gRPC code, by name.
        code: String,
        /// The machine-readable reason.
        reason: String,
    },
    /// No answer (network, no leader): says nothing either way.
    NoAnswer,
}

/// One request of a hostile client and how it was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostileProbe {
    /// Which hostile client.
    pub client: usize,
    /// Which trick (`changed_payload`, `restart`, `flood`, …).
    pub trick: &'static str,
    /// The request id, rendered (`client/seq`).
    pub request_id: String,
    /// The request, rendered (key, region, tokens).
    pub request: String,
    /// What the answer may be.
    pub expected: Expected,
    /// What it was.
    pub answer: ProbeAnswer,
}

/// One Raft message forged by a hostile peer (a retired member's, a
/// stranger's or an impostor's certificate) and how a member answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerProbe {
    /// Whose certificate sent it, and as whom it claimed to speak.
    pub from: String,
    /// The member that received it (`host:port`).
    pub to: String,
    /// The message and transport (`Vote over gRPC`, `AppendEntries framed`).
    pub message: String,
    /// The term it carried.
    pub term: u64,
    /// How it was answered.
    pub answer: PeerAnswer,
}

/// How a member answered a forged Raft message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAnswer {
    /// Handed to Raft and answered: a hostile message got through.
    Accepted,
    /// Refused with this gRPC code and `leasehold-reason`.
    Refused {
        /// The gRPC code, by name.
        code: String,
        /// The machine-readable reason (empty if none).
        reason: String,
    },
    /// The connection was closed before any message (framed transport:
    /// no preface answered for a certificate it does not accept).
    ConnectionRefused,
    /// No answer (the member is down or stopped): says nothing.
    NoAnswer,
}

/// One over-return to an escrow node: a hostile client gives back more than
/// it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverReturn {
    /// Which hostile client.
    pub client: usize,
    /// The window the tokens were claimed to belong to.
    pub window_start_ms: u64,
    /// Tokens the client held unspent for that window (as that holder).
    pub held: u64,
    /// Tokens it offered back.
    pub offered: u64,
    /// Tokens the escrow node accepted.
    pub accepted: u64,
}

/// A recorded run of one scenario for one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    /// L of the key (constant over the run).
    pub limit: u64,
    /// Window length of the key.
    pub window_ms: u64,
    /// The key the load spends, whose utilisation is reported; empty:
    /// [`SHARED_KEY`].
    pub load_key: &'static str,
    /// Keys governed by a shadow-mode policy at any time of the run: their
    /// decisions are counted, never enforced, so the Δ oracle leaves them
    /// out (explicitly: see `invariants::delta`).
    pub shadow_keys: BTreeSet<&'static str>,
    /// Every admission.
    pub admissions: Vec<Admission>,
    /// Every acknowledged grant.
    pub acked_grants: Vec<AckedGrant>,
    /// Replies to requests sent more than once.
    pub replies: Vec<RecordedReply>,
    /// Hostile clients' requests and their answers.
    pub hostile_probes: Vec<HostileProbe>,
    /// Hostile clients' returns of more than they held.
    pub over_returns: Vec<OverReturn>,
    /// Raft messages forged by hostile peers and their answers.
    pub peer_probes: Vec<PeerProbe>,
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
    /// Tokens a (key, window) may exceed L by, because the key's outage
    /// policy is `fallback` (regions × fallback share, as documented); 0
    /// under `fail_closed`.
    pub outage_allowance: u64,
    /// Operator actions (membership changes) that never completed before
    /// the load ended.
    pub unfinished: Vec<String>,
    /// After a survivor was forced into a new cluster: windows starting
    /// before this were sealed by it. What the lost members acknowledged
    /// in them and the survivor lacks is forgotten by design (the
    /// documented cost of the unsafe recovery), so a read of one of them
    /// may count less than was acknowledged; Δ still covers them.
    pub forgotten_before_ms: Option<u64>,
}

impl History {
    /// Σ admitted tokens of the load's key per window start.
    pub fn admitted_per_window(&self) -> BTreeMap<u64, u64> {
        let key = if self.load_key.is_empty() {
            SHARED_KEY
        } else {
            self.load_key
        };
        let mut sums = BTreeMap::new();
        for a in self.admissions.iter().filter(|a| a.key == key) {
            *sums.entry(a.window_start_ms).or_insert(0) += a.cost;
        }
        sums
    }

    /// Σ admitted tokens per (key, window start) of every key not in
    /// [`shadow_keys`](Self::shadow_keys): the (key, window)s Δ = 0 is about.
    pub fn enforced_per_key_window(&self) -> BTreeMap<(&'static str, u64), u64> {
        let mut sums = self.admitted_per_key_window();
        sums.retain(|(key, _), _| !self.shadow_keys.contains(key));
        sums
    }

    /// Σ admitted tokens per (key, window start), every key.
    pub fn admitted_per_key_window(&self) -> BTreeMap<(&'static str, u64), u64> {
        let mut sums = BTreeMap::new();
        for a in &self.admissions {
            *sums.entry((a.key, a.window_start_ms)).or_insert(0) += a.cost;
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

    /// Tolerates `tokens` beyond L per (key, window): the fallback share of
    /// every region ([`History::outage_allowance`]).
    pub fn allow_outage_excess(&self, tokens: u64) {
        self.with(|h| h.outage_allowance = tokens);
    }

    /// Names the key the load spends (when it is not [`SHARED_KEY`]).
    pub fn load_key(&self, key: &'static str) {
        self.with(|h| h.load_key = key);
    }

    /// Records an admission.
    pub fn admit(&self, admission: Admission) {
        self.with(|h| h.admissions.push(admission));
    }

    /// Records that `key` is governed by a shadow-mode policy (its
    /// admissions are left out of the Δ check).
    pub fn shadow_key(&self, key: &'static str) {
        self.with(|h| {
            h.shadow_keys.insert(key);
        });
    }

    /// Records an acknowledged grant.
    pub fn acked(&self, grant: AckedGrant) {
        self.with(|h| h.acked_grants.push(grant));
    }

    /// Records a reply to a request id.
    pub fn reply(&self, reply: RecordedReply) {
        self.with(|h| h.replies.push(reply));
    }

    /// Records a hostile client's request and its answer.
    pub fn hostile_probe(&self, probe: HostileProbe) {
        self.with(|h| h.hostile_probes.push(probe));
    }

    /// Records a forged Raft message and its answer.
    pub fn peer_probe(&self, probe: PeerProbe) {
        self.with(|h| h.peer_probes.push(probe));
    }

    /// Records a hostile client's over-return to an escrow node.
    pub fn over_return(&self, over_return: OverReturn) {
        self.with(|h| h.over_returns.push(over_return));
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
    /// The window length of the run.
    pub fn window_ms(&self) -> u64 {
        self.with(|h| h.window_ms)
    }

    /// Records a survivor forced into a new cluster whose seal covers the
    /// windows starting before `sealed_before_ms`
    /// ([`History::forgotten_before_ms`]).
    pub fn forced_new_cluster(&self, sealed_before_ms: u64) {
        self.with(|h| h.forgotten_before_ms = Some(sealed_before_ms));
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
