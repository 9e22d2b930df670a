//! The leader's pool desk, sans IO: what the member leading the cluster
//! adds around the replicated pool commands of a `fair` key, in one place
//! for the coordinator's API, the simulations and the tests.
//!
//! Before proposing a pool call ([`PoolDesk::plan`]) it caps the ask early
//! in a window at the region's expected ceiling ([`PoolRoster::cap`]; a
//! retried request id goes out with the total its first attempt had:
//! [`CappedAsks`]), lapses the reserves no region holds before a late ask
//! beyond the ceiling ([`lapse_commands`]) and caps the join ahead the call
//! carries in the window it joins; and it writes in each grant's and
//! join's `region_weight` the sum over the region's holders
//! ([`HolderWeights`]: a region served by several escrow processes weighs
//! what they serve together). Every driver — the coordinator's API, the
//! simulations, the tests — proposes the plan's commands in one group
//! and hands their outcomes to [`PoolDesk::finish`], which settles the
//! asks it planned and reads back the call's outcome, its join's and the
//! lapses' ([`PoolCallOutcome`]). After the commands are applied it
//! answers a grant's hints ([`PoolDesk::grant_notes`], [`PoolDesk::join_notes`]):
//! the region's standing, plain and expected, what other regions reserve
//! unheld or keep retired, what was handed back late in the window before,
//! and the tenants' demand totals its report earns ([`DemandBoard`], one
//! report per holder); and it remembers what a release handed back and
//! that its holder stopped reserving ([`PoolDesk::note_release`]). All of
//! it is the leader's memory, never replicated: hints, never a bound.

use crate::coordinator::{
    Command, CoordinatorState, Outcome, PoolGrantOutcome, PoolReleaseDisposition,
    PoolReleaseOutcome, PoolView,
};
use crate::ids::{Key, RegionId, TenantId};
use crate::pool::demand_board::{DemandBoard, Reporter};
use crate::pool::fair_pool::PoolStanding;
use crate::pool::holder_weights::{Holder, HolderWeights};
use crate::pool::in_flight::InFlightAsks;
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
    /// `None`: a leader that takes each call's weight as the region's.
    holders: Option<HolderWeights>,
    in_flight: InFlightAsks,
    capped: CappedAsks,
}

impl Default for PoolDesk {
    fn default() -> Self {
        PoolDesk {
            board: Some(DemandBoard::default()),
            roster: Some(PoolRoster::default()),
            holders: Some(HolderWeights::default()),
            in_flight: InFlightAsks::default(),
            capped: CappedAsks::default(),
        }
    }
}

/// One pool call as the leader takes it up (the proto's
/// `PoolGrantRequest` and `PoolReleaseRequest`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCall {
    /// Its own command: a `PoolGrant` or a `PoolRelease`.
    pub command: Command,
    /// The holder it speaks for (its join's too).
    pub holder: Holder,
    /// How much more than the region holds a grant asks for (0: its
    /// `want_total` alone; see [`PoolDesk::plan`]).
    pub want_more: u64,
    /// The join ahead it carries (a `PoolJoinNext`) and the join's
    /// `want_more`.
    pub join: Option<(Command, u64)>,
}

impl PoolCall {
    /// A call of the region's anonymous holder asking by totals alone,
    /// without a join.
    pub fn plain(command: Command) -> Self {
        PoolCall {
            command,
            holder: Holder::Anonymous,
            want_more: 0,
            join: None,
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
    /// The asks by `want_more` it planned, to settle once the commands'
    /// outcomes are known ([`PoolDesk::finish`]).
    pub in_flight: Vec<u64>,
}

impl PoolPlan {
    /// The commands to propose, in one group and in order, and the receipt
    /// that reads their outcomes back ([`PoolDesk::finish`]).
    pub fn into_parts(self) -> (Vec<Command>, PlanReceipt) {
        let receipt = PlanReceipt {
            lapses: self.lapses,
            joined: self.joined,
            in_flight: self.in_flight,
        };
        (self.commands, receipt)
    }
}

/// What [`PoolDesk::finish`] needs of a plan once its commands are
/// proposed: where the call's outcomes stand among theirs and the asks to
/// settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanReceipt {
    lapses: usize,
    joined: bool,
    in_flight: Vec<u64>,
}

/// What one pool call's commands came to, in the call's terms
/// ([`PoolDesk::finish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCallOutcome {
    /// The call's own command's outcome (a refusal included).
    pub call: Outcome,
    /// Its join ahead's, when it carried one.
    pub join: Option<Outcome>,
    /// How many regions the lapses retired (a lapse that met a total
    /// changed since the plan retired none).
    pub lapsed: u64,
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

