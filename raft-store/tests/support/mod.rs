//! Builders shared by the store's integration tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use leasehold_core::coordinator::{Command, Proposal};
use leasehold_raft_store::{Entry, EntryPayload, LogId, Membership};
use openraft::CommittedLeaderId;

/// Log id `index` written by leader `1` in `term`.
pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// A membership entry of voters {1, 2, 3}.
pub fn membership_entry(term: u64, index: u64) -> Entry {
    let voters: BTreeSet<u64> = [1, 2, 3].into_iter().collect();
    let nodes: BTreeMap<u64, openraft::BasicNode> = voters
        .iter()
        .map(|id| (*id, openraft::BasicNode::new(format!("node-{id}:7000"))))
        .collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![voters], nodes)),
    }
}

/// A proposal entry stamped `index * 1000` ms carrying one `Tick`.
pub fn proposal_entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Proposal {
            stamp_ms: index * 1_000,
            commands: vec![Command::Tick],
        }),
    }
}

/// Entries `first..=last` of term 1: a membership entry at index 1, proposals elsewhere.
pub fn entries(first: u64, last: u64) -> Vec<Entry> {
    (first..=last)
        .map(|index| {
            if index == 1 {
                membership_entry(1, 1)
            } else {
                proposal_entry(1, index)
            }
        })
        .collect()
}
