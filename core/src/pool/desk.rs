//! The leader's pool desk, sans IO: what the member leading the cluster
//! adds around the replicated pool commands of a `fair` key, in one place
//! for the coordinator's API, the simulations and the tests.
//!
//! Before proposing a pool call ([`PoolDesk::plan`]) it caps the ask early
//! in a window at the region's expected ceiling ([`PoolRoster::cap`]; a
//! retried request id goes out with the total its first attempt had:
//! [`CappedAsks`]), lapses the reserves no region holds before a late ask
//! beyond the ceiling ([`lapse_commands`]) and caps the join ahead the call
//! carries in the window it joins. After the commands are applied it
//! answers a grant's hints ([`PoolDesk::grant_notes`], [`PoolDesk::join_notes`]):
//! the region's standing, plain and expected, what other regions reserve
//! unheld or keep retired, what was handed back late in the window before,
//! and the tenants' demand totals its report earns ([`DemandBoard`]); and it
//! remembers what a release handed back ([`PoolDesk::note_release`]). All of
//! it is the leader's memory, never replicated: hints, never a bound.

use crate::coordinator::{Command, CoordinatorState, PoolGrantOutcome, PoolReleaseOutcome};
use crate::ids::{Key, RegionId, TenantId};
use crate::pool::demand_board::DemandBoard;
use crate::pool::fair_pool::PoolStanding;
use crate::pool::lapse::lapse_commands;
use crate::pool::roster::{CappedAsks, PoolRoster, StandingAnswer};
use crate::principal::Principal;
use crate::window::WindowBounds;

/// The leader's pool memory (see the module doc).
#[derive(Debug, Clone)]
pub struct PoolDesk {
    /// `None`: a leader that answers no tenant demand totals.
    board: Option<DemandBoard>,
    /// `None`: a leader that answers no expected standing and caps nothing.
    roster: Option<PoolRoster>,
    capped: CappedAsks,
}

impl Default for PoolDesk {
    fn default() -> Self {
        PoolDesk {
            board: Some(DemandBoard::default()),
            roster: Some(PoolRoster::default()),
            capped: CappedAsks::default(),
        }
    }
}

/// The commands to propose for one pool call, in order: the lapses, the
/// call's own command, its join ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlan {
    /// Every command, in proposal order (one group).
    pub commands: Vec<Command>,
    /// How many lapses lead the group (their outcomes come first).
    pub lapses: usize,
    /// Whether the last command is the call's join ahead.
    pub joined: bool,
}

/// What a grant's answer carries besides its outcome (the proto's
/// `PoolGrantResponse` hints and demand totals).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantNotes {
    /// The region's standing (its ceiling at least its total).
    pub standing: Option<PoolStanding>,
    /// The same, counting the regions still expected.
    pub expected: Option<PoolStanding>,
    /// What the other regions reserve beyond what they hold.
    pub reserved_unheld: u64,
    /// What the other retired regions keep.
    pub retired_kept: u64,
    /// What regions handed back late in one of the two windows before.
    pub late_released_before: u64,
    /// Each reported tenant's demand over the regions that reported the
    /// reported window.
    pub tenant_demands: Vec<(TenantId, u64)>,
    /// The same for the window before it (every region has reported it).
    pub settled_tenant_demands: Vec<(TenantId, u64)>,
}

impl PoolDesk {
    /// A desk that answers demand totals and standings and caps asks.
    pub fn new() -> Self {
        PoolDesk::default()
    }

    /// The same desk without demand totals (an older leader).
    pub fn without_demand_totals(mut self) -> Self {
        self.board = None;
        self
    }

    /// The same desk without the expected standing and its caps (an older
    /// leader: a plain standing only).
    pub fn without_roster(mut self) -> Self {
        self.roster = None;
        self
    }

