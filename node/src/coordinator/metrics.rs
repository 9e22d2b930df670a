//! Counters of one coordinator member: what it granted, what it refused and
//! why, and how well group commit batches. Lock-free, cheap to bump on the
//! hot path, read as a sorted list of `(name, value)` pairs by `Status`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::metrics::{Histogram, SIZE_BOUNDS};

use leasehold_core::coordinator::{CommandError, Outcome};

use crate::auth::AuthRefusals;
use crate::net::ConnectionCounters;

/// Counters of one member since it started.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    leases: AtomicU64,
    lease_tokens_requested: AtomicU64,
    lease_tokens_granted: AtomicU64,
    lease_denials: AtomicU64,
    pool_grants: AtomicU64,
    pool_releases: AtomicU64,
    pool_tokens_released: AtomicU64,
    reconciles: AtomicU64,
    tokens_credited_back: AtomicU64,
    policy_changes: AtomicU64,
    rejected_invalid_argument: AtomicU64,
    rejected_no_policy: AtomicU64,
    rejected_wrong_kind: AtomicU64,
    rejected_not_leader: AtomicU64,
    rejected_unavailable: AtomicU64,
    rejected_overloaded: AtomicU64,
    rejected_session: AtomicU64,
    rejected_not_owner: AtomicU64,
    proposals: AtomicU64,
    proposals_failed: AtomicU64,
    proposed_commands: AtomicU64,
    largest_batch: AtomicU64,
    linearizable_reads: AtomicU64,
    pool_reserves_lapsed: AtomicU64,
    pool_joins_ahead: AtomicU64,
    shard_leader_reclaims: AtomicU64,
    /// Proposal commit latency (propose → applied on the leader), µs.
    pub commit_latency: Histogram,
    /// Commands per proposal (group-commit batch sizes).
    pub batch_sizes: BatchSizes,
    /// The listener's counters (connections, refused requests).
    connections: Arc<ConnectionCounters>,
    /// Calls refused by identity (shared with the listener's auth layer).
    pub auth: Arc<AuthRefusals>,
}

/// A histogram of group-commit batch sizes (powers of two to 1 024).
#[derive(Debug)]
pub struct BatchSizes(pub Histogram);

impl Default for BatchSizes {
    fn default() -> Self {
        Self(Histogram::new(SIZE_BOUNDS))
    }
}

/// Why a request was refused before or by the state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Malformed input.
    InvalidArgument,
    /// No policy for the key.
    NoPolicy,
    /// The command does not fit the key's policy.
    WrongKind,
    /// This member is not the leader.
    NotLeader,
    /// No leader, no quorum, or a deadline passed.
    Unavailable,
    /// The batch queue was full.
    Overloaded,
    /// The request id was reused for another request, or its session
    /// expired, or the caller may not open another session.
    Session,
    /// Another shard serves the key (or a placement change was refused).
    NotOwner,
}

