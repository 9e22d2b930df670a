//! The coordinator state as storage format 3 wrote it, before a `fair` key
//! could hold its next pool window beside its live one, and its upgrade.
//!
//! Format 4 adds the next windows (a last field of the window table) and
//! the `PoolJoinNext` command (a last variant: format-3 log entries decode
//! as they are). A format-3 snapshot's state reads through
//! [`CoordinatorStateV3`] and converts (`From`) to a state with no next
//! windows: exactly the state the same proposals give the current code
//! (tested against fixtures written by the format-3 code in
//! `raft-store/tests`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sessions::SessionsV8;
use super::state::CoordinatorState;
use super::windows::WindowTableV3;
use crate::policy::PolicyTable;
use crate::shadow::ShadowTally;

/// The coordinator state of format 3 (a snapshot's body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStateV3 {
    now_ms: u64,
    policies: PolicyTable,
    windows: WindowTableV3,
    sessions: SessionsV8,
    shadow_tallies: BTreeMap<String, ShadowTally>,
}

impl From<CoordinatorStateV3> for CoordinatorState {
    fn from(old: CoordinatorStateV3) -> Self {
        CoordinatorState {
            now_ms: old.now_ms,
            policies: old.policies,
            windows: old.windows.into(),
            sessions: old.sessions.into(),
            shadow_tallies: old.shadow_tallies,
            sharding: Default::default(),
        }
    }
}