    /// The commands proposing pool call `command` (a `PoolGrant` or a
    /// `PoolRelease`) with its join ahead `join`, at coordinator time
    /// `now_ms` against `state`, by `leader` (the lapses' caller).
    pub fn plan(
        &mut self,
        state: &CoordinatorState,
        mut command: Command,
        join: Option<Command>,
        now_ms: u64,
        leader: &Principal,
    ) -> PoolPlan {
        let mut commands = Vec::new();
        if let Command::PoolGrant {
            key,
            region,
            region_weight,
            ..
        } = &command
        {
            let (key, region, region_weight) = (key.clone(), region.clone(), *region_weight);
            let view = state.pool_view(&key, now_ms);
            self.cap_ask(&mut command, view.as_ref(), now_ms);
            // In the window's last eighth, a late ask beyond the ceiling
            // first lapses the reserves no region holds.
            if let (Some(view), Command::PoolGrant { want_total, .. }) = (&view, &command) {
                commands = lapse_commands(
                    view,
                    &key,
                    &region,
                    region_weight,
                    *want_total,
                    now_ms,
                    leader,
                );
            }
        }
        let lapses = commands.len();
        commands.push(command);
        let joined = join.is_some();
        if let Some(mut join) = join {
            if let Command::PoolJoinNext {
                key,
                window_start_ms,
                ..
            } = &join
            {
                let view = state.pool_view_at(key, *window_start_ms, now_ms);
                self.cap_ask(&mut join, view.as_ref(), now_ms);
            }
            commands.push(join);
        }
        PoolPlan {
            commands,
            lapses,
            joined,
        }
    }

    /// A `PoolGrant`'s or `PoolJoinNext`'s ask as proposed in `view`'s
    /// window: early in a window, capped at the region's expected ceiling;
    /// a retried request id goes out with the total its first attempt had.
    fn cap_ask(
        &mut self,
        command: &mut Command,
        view: Option<&crate::coordinator::PoolView>,
        now_ms: u64,
    ) {
        let (Command::PoolGrant {
            key,
            region,
            region_weight,
            want_total,
            request_id,
            caller,
        }
        | Command::PoolJoinNext {
            key,
            region,
            region_weight,
            want_total,
            request_id,
            caller,
            ..
        }) = command
        else {
            return;
        };
        let cap = match (view, self.roster.as_ref()) {
            (Some(view), Some(roster)) => roster.cap(view, key, region, *region_weight, now_ms),
            _ => None,
        };
        *want_total = self.capped.total(
            caller,
            request_id.as_ref(),
            *want_total,
            cap.map(|cap| cap.max(1)),
            now_ms,
        );
    }

    /// The notes of `grant` to `region` of `key` as `state` applied it;
    /// `report`: the call's demand report (the window it counts and the
    /// counts), counted when it is of the window right before the granted
    /// one.
    pub fn grant_notes(
        &mut self,
        state: &CoordinatorState,
        key: &Key,
        region: &RegionId,
        grant: &PoolGrantOutcome,
        report: Option<(u64, &[(TenantId, u64)])>,
    ) -> GrantNotes {
        let window_ms = grant.window_end_ms.saturating_sub(grant.window_start_ms);
        let previous = grant.window_start_ms.checked_sub(window_ms);
        let mut notes = self.standing_notes(state, key, region, grant);
        if let Some((reported, demands)) = report.filter(|(w, _)| Some(*w) == previous) {
            self.count_report(&mut notes, key, region, reported, window_ms, demands);
        }
        notes
    }

    /// The notes of a join ahead's `grant` (see [`Self::grant_notes`]):
    /// its report of the window before the one it named
    /// (`join_window_start_ms`) counts when the grant is in that window.
    pub fn join_notes(
        &mut self,
        state: &CoordinatorState,
        key: &Key,
        region: &RegionId,
        grant: &PoolGrantOutcome,
        join_window_start_ms: u64,
        demands: &[(TenantId, u64)],
    ) -> GrantNotes {
        let window_ms = grant.window_end_ms.saturating_sub(grant.window_start_ms);
        let mut notes = self.standing_notes(state, key, region, grant);
        if let (true, Some(reported)) = (
            grant.window_start_ms == join_window_start_ms,
            grant.window_start_ms.checked_sub(window_ms),
        ) {
            self.count_report(&mut notes, key, region, reported, window_ms, demands);
        }
        notes
    }

    /// Remembers what `outcome` of a release of `key` handed back at
    /// coordinator time `now_ms` (late hand-backs are a hint to the next
    /// window's grants).
    pub fn note_release(&mut self, key: &Key, outcome: &PoolReleaseOutcome, now_ms: u64) {
        if let Some(roster) = self.roster.as_mut() {
            let window = WindowBounds {
                start_ms: outcome.window_start_ms,
                end_ms: outcome.window_end_ms,
            };
            roster.note_release(key, window, now_ms, outcome.released);
        }
    }

