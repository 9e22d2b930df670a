//! Builders shared by the store's integration tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};

use leasehold_core::coordinator::{Command, Proposal};
use leasehold_raft_store::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    NodeId, TypeConfig, VoteRequest, VoteResponse,
};
use leasehold_raft_store::{Entry, EntryPayload, LogId, Membership};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::{BasicNode, CommittedLeaderId};

/// Log id `index` written by leader `1` in `term`.
pub fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// A membership entry of voters {1, 2, 3}.
pub fn membership_entry(term: u64, index: u64) -> Entry {
    membership_of(term, index, &[1, 2, 3])
}

/// A membership entry of exactly `voters`, no learners.
pub fn membership_of(term: u64, index: u64, voters: &[u64]) -> Entry {
    let voters: BTreeSet<u64> = voters.iter().copied().collect();
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
        payload: EntryPayload::Normal(
            Proposal {
                stamp_ms: index * 1_000,
                commands: vec![Command::Tick],
            }
            .into(),
        ),
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

/// The record named `name` in a fixtures file of `name hex` lines, as
/// bytes.
pub fn hex_fixture(fixtures: &str, name: &str) -> Vec<u8> {
    let hex = fixtures
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("fixture {name} missing"));
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A network with no peers: a single-member group never dials anyone.
pub struct NoPeers;

fn unreachable() -> Unreachable {
    Unreachable::new(&std::io::Error::other("single-member group has no peers"))
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(unreachable()))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest,
        _option: RPCOption,
    ) -> Result<VoteResponse, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(RPCError::Unreachable(unreachable()))
    }
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;

    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> NoPeers {
        NoPeers
    }
}
pub mod format_v2;
pub mod format_v3;
pub mod format_v6;
pub mod format_v8;
