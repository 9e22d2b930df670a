//! The coordinator state as storage formats 4 to 6 wrote it, before a
//! restore could seal windows, and its upgrade.
//!
//! Format 7 adds when the state was last restored (a last field of the
//! window table, [`super::windows::seals`]). A snapshot of formats 4 to 6
//! reads its state through [`CoordinatorStateV6`] and converts (`From`) to a
//! state never restored: exactly what the same proposals give the current
//! code.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sessions::SessionsV8;
use super::state::CoordinatorState;
use super::windows::WindowTableV6;
use crate::policy::PolicyTable;
use crate::shadow::ShadowTally;

/// The coordinator state of formats 4 to 6 (a snapshot's body).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorStateV6 {
    now_ms: u64,
    policies: PolicyTable,
    windows: WindowTableV6,
    sessions: SessionsV8,
    shadow_tallies: BTreeMap<String, ShadowTally>,
}

impl From<CoordinatorStateV6> for CoordinatorState {
    fn from(old: CoordinatorStateV6) -> Self {
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