    /// The region's standing in the granted window as `state` holds it;
    /// the roster records the window's regions. Nothing when the window is
    /// gone meanwhile.
    fn standing_notes(
        &mut self,
        state: &CoordinatorState,
        key: &Key,
        region: &RegionId,
        grant: &PoolGrantOutcome,
    ) -> GrantNotes {
        let now_ms = grant.coordinator_now_ms;
        let Some(view) = state
            .pool_view_at(key, grant.window_start_ms, now_ms)
            .filter(|view| view.bounds.start_ms == grant.window_start_ms)
        else {
            return GrantNotes::default();
        };
        let answer = match self.roster.as_mut() {
            Some(roster) => roster.answer(&view, key, region, now_ms),
            None => StandingAnswer {
                expected: None,
                ..PoolRoster::default().answer(&view, key, region, now_ms)
            },
        };
        let at_least_held = |s: PoolStanding| PoolStanding {
            guarantee: s.guarantee,
            ceiling: s.ceiling.max(grant.granted_total),
        };
        GrantNotes {
            standing: answer.standing.map(at_least_held),
            expected: answer.expected.map(at_least_held),
            reserved_unheld: answer.reserved_unheld,
            retired_kept: answer.retired_kept,
            late_released_before: answer.late_released_before,
            tenant_demands: Vec::new(),
            settled_tenant_demands: Vec::new(),
        }
    }

