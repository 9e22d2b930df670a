//! The model the coordinator property tests check outcomes against, built
//! only from the commands and their outcomes.

use std::collections::BTreeMap;

use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, Outcome, PoolGrantOutcome, PoolReleaseDisposition,
    ReconcileDisposition, MAX_RESPONSES_PER_SESSION, SESSION_MIN_RETAIN_MS,
};
use leasehold_core::ids::RequestId;
use leasehold_core::policy::{Policy, PolicyKind, PolicyTable};
use proptest::prelude::*;

use super::history_gen::{Gen, NextPick, WindowPick, CLIENTS, KEYS, PREFIXES, REGIONS, WINDOWS};
use super::{key, policy, region, request};
use leasehold_core::coordinator::NEXT_WINDOW_JOIN_SHARE;

/// The model's accounting of one window `(key, start)`.
#[derive(Debug, Default)]
struct WindowTrack {
    end: u64,
    min_limit: u64,
    /// max(min_limit, outstanding when the limit was last lowered)
    allowance: u64,
    granted: u64,
    returned: u64,
    /// region → (granted, returned)
    regions: BTreeMap<String, (u64, u64)>,
}

/// The model of one client session.
#[derive(Debug, Default)]
struct ModelSession {
    retain_until: u64,
    floor: u64,
    responses: BTreeMap<u64, Outcome>,
}

#[derive(Default)]
pub struct Model {
    policies: PolicyTable,
    windows: BTreeMap<(String, u64), WindowTrack>,
    /// key → (start, end) of its latest window
    latest: BTreeMap<String, (u64, u64)>,
    /// key → start of the window before the latest
    previous: BTreeMap<String, u64>,
    sessions: BTreeMap<String, ModelSession>,
    next_seq: BTreeMap<String, u64>,
    issued: Vec<Command>,
}

pub fn request_id_of(command: &Command) -> Option<&RequestId> {
    match command {
        Command::Lease { request_id, .. }
        | Command::Reconcile { request_id, .. }
        | Command::PoolGrant { request_id, .. }
        | Command::PoolRelease { request_id, .. }
        | Command::PoolJoinNext { request_id, .. } => request_id.as_ref(),
        _ => None,
    }
}

impl Model {
    fn fresh_id(&mut self, client: Option<usize>) -> Option<RequestId> {
        let name = CLIENTS[client?];
        let seq = self.next_seq.entry(name.to_string()).or_default();
        *seq += 1;
        Some(request(name, *seq))
    }

    /// Turns a generated command into a concrete one, given the run so far.
    pub fn resolve(&mut self, gen: &Gen, now: u64) -> Command {
        let command = match gen {
            Gen::Lease {
                key: k,
                region: r,
                tokens,
                client,
            } => Command::Lease {
                key: key(KEYS[*k]),
                region: region(REGIONS[*r]),
                tokens: *tokens,
                request_id: self.fresh_id(*client),
                caller: leasehold_core::principal::Principal::Anonymous,
            },
            Gen::Reconcile {
                key: k,
                region: r,
                leftover,
                window,
                client,
            } => {
                let name = KEYS[*k];
                let window_start_ms = self.pick_window(name, window, now);
                Command::Reconcile {
                    key: key(name),
                    region: region(REGIONS[*r]),
                    leftover: *leftover,
                    window_start_ms,
                    request_id: self.fresh_id(*client),
                    caller: leasehold_core::principal::Principal::Anonymous,
                }
            }
            Gen::Pool {
                key: k,
                region: r,
                weight,
                want,
                client,
            } => Command::PoolGrant {
                key: key(KEYS[*k]),
                region: region(REGIONS[*r]),
                region_weight: *weight,
                want_total: *want,
                request_id: self.fresh_id(*client),
                caller: leasehold_core::principal::Principal::Anonymous,
            },
            Gen::Release {
                key: k,
                region: r,
                stale,
                keep_pct,
                window,
                client,
            } => {
                let name = KEYS[*k];
                let window_start_ms = self.pick_window(name, window, now);
                let held = self
                    .windows
                    .get(&(name.to_string(), window_start_ms))
                    .and_then(|track| track.regions.get(REGIONS[*r]))
                    .map_or(0, |used| used.0);
                let from_total = held + stale;
                Command::PoolRelease {
                    key: key(name),
                    region: region(REGIONS[*r]),
                    from_total,
                    // keep_pct 101 asks to keep more than the total: refused.
                    keep_total: from_total * keep_pct / 100 + u64::from(*keep_pct > 100),
                    window_start_ms,
                    request_id: self.fresh_id(*client),
                    caller: leasehold_core::principal::Principal::Anonymous,
                }
            }
            Gen::JoinNext {
                key: k,
                region: r,
                weight,
                want,
                window,
                retire,
                client,
            } => {
                let name = KEYS[*k];
                let live = self.live(name, now);
                let window_start_ms = match window {
                    NextPick::Next => live.map_or(now - now % 500 + 500, |w| w.1),
                    NextPick::Latest => live.map_or(now - now % 500, |w| w.0),
                    NextPick::AlignedBack(n) => (now - now % 500).saturating_sub(n * 500),
                };
                Command::PoolJoinNext {
                    key: key(name),
                    region: region(REGIONS[*r]),
                    region_weight: *weight,
                    want_total: *want,
                    window_start_ms,
                    retire: *retire,
                    request_id: self.fresh_id(*client),
                    caller: leasehold_core::principal::Principal::Anonymous,
                }
            }
            Gen::SetPolicy {
                prefix,
                limit,
                window,
                fair: is_fair,
            } => {
                let kind = if *is_fair {
                    PolicyKind::Fair
                } else {
                    PolicyKind::Counter
                };
                Command::SetPolicy(policy(PREFIXES[*prefix], *limit, WINDOWS[*window], kind))
            }
            Gen::DeletePolicy { prefix } => Command::DeletePolicy {
                prefix: PREFIXES[*prefix].to_string(),
            },
            Gen::Tick => Command::Tick,
            Gen::Retry(i) => {
                let with_ids: Vec<&Command> = self
                    .issued
                    .iter()
                    .filter(|c| request_id_of(c).is_some())
                    .collect();
                if with_ids.is_empty() {
                    Command::Tick
                } else {
                    with_ids[i % with_ids.len()].clone()
                }
            }
        };
        self.issued.push(command.clone());
        command
    }

