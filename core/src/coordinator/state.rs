//! The coordinator state (the Raft snapshot) and `apply`, which dispatches
//! each command to its own module.
//!
//! # Applying a proposal
//! 1. The clock becomes `max(previous now, min(proposal.stamp_ms,
//!    MAX_CLOCK_MS))`: it never goes back, whatever the leaders' wall clocks say.
//! 2. Garbage is collected at that clock (windows whose end is `<= now`,
//!    expired tombstones and sessions; see `gc`). The clock is fixed for
//!    the rest of the proposal, so nothing else dies during it, and the state
//!    after a proposal depends only on the state before and the proposal.
//!    Every `Tick` of the proposal reports the number of windows this pass
//!    collected.
//! 3. Each command, in order: if it carries a request id, the session of
//!    `(caller, client id)` is consulted first (a retry of the same request
//!    returns the first outcome and changes nothing; a reused, expired or
//!    unopenable id is refused); otherwise, or for a new id, it is executed.
//!
//! Everything is integer arithmetic over `BTreeMap`s, so two replicas applying
//! the same proposals reach equal states and produce equal outcomes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::*;
use super::outcome::*;
use super::sessions::{
    SessionLookup, Sessions, MAX_SESSIONS, MAX_SESSIONS_PER_PRINCIPAL, SESSION_MIN_RETAIN_MS,
};
use super::sharding::Sharding;
use super::windows::WindowTable;
use crate::ids::{Key, RequestId};
use crate::policy::{Policy, PolicyTable};
use crate::principal::Principal;
use crate::shadow::ShadowTally;

/// Largest clock value the state machine uses: larger stamps count as this, so
/// every window end (`start + window_ms`) stays representable and is > now.
pub const MAX_CLOCK_MS: u64 = 1 << 62;

/// What the live windows of one policy's keys hold (see
/// [`CoordinatorState::usage_by_policy`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyUsage {
    /// The policy.
    pub policy: Policy,
    /// Keys of the policy with a live window.
    pub live_windows: u64,
    /// Σ of those windows' limits.
    pub limit_in_live_windows: u64,
    /// Σ granted in those windows.
    pub granted: u64,
    /// Σ credited back in those windows.
    pub returned: u64,
}

/// A read-only view of one key's current window (for `GetWindow`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowView {
    /// The policy matching the key.
    pub policy: Policy,
    /// Effective limit of the window.
    pub limit: u64,
    /// Window start.
    pub window_start_ms: u64,
    /// Window end.
    pub window_end_ms: u64,
    /// Σ granted.
    pub granted: u64,
    /// Σ credited back.
    pub returned: u64,
    /// Per region: (region, granted, returned, pool weight), sorted by region.
    pub regions: Vec<RegionView>,
    /// What a shadow policy handed out beyond its limit in this window
    /// (empty unless the key's policy is or was in shadow mode).
    pub shadow: ShadowTally,
    /// The time the view was taken at: the later of the caller's clock and
    /// the state-machine clock (the window shown is the one current then).
    pub coordinator_now_ms: u64,
}

/// One region's use of a window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionView {
    /// Region id.
    pub region: String,
    /// Granted to it.
    pub granted: u64,
    /// Credited back by it.
    pub returned: u64,
    /// Its last pool weight (fair keys), else 0.
    pub pool_weight: u64,
}

/// The whole replicated coordinator state; a snapshot is this value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorState {
    pub(super) now_ms: u64,
    pub(super) policies: PolicyTable,
    pub(super) windows: WindowTable,
    pub(super) sessions: Sessions,
    /// Would-deny counts of shadow decisions per policy prefix, since the
    /// policy was set (dropped with it); only prefixes that counted any.
    pub(super) shadow_tallies: BTreeMap<String, ShadowTally>,
    /// Which keys this group serves, and (meta group) the placement and
    /// the moves out of it ([`super::sharding`]). (Last: storage format 8.)
    pub(super) sharding: Sharding,
}

