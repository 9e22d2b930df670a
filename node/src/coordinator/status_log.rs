//! Leasehold's own lines about the cluster, from openraft's metrics watch:
//! one line per change of leader, of membership, of initialisation, and a
//! reminder while a fresh member waits for `leasehold cluster init`.
//!
//! [`changes`] is the pure part: what differs between two [`ClusterView`]s
//! (nothing for equal views, so a metrics update that only moves log
//! indexes logs nothing). [`log_status_changes`] is the task that feeds it.

use std::collections::BTreeSet;
use std::time::Duration;

use leasehold_raft_store::{NodeId, Raft, RaftMetrics};
use openraft::ServerState;
use tokio::sync::watch;

/// How often a member that is not initialised says it is waiting.
pub const WAITING_REMINDER: Duration = Duration::from_secs(60);

/// What the lines are about, read from the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Raft term.
    pub term: u64,
    /// The leader this member knows, if any.
    pub leader: Option<NodeId>,
    /// Whether this member is the leader.
    pub leads: bool,
    /// Voters of the membership in force.
    pub voters: BTreeSet<NodeId>,
    /// Learners of the membership in force.
    pub learners: BTreeSet<NodeId>,
}

impl ClusterView {
    /// The view in `metrics`.
    pub fn from_metrics(metrics: &RaftMetrics) -> Self {
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let learners = membership.learner_ids().collect();
        Self {
            term: metrics.current_term,
            leader: metrics.current_leader,
            leads: metrics.state == ServerState::Leader,
            voters,
            learners,
        }
    }

    /// Whether this member is part of a cluster yet.
    pub fn initialized(&self) -> bool {
        !self.voters.is_empty()
    }
}

/// One line's worth of change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusChange {
    /// No membership: the member waits for `cluster init` or to be added.
    WaitingForInit,
    /// A leader is known (this member or another) in `term`.
    LeaderElected {
        /// The leader.
        leader: NodeId,
        /// Its term.
        term: u64,
        /// Whether it is this member.
        this_member: bool,
    },
    /// The leader known before is no longer known (election under way).
    LeaderLost {
        /// The leader that was known.
        previous: NodeId,
        /// The term now.
        term: u64,
    },
    /// Voters or learners changed (including the first membership).
    MembershipChanged {
        /// Voters now.
        voters: BTreeSet<NodeId>,
        /// Learners now.
        learners: BTreeSet<NodeId>,
    },
}

/// What changed from `before` (`None`: nothing seen yet) to `now`.
pub fn changes(before: Option<&ClusterView>, now: &ClusterView) -> Vec<StatusChange> {
    let mut out = Vec::new();
    let was_initialized = before.is_some_and(ClusterView::initialized);
    if !now.initialized() {
        if before.is_none() || was_initialized {
            out.push(StatusChange::WaitingForInit);
        }
        return out;
    }
    if before.map(|b| (&b.voters, &b.learners)) != Some((&now.voters, &now.learners)) {
        out.push(StatusChange::MembershipChanged {
            voters: now.voters.clone(),
            learners: now.learners.clone(),
        });
    }
    let previous_leader = before.and_then(|b| b.leader);
    let previous_term = before.map(|b| b.term);
    match (previous_leader, now.leader) {
        (_, Some(leader)) if previous_leader != Some(leader) || previous_term != Some(now.term) => {
            out.push(StatusChange::LeaderElected {
                leader,
                term: now.term,
                this_member: now.leads,
            })
        }
        (Some(previous), None) => out.push(StatusChange::LeaderLost {
            previous,
            term: now.term,
        }),
        _ => {}
    }
    out
}

fn ids(set: &BTreeSet<NodeId>) -> String {
    let list: Vec<String> = set.iter().map(ToString::to_string).collect();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(",")
    }
}

fn log(member: NodeId, change: &StatusChange) {
    match change {
        StatusChange::WaitingForInit => tracing::info!(
            member,
            "waiting for `leasehold cluster init` (or to be added as a learner): this member is not part of a cluster yet"
        ),
        StatusChange::LeaderElected {
            leader,
            term,
            this_member: true,
        } => tracing::info!(member, leader, term, "this member leads (term {term})"),
        StatusChange::LeaderElected { leader, term, .. } => {
            tracing::info!(member, leader, term, "member {leader} leads (term {term})")
        }
        StatusChange::LeaderLost { previous, term } => tracing::warn!(
            member,
            previous,
            term,
            "no leader known (member {previous} led); election under way"
        ),
        StatusChange::MembershipChanged { voters, learners } => tracing::info!(
            member,
            voters = %ids(voters),
            learners = %ids(learners),
            "membership: voters {}, learners {}",
            ids(voters),
            ids(learners)
        ),
    }
}

