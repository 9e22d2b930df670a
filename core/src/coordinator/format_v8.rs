//! The coordinator state as storage format 8 wrote it, before sessions
//! moved with their slots, and its upgrade.
//!
//! Format 9 records the hash slot of each answer a session keeps, carries
//! the source's sessions in a move of slots (and how far the new owner
//! has merged them), and keeps the replicas each shard was founded with.
//! A format-8 snapshot reads through [`CoordinatorStateV8`] and converts
//! (`From`): its answers are of unknown slot (they move with every move),
//! its moves carry no sessions (an arrival under way goes on with its
//! keys), and each shard's founding replicas are its replicas then.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sessions::SessionsV8;
use super::sharding::ShardingV8;
use super::state::CoordinatorState;
use super::windows::WindowTable;
use crate::policy::PolicyTable;
use crate::shadow::ShadowTally;

/// The coordinator state of format 8 (a snapshot's body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStateV8 {
    now_ms: u64,
    policies: PolicyTable,
    windows: WindowTable,
    sessions: SessionsV8,
    shadow_tallies: BTreeMap<String, ShadowTally>,
    sharding: ShardingV8,
}

impl From<CoordinatorStateV8> for CoordinatorState {
    fn from(old: CoordinatorStateV8) -> Self {
        CoordinatorState {
            now_ms: old.now_ms,
            policies: old.policies,
            windows: old.windows,
            sessions: old.sessions.into(),
            shadow_tallies: old.shadow_tallies,
            sharding: old.sharding.into(),
        }
    }
}