impl CoordinatorState {
    /// Applies one proposal; deterministic (see the module doc).
    pub fn apply(&mut self, proposal: &Proposal) -> ProposalResult {
        self.now_ms = self.now_ms.max(proposal.stamp_ms.min(MAX_CLOCK_MS));
        let collected_windows = self.collect_garbage();
        let outcomes = proposal
            .commands
            .iter()
            .map(|command| self.apply_command(command, collected_windows))
            .collect();
        ProposalResult { outcomes }
    }

    fn apply_command(&mut self, command: &Command, collected_windows: u64) -> Outcome {
        match command {
            Command::Tick => Outcome::Ticked { collected_windows },
            Command::ChangePlacement {
                expected_version,
                change,
            } => self.change_placement(*expected_version, change),
            Command::BecomeShard { shard } => self.become_shard(*shard),
            Command::AcquireSlots(part) => self.acquire_slots(part),
            Command::AcquireSessions(part) => self.acquire_sessions(part),
            Command::ReleaseSlots { id, slots } => self.release_slots(*id, *slots),
            Command::SetPolicy(policy) => self.set_policy(policy),
            Command::DeletePolicy { prefix } => self.delete_policy(prefix),
            Command::Lease {
                key,
                region,
                tokens,
                request_id,
                caller,
            } => self.exactly_once(command, caller, request_id.as_ref(), |state| {
                state.if_owned(key, |state| state.lease(key, region, *tokens))
            }),
            Command::Reconcile {
                key,
                region,
                leftover,
                window_start_ms,
                request_id,
                caller,
            } => self.exactly_once(command, caller, request_id.as_ref(), |state| {
                state.if_owned(key, |state| {
                    state.reconcile(key, region, *leftover, *window_start_ms)
                })
            }),
            Command::PoolGrant {
                key,
                region,
                region_weight,
                want_total,
                request_id,
                caller,
            } => self.exactly_once(command, caller, request_id.as_ref(), |state| {
                state.if_owned(key, |state| {
                    state.pool_grant(key, region, *region_weight, *want_total)
                })
            }),
            Command::PoolRelease {
                key,
                region,
                from_total,
                keep_total,
                window_start_ms,
                request_id,
                caller,
            } => self.exactly_once(command, caller, request_id.as_ref(), |state| {
                state.if_owned(key, |state| {
                    state.pool_release(key, region, *from_total, *keep_total, *window_start_ms)
                })
            }),
            Command::PoolJoinNext {
                key,
                region,
                region_weight,
                want_total,
                window_start_ms,
                retire,
                request_id,
                caller,
            } => self.exactly_once(command, caller, request_id.as_ref(), |state| {
                state.if_owned(key, |state| {
                    state.pool_join_next(
                        key,
                        region,
                        *region_weight,
                        *want_total,
                        *window_start_ms,
                        *retire,
                    )
                })
            }),
        }
    }

    /// Runs `execute` once per `(caller, request id)`: a retry of the same
    /// request gets the stored outcome; a reused, expired or unopenable id
    /// is refused without executing anything (see `sessions`).
    fn exactly_once(
        &mut self,
        command: &Command,
        caller: &Principal,
        request_id: Option<&RequestId>,
        execute: impl FnOnce(&mut Self) -> Outcome,
    ) -> Outcome {
        let Some(id) = request_id else {
            return execute(self);
        };
        let fingerprint = command.fingerprint();
        let lookup = self.sessions.lookup(caller, id, fingerprint);
        // About a key this group does not serve, only an answer it keeps
        // for the id is this group's to give (it executed it before the key
        // moved). Anything else — a new id, an id its session cannot place —
        // is the owner's: the owner has the sessions this group lacks (a
        // shard still acquiring a move, a shard the key has not reached).
        let kept = matches!(lookup, SessionLookup::Replay(_) | SessionLookup::Reused);
        if let Some(key) = command.key().filter(|key| !kept && !self.owns(key)) {
            return self.not_owner(key);
        }
        match lookup {
            SessionLookup::Replay(outcome) => outcome,
            SessionLookup::Reused => Outcome::Rejected(CommandError::RequestIdReused(format!(
                "request id ({}, {}) already names a different request; use a new seq",
                id.client, id.seq
            ))),
            SessionLookup::Expired => Outcome::Rejected(CommandError::SessionExpired(format!(
                "request id ({}, {}) is older than its session remembers (or the session expired): \
                 it is not executed again; send new requests under a new seq or client id",
                id.client, id.seq
            ))),
            SessionLookup::Exhausted => Outcome::Rejected(CommandError::SessionsExhausted(format!(
                "{caller} holds as many client sessions as it may (at most {MAX_SESSIONS_PER_PRINCIPAL} \
                 per principal, {MAX_SESSIONS} in all); sessions expire {SESSION_MIN_RETAIN_MS} ms after their last use"
            ))),
            SessionLookup::New => {
                // (Another group's key was refused above, unrecorded.)
                let outcome = execute(self);
                let window_end = match &outcome {
                    Outcome::Lease(grant) => grant.window_end_ms,
                    Outcome::PoolGrant(grant) => grant.window_end_ms,
                    Outcome::PoolRelease(release) => release.window_end_ms,
                    _ => 0,
                };
                let retain_until =
                    window_end.max(self.now_ms.saturating_add(SESSION_MIN_RETAIN_MS));
                self.sessions
                    .record(caller, id, fingerprint, command.slot(), &outcome, retain_until);
                outcome
            }
        }
    }

