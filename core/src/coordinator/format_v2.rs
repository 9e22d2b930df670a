//! The replicated types as storage format 2 wrote them, before shadow mode
//! (policies without the `shadow` flag, windows without would-deny
//! tallies), and their upgrade to the current types.
//!
//! The Raft store reads log entries and snapshots of format 2 through these
//! and converts them (`From`): a policy becomes `shadow = false`, a window
//! gets an empty tally, the state gets no shadow tallies. The upgrade is
//! exact: applying the same proposals with the current code from an empty
//! state gives the state an upgraded format-2 snapshot decodes to (tested
//! against fixtures written by the format-2 code in `raft-store/tests`).
//! postcard is not self-describing, so each type mirrors its old layout
//! field by field and variant by variant.

use serde::{Deserialize, Serialize};

use super::command::{Command, Proposal};
use super::sessions::SessionsV8;
use super::state::CoordinatorState;
use super::windows::WindowTableV2;
use crate::ids::{Key, RegionId, RequestId};
use crate::policy::{OutagePolicy, Policy, PolicyKind, PolicyTable};
use crate::principal::Principal;

/// A policy of format 2: no shadow flag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyV2 {
    /// Key prefix.
    pub prefix: String,
    /// L.
    pub limit: u64,
    /// Window length.
    pub window_ms: u64,
    /// Counter or fair.
    pub kind: PolicyKind,
    /// Outage behaviour.
    pub outage: OutagePolicy,
}

impl From<PolicyV2> for Policy {
    fn from(old: PolicyV2) -> Self {
        Policy {
            prefix: old.prefix,
            limit: old.limit,
            window_ms: old.window_ms,
            kind: old.kind,
            outage: old.outage,
            shadow: false,
        }
    }
}

/// A command of format 2 (variants in the same order as [`Command`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum CommandV2 {
    Lease {
        key: Key,
        region: RegionId,
        tokens: u64,
        request_id: Option<RequestId>,
        caller: Principal,
    },
    Reconcile {
        key: Key,
        region: RegionId,
        leftover: u64,
        window_start_ms: u64,
        request_id: Option<RequestId>,
        caller: Principal,
    },
    PoolGrant {
        key: Key,
        region: RegionId,
        region_weight: u64,
        want_total: u64,
        request_id: Option<RequestId>,
        caller: Principal,
    },
    SetPolicy(PolicyV2),
    DeletePolicy {
        prefix: String,
    },
    Tick,
}

impl From<CommandV2> for Command {
    fn from(old: CommandV2) -> Self {
        match old {
            CommandV2::Lease {
                key,
                region,
                tokens,
                request_id,
                caller,
            } => Command::Lease {
                key,
                region,
                tokens,
                request_id,
                caller,
            },
            CommandV2::Reconcile {
                key,
                region,
                leftover,
                window_start_ms,
                request_id,
                caller,
            } => Command::Reconcile {
                key,
                region,
                leftover,
                window_start_ms,
                request_id,
                caller,
            },
            CommandV2::PoolGrant {
                key,
                region,
                region_weight,
                want_total,
                request_id,
                caller,
            } => Command::PoolGrant {
                key,
                region,
                region_weight,
                want_total,
                request_id,
                caller,
            },
            CommandV2::SetPolicy(policy) => Command::SetPolicy(policy.into()),
            CommandV2::DeletePolicy { prefix } => Command::DeletePolicy { prefix },
            CommandV2::Tick => Command::Tick,
        }
    }
}

/// A proposal of format 2.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProposalV2 {
    /// Leader stamp.
    pub stamp_ms: u64,
    /// The commands.
    pub commands: Vec<CommandV2>,
}

impl From<ProposalV2> for Proposal {
    fn from(old: ProposalV2) -> Self {
        Proposal {
            stamp_ms: old.stamp_ms,
            commands: old.commands.into_iter().map(Command::from).collect(),
        }
    }
}

/// The coordinator state of format 2 (a snapshot's body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStateV2 {
    now_ms: u64,
    policies: PolicyTableV2,
    windows: WindowTableV2,
    sessions: SessionsV8,
}

/// The policy table of format 2 (same layout as [`PolicyTable`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PolicyTableV2 {
    by_prefix: std::collections::BTreeMap<String, PolicyV2>,
}

impl From<CoordinatorStateV2> for CoordinatorState {
    fn from(old: CoordinatorStateV2) -> Self {
        let policies =
            PolicyTable::from_stored(old.policies.by_prefix.into_values().map(Policy::from));
        CoordinatorState {
            now_ms: old.now_ms,
            policies,
            windows: old.windows.into(),
            sessions: old.sessions.into(),
            shadow_tallies: Default::default(),
            sharding: Default::default(),
        }
    }
}