    /// The same desk taking each call's weight as its region's (an older
    /// leader: the region weighs what its latest caller declared).
    pub fn without_holder_weights(mut self) -> Self {
        self.holders = None;
        self
    }

    /// The commands proposing `call` at coordinator time `now_ms` against
    /// `state`, by `leader` (the lapses' caller).
    pub fn plan(
        &mut self,
        state: &CoordinatorState,
        call: PoolCall,
        now_ms: u64,
        leader: &Principal,
    ) -> PoolPlan {
        let PoolCall {
            mut command,
            holder,
            want_more,
            join,
        } = call;
        let mut commands = Vec::new();
        let mut in_flight = Vec::new();
        if let Command::PoolGrant { key, region, .. } = &command {
            let (key, region) = (key.clone(), region.clone());
            let view = state.pool_view(&key, now_ms);
            if let Some(view) = &view {
                self.weigh(&mut command, &holder, view);
                in_flight.extend(self.size_ask(&mut command, want_more, view, now_ms));
            }
            self.cap_ask(&mut command, view.as_ref(), now_ms);
            // In the window's last eighth, a late ask beyond the ceiling
            // first lapses the reserves no region holds.
            if let (
                Some(view),
                Command::PoolGrant {
                    want_total,
                    region_weight,
                    ..
                },
            ) = (&view, &command)
            {
                commands = lapse_commands(
                    view,
                    &key,
                    &region,
                    *region_weight,
                    *want_total,
                    now_ms,
                    leader,
                );
            }
        }
        let lapses = commands.len();
        commands.push(command);
        let joined = join.is_some();
        if let Some((mut join, join_want_more)) = join {
            if let Command::PoolJoinNext {
                key,
                window_start_ms,
                ..
            } = &join
            {
                let view = state.pool_view_at(key, *window_start_ms, now_ms);
                // A join that came late names the live window, where its
                // holder may hold already (its own earlier join): it asks
                // by totals alone there.
                let late = state.pool_view(key, now_ms).is_some_and(|live| {
                    live.bounds.start_ms == *window_start_ms && !live.regions.is_empty()
                });
                if let Some(view) = &view {
                    self.weigh(&mut join, &holder, view);
                    if !late {
                        in_flight.extend(self.size_ask(&mut join, join_want_more, view, now_ms));
                    }
                }
                self.cap_ask(&mut join, view.as_ref(), now_ms);
            }
            commands.push(join);
        }
        PoolPlan {
            commands,
            lapses,
            joined,
            in_flight,
        }
    }

    /// Finishes a planned call once its commands were applied or refused:
    /// forgets the asks it planned (the region's totals now count them:
    /// [`InFlightAsks`]) and reads back, from `outcomes` — one per planned
    /// command, in order — the call's outcome, its join's and how many
    /// regions its lapses retired. `None` when the outcomes are not one per
    /// command (a proposal that failed before any was applied: pass none).
    pub fn finish(
        &mut self,
        receipt: PlanReceipt,
        mut outcomes: Vec<Outcome>,
    ) -> Option<PoolCallOutcome> {
        for id in &receipt.in_flight {
            self.in_flight.settle(*id);
        }
        if outcomes.len() != receipt.lapses + 1 + usize::from(receipt.joined) {
            return None;
        }
        let join = if receipt.joined { outcomes.pop() } else { None };
        let call = outcomes.pop()?;
        let lapsed = outcomes
            .iter()
            .filter(|outcome| {
                matches!(
                    outcome,
                    Outcome::PoolRelease(release)
                        if release.disposition == PoolReleaseDisposition::Released
                )
            })
            .count() as u64;
        Some(PoolCallOutcome { call, join, lapsed })
    }