    /// Every pool grant cached for a retry answers an increment of 0 from
    /// now on: what a snapshot of a storage format before 5 holds (its
    /// cache recorded no increments), read by the current code. A retry
    /// then hands its caller nothing it may have spent already.
    pub fn zero_cached_increments(&mut self) {
        self.sessions.zero_cached_increments();
    }

    /// The state-machine clock.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Prepares this state to serve a new cluster restored from it at
    /// `restored_at_ms` (a backup, or a survivor's state after a lost
    /// quorum): every window the source cluster may have granted in after
    /// this state was taken is sealed ([`super::restore_seals`]: limit 0,
    /// returns still credited). `restored_at_ms` must be no earlier than
    /// the source cluster's last clock; it is raised to this state's.
    /// Not a command: applied to the state a new cluster starts from,
    /// before its first entry.
    pub fn seal_after_restore(&mut self, restored_at_ms: u64) {
        let at = restored_at_ms.max(self.now_ms).min(MAX_CLOCK_MS);
        self.windows.seal_after_restore(at, &self.policies);
    }

    /// When this state was last restored onto a new cluster (0: never).
    pub fn restored_at_ms(&self) -> u64 {
        self.windows.restored_at_ms()
    }

    /// All policies, sorted by prefix.
    pub fn policies(&self) -> Vec<Policy> {
        self.policies.iter().cloned().collect()
    }

    /// The policy matching `key` (longest prefix).
    pub fn policy_for(&self, key: &Key) -> Option<&Policy> {
        self.policies.lookup(key.as_str())
    }

    /// The current window of `key` as of `max(now_ms, state clock)`
    /// (read-only; does not create it): the live record if there is one,
    /// otherwise the window a lease would create then, with nothing granted.
    /// `NoPolicy` when no policy governs the key.
    pub fn window_view(&self, key: &Key, now_ms: u64) -> Result<WindowView, CommandError> {
        let policy = self
            .policy_for(key)
            .ok_or_else(|| CommandError::NoPolicy(key.to_string()))?;
        let now = now_ms.min(MAX_CLOCK_MS).max(self.now_ms);
        let view = match self.windows.live(key, now) {
            Some(record) => WindowView {
                policy: policy.clone(),
                limit: record.limit,
                window_start_ms: record.bounds.start_ms,
                window_end_ms: record.bounds.end_ms,
                granted: record.granted,
                returned: record.returned,
                regions: record
                    .regions
                    .iter()
                    .map(|(region, used)| RegionView {
                        region: region.to_string(),
                        granted: used.granted,
                        returned: used.returned,
                        pool_weight: used.pool_weight,
                    })
                    .collect(),
                shadow: record.shadow,
                coordinator_now_ms: now,
            },
            None => {
                let bounds = self.windows.next_bounds(key, policy.window_ms, now);
                WindowView {
                    policy: policy.clone(),
                    limit: self.windows.opening_limit(&bounds, policy),
                    window_start_ms: bounds.start_ms,
                    window_end_ms: bounds.end_ms,
                    granted: 0,
                    returned: 0,
                    regions: Vec::new(),
                    shadow: ShadowTally::default(),
                    coordinator_now_ms: now,
                }
            }
        };
        Ok(view)
    }