    /// Counts `region`'s report of `demands` for the window starting at
    /// `reported` and adds the totals it earns to `notes`: that window's
    /// (so far) and the settled one before it.
    fn count_report(
        &mut self,
        notes: &mut GrantNotes,
        key: &Key,
        region: &RegionId,
        reported: u64,
        window_ms: u64,
        demands: &[(TenantId, u64)],
    ) {
        let Some(board) = self.board.as_mut() else {
            return;
        };
        if demands.is_empty() {
            return;
        }
        notes.tenant_demands = board.report(key, reported, region, demands);
        let tenants: Vec<TenantId> = demands.iter().map(|(tenant, _)| tenant.clone()).collect();
        notes.settled_tenant_demands = reported
            .checked_sub(window_ms)
            .map(|settled| board.totals(key, settled, &tenants))
            .unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::{Outcome, Proposal};
    use crate::ids::{ClientId, RequestId};
    use crate::policy::Policy;

    const T0: u64 = 1_700_000_000_000;
    const WINDOW_MS: u64 = 8_000;

    fn state() -> CoordinatorState {
        let mut state = CoordinatorState::default();
        state.apply(&Proposal {
            stamp_ms: T0,
            commands: vec![Command::SetPolicy(Policy::fair("p/", 100, WINDOW_MS))],
        });
        state
    }

    fn ask(region: &str, weight: u64, want: u64, seq: Option<u64>) -> Command {
        Command::PoolGrant {
            key: Key::new("p/k").expect("valid"),
            region: RegionId::new(region).expect("valid"),
            region_weight: weight,
            want_total: want,
            request_id: seq.map(|seq| RequestId {
                client: ClientId::new(format!("{region}-node")).expect("valid"),
                seq,
            }),
            caller: Principal::Anonymous,
        }
    }

    fn apply(state: &mut CoordinatorState, plan: &PoolPlan, at: u64) -> Vec<Outcome> {
        state
            .apply(&Proposal {
                stamp_ms: at,
                commands: plan.commands.clone(),
            })
            .outcomes
    }

    fn want_of(command: &Command) -> u64 {
        match command {
            Command::PoolGrant { want_total, .. } | Command::PoolJoinNext { want_total, .. } => {
                *want_total
            }
            other => panic!("{other:?}"),
        }
    }

    /// Early in a window the ask of a region is capped by the share of a
    /// region of the window before that has not asked yet, and a retry of
    /// the same request id goes out with the same total even once the cap
    /// is gone.
    #[test]
    fn early_asks_are_capped_and_a_retry_keeps_its_total() {
        let mut desk = PoolDesk::new();
        let mut state = state();
        let leader = Principal::Member(1);
        // A window in which eu and us both asked.
        let start = T0 / WINDOW_MS * WINDOW_MS;
        for region in ["eu", "us"] {
            let plan = desk.plan(&state, ask(region, 1, 10, None), None, start + 1, &leader);
            let outcomes = apply(&mut state, &plan, start + 1);
            let Some(Outcome::PoolGrant(grant)) = outcomes.last() else {
                panic!("{outcomes:?}");
            };
            desk.grant_notes(
                &state,
                &grant_key(),
                &RegionId::new(region).unwrap(),
                grant,
                None,
            );
        }
        // The next window: eu asks for everything before us has asked.
        let next = start + WINDOW_MS + 1;
        let plan = desk.plan(&state, ask("eu", 1, 100, Some(7)), None, next, &leader);
        assert_eq!(
            want_of(&plan.commands[plan.lapses]),
            50,
            "us's share is kept"
        );
        // The same id later, when the leader no longer expects us: the same total.
        let later = start + 2 * WINDOW_MS - 1;
        let retry = desk.plan(&state, ask("eu", 1, 100, Some(7)), None, later, &leader);
        assert_eq!(want_of(&retry.commands[retry.lapses]), 50);
        // A desk without the roster caps nothing.
        let mut plain = PoolDesk::new().without_roster();
        let plan = plain.plan(&state, ask("eu", 1, 100, Some(8)), None, next, &leader);
        assert_eq!(want_of(&plan.commands[0]), 100);
    }

    fn grant_key() -> Key {
        Key::new("p/k").expect("valid")
    }

    /// In a window's last eighth, an ask beyond the ceiling while another
    /// region reserves more than it holds is planned after a lapse of that
    /// region's reserve, and takes what nobody holds.
    #[test]
    fn a_late_ask_beyond_the_ceiling_lapses_the_reserves_first() {
        let mut desk = PoolDesk::new();
        let mut state = state();
        let leader = Principal::Member(1);
        let start = T0 / WINDOW_MS * WINDOW_MS;
        for (region, want) in [("eu", 10), ("us", 50)] {
            let plan = desk.plan(&state, ask(region, 1, want, None), None, start + 1, &leader);
            apply(&mut state, &plan, start + 1);
        }
        // eu holds 10 of its guarantee of 50; us asks for all, late.
        let late = start + WINDOW_MS - WINDOW_MS / 16;
        let plan = desk.plan(&state, ask("us", 1, 100, None), None, late, &leader);
        assert_eq!(plan.lapses, 1, "{plan:?}");
        assert!(matches!(plan.commands[0], Command::PoolRelease { .. }));
        let outcomes = apply(&mut state, &plan, late);
        match outcomes.last() {
            Some(Outcome::PoolGrant(grant)) => {
                assert_eq!((grant.granted_total, grant.granted_increment), (90, 40))
            }
            other => panic!("{other:?}"),
        }
    }

    /// A grant's notes: the standing (its ceiling at least the total) and,
    /// for a report of the window right before the granted one, the demand
    /// totals — none for a report of any other window or from a desk
    /// without demand totals.
    #[test]
    fn a_report_of_the_window_before_earns_the_totals() {
        let mut state = state();
        let leader = Principal::Member(1);
        let start = T0 / WINDOW_MS * WINDOW_MS;
        let tenant = TenantId::new("t").expect("valid");
        let demands = vec![(tenant.clone(), 30)];
        for (mut desk, counted) in [
            (PoolDesk::new(), true),
            (PoolDesk::new().without_demand_totals(), false),
        ] {
            let plan = desk.plan(&state, ask("eu", 1, 10, None), None, start + 1, &leader);
            let outcomes = apply(&mut state, &plan, start + 1);
            let Some(Outcome::PoolGrant(grant)) = outcomes.last() else {
                panic!("{outcomes:?}");
            };
            let eu = RegionId::new("eu").expect("valid");
            let before = start - WINDOW_MS;
            let notes =
                desk.grant_notes(&state, &grant_key(), &eu, grant, Some((before, &demands)));
            let standing = notes.standing.expect("a standing");
            assert!(standing.ceiling >= grant.granted_total);
            assert_eq!(
                notes.tenant_demands,
                if counted {
                    vec![(tenant.clone(), 30)]
                } else {
                    vec![]
                }
            );
            let elsewhere = desk.grant_notes(
                &state,
                &grant_key(),
                &eu,
                grant,
                Some((before - WINDOW_MS, &demands)),
            );
            assert!(elsewhere.tenant_demands.is_empty());
        }
    }
}