impl NodeMetrics {
    /// Counts the outcome of one applied command.
    pub fn record_outcome(&self, outcome: &Outcome) {
        match outcome {
            Outcome::Lease(grant) => {
                self.leases.fetch_add(1, Ordering::Relaxed);
                self.lease_tokens_granted
                    .fetch_add(grant.granted, Ordering::Relaxed);
                if grant.granted == 0 {
                    self.lease_denials.fetch_add(1, Ordering::Relaxed);
                }
            }
            Outcome::PoolGrant(_) | Outcome::PoolGrantTotal(_) => {
                self.pool_grants.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::PoolRelease(release) => {
                self.pool_releases.fetch_add(1, Ordering::Relaxed);
                self.pool_tokens_released
                    .fetch_add(release.released, Ordering::Relaxed);
            }
            Outcome::Reconcile(reconcile) => {
                self.reconciles.fetch_add(1, Ordering::Relaxed);
                self.tokens_credited_back
                    .fetch_add(reconcile.credited, Ordering::Relaxed);
            }
            Outcome::PolicySet | Outcome::PolicyDeleted { .. } => {
                self.policy_changes.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Ticked { .. } => {}
            Outcome::Rejected(error) => self.record_rejection(match error {
                CommandError::InvalidArgument(_) => Rejection::InvalidArgument,
                CommandError::NoPolicy(_) => Rejection::NoPolicy,
                CommandError::WrongKind(_) => Rejection::WrongKind,
                CommandError::RequestIdReused(_)
                | CommandError::SessionExpired(_)
                | CommandError::SessionsExhausted(_) => Rejection::Session,
                CommandError::NotOwner(_) | CommandError::Placement(_) => Rejection::NotOwner,
            }),
            Outcome::Sharding(_) => {}
        }
    }

    /// Counts tokens asked for by a lease request.
    pub fn record_lease_request(&self, tokens: u64) {
        self.lease_tokens_requested
            .fetch_add(tokens, Ordering::Relaxed);
    }

    /// Counts one refusal.
    pub fn record_rejection(&self, why: Rejection) {
        let counter = match why {
            Rejection::InvalidArgument => &self.rejected_invalid_argument,
            Rejection::NoPolicy => &self.rejected_no_policy,
            Rejection::WrongKind => &self.rejected_wrong_kind,
            Rejection::NotLeader => &self.rejected_not_leader,
            Rejection::Unavailable => &self.rejected_unavailable,
            Rejection::Overloaded => &self.rejected_overloaded,
            Rejection::Session => &self.rejected_session,
            Rejection::NotOwner => &self.rejected_not_owner,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one proposal of `commands` commands, whether it committed, and
    /// (when it did) how long it took from proposing to applied on the
    /// leader: replicated to a quorum, fsync'd, committed and applied.
    pub fn record_proposal(&self, commands: usize, committed: bool, took: Duration) {
        let commands = commands as u64;
        self.batch_sizes.0.record(commands);
        if committed {
            self.commit_latency.record_duration(took);
        }
        self.proposals.fetch_add(1, Ordering::Relaxed);
        self.proposed_commands
            .fetch_add(commands, Ordering::Relaxed);
        self.largest_batch.fetch_max(commands, Ordering::Relaxed);
        if !committed {
            self.proposals_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one linearizable read.
    pub fn record_linearizable_read(&self) {
        self.linearizable_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `regions` retired by the leader, keeping all they hold, to
    /// lapse the reserves before a late pool ask (`leasehold_core::pool::lapse`).
    pub fn record_pool_reserves_lapsed(&self, regions: u64) {
        self.pool_reserves_lapsed
            .fetch_add(regions, Ordering::Relaxed);
    }

    /// Counts one join of a next window ahead answered with a grant
    /// (`PoolJoinNext`, carried by a pool call; a resend's replay too).
    pub fn record_pool_join_ahead(&self) {
        self.pool_joins_ahead.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one election this member stood for to take back a shard it
    /// is the preferred leader of (`ShardHost`, step 3).
    pub fn record_shard_leader_reclaim(&self) {
        self.shard_leader_reclaims.fetch_add(1, Ordering::Relaxed);
    }

    /// The listener counters, shared with the listener and the server layer.
    pub fn connections(&self) -> Arc<ConnectionCounters> {
        self.connections.clone()
    }

    /// Every counter as `(name, value)`, sorted by name.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut all = vec![
            ("leases", read(&self.leases)),
            ("lease_tokens_requested", read(&self.lease_tokens_requested)),
            ("lease_tokens_granted", read(&self.lease_tokens_granted)),
            ("lease_denials", read(&self.lease_denials)),
            ("pool_grants", read(&self.pool_grants)),
            ("pool_releases", read(&self.pool_releases)),
            ("pool_tokens_released", read(&self.pool_tokens_released)),
            ("reconciles", read(&self.reconciles)),
            ("tokens_credited_back", read(&self.tokens_credited_back)),
            ("policy_changes", read(&self.policy_changes)),
            (
                "rejected_invalid_argument",
                read(&self.rejected_invalid_argument),
            ),
            ("rejected_no_policy", read(&self.rejected_no_policy)),
            ("rejected_wrong_kind", read(&self.rejected_wrong_kind)),
            ("rejected_not_leader", read(&self.rejected_not_leader)),
            ("rejected_unavailable", read(&self.rejected_unavailable)),
            ("rejected_overloaded", read(&self.rejected_overloaded)),
            ("rejected_session", read(&self.rejected_session)),
            ("rejected_not_owner", read(&self.rejected_not_owner)),
            ("proposals", read(&self.proposals)),
            ("proposals_failed", read(&self.proposals_failed)),
            ("proposed_commands", read(&self.proposed_commands)),
            ("largest_batch", read(&self.largest_batch)),
            ("linearizable_reads", read(&self.linearizable_reads)),
            ("pool_reserves_lapsed", read(&self.pool_reserves_lapsed)),
            ("pool_joins_ahead", read(&self.pool_joins_ahead)),
            ("shard_leader_reclaims", read(&self.shard_leader_reclaims)),
            ("refused_unauthenticated", self.auth.unauthenticated()),
            ("refused_permission_denied", self.auth.permission_denied()),
        ];
        all.extend(self.connections.snapshot());
        all.sort_by_key(|(name, _)| *name);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::coordinator::LeaseGrant;

    fn value(metrics: &NodeMetrics, name: &str) -> u64 {
        metrics
            .snapshot()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .unwrap()
    }

    #[test]
    fn outcomes_and_batches_are_counted() {
        let metrics = NodeMetrics::default();
        let grant = |granted| {
            Outcome::Lease(LeaseGrant {
                granted,
                limit: 10,
                window_start_ms: 0,
                window_end_ms: 1,
                coordinator_now_ms: 0,
            })
        };
        metrics.record_outcome(&grant(4));
        metrics.record_outcome(&grant(0));
        metrics.record_outcome(&Outcome::Rejected(CommandError::NoPolicy("k".into())));
        metrics.record_proposal(3, true, Duration::from_millis(2));
        metrics.record_proposal(7, false, Duration::from_millis(9));
        assert_eq!(value(&metrics, "leases"), 2);
        assert_eq!(value(&metrics, "lease_tokens_granted"), 4);
        assert_eq!(value(&metrics, "lease_denials"), 1);
        assert_eq!(value(&metrics, "rejected_no_policy"), 1);
        assert_eq!(value(&metrics, "proposals"), 2);
        assert_eq!(value(&metrics, "proposals_failed"), 1);
        assert_eq!(value(&metrics, "proposed_commands"), 10);
        assert_eq!(value(&metrics, "largest_batch"), 7);
        let sizes = metrics.batch_sizes.0.snapshot();
        assert_eq!((sizes.count, sizes.sum), (2, 10));
        let commits = metrics.commit_latency.snapshot();
        assert_eq!(
            (commits.count, commits.sum),
            (1, 2_000),
            "only the committed proposal's latency, in µs"
        );
    }
}