    /// The window start a generated command names, given the run so far.
    fn pick_window(&self, name: &str, pick: &WindowPick, now: u64) -> u64 {
        match pick {
            WindowPick::Latest => self.latest.get(name).map_or(0, |w| w.0),
            WindowPick::Previous => self.previous.get(name).copied().unwrap_or(0),
            WindowPick::AlignedBack(n) => (now - now % 500).saturating_sub(n * 500),
        }
    }

    fn limit_of(&self, key: &str) -> Option<&Policy> {
        self.policies.lookup(key)
    }

    /// The key's window containing `now` (a window joined ahead is not
    /// live before it starts).
    fn live(&self, key: &str, now: u64) -> Option<(u64, u64)> {
        self.windows
            .range((key.to_string(), 0)..=(key.to_string(), now))
            .next_back()
            .map(|((_, start), track)| (*start, track.end))
            .filter(|w| w.1 > now)
    }

    /// Whether `window_start_ms` may be joined ahead at `now`: it is the
    /// end of the live window and `now` lies in that window's last quarter.
    fn joinable_ahead(&self, key: &str, window_start_ms: u64, now: u64) -> bool {
        self.live(key, now).is_some_and(|(start, end)| {
            end == window_start_ms && now >= end - (end - start) / NEXT_WINDOW_JOIN_SHARE
        })
    }

    /// Opens or finds the tracked window named by an outcome; checks the
    /// non-overlap law and the effective limit.
    fn window_for(
        &mut self,
        key: &str,
        start: u64,
        end: u64,
        limit: u64,
        now: u64,
    ) -> Result<&mut WindowTrack, TestCaseError> {
        let ahead = self.joinable_ahead(key, start, now) && now < start;
        prop_assert!(
            (start <= now || ahead) && now < end,
            "window [{start}, {end}) does not contain now {now}"
        );
        let label = (key.to_string(), start);
        if !self.windows.contains_key(&label) {
            if let Some((prev_start, prev_end)) = self.latest.get(key).copied() {
                prop_assert!(
                    start >= prev_end,
                    "{key}: window {start} overlaps [{prev_start}, {prev_end})"
                );
                self.previous.insert(key.to_string(), prev_start);
            }
            let policy_limit = self.limit_of(key).map(|p| p.limit);
            prop_assert!(
                policy_limit.is_some(),
                "{key}: window created without a policy"
            );
            self.latest.insert(key.to_string(), (start, end));
            self.windows.insert(
                label.clone(),
                WindowTrack {
                    end,
                    min_limit: policy_limit.unwrap_or(0),
                    allowance: policy_limit.unwrap_or(0),
                    ..Default::default()
                },
            );
        }
        let track = self.windows.get_mut(&label).expect("inserted above");
        prop_assert_eq!(track.end, end);
        prop_assert_eq!(
            limit,
            track.min_limit,
            "{}: effective limit differs from the minimum policy limit",
            key
        );
        Ok(track)
    }