    /// Number of window records held.
    pub fn live_windows(&self) -> u64 {
        self.windows.live_count()
    }

    /// Number of keys with any window state (a live window or the tombstone
    /// that keeps window starts increasing; see the window creation rule).
    pub fn tracked_keys(&self) -> u64 {
        self.windows.key_count()
    }

    /// The state as a snapshot of storage format 8 or earlier reads it
    /// back: every answer its sessions keep of unknown slot (those formats
    /// recorded none). What an upgraded snapshot is compared with.
    pub fn with_answers_of_unknown_slot(mut self) -> Self {
        self.sessions.forget_slots();
        self
    }

    /// Number of client sessions held (bounded by [`super::MAX_SESSIONS`]).
    pub fn client_sessions(&self) -> u64 {
        self.sessions.len()
    }

    /// Keys under `prefix` with a live window as of `max(now_ms, state
    /// clock)`, in key order, at most `max`; and how many there are,
    /// counted up to `count_up_to` (bounding the scan).
    pub fn live_keys_with_prefix(
        &self,
        prefix: &str,
        now_ms: u64,
        max: usize,
        count_up_to: usize,
    ) -> (Vec<Key>, usize) {
        let now = now_ms.min(MAX_CLOCK_MS).max(self.now_ms);
        self.windows
            .live_keys_with_prefix(prefix, now, max, count_up_to)
    }

    /// Per policy, what its keys' windows live at `max(now_ms, state clock)`
    /// hold, sorted by prefix (every policy appears, with zeros when none of
    /// its keys has a live window). O(live windows): for metrics scrapes,
    /// not for the request path.
    pub fn usage_by_policy(&self, now_ms: u64) -> Vec<PolicyUsage> {
        let now = now_ms.min(MAX_CLOCK_MS).max(self.now_ms);
        let mut usage: BTreeMap<String, PolicyUsage> = self
            .policies
            .iter()
            .map(|policy| {
                let row = PolicyUsage {
                    policy: policy.clone(),
                    live_windows: 0,
                    limit_in_live_windows: 0,
                    granted: 0,
                    returned: 0,
                };
                (policy.prefix.clone(), row)
            })
            .collect();
        for (key, record) in self.windows.live_records(now) {
            let Some(policy) = self.policies.lookup(key.as_str()) else {
                continue;
            };
            if let Some(row) = usage.get_mut(&policy.prefix) {
                row.live_windows += 1;
                row.limit_in_live_windows = row.limit_in_live_windows.saturating_add(record.limit);
                row.granted = row.granted.saturating_add(record.granted);
                row.returned = row.returned.saturating_add(record.returned);
            }
        }
        usage.into_values().collect()
    }

    /// Would-deny counts of shadow decisions per policy prefix (only
    /// prefixes that counted any), sorted by prefix. Replicated: every
    /// member reports the same counts as of its applied index. A prefix's
    /// count starts when its policy is set and is dropped when the policy is
    /// deleted (a metrics exporter sees that as a counter reset).
    pub fn shadow_tallies(&self) -> impl Iterator<Item = (&str, ShadowTally)> {
        self.shadow_tallies
            .iter()
            .map(|(prefix, tally)| (prefix.as_str(), *tally))
    }

    /// The sum of [`shadow_tallies`](Self::shadow_tallies) over every policy.
    pub fn shadow_total(&self) -> ShadowTally {
        let mut total = ShadowTally::default();
        for tally in self.shadow_tallies.values() {
            total.add(*tally);
        }
        total
    }

    /// Counts a shadow decision of the policy with `prefix` in its tally
    /// (nothing when `would_deny` is 0, so no empty entry is made).
    pub(super) fn record_shadow(&mut self, prefix: &str, would_deny: u64) {
        if would_deny > 0 {
            self.shadow_tallies
                .entry(prefix.to_string())
                .or_default()
                .record(would_deny);
        }
    }
}
