//! The coordinator state as storage format 7 wrote it, before shards, and
//! its upgrade.
//!
//! Format 8 adds the group's part in a sharded cluster (a last field,
//! [`super::sharding::Sharding`]). A format-7 snapshot reads its state
//! through [`CoordinatorStateV7`] and converts (`From`) to the meta group
//! of a cluster never sharded: exactly what the same proposals give the
//! current code.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sessions::SessionsV8;
use super::state::CoordinatorState;
use super::windows::WindowTable;
use crate::policy::PolicyTable;
use crate::shadow::ShadowTally;

/// The coordinator state of format 7 (a snapshot's body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStateV7 {
    now_ms: u64,
    policies: PolicyTable,
    windows: WindowTable,
    sessions: SessionsV8,
    shadow_tallies: BTreeMap<String, ShadowTally>,
}

impl From<CoordinatorStateV7> for CoordinatorState {
    fn from(old: CoordinatorStateV7) -> Self {
        CoordinatorState {
            now_ms: old.now_ms,
            policies: old.policies,
            windows: old.windows,
            sessions: old.sessions.into(),
            shadow_tallies: old.shadow_tallies,
            sharding: Default::default(),
        }
    }
}