    /// A pool grant's outcome `p` for `region` asking `want_total`: the
    /// region's total in the window named never shrinks, never exceeds the
    /// ask (unless it held more), and the window stays within its limit.
    fn observe_pool_total(
        &mut self,
        key: &str,
        region: &str,
        want_total: u64,
        p: &PoolGrantOutcome,
        now: u64,
    ) -> Result<(), TestCaseError> {
        let track = self.window_for(key, p.window_start_ms, p.window_end_ms, p.limit, now)?;
        let held = track.regions.entry(region.to_string()).or_default();
        prop_assert!(p.granted_total >= held.0, "pool total shrank");
        prop_assert!(p.granted_total <= held.0.max(want_total));
        let delta = p.granted_total - held.0;
        held.0 = p.granted_total;
        track.granted += delta;
        if delta > 0 {
            prop_assert!(
                track.granted - track.returned <= track.min_limit,
                "pool granted past the limit"
            );
        }
        Ok(())
    }

    /// Checks one outcome against the model and updates the model.
    pub fn observe(
        &mut self,
        command: &Command,
        outcome: &Outcome,
        now: u64,
    ) -> Result<(), TestCaseError> {
        match (command, outcome) {
            (
                Command::Lease {
                    key,
                    region,
                    tokens,
                    ..
                },
                Outcome::Lease(g),
            ) => {
                prop_assert!(*tokens > 0);
                prop_assert_eq!(
                    self.limit_of(key.as_str()).map(|p| p.kind),
                    Some(PolicyKind::Counter)
                );
                prop_assert!(g.granted <= *tokens);
                prop_assert_eq!(g.coordinator_now_ms, now);
                let track = self.window_for(
                    key.as_str(),
                    g.window_start_ms,
                    g.window_end_ms,
                    g.limit,
                    now,
                )?;
                track.granted += g.granted;
                track.regions.entry(region.to_string()).or_default().0 += g.granted;
                if g.granted > 0 {
                    prop_assert!(
                        track.granted - track.returned <= track.min_limit,
                        "lease granted past the limit"
                    );
                }
            }
            (
                Command::PoolGrant {
                    key,
                    region,
                    region_weight,
                    want_total,
                    ..
                },
                Outcome::PoolGrant(p),
            ) => {
                prop_assert!(*region_weight > 0);
                prop_assert_eq!(
                    self.limit_of(key.as_str()).map(|p| p.kind),
                    Some(PolicyKind::Fair)
                );
                self.observe_pool_total(key.as_str(), region.as_str(), *want_total, p, now)?;
            }
            (
                Command::PoolJoinNext {
                    key,
                    region,
                    region_weight,
                    want_total,
                    window_start_ms,
                    ..
                },
                Outcome::PoolGrant(p),
            ) => {
                prop_assert!(*region_weight > 0);
                prop_assert_eq!(
                    self.limit_of(key.as_str()).map(|p| p.kind),
                    Some(PolicyKind::Fair)
                );
                // The grant is in the window named: the live one, the one
                // after it (joined ahead), or the one opened now.
                prop_assert_eq!(p.window_start_ms, *window_start_ms);
                self.observe_pool_total(key.as_str(), region.as_str(), *want_total, p, now)?;
            }
            (
                Command::Reconcile {
                    key,
                    region,
                    leftover,
                    window_start_ms,
                    ..
                },
                Outcome::Reconcile(r),
            ) => {
                prop_assert!(r.credited <= *leftover);
                let live = self.live(key.as_str(), now);
                if live.map(|w| w.0) != Some(*window_start_ms) {
                    prop_assert_eq!(r.disposition, ReconcileDisposition::WindowEnded);
                }
                if r.credited > 0 {
                    let track = self.windows.get_mut(&(key.to_string(), *window_start_ms));
                    prop_assert!(track.is_some(), "credited into an unknown window");
                    let track = track.expect("checked");
                    track.returned += r.credited;
                    let used = track.regions.entry(region.to_string()).or_default();
                    used.1 += r.credited;
                    prop_assert!(used.1 <= used.0, "region returned more than it was granted");
                }
            }
            (
                Command::PoolRelease {
                    key,
                    region,
                    from_total,
                    keep_total,
                    window_start_ms,
                    ..
                },
                Outcome::PoolRelease(o),
            ) => {
                prop_assert!(keep_total <= from_total);
                prop_assert_eq!(
                    self.limit_of(key.as_str()).map(|p| p.kind),
                    Some(PolicyKind::Fair)
                );
                let live = self.live(key.as_str(), now);
                if live.map(|w| w.0) != Some(*window_start_ms) {
                    prop_assert_eq!(o.disposition, PoolReleaseDisposition::WindowEnded);
                    prop_assert_eq!(o.released, 0);
                } else {
                    let track = self
                        .windows
                        .get_mut(&(key.to_string(), *window_start_ms))
                        .expect("a live window is tracked");
                    let held = track.regions.entry(region.to_string()).or_default();
                    if held.0 == *from_total {
                        let keep = (*keep_total).max(held.1).min(*from_total);
                        prop_assert_eq!(o.disposition, PoolReleaseDisposition::Released);
                        prop_assert_eq!(o.released, from_total - keep);
                        prop_assert_eq!(o.granted_total, keep);
                        held.0 = keep;
                        track.granted -= o.released;
                    } else {
                        prop_assert_eq!(o.disposition, PoolReleaseDisposition::StaleTotal);
                        prop_assert_eq!(o.released, 0);
                        prop_assert_eq!(o.granted_total, held.0);
                    }
                }
            }
            (Command::SetPolicy(p), outcome) => {
                let valid = p.validate().is_ok();
                prop_assert_eq!(
                    matches!(outcome, Outcome::PolicySet),
                    valid,
                    "{:?}",
                    outcome
                );
                if valid {
                    self.policies.set(p.clone()).expect("validated");
                    self.lower_live_limits(now);
                }
            }
            (Command::DeletePolicy { prefix }, Outcome::PolicyDeleted { existed }) => {
                prop_assert_eq!(self.policies.remove(prefix).is_some(), *existed);
                self.lower_live_limits(now);
            }
            (Command::Tick, Outcome::Ticked { .. }) => {}
            (command, Outcome::Rejected(error)) => self.check_rejection(command, error, now)?,
            (command, outcome) => prop_assert!(false, "{command:?} produced {outcome:?}"),
        }
        self.check_conservation()
    }

