//! What the coordinator's commands did ([`Outcome`], one per command of a
//! proposal) and why one was refused ([`CommandError`]). These types cross
//! the Raft log's replies and the snapshot's session cache, so they are
//! serde types encoded with postcard; add variants only at the end.

use serde::{Deserialize, Serialize};

use crate::shard::ShardId;

/// The result of applying one [`Proposal`](super::Proposal): one outcome per command, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ProposalResult {
    /// One entry per command of the proposal.
    pub outcomes: Vec<Outcome>,
}

/// What one command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Result of [`Command::Lease`](super::Command::Lease).
    Lease(LeaseGrant),
    /// Result of [`Command::Reconcile`](super::Command::Reconcile).
    Reconcile(ReconcileOutcome),
    /// A pool grant as storage formats up to 4 recorded it, without the
    /// increment: only ever decoded from an older snapshot's session
    /// cache, and turned into [`Outcome::PoolGrant`] with an increment of 0
    /// as the snapshot is read ([`Outcome::upgraded`],
    /// [`super::CoordinatorState::zero_cached_increments`]: a retry is
    /// handed nothing it could spend a second time).
    PoolGrantTotal(PoolGrantTotalOutcome),
    /// A policy was inserted or replaced.
    PolicySet,
    /// A policy delete; `existed` is false when there was nothing to delete.
    PolicyDeleted {
        /// Whether a policy with that prefix existed.
        existed: bool,
    },
    /// The clock advanced; `collected_windows` dead windows were dropped.
    Ticked {
        /// How many window records were garbage-collected.
        collected_windows: u64,
    },
    /// The command was refused; the state did not change.
    Rejected(CommandError),
    /// Result of [`Command::PoolRelease`](super::Command::PoolRelease) (earlier encodings unchanged).
    PoolRelease(PoolReleaseOutcome),
    /// Result of [`Command::PoolGrant`](super::Command::PoolGrant) and [`Command::PoolJoinNext`](super::Command::PoolJoinNext)
    /// (storage format 5; earlier encodings unchanged).
    PoolGrant(PoolGrantOutcome),
    /// Result of a sharding command (last: storage format 8).
    Sharding(ShardingOutcome),
}

/// What a sharding command did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ShardingOutcome {
    /// [`Command::ChangePlacement`](super::Command::ChangePlacement): the placement's new version.
    PlacementChanged {
        /// The version.
        version: u64,
    },
    /// [`Command::BecomeShard`](super::Command::BecomeShard): the group is this shard.
    BecameShard {
        /// The shard.
        shard: ShardId,
    },
    /// [`Command::AcquireSlots`](super::Command::AcquireSlots): where the move stands.
    Acquired {
        /// Keys acquired so far.
        acquired_keys: u64,
        /// Whether the slots are this shard's.
        complete: bool,
    },
    /// [`Command::ReleaseSlots`](super::Command::ReleaseSlots): the slots left this shard with this many
    /// keys (a last variant: entries format 6).
    Released {
        /// Keys frozen for the new owner.
        keys: u64,
    },
    /// [`Command::AcquireSessions`](super::Command::AcquireSessions): where the move's sessions stand (a
    /// last variant: entries format 7).
    AcquiredSessions {
        /// Sessions acquired so far.
        acquired_sessions: u64,
        /// Whether every session of the move is here (its keys may follow).
        complete: bool,
    },
}

impl Outcome {
    /// The outcome as the current format answers it: a pool grant recorded
    /// by an older format ([`Outcome::PoolGrantTotal`]) becomes a
    /// [`Outcome::PoolGrant`] with `granted_increment` 0 — its caller
    /// holds nothing by a retry (it may have spent the first answer).
    pub fn upgraded(self) -> Outcome {
        match self {
            Outcome::PoolGrantTotal(old) => Outcome::PoolGrant(PoolGrantOutcome {
                granted_total: old.granted_total,
                granted_increment: 0,
                limit: old.limit,
                window_start_ms: old.window_start_ms,
                window_end_ms: old.window_end_ms,
                coordinator_now_ms: old.coordinator_now_ms,
            }),
            other => other,
        }
    }
}

/// A grant from the coordinator, with the window it is valid for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseGrant {
    /// Tokens granted, in `[0, tokens]`; partial grants are normal.
    pub granted: u64,
    /// The key's limit for this window.
    pub limit: u64,
    /// Start of the window the grant belongs to.
    pub window_start_ms: u64,
    /// End of that window; the grant dies there.
    pub window_end_ms: u64,
    /// The state-machine clock when the grant was applied. Receivers use
    /// `window_end_ms - coordinator_now_ms` as a relative lifetime (DESIGN §4).
    pub coordinator_now_ms: u64,
}