    /// Raises a `PoolGrant`'s or `PoolJoinNext`'s `want_total` to the
    /// region's total in `view`'s window, plus what the asks planned ahead
    /// of it and not yet applied ask for beyond it
    /// ([`InFlightAsks`]), plus `want_more` (the proto's `want_more`): a
    /// holder cannot know what the region's other holders added since its
    /// last answer — nor, joining a window, what they hold there — so it
    /// asks by how much more it wants. Only the size of the ask: the grant
    /// rule and every cap apply to the total as to any other. Returns the
    /// ask's in-flight id when it asked by `want_more`.
    fn size_ask(
        &mut self,
        command: &mut Command,
        want_more: u64,
        view: &PoolView,
        now_ms: u64,
    ) -> Option<u64> {
        let (Command::PoolGrant {
            key,
            region,
            want_total,
            ..
        }
        | Command::PoolJoinNext {
            key,
            region,
            want_total,
            ..
        }) = command
        else {
            return None;
        };
        if want_more == 0 {
            return None;
        }
        let window_start_ms = view.bounds.start_ms;
        let held = view
            .regions
            .iter()
            .find(|(id, _)| id == region)
            .map_or(0, |(_, member)| member.granted);
        let ahead = self.in_flight.pending(key, window_start_ms, region, now_ms);
        *want_total = (*want_total).max(held.saturating_add(ahead).saturating_add(want_more));
        Some(
            self.in_flight
                .add(key, window_start_ms, region, want_more, now_ms),
        )
    }