    fn check_rejection(
        &self,
        command: &Command,
        error: &CommandError,
        now: u64,
    ) -> Result<(), TestCaseError> {
        let (key, bad_input, wanted_kind) = match command {
            Command::Lease { key, tokens, .. } => (key, *tokens == 0, PolicyKind::Counter),
            Command::PoolGrant {
                key, region_weight, ..
            } => (key, *region_weight == 0, PolicyKind::Fair),
            Command::PoolRelease {
                key,
                from_total,
                keep_total,
                ..
            } => (key, keep_total > from_total, PolicyKind::Fair),
            Command::PoolJoinNext {
                key,
                region_weight,
                window_start_ms,
                ..
            } => {
                let named = match self.live(key.as_str(), now) {
                    Some((start, _)) => {
                        start == *window_start_ms
                            || self.joinable_ahead(key.as_str(), *window_start_ms, now)
                    }
                    // No live window: the one a grant opens now (its start
                    // may be raised past the aligned one: either answer).
                    None => {
                        if matches!(error, CommandError::InvalidArgument(_)) {
                            return Ok(());
                        }
                        true
                    }
                };
                let policy = self.limit_of(key.as_str());
                let expected = match policy {
                    None if *region_weight == 0 => "invalid",
                    None => "no policy",
                    Some(_) if !named || *region_weight == 0 => "invalid",
                    Some(p) if p.kind != PolicyKind::Fair => "wrong kind",
                    Some(_) => "accepted",
                };
                let got = match error {
                    CommandError::InvalidArgument(_) => "invalid",
                    CommandError::NoPolicy(_) => "no policy",
                    CommandError::WrongKind(_) => "wrong kind",
                    _ => "session refused",
                };
                prop_assert_eq!(got, expected, "{:?}", command);
                return Ok(());
            }
            Command::Reconcile { key, .. } => {
                let kind = self.limit_of(key.as_str()).map(|p| p.kind);
                prop_assert!(matches!(error, CommandError::WrongKind(_)), "{error:?}");
                prop_assert!(
                    kind == Some(PolicyKind::Fair)
                        || (kind.is_none() && self.live(key.as_str(), now).is_some())
                );
                return Ok(());
            }
            other => {
                prop_assert!(false, "{other:?} rejected with {error:?}");
                return Ok(());
            }
        };
        let expected = if bad_input {
            "invalid"
        } else {
            match self.limit_of(key.as_str()) {
                None => "no policy",
                Some(p) if p.kind != wanted_kind => "wrong kind",
                Some(_) => "accepted",
            }
        };
        let got = match error {
            CommandError::InvalidArgument(_) => "invalid",
            CommandError::NoPolicy(_) => "no policy",
            CommandError::WrongKind(_) => "wrong kind",
            CommandError::RequestIdReused(_)
            | CommandError::SessionExpired(_)
            | CommandError::SessionsExhausted(_) => "session refused",
            CommandError::NotOwner(_) | CommandError::Placement(_) => "not this shard's",
        };
        prop_assert_eq!(got, expected, "{:?}", command);
        Ok(())
    }

