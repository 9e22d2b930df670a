//! Joins of a fair key's next window ahead, carried by a call the key makes
//! anyway late in the live window, and their answers, adopted once the live
//! grant expires (see the parent module's doc, Joins ahead).

use super::grant::own_answer;
use super::*;

impl<Id: Clone> FairKey<Id> {
    /// Makes the answered join ahead the key's grant (no join call).
    pub(super) fn adopt_ahead(&mut self, ahead: AheadGrant) {
        self.ahead = None;
        self.holding = ahead.holding;
        self.absorb_grant(
            ahead.answer,
            ahead.want_total,
            ahead.sent_ms,
            ahead.received_ms,
            ahead.re_ask_ms,
        );
        if let Some(state) = self.granted.as_mut() {
            // Joined retired: its total is what it keeps; the surplus
            // check a quarter in has nothing to hand back.
            state.retired = ahead.retired;
            state.surplus_checked |= ahead.retired;
        }
        // The window is weighed by the split it was joined with.
        if let Some(basis) = self.ahead_basis.take() {
            self.basis = Some(basis);
        }
    }

    /// The answered join ahead that takes over once the live grant has
    /// expired at `now_ms` (the window right after it), if any.
    pub(super) fn due_ahead(&self, now_ms: u64) -> Option<AheadGrant> {
        let state = self.granted.as_ref()?;
        self.ahead_of_granted()
            .filter(|_| now_ms >= state.deadline_ms)
    }

    /// The answered join ahead of the window right after the granted one.
    pub(super) fn ahead_of_granted(&self) -> Option<AheadGrant> {
        let state = self.granted.as_ref()?;
        self.ahead
            .filter(|a| a.answer.window.start_ms == state.window.end_ms)
    }

    /// The join of the next window a pool call sent at `now_ms` carries
    /// (under `request_id`), if it should carry one: once a window, from
    /// the late check on (the coordinator accepts joins ahead in the live
    /// window's last quarter), for a key that admitted something in it,
    /// with the live window's demand report projected to its end and the
    /// region weight of the next window's split. It asks what a join at the
    /// window's start would (the warm start), with what the key admitted
    /// projected to the window's end at its pace, and the region weight of
    /// the live window's tenants; or, when that pace needs well under its
    /// share, joins retired at what the first surplus check would keep.
    pub fn join_ahead(
        &mut self,
        request_id: Id,
        lease_size: u64,
        now_ms: u64,
    ) -> Option<JoinAhead<Id>> {
        let state = self.granted.as_ref().filter(|g| now_ms < g.deadline_ms)?;
        let next_start = state.window.end_ms;
        if now_ms < state.late_check_ms() || !self.may_join_ahead() {
            return None;
        }
        let window_ms = state.window.end_ms.saturating_sub(state.window.start_ms);
        let started = state.deadline_ms.saturating_sub(window_ms);
        let elapsed = now_ms.saturating_sub(started).max(1);
        let left = state.deadline_ms.saturating_sub(now_ms);
        let used = state.escrow.total_used();
        let rest = u128::from(used) * u128::from(left) / u128::from(elapsed);
        let projected = used.saturating_add(u64::try_from(rest).unwrap_or(u64::MAX));
        let limit = state.escrow.limit();
        let share = state
            .guarantee
            .filter(|g| *g > 0)
            .unwrap_or(self.last_share)
            .max(state.escrow.budget().min(limit));
        // What the first surplus check would keep for this pace: well under
        // the share, the region joins retired at it (nothing to hand back a
        // quarter in; the late check hands back what is left of it).
        let need = projected
            .saturating_add(projected / 8)
            .saturating_add((projected / 16).max(2));
        let worth = (limit / 100).max(1);
        let retire = !state.held_back && need.saturating_add(worth) < share;
        let want_total = if retire {
            need
        } else {
            let step = lease_size.max(projected / 4);
            let target = projected.saturating_add(step).min(share).min(limit);
            target.saturating_add(limit / 100)
        }
        .min(limit)
        .max(1);
        // The next window is weighed by the split a join at its start
        // would freeze (the settled window's), and reports the live
        // window's demand, projected to its end: every region's report of
        // a window is in before its totals settle.
        let live_start = state.window.start_ms;
        let basis = self.settled_basis();
        let region_weight = self.tenants_weight(Some(&basis), None).max(1);
        let demands = self.projected_report(elapsed, window_ms);
        self.reported_ahead = Some((live_start, demands.clone()));
        self.ahead_basis = Some(basis);
        self.ahead_asked = Some(next_start);
        self.ahead_retires = retire;
        self.asked_weight = region_weight;
        Some(JoinAhead {
            request_id,
            region_weight,
            want_total,
            want_more: want_total,
            window_start_ms: next_start,
            retire,
            demands,
        })
    }

    /// Whether the key may join the next window ahead with a call it makes
    /// now or later in this window (see [`Self::join_ahead`], whose time
    /// condition — from the late check on — this leaves out).
    pub(super) fn may_join_ahead(&self) -> bool {
        let Some(state) = self.granted.as_ref() else {
            return false;
        };
        !self.joined_ahead_of(state.window.end_ms) && state.escrow.total_used() > 0
    }

    /// Whether the key has joined (or is joining) the window starting at
    /// `next_start_ms` ahead.
    pub(super) fn joined_ahead_of(&self, next_start_ms: u64) -> bool {
        self.ahead_asked == Some(next_start_ms)
            || self
                .ahead
                .is_some_and(|a| a.answer.window.start_ms == next_start_ms)
    }

    /// Feeds the answer of a join ahead (sent at monotonic `sent_ms` for
    /// `want_total`, arriving at `now_ms`) with the settled demand totals
    /// it carries (of the window two before the one joined, which the
    /// next window's join weighs by): kept until the live grant expires,
    /// then the key's grant ([`Self::decide`]). An answer for any window
    /// but the one after the live grant is dropped.
    pub fn on_ahead_answer(
        &mut self,
        answer: PoolAnswer,
        settled_demands: Vec<(TenantId, u64)>,
        want_total: u64,
        sent_ms: u64,
        now_ms: u64,
        re_ask_ms: u64,
    ) {
        let next = self.granted.as_ref().map(|g| g.window.end_ms);
        if next != Some(answer.window.start_ms) {
            return;
        }
        // This holder held nothing in the window joined before the join.
        let mut holding = PoolHolding::new();
        holding.on_grant(
            answer.window,
            answer.granted_total,
            answer.granted_increment,
        );
        let (answer, want_total) = own_answer(&holding, answer, want_total);
        let window_ms = answer.window.end_ms.saturating_sub(answer.window.start_ms);
        if let Some(settled) = answer
            .window
            .start_ms
            .checked_sub(window_ms.saturating_mul(2))
        {
            self.on_tenant_demands(settled, settled_demands);
        }
        self.ahead = Some(AheadGrant {
            answer,
            holding,
            retired: self.ahead_retires,
            want_total,
            sent_ms,
            received_ms: now_ms,
            re_ask_ms,
        });
    }
}