    /// Writes in a `PoolGrant`'s or `PoolJoinNext`'s `region_weight` the sum
    /// over its region's holders in `view`'s window, `holder`'s
    /// declaration included. A retired join counts its holder's weight for
    /// its own grant only: the holder stops reserving once granted.
    fn weigh(&mut self, command: &mut Command, holder: &Holder, view: &PoolView) {
        let window_start_ms = view.bounds.start_ms;
        let (Command::PoolGrant {
            key,
            region,
            region_weight,
            ..
        }
        | Command::PoolJoinNext {
            key,
            region,
            region_weight,
            ..
        }) = command
        else {
            return;
        };
        let Some(holders) = self.holders.as_mut() else {
            return;
        };
        let sum = holders.declare(key, window_start_ms, region, holder, *region_weight);
        *region_weight = sum;
        if let Command::PoolJoinNext {
            key,
            region,
            retire: true,
            ..
        } = command
        {
            holders.retire(key, window_start_ms, region, holder);
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

    /// The notes of `grant` to `holder` of `region` of `key` as `state`
    /// applied it; `report`: the call's demand report (the window it counts
    /// and the counts), counted when it is of the window right before the
    /// granted one.
    pub fn grant_notes(
        &mut self,
        state: &CoordinatorState,
        key: &Key,
        (region, holder): (&RegionId, &Holder),
        grant: &PoolGrantOutcome,
        report: Option<(u64, &[(TenantId, u64)])>,
    ) -> GrantNotes {
        let window_ms = grant.window_end_ms.saturating_sub(grant.window_start_ms);
        let previous = grant.window_start_ms.checked_sub(window_ms);
        let mut notes = self.standing_notes(state, key, region, grant);
        if let Some((reported, demands)) = report.filter(|(w, _)| Some(*w) == previous) {
            let reporter = (region.clone(), holder.clone());
            self.count_report(&mut notes, key, &reporter, reported, window_ms, demands);
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
        (region, holder): (&RegionId, &Holder),
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
            let reporter = (region.clone(), holder.clone());
            self.count_report(&mut notes, key, &reporter, reported, window_ms, demands);
        }
        notes
    }

    /// Remembers what `outcome` of a release of `key` by `holder` of
    /// `region` handed back at coordinator time `now_ms` (late hand-backs
    /// are a hint to the next window's grants) and, when it was applied,
    /// that the holder stopped reserving in that window.
    pub fn note_release(
        &mut self,
        key: &Key,
        (region, holder): (&RegionId, &Holder),
        outcome: &PoolReleaseOutcome,
        now_ms: u64,
    ) {
        if let (Some(holders), crate::coordinator::PoolReleaseDisposition::Released) =
            (self.holders.as_mut(), outcome.disposition)
        {
            holders.retire(key, outcome.window_start_ms, region, holder);
        }
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

    /// Counts `reporter`'s report of `demands` for the window starting at
    /// `reported` and adds the totals it earns to `notes`: that window's
    /// (so far) and the settled one before it.
    fn count_report(
        &mut self,
        notes: &mut GrantNotes,
        key: &Key,
        reporter: &Reporter,
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
        notes.tenant_demands = board.report(key, reported, reporter, demands);
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

    /// Applies `plan` at `at` and finishes it on `desk`, as every driver
    /// does: its outcomes, one per command, the call's where `finish` reads
    /// it.
    fn apply_and_finish(
        desk: &mut PoolDesk,
        state: &mut CoordinatorState,
        plan: &PoolPlan,
        at: u64,
    ) -> Vec<Outcome> {
        let outcomes = apply(state, plan, at);
        let finished = desk
            .finish(plan.clone().into_parts().1, outcomes.clone())
            .expect("one outcome per command");
        assert_eq!(Some(&finished.call), outcomes.get(plan.lapses));
        assert_eq!(finished.join.is_some(), plan.joined);
        outcomes
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
            let plan = desk.plan(
                &state,
                PoolCall::plain(ask(region, 1, 10, None)),
                start + 1,
                &leader,
            );
            let outcomes = apply(&mut state, &plan, start + 1);
            let Some(Outcome::PoolGrant(grant)) = outcomes.last() else {
                panic!("{outcomes:?}");
            };
            desk.grant_notes(
                &state,
                &grant_key(),
                (&RegionId::new(region).unwrap(), &Holder::Anonymous),
                grant,
                None,
            );
        }
        // The next window: eu asks for everything before us has asked.
        let next = start + WINDOW_MS + 1;
        let plan = desk.plan(
            &state,
            PoolCall::plain(ask("eu", 1, 100, Some(7))),
            next,
            &leader,
        );
        assert_eq!(
            want_of(&plan.commands[plan.lapses]),
            50,
            "us's share is kept"
        );
        // The same id later, when the leader no longer expects us: the same total.
        let later = start + 2 * WINDOW_MS - 1;
        let retry = desk.plan(
            &state,
            PoolCall::plain(ask("eu", 1, 100, Some(7))),
            later,
            &leader,
        );
        assert_eq!(want_of(&retry.commands[retry.lapses]), 50);
        // A desk without the roster caps nothing.
        let mut plain = PoolDesk::new().without_roster();
        let plan = plain.plan(
            &state,
            PoolCall::plain(ask("eu", 1, 100, Some(8))),
            next,
            &leader,
        );
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
            let plan = desk.plan(
                &state,
                PoolCall::plain(ask(region, 1, want, None)),
                start + 1,
                &leader,
            );
            apply(&mut state, &plan, start + 1);
        }
        // eu holds 10 of its guarantee of 50; us asks for all, late.
        let late = start + WINDOW_MS - WINDOW_MS / 16;
        let plan = desk.plan(
            &state,
            PoolCall::plain(ask("us", 1, 100, None)),
            late,
            &leader,
        );
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
            let plan = desk.plan(
                &state,
                PoolCall::plain(ask("eu", 1, 10, None)),
                start + 1,
                &leader,
            );
            let outcomes = apply(&mut state, &plan, start + 1);
            let Some(Outcome::PoolGrant(grant)) = outcomes.last() else {
                panic!("{outcomes:?}");
            };
            let eu = RegionId::new("eu").expect("valid");
            let before = start - WINDOW_MS;
            let notes = desk.grant_notes(
                &state,
                &grant_key(),
                (&eu, &Holder::Anonymous),
                grant,
                Some((before, &demands)),
            );
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
                (&eu, &Holder::Anonymous),
                grant,
                Some((before - WINDOW_MS, &demands)),
            );
            assert!(elsewhere.tenant_demands.is_empty());
        }
    }

    fn holder(name: &str) -> Holder {
        Holder::Process(ClientId::new(name).expect("valid"))
    }

    fn weight_of(command: &Command) -> u64 {
        match command {
            Command::PoolGrant { region_weight, .. }
            | Command::PoolJoinNext { region_weight, .. } => *region_weight,
            other => panic!("{other:?}"),
        }
    }