    fn lower_live_limits(&mut self, now: u64) {
        for ((key, _), track) in self.windows.iter_mut() {
            if track.end > now {
                if let Some(p) = self.policies.lookup(key) {
                    track.min_limit = track.min_limit.min(p.limit);
                    track.allowance = track.min_limit.max(track.granted - track.returned);
                }
            }
        }
    }

    fn check_conservation(&self) -> Result<(), TestCaseError> {
        for ((key, start), track) in &self.windows {
            prop_assert!(track.returned <= track.granted);
            prop_assert!(
                track.granted - track.returned <= track.allowance,
                "window ({key}, {start}): granted {} − returned {} > allowance {} (min limit {})",
                track.granted,
                track.returned,
                track.allowance,
                track.min_limit
            );
        }
        Ok(())
    }

    /// The state's view of each key's live window equals the model's.
    pub fn check_views(&self, state: &CoordinatorState) -> Result<(), TestCaseError> {
        let now = state.now_ms();
        for name in KEYS {
            let Ok(view) = state.window_view(&key(name), now) else {
                continue;
            };
            match self.live(name, now) {
                Some((start, end)) => {
                    let track = &self.windows[&(name.to_string(), start)];
                    prop_assert_eq!((view.window_start_ms, view.window_end_ms), (start, end));
                    prop_assert_eq!(
                        (view.granted, view.returned, view.limit),
                        (track.granted, track.returned, track.min_limit)
                    );
                }
                None => prop_assert_eq!((view.granted, view.returned), (0, 0)),
            }
        }
        Ok(())
    }
}

/// Decides whether `outcome` is a replay of an earlier execution of `id`,
/// following the documented session rules: a session lives until the clock
/// reaches the largest `max(window end, applied at + SESSION_MIN_RETAIN_MS)`
/// of its outcomes, and keeps its last `MAX_RESPONSES_PER_SESSION` seqs.
pub fn classify_retry(
    model: &mut Model,
    id: &RequestId,
    outcome: &Outcome,
    now: u64,
) -> Result<bool, TestCaseError> {
    let client = id.client.as_str().to_string();
    if model
        .sessions
        .get(&client)
        .is_some_and(|s| now >= s.retain_until)
    {
        model.sessions.remove(&client);
    }
    let session = model.sessions.entry(client).or_default();
    if let Some(first) = session.responses.get(&id.seq) {
        prop_assert_eq!(outcome, first, "retry of {:?} changed its outcome", id);
        return Ok(true);
    }
    if id.seq < session.floor {
        let too_old = Outcome::Rejected(CommandError::InvalidArgument(
            "request id too old".to_string(),
        ));
        prop_assert_eq!(outcome, &too_old);
        return Ok(true);
    }
    let window_end = match outcome {
        Outcome::Lease(g) => g.window_end_ms,
        Outcome::PoolGrant(p) => p.window_end_ms,
        Outcome::PoolRelease(p) => p.window_end_ms,
        _ => 0,
    };
    session.retain_until = session
        .retain_until
        .max(window_end.max(now + SESSION_MIN_RETAIN_MS));
    session.responses.insert(id.seq, outcome.clone());
    while session.responses.len() > MAX_RESPONSES_PER_SESSION {
        if let Some((seq, _)) = session.responses.pop_first() {
            session.floor = session.floor.max(seq + 1);
        }
    }
    Ok(false)
}