/// What a reconcile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileOutcome {
    /// Tokens credited back to the window (0 when forfeited or duplicate).
    pub credited: u64,
    /// Why that amount.
    pub disposition: ReconcileDisposition,
}

/// Why a reconcile credited what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReconcileDisposition {
    /// Credited (possibly capped) into the still-current window.
    Credited,
    /// The window is no longer current: the leftover is forfeited.
    WindowEnded,
    /// This (key, region, window) was already reconciled: no-op.
    Duplicate,
}

/// The region's total pool grant after a [`Command::PoolGrant`](super::Command::PoolGrant), and what
/// the call added to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolGrantOutcome {
    /// The region's new total grant for the window (monotonic within it):
    /// the sum of what every holder of the region holds there.
    pub granted_total: u64,
    /// What this call added to the region's total: the tokens its caller
    /// now holds beyond what it held. A holder (one escrow node process)
    /// may spend the sum of its calls' increments in the window, never the
    /// region's total, which counts what other holders — other escrow
    /// nodes of the region, or earlier incarnations of this one that lost
    /// their memory — hold and may have spent.
    pub granted_increment: u64,
    /// The key's limit for this window.
    pub limit: u64,
    /// Start of the window.
    pub window_start_ms: u64,
    /// End of the window.
    pub window_end_ms: u64,
    /// The state-machine clock when applied.
    pub coordinator_now_ms: u64,
}

/// A pool grant as storage formats up to 4 recorded it (the region's total
/// alone; see [`Outcome::PoolGrantTotal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolGrantTotalOutcome {
    /// The region's total grant for the window.
    pub granted_total: u64,
    /// The key's limit for this window.
    pub limit: u64,
    /// Start of the window.
    pub window_start_ms: u64,
    /// End of the window.
    pub window_end_ms: u64,
    /// The state-machine clock when applied.
    pub coordinator_now_ms: u64,
}

/// What a [`Command::PoolRelease`](super::Command::PoolRelease) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolReleaseOutcome {
    /// Why the region's total is what it is now.
    pub disposition: PoolReleaseDisposition,
    /// Tokens handed back to the pool (0 unless `Released`).
    pub released: u64,
    /// The region's total in the live window after the command (its
    /// current total when the release was refused as stale; 0 when the
    /// window ended).
    pub granted_total: u64,
    /// Start of the key's live window (0 when there is none).
    pub window_start_ms: u64,
    /// End of that window (0 when there is none).
    pub window_end_ms: u64,
}

/// Why a pool release did what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PoolReleaseDisposition {
    /// The region now holds `keep_total` with weight 0.
    Released,
    /// `window_start_ms` is not the live window: nothing to release (what
    /// the region held died with its window).
    WindowEnded,
    /// `from_total` is not the region's total: nothing changed; the answer
    /// carries the real total.
    StaleTotal,
}

/// Why a command was refused. Maps onto gRPC codes at the edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    /// Malformed input (`INVALID_ARGUMENT`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No policy matches the key (`NOT_FOUND`).
    #[error("no policy matches key {0:?}")]
    NoPolicy(String),
    /// The command does not fit the key's policy, e.g. a pool grant on a
    /// `counter` key (`FAILED_PRECONDITION`).
    #[error("failed precondition: {0}")]
    WrongKind(String),
    /// The request id already names a different request (another command,
    /// key, region or amount): nothing was executed (`ALREADY_EXISTS`).
    #[error("request id reused: {0}")]
    RequestIdReused(String),
    /// The request id belongs to a session the coordinator no longer holds
    /// (expired), or is older than what the session remembers: it may have
    /// been executed already and is never executed again
    /// (`FAILED_PRECONDITION`, reason `SESSION_EXPIRED`).
    #[error("session expired: {0}")]
    SessionExpired(String),
    /// The caller holds as many sessions as it may; nothing was executed
    /// (`RESOURCE_EXHAUSTED`).
    #[error("sessions exhausted: {0}")]
    SessionsExhausted(String),
    /// The group does not serve the key: another shard owns its slot, or
    /// the slot is moving (`FAILED_PRECONDITION`, reason `NOT_OWNER`).
    /// (Storage format 8.)
    #[error("not owner: {0}")]
    NotOwner(String),
    /// A sharding command was refused (`FAILED_PRECONDITION`, reason
    /// `PLACEMENT_REFUSED`). (Storage format 8.)
    #[error("placement refused: {0}")]
    Placement(String),
}