    /// Two holders of eu (weight 1 each) against us (weight 2): eu weighs
    /// the sum of its holders, so the pool splits 50 / 50 — not a third
    /// to eu as when eu weighed its latest caller alone (an older leader);
    /// a holder's release leaves the other's weight.
    #[test]
    fn a_region_of_two_holders_weighs_their_sum() {
        let leader = Principal::Member(1);
        let start = T0 / WINDOW_MS * WINDOW_MS;
        for (mut desk, eu_weight, eu_total) in [
            (PoolDesk::new(), 2, 50),
            (PoolDesk::new().without_holder_weights(), 1, 34),
        ] {
            let mut state = state();
            let mut call = |region, name, weight, want| {
                let plan = desk.plan(
                    &state,
                    PoolCall {
                        command: ask(region, weight, want, None),
                        holder: holder(name),
                        want_more: 0,
                        join: None,
                    },
                    start + 1,
                    &leader,
                );
                let weight = weight_of(&plan.commands[plan.lapses]);
                let outcomes = apply_and_finish(&mut desk, &mut state, &plan, start + 1);
                match outcomes.last() {
                    Some(Outcome::PoolGrant(grant)) => (weight, grant.granted_total),
                    other => panic!("{other:?}"),
                }
            };
            call("us", "us-a", 2, 1);
            call("eu", "eu-a", 1, 100);
            let (weight, total) = call("eu", "eu-b", 1, 100);
            assert_eq!((weight, total), (eu_weight, eu_total));
        }
        // A release by one holder: the other's weight stays the region's.
        let mut desk = PoolDesk::new();
        let eu = RegionId::new("eu").expect("valid");
        let key = grant_key();
        for name in ["eu-a", "eu-b"] {
            let plan = desk.plan(
                &state(),
                PoolCall {
                    command: ask("eu", 3, 10, None),
                    holder: holder(name),
                    want_more: 0,
                    join: None,
                },
                start + 1,
                &leader,
            );
            // Planned, never proposed: finished with no outcome.
            assert_eq!(desk.finish(plan.into_parts().1, Vec::new()), None);
        }
        let released = PoolReleaseOutcome {
            disposition: crate::coordinator::PoolReleaseDisposition::Released,
            released: 5,
            granted_total: 5,
            window_start_ms: start,
            window_end_ms: start + WINDOW_MS,
        };
        desk.note_release(&key, (&eu, &holder("eu-a")), &released, start + 2);
        let plan = desk.plan(
            &state(),
            PoolCall {
                command: ask("eu", 3, 10, None),
                holder: holder("eu-b"),
                want_more: 0,
                join: None,
            },
            start + 3,
            &leader,
        );
        assert_eq!(weight_of(&plan.commands[plan.lapses]), 3);
    }

    /// Two holders of one region joining the next window at once, each by
    /// `want_more`: both planned before either is applied, each gets what
    /// it asked for — the second is sized on top of the first (in flight)
    /// — where asks by totals alone would give the second nothing.
    #[test]
    fn two_holders_joining_at_once_both_get_their_ask() {
        let leader = Principal::Member(1);
        let start = T0 / WINDOW_MS * WINDOW_MS;
        let late = start + WINDOW_MS - WINDOW_MS / 8;
        let next = start + WINDOW_MS;
        let join = |name: &str, want: u64| Command::PoolJoinNext {
            key: grant_key(),
            region: RegionId::new("eu").expect("valid"),
            region_weight: 1,
            want_total: want,
            window_start_ms: next,
            retire: false,
            request_id: Some(RequestId {
                client: ClientId::new(name).expect("valid"),
                seq: 1,
            }),
            caller: Principal::Anonymous,
        };
        for (by_more, increments) in [(true, [30, 20]), (false, [30, 0])] {
            let mut desk = PoolDesk::new();
            let mut state = state();
            // A live window, in which eu asks.
            let plan = desk.plan(
                &state,
                PoolCall::plain(ask("eu", 1, 10, None)),
                late,
                &leader,
            );
            apply(&mut state, &plan, late);
            let plans: Vec<PoolPlan> = [("eu-a", 30), ("eu-b", 20)]
                .into_iter()
                .map(|(name, want)| {
                    let more = if by_more { want } else { 0 };
                    desk.plan(
                        &state,
                        PoolCall {
                            command: ask("eu", 1, 10, None),
                            holder: holder(name),
                            want_more: 0,
                            join: Some((join(name, want), more)),
                        },
                        late,
                        &leader,
                    )
                })
                .collect();
            for (plan, increment) in plans.iter().zip(increments) {
                let outcomes = apply_and_finish(&mut desk, &mut state, plan, late);
                match outcomes.last() {
                    Some(Outcome::PoolGrant(grant)) => {
                        assert_eq!(grant.window_start_ms, next);
                        assert_eq!(grant.granted_increment, increment, "{by_more}");
                    }
                    other => panic!("{other:?}"),
                }
            }
            assert!(desk.in_flight.is_empty());
        }
    }

