//! Taking a shard's leadership back (ADR 0025), where this member is the
//! shard's forming replica (its *preferred* leader) and another member
//! leads it: once that leader has led it for [`RECLAIM_AFTER`] and leads
//! more of the groups this member hosts (shard 0 counted) than this member
//! does, this member stands for election (`trigger().elect()`). A member
//! that failed and came back so gets its share of the leaderships again
//! (openraft 0.9 has no leadership transfer); each reclaim costs the shard
//! one election. Tries back off from [`RECLAIM_BACKOFF_FIRST`] to
//! [`RECLAIM_BACKOFF_MAX`] while they do not take.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use leasehold_core::shard::{forming_replica, ShardId};
use leasehold_raft_store::NodeId;

use super::hosted::Hosted;
use crate::coordinator::context::NodeContext;

/// How long another member must have led a shard before its preferred
/// replica takes the leadership back (a member that just came back has
/// caught up by then; a leader just elected is not unseated at once).
pub const RECLAIM_AFTER: Duration = Duration::from_secs(5);

/// The wait after a reclaim of one shard before the next; doubled after
/// each that did not take, up to [`RECLAIM_BACKOFF_MAX`].
pub const RECLAIM_BACKOFF_FIRST: Duration = Duration::from_secs(15);

/// The longest wait between two reclaims of one shard.
pub const RECLAIM_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The leadership of one shard as its preferred replica sees it.
#[derive(Debug, Clone, Copy)]
struct Reclaim {
    /// The other member leading the shard, and since when (as seen).
    leader: NodeId,
    since: tokio::time::Instant,
    /// No reclaim before this.
    next_try: tokio::time::Instant,
    /// The wait after the next reclaim.
    backoff: Duration,
}

/// Whether `preferred` should stand for election against `leader`, which
/// has led the shard for `led_for`, given how many of the groups
/// `preferred` hosts each member leads: only when `leader` leads more
/// than `preferred`, so a reclaim never leaves the two further apart. It
/// cannot go back and forth either: only a shard's preferred replica
/// reclaims it, and it keeps what it leads.
pub fn should_reclaim(
    leaderships: &BTreeMap<NodeId, usize>,
    preferred: NodeId,
    leader: NodeId,
    led_for: Duration,
) -> bool {
    let count = |member| leaderships.get(&member).copied().unwrap_or(0);
    leader != preferred && led_for >= RECLAIM_AFTER && count(leader) > count(preferred)
}

/// Per shard this member is the preferred leader of: who else leads it,
/// since when, and when a reclaim may be tried next.
#[derive(Debug, Default)]
pub(super) struct Reclaims {
    by_shard: BTreeMap<ShardId, Reclaim>,
}

/// Who leads the groups this member hosts (shard 0's, `meta`, and every
/// hosted shard's), counted per member.
fn leaderships(meta: &NodeContext, hosted: &BTreeMap<ShardId, Hosted>) -> BTreeMap<NodeId, usize> {
    let mut counts = BTreeMap::new();
    let leaders = std::iter::once(meta.raft.metrics().borrow().current_leader).chain(
        hosted
            .values()
            .map(|hosted| hosted.context.raft.metrics().borrow().current_leader),
    );
    for leader in leaders.flatten() {
        *counts.entry(leader).or_insert(0) += 1;
    }
    counts
}

impl Reclaims {
    /// Stands for election in each shard of `wanted` (the shards the
    /// placement names this member a replica of, with their replicas) it
    /// hosts (`hosted`) and is the preferred leader of, where another
    /// member has led too long while leading too many (see the module
    /// doc); `meta` is shard 0's group.
    pub(super) async fn reclaim_preferred(
        &mut self,
        meta: &NodeContext,
        hosted: &BTreeMap<ShardId, Hosted>,
        wanted: &BTreeMap<ShardId, BTreeSet<NodeId>>,
        now: tokio::time::Instant,
    ) {
        let me = meta.id;
        let leaderships = leaderships(meta, hosted);
        self.by_shard.retain(|shard, _| {
            wanted
                .get(shard)
                .is_some_and(|replicas| forming_replica(*shard, replicas) == Some(me))
        });
        for (shard, replicas) in wanted {
            if forming_replica(*shard, replicas) != Some(me) {
                continue;
            }
            let Some(hosted) = hosted.get(shard) else {
                continue;
            };
            let (leader, voter) = {
                let metrics = hosted.context.raft.metrics();
                let metrics = metrics.borrow();
                let voter = metrics
                    .membership_config
                    .membership()
                    .voter_ids()
                    .any(|id| id == me);
                (metrics.current_leader, voter)
            };
            let leader = match leader {
                Some(leader) if leader != me && voter => leader,
                Some(leader) if leader == me => {
                    // Led here: the next reclaim, if ever, starts afresh.
                    self.by_shard.remove(shard);
                    continue;
                }
                _ => continue,
            };
            let reclaim = self.by_shard.entry(*shard).or_insert(Reclaim {
                leader,
                since: now,
                next_try: now,
                backoff: RECLAIM_BACKOFF_FIRST,
            });
            if reclaim.leader != leader {
                reclaim.leader = leader;
                reclaim.since = now;
            }
            let led_for = now.duration_since(reclaim.since);
            if now < reclaim.next_try || !should_reclaim(&leaderships, me, leader, led_for) {
                continue;
            }
            tracing::info!(
                shard = shard.0,
                leader,
                "shard {}: its preferred replica stands for election (member {leader} leads \
                 {} of the groups here, this member {})",
                shard.0,
                leaderships.get(&leader).copied().unwrap_or(0),
                leaderships.get(&me).copied().unwrap_or(0)
            );
            reclaim.next_try = now + reclaim.backoff;
            reclaim.backoff = (reclaim.backoff * 2).min(RECLAIM_BACKOFF_MAX);
            meta.metrics.record_shard_leader_reclaim();
            if let Err(error) = hosted.context.raft.trigger().elect().await {
                tracing::warn!(shard = shard.0, %error, "shard {} could not stand for election", shard.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(NodeId, usize)]) -> BTreeMap<NodeId, usize> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_preferred_replica_reclaims_only_from_a_busier_leader_that_settled() {
        let settled = RECLAIM_AFTER;
        // Member 3 came back leading nothing; member 1 leads two groups.
        let back = counts(&[(1, 2), (2, 1)]);
        assert!(should_reclaim(&back, 3, 1, settled));
        assert!(
            !should_reclaim(&back, 3, 1, settled - Duration::from_millis(1)),
            "a leader just elected is left alone"
        );
        assert!(!should_reclaim(&back, 1, 1, settled), "it leads already");
        // Even: a reclaim would only move the imbalance.
        let even = counts(&[(1, 1), (3, 1)]);
        assert!(!should_reclaim(&even, 3, 1, settled));
        // One more than the preferred one: taking it keeps them within one.
        assert!(should_reclaim(&counts(&[(1, 1)]), 3, 1, settled));
        assert!(should_reclaim(&counts(&[(1, 3), (3, 2)]), 3, 1, settled));
        assert!(!should_reclaim(&counts(&[(1, 2), (3, 2)]), 3, 1, settled));
    }
}
