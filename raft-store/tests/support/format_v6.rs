//! The history behind the format-6 fixture in `tests/fixtures/`: the
//! format-3 history, then a region joining the fair key's next window
//! ahead and the membership of members 1, 2, 3, 4 shrinking to 1, 2, 3 —
//! a state with a next window and a retired member, as the code of format
//! 6 (before a restore could seal windows) snapshotted it.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_core::coordinator::{Command, Proposal};
use leasehold_core::ids::{Key, RegionId};
use leasehold_core::principal::Principal;
use leasehold_raft_store::{Entry, EntryPayload, Membership};

use super::log_id;

/// A membership of exactly `voters`.
fn membership(voters: &[u64]) -> Membership {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
    let nodes: BTreeMap<u64, openraft::BasicNode> = voters
        .iter()
        .map(|id| (*id, openraft::BasicNode::new(format!("node-{id}:7000"))))
        .collect();
    Membership::new(vec![voters], nodes)
}

/// The log of the history: membership {1, 2, 3, 4}, the proposals, then
/// membership {1, 2, 3}.
pub fn entries() -> Vec<Entry> {
    let mut proposals = super::format_v3::proposals();
    proposals.push(Proposal {
        stamp_ms: 2_800,
        commands: vec![Command::PoolJoinNext {
            key: Key::new("fair/f").expect("key"),
            region: RegionId::new("eu").expect("region"),
            region_weight: 2,
            want_total: 30,
            window_start_ms: 3_000,
            retire: false,
            request_id: None,
            caller: Principal::Region(RegionId::new("eu").expect("region")),
        }],
    });
    let mut log = vec![Entry {
        log_id: log_id(2, 1),
        payload: EntryPayload::Membership(membership(&[1, 2, 3, 4])),
    }];
    for proposal in proposals {
        log.push(Entry {
            log_id: log_id(2, log.len() as u64 + 1),
            payload: EntryPayload::Normal(proposal.into()),
        });
    }
    log.push(Entry {
        log_id: log_id(2, log.len() as u64 + 1),
        payload: EntryPayload::Membership(membership(&[1, 2, 3])),
    });
    log
}