    /// A join that comes late — it names the live window, where its
    /// holder may hold already — asks by its total alone: `want_more` does
    /// not raise it on top of what the region holds there. An ask by
    /// `want_more` is sized on its own region's total, not another's.
    #[test]
    fn a_late_join_asks_by_its_total_and_an_ask_by_its_own_region() {
        let leader = Principal::Member(1);
        let start = T0 / WINDOW_MS * WINDOW_MS;
        let mut desk = PoolDesk::new();
        let mut state = state();
        for (region, want) in [("us", 20), ("eu", 30)] {
            let plan = desk.plan(
                &state,
                PoolCall::plain(ask(region, 1, want, None)),
                start + 1,
                &leader,
            );
            apply(&mut state, &plan, start + 1);
        }
        let late_join = Command::PoolJoinNext {
            key: grant_key(),
            region: RegionId::new("eu").expect("valid"),
            region_weight: 1,
            want_total: 30,
            window_start_ms: start,
            retire: false,
            request_id: None,
            caller: Principal::Anonymous,
        };
        let plan = desk.plan(
            &state,
            PoolCall {
                command: ask("eu", 1, 30, None),
                holder: holder("eu-a"),
                want_more: 0,
                join: Some((late_join, 30)),
            },
            start + 2,
            &leader,
        );
        assert_eq!(want_of(plan.commands.last().expect("the join")), 30);
        // eu holds 30, us 20: 5 more for eu is 35, whatever us holds.
        let plan = desk.plan(
            &state,
            PoolCall {
                command: ask("eu", 1, 1, None),
                holder: holder("eu-a"),
                want_more: 5,
                join: None,
            },
            start + 3,
            &leader,
        );
        assert_eq!(want_of(&plan.commands[plan.lapses]), 35);
    }

    fn seq(client: &str, seq: u64) -> Option<RequestId> {
        Some(RequestId {
            client: ClientId::new(client).expect("valid"),
            seq,
        })
    }