/// Logs each change of `raft`'s metrics until `stop` turns true, and
/// repeats the waiting line every [`WAITING_REMINDER`] while the member is
/// not initialised.
pub async fn log_status_changes(raft: Raft, mut stop: watch::Receiver<bool>) {
    let mut metrics = raft.metrics();
    let mut before: Option<ClusterView> = None;
    loop {
        let (member, now) = {
            let metrics = metrics.borrow_and_update();
            (metrics.id, ClusterView::from_metrics(&metrics))
        };
        for change in changes(before.as_ref(), &now) {
            log(member, &change);
        }
        let waiting = !now.initialized();
        before = Some(now);
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = tokio::time::sleep(WAITING_REMINDER), if waiting => {
                log(member, &StatusChange::WaitingForInit);
            }
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn view(term: u64, leader: Option<NodeId>, leads: bool, voters: &[NodeId]) -> ClusterView {
        ClusterView {
            term,
            leader,
            leads,
            voters: voters.iter().copied().collect(),
            learners: BTreeSet::new(),
        }
    }

    #[test]
    fn a_fresh_member_says_it_waits_once() {
        let fresh = view(0, None, false, &[]);
        assert_eq!(changes(None, &fresh), vec![StatusChange::WaitingForInit]);
        assert!(changes(Some(&fresh), &fresh).is_empty());
    }

    #[test]
    fn init_then_election_then_loss_then_new_leader() {
        let fresh = view(0, None, false, &[]);
        let member = view(1, None, false, &[1, 2, 3]);
        let led = view(1, Some(2), false, &[1, 2, 3]);
        let lost = view(2, None, false, &[1, 2, 3]);
        let mine = view(2, Some(1), true, &[1, 2, 3]);
        assert_eq!(
            changes(Some(&fresh), &member),
            vec![StatusChange::MembershipChanged {
                voters: [1, 2, 3].into(),
                learners: BTreeSet::new()
            }]
        );
        assert_eq!(
            changes(Some(&member), &led),
            vec![StatusChange::LeaderElected {
                leader: 2,
                term: 1,
                this_member: false
            }]
        );
        assert_eq!(
            changes(Some(&led), &lost),
            vec![StatusChange::LeaderLost {
                previous: 2,
                term: 2
            }]
        );
        assert_eq!(
            changes(Some(&lost), &mine),
            vec![StatusChange::LeaderElected {
                leader: 1,
                term: 2,
                this_member: true
            }]
        );
    }

    fn any_view() -> impl Strategy<Value = ClusterView> {
        (
            0u64..4,
            prop::option::of(1u64..4),
            any::<bool>(),
            prop::collection::btree_set(1u64..5, 0..4),
        )
            .prop_map(|(term, leader, leads, voters)| ClusterView {
                term,
                leader,
                leads,
                voters,
                learners: BTreeSet::new(),
            })
    }

    proptest! {
        #[test]
        fn equal_views_log_nothing(v in any_view()) {
            prop_assert!(changes(Some(&v), &v).is_empty());
        }

        #[test]
        fn each_change_is_a_real_difference(a in any_view(), b in any_view()) {
            for change in changes(Some(&a), &b) {
                match change {
                    StatusChange::WaitingForInit => prop_assert!(a.initialized() && !b.initialized()),
                    StatusChange::MembershipChanged { voters, .. } => {
                        prop_assert_ne!(&a.voters, &voters);
                        prop_assert_eq!(&voters, &b.voters);
                    }
                    StatusChange::LeaderElected { leader, .. } => prop_assert_eq!(b.leader, Some(leader)),
                    StatusChange::LeaderLost { previous, .. } => {
                        prop_assert_eq!(a.leader, Some(previous));
                        prop_assert_eq!(b.leader, None);
                    }
                }
            }
        }
    }
}