    /// The whole command list of a late ask beyond the ceiling by a second
    /// holder of us, asking by how much more it wants and joining the next
    /// window: the lapse of eu's reserve (keeping all it holds, by the
    /// leader, in the live window), the ask weighing both of us's holders
    /// and sized from what us holds, then the join weighing the one holder
    /// that joined — and what `finish` reads back.
    #[test]
    fn a_late_ask_plans_the_lapse_the_ask_and_its_join_in_that_order() {
        let mut desk = PoolDesk::new();
        let mut state = state();
        let start = T0 / WINDOW_MS * WINDOW_MS;
        let key = grant_key();
        let (eu, us) = (RegionId::new("eu").unwrap(), RegionId::new("us").unwrap());
        for (region, name, weight, want) in [("us", "us-a", 2, 50), ("eu", "eu-a", 1, 10)] {
            let call = PoolCall {
                command: ask(region, weight, want, None),
                holder: holder(name),
                want_more: 0,
                join: None,
            };
            let plan = desk.plan(&state, call, start + 1, &Principal::Member(1));
            apply_and_finish(&mut desk, &mut state, &plan, start + 1);
        }
        let late = start + WINDOW_MS - WINDOW_MS / 16;
        let next = start + WINDOW_MS;
        let join = Command::PoolJoinNext {
            key: key.clone(),
            region: us.clone(),
            region_weight: 1,
            want_total: 30,
            window_start_ms: next,
            retire: false,
            request_id: seq("us-b", 2),
            caller: Principal::Anonymous,
        };
        let call = PoolCall {
            command: Command::PoolGrant {
                key: key.clone(),
                region: us.clone(),
                region_weight: 1,
                want_total: 1,
                request_id: seq("us-b", 1),
                caller: Principal::Anonymous,
            },
            holder: holder("us-b"),
            want_more: 40,
            join: Some((join, 0)),
        };
        let plan = desk.plan(&state, call, late, &Principal::Member(1));
        assert_eq!(
            plan.commands,
            vec![
                Command::PoolRelease {
                    key: key.clone(),
                    region: eu.clone(),
                    from_total: 10,
                    keep_total: 10,
                    window_start_ms: start,
                    request_id: None,
                    caller: Principal::Member(1),
                },
                Command::PoolGrant {
                    key: key.clone(),
                    region: us.clone(),
                    region_weight: 3,
                    want_total: 90,
                    request_id: seq("us-b", 1),
                    caller: Principal::Anonymous,
                },
                Command::PoolJoinNext {
                    key: key.clone(),
                    region: us.clone(),
                    region_weight: 1,
                    want_total: 30,
                    window_start_ms: next,
                    retire: false,
                    request_id: seq("us-b", 2),
                    caller: Principal::Anonymous,
                },
            ]
        );
        assert_eq!(
            (plan.lapses, plan.joined, plan.in_flight.len()),
            (1, true, 1)
        );
        let (commands, receipt) = plan.into_parts();
        let outcomes = state
            .apply(&Proposal {
                stamp_ms: late,
                commands,
            })
            .outcomes;
        let finished = desk
            .finish(receipt, outcomes)
            .expect("one outcome per command");
        assert_eq!(finished.lapsed, 1);
        match (&finished.call, &finished.join) {
            (Outcome::PoolGrant(grant), Some(Outcome::PoolGrant(joined))) => {
                assert_eq!((grant.granted_total, grant.granted_increment), (90, 40));
                assert_eq!(
                    (joined.window_start_ms, joined.granted_increment),
                    (next, 30)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(desk.in_flight.is_empty());
    }

    mod laws {
        use super::*;
        use proptest::prelude::*;

        /// One pool call of the world below.
        #[derive(Debug, Clone)]
        struct Step {
            region: usize,
            holder: usize,
            weight: u64,
            want: u64,
            want_more: u64,
            advance_ms: u64,
            join: bool,
            release_keeping: Option<u64>,
        }

        fn step() -> impl Strategy<Value = Step> {
            (
                0..3usize,
                0..2usize,
                1..5u64,
                0..120u64,
                prop_oneof![Just(0u64), 1..60u64],
                0..WINDOW_MS / 3,
                any::<bool>(),
                proptest::option::weighted(0.2, 0..100u64),
            )
                .prop_map(
                    |(
                        region,
                        holder,
                        weight,
                        want,
                        want_more,
                        advance_ms,
                        join,
                        release_keeping,
                    )| Step {
                        region,
                        holder,
                        weight,
                        want,
                        want_more,
                        advance_ms,
                        join,
                        release_keeping,
                    },
                )
        }

        const REGIONS: [&str; 3] = ["eu", "us", "ap"];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(128))]

            /// Over any sequence of grants, joins and releases by several
            /// holders of several regions, driven as every driver drives the
            /// desk (plan, apply in one group, finish), each plan's whole
            /// command list is: the lapses — releases by the leader of other
            /// regions keeping all they hold, in the live window — then the
            /// call, changed in its weight and total only (its weight at
            /// least what its holder declared), then its join; `finish`
            /// reads one outcome of the call's kind back; no ask stays in
            /// flight; and no window grants past its limit.
            #[test]
            fn every_plan_is_lapses_the_call_and_its_join(steps in proptest::collection::vec(step(), 1..40)) {
                let mut desk = PoolDesk::new();
                let mut state = state();
                let key = grant_key();
                let leader = Principal::Member(1);
                let mut now = T0 / WINDOW_MS * WINDOW_MS + 1;
                for (n, step) in steps.iter().enumerate() {
                    now += step.advance_ms;
                    let region = RegionId::new(REGIONS[step.region]).unwrap();
                    let name = format!("{}-{}", REGIONS[step.region], step.holder);
                    let live = state.pool_view(&key, now);
                    let held = live.as_ref().and_then(|view| {
                        view.regions.iter().find(|(id, _)| *id == region).map(|(_, m)| m.granted)
                    });
                    let command = match (step.release_keeping, &live, held) {
                        (Some(keep), Some(view), Some(total)) => Command::PoolRelease {
                            key: key.clone(),
                            region: region.clone(),
                            from_total: total,
                            keep_total: keep.min(total),
                            window_start_ms: view.bounds.start_ms,
                            request_id: seq(&name, n as u64 + 1),
                            caller: Principal::Anonymous,
                        },
                        _ => ask(REGIONS[step.region], step.weight, step.want, None),
                    };
                    let is_grant = matches!(command, Command::PoolGrant { .. });
                    let join = step.join.then(|| {
                        let next = (now / WINDOW_MS + 1) * WINDOW_MS;
                        (
                            Command::PoolJoinNext {
                                key: key.clone(),
                                region: region.clone(),
                                region_weight: step.weight,
                                want_total: step.want,
                                window_start_ms: next,
                                retire: false,
                                request_id: None,
                                caller: Principal::Anonymous,
                            },
                            step.want_more,
                        )
                    });
                    let call = PoolCall {
                        command: command.clone(),
                        holder: holder(&name),
                        want_more: if is_grant { step.want_more } else { 0 },
                        join: join.clone(),
                    };
                    let plan = desk.plan(&state, call, now, &leader);
                    let lapses = &plan.commands[..plan.lapses];
                    for lapse in lapses {
                        match lapse {
                            Command::PoolRelease { key: k, region: r, from_total, keep_total, window_start_ms, request_id, caller } => {
                                prop_assert_eq!(k, &key);
                                prop_assert_ne!(r, &region);
                                prop_assert_eq!(from_total, keep_total);
                                prop_assert_eq!(Some(*window_start_ms), live.as_ref().map(|v| v.bounds.start_ms));
                                prop_assert_eq!(request_id, &None);
                                prop_assert_eq!(caller, &leader);
                            }
                            other => prop_assert!(false, "a lapse that is not a release: {:?}", other),
                        }
                    }
                    prop_assert!(lapses.is_empty() || is_grant, "only a grant lapses reserves");
                    prop_assert_eq!(plan.commands.len(), plan.lapses + 1 + usize::from(plan.joined));
                    prop_assert_eq!(plan.joined, join.is_some());
                    let planned = &plan.commands[plan.lapses];
                    match (&command, planned) {
                        (
                            Command::PoolGrant { key: k0, region: r0, region_weight: w0, request_id: q0, caller: c0, .. },
                            Command::PoolGrant { key: k1, region: r1, region_weight: w1, request_id: q1, caller: c1, .. },
                        ) => {
                            prop_assert_eq!((k0, r0, q0, c0), (k1, r1, q1, c1));
                            prop_assert!(w1 >= w0, "weight {} below the declared {}", w1, w0);
                        }
                        (release @ Command::PoolRelease { .. }, planned) => prop_assert_eq!(release, planned),
                        other => prop_assert!(false, "{:?}", other),
                    }
                    if let (Some((join, _)), true) = (&join, plan.joined) {
                        match (join, plan.commands.last().unwrap()) {
                            (
                                Command::PoolJoinNext { key: k0, region: r0, window_start_ms: s0, retire: t0, request_id: q0, caller: c0, .. },
                                Command::PoolJoinNext { key: k1, region: r1, window_start_ms: s1, retire: t1, request_id: q1, caller: c1, .. },
                            ) => prop_assert_eq!((k0, r0, s0, t0, q0, c0), (k1, r1, s1, t1, q1, c1)),
                            other => prop_assert!(false, "{:?}", other),
                        }
                    }
                    let (commands, receipt) = plan.into_parts();
                    let outcomes = state.apply(&Proposal { stamp_ms: now, commands }).outcomes;
                    let finished = desk.finish(receipt, outcomes);
                    prop_assert!(finished.is_some(), "one outcome per command");
                    let finished = finished.unwrap();
                    match (&command, &finished.call) {
                        (_, Outcome::Rejected(_))
                        | (Command::PoolGrant { .. }, Outcome::PoolGrant(_))
                        | (Command::PoolRelease { .. }, Outcome::PoolRelease(_)) => {}
                        other => prop_assert!(false, "the call read back as {:?}", other),
                    }
                    prop_assert_eq!(finished.join.is_some(), join.is_some());
                    prop_assert!(desk.in_flight.is_empty(), "an ask left in flight");
                    for at in [now, (now / WINDOW_MS + 1) * WINDOW_MS] {
                        if let Some(view) = state.pool_view_at(&key, at / WINDOW_MS * WINDOW_MS, now) {
                            let granted: u64 = view.regions.iter().map(|(_, m)| m.granted).sum();
                            prop_assert!(granted <= view.limit, "{} granted past {}", granted, view.limit);
                        }
                    }
                }
            }
        }
    }
}
