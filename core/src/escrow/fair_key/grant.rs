//! A fair key's pool grants: what a join of a new window asks for (the
//! warm start and the region weight) and how an answer is taken in — the
//! region's totals turned into this holder's own ([`PoolHolding`]), the
//! ceiling and its backoff, the standing hints (see the parent module's
//! doc, Warm start, Ceiling, Holdings).

use super::*;

/// `answer` and the `want_total` it answered (the region's totals) in the
/// own totals of the holder whose `holding` has counted it: its total is
/// what the holder holds, its standing the part of the region's not held
/// by others, and the want what the ask asked beyond what others hold.
pub(super) fn own_answer(
    holding: &PoolHolding,
    answer: PoolAnswer,
    want_total: u64,
) -> (PoolAnswer, u64) {
    let own = PoolAnswer {
        granted_total: holding.own(),
        granted_increment: answer.granted_increment,
        standing: answer.standing.map(|s| holding.own_standing(s)),
        expected: answer.expected.map(|s| holding.own_standing(s)),
        ..answer
    };
    (own, holding.own_part(want_total))
}

impl<Id: Clone> FairKey<Id> {
    /// The region weight to join a new window with: the requesting
    /// tenant's (split) `weight` plus, when the key held the window right
    /// before, the weights of that window's other tenants — they are most
    /// likely active again, and a join may be the window's only pool call,
    /// so the region must not weigh one tenant alone all window.
    pub(super) fn join_weight(&self, tenant: &TenantId, weight: u64, now_ms: u64) -> u64 {
        let Some(state) = self.granted.as_ref() else {
            return weight;
        };
        let window_ms = state.window.end_ms.saturating_sub(state.window.start_ms);
        if now_ms >= state.deadline_ms.saturating_add(window_ms) {
            return weight;
        }
        weight.saturating_add(self.tenants_weight(self.basis.as_ref(), Some(tenant)))
    }

    /// What to join a new window with `region_weight` (see the module
    /// doc), and whether to join for all of it (the guarantee it rests on
    /// counted the expected regions): 0 without a grant in the window
    /// right before `now_ms` or a guarantee from it. The guarantee is
    /// scaled by the region's weight now over the weight it was computed
    /// with: a tenant's demand split moves weight between regions from
    /// window to window, leaving the sum of the weights as it was.
    pub(super) fn warm_start(
        &self,
        lease_size: u64,
        region_weight: u64,
        now_ms: u64,
    ) -> (u64, bool) {
        let Some(state) = self.granted.as_ref() else {
            return (0, false);
        };
        let window_ms = state.window.end_ms.saturating_sub(state.window.start_ms);
        if now_ms >= state.deadline_ms.saturating_add(window_ms) {
            return (0, false);
        }
        let used = state.escrow.total_used();
        let step = lease_size.max(used / 4);
        // (A region that joined its window retired heard no guarantee
        // there: its share as last heard with a weight.)
        let guarantee = state
            .guarantee
            .filter(|g| *g > 0 || !state.retired)
            .unwrap_or(self.last_share);
        let guarantee = if state.guarantee_weight > 0 {
            let scaled = u128::from(guarantee) * u128::from(region_weight)
                / u128::from(state.guarantee_weight);
            u64::try_from(scaled).unwrap_or(u64::MAX)
        } else {
            guarantee
        };
        let target = used
            .saturating_add(step)
            .min(guarantee)
            .min(state.escrow.limit());
        (target, state.guarantee_counts_expected)
    }

    /// Feeds a pool grant answered for an ask of `want_total` (the
    /// region's total asked, as sent) sent at monotonic `sent_ms`, arriving
    /// at `now_ms`; at the ceiling the key asks again no sooner than
    /// `re_ask_ms` later. Feed each call's answer once: its increment is
    /// what this holder may spend ([`PoolHolding`]). Returns the budget.
    pub fn on_pool_answer(
        &mut self,
        answer: PoolAnswer,
        want_total: u64,
        sent_ms: u64,
        now_ms: u64,
        re_ask_ms: u64,
    ) -> u64 {
        let counted = self.holding.on_grant(
            answer.window,
            answer.granted_total,
            answer.granted_increment,
        );
        if !counted {
            // An answer for a window before the one held: nothing to hold.
            return self.granted.as_ref().map_or(0, |g| g.escrow.budget());
        }
        let (answer, want_total) = own_answer(&self.holding, answer, want_total);
        self.absorb_grant(answer, want_total, sent_ms, now_ms, re_ask_ms)
    }

    /// [`Self::on_pool_answer`] for the region's only holder: the answer's
    /// increment is whatever its total adds to what the key holds.
    #[cfg(test)]
    pub(super) fn on_sole_answer(
        &mut self,
        answer: PoolAnswer,
        want_total: u64,
        sent_ms: u64,
        now_ms: u64,
        re_ask_ms: u64,
    ) -> u64 {
        let held = if self.holding.window() == Some(answer.window) {
            self.holding.own()
        } else {
            0
        };
        let answer = PoolAnswer {
            granted_increment: answer.granted_total.saturating_sub(held),
            ..answer
        };
        self.on_pool_answer(answer, want_total, sent_ms, now_ms, re_ask_ms)
    }

    /// [`Self::on_ahead_answer`] for the region's only holder.
    #[cfg(test)]
    pub(super) fn on_sole_ahead_answer(
        &mut self,
        answer: PoolAnswer,
        settled_demands: Vec<(TenantId, u64)>,
        want_total: u64,
        sent_ms: u64,
        now_ms: u64,
        re_ask_ms: u64,
    ) {
        let answer = PoolAnswer {
            granted_increment: answer.granted_total,
            ..answer
        };
        self.on_ahead_answer(
            answer,
            settled_demands,
            want_total,
            sent_ms,
            now_ms,
            re_ask_ms,
        );
    }

    /// [`Self::on_pool_answer`] in this holder's own totals.
    pub(super) fn absorb_grant(
        &mut self,
        answer: PoolAnswer,
        want_total: u64,
        sent_ms: u64,
        now_ms: u64,
        re_ask_ms: u64,
    ) -> u64 {
        let deadline_ms = sent_ms.saturating_add(answer.remaining_lifetime_ms);
        let max_tenants = self.max_tenants;
        // The expected standing, when the leader said, protects the regions
        // that have not joined yet; the plain one counts only the others.
        let hint = answer.expected.or(answer.standing);
        // Room of a two-hundredth of L or less is the pool's rounding: not
        // worth a call (whoever looks next takes it).
        let slack = answer.limit / 200;
        let at_ceiling = answer.granted_total < want_total
            || hint.is_some_and(|s| s.ceiling <= answer.granted_total.saturating_add(slack));
        // Held back only by regions that may yet not come: look again
        // once they are no longer waited for.
        let waiting_on_expected = match (answer.expected, answer.standing) {
            (Some(expected), Some(plain)) => expected.ceiling < plain.ceiling,
            _ => false,
        };
        // Held back by reserves other regions do not hold: quiet ones hand
        // theirs back once the first quarter is over (their surplus check).
        // (A twentieth of L: rounding and a demand split's drift leave a
        // few tokens reserved and unheld in any busy window.)
        let waiting_on_reserves = answer.reserved_unheld >= (answer.limit / 20).max(1);
        let fresh = self.granted.is_none();
        let joined_ahead = self.joined_ahead_of(answer.window.end_ms);
        let state = self.granted.get_or_insert_with(|| Granted {
            escrow: WeightedFairEscrow::new(answer.limit, max_tenants),
            window: answer.window,
            deadline_ms,
            exhausted_until_ms: 0,
            guarantee: None,
            guarantee_counts_expected: false,
            guarantee_weight: 0,
            round_trip_ms: now_ms.saturating_sub(sent_ms),
            surplus_checked: false,
            retiring_raise: None,
            raised_to_retire: false,
            late_checked: false,
            others_hand_back: false,
            late_look_raised: false,
            late_look_paid_before: false,
            held_back: false,
            retired: false,
        });
        if state.window != answer.window {
            if state.window.start_ms < answer.window.start_ms {
                let mut counts = std::mem::take(&mut self.demand);
                // A window reported ahead counts as reported: the split
                // reads the same counts as the leader's totals.
                if let Some((_, reported)) = self
                    .reported_ahead
                    .take()
                    .filter(|(start, _)| *start == state.window.start_ms)
                {
                    counts = reported.into_iter().collect();
                }
                self.settled = self.previous.take();
                self.previous = Some((state.window.start_ms, counts));
                self.previous_used = state.escrow.total_used();
            }
            state.window = answer.window;
            state.deadline_ms = deadline_ms;
            state.round_trip_ms = now_ms.saturating_sub(sent_ms);
            state.surplus_checked = false;
            state.retiring_raise = None;
            state.raised_to_retire = false;
            state.late_checked = false;
            // A late look that paid in the window before: the regions that
            // handed back their margins then will likely do so again.
            state.late_look_paid_before = std::mem::take(&mut state.late_look_raised);
            state.others_hand_back = false;
            state.held_back = false;
            state.exhausted_until_ms = 0;
            state.guarantee = None;
            state.guarantee_counts_expected = false;
        } else if !fresh {
            state.deadline_ms = state.deadline_ms.min(deadline_ms);
            // An ask within the window (not a join): a look at the ceiling
            // that raised nothing doubles the next wait; one that raised
            // the total, or an ask that found room beyond it, resets it.
            // Rounding (the slack above) does not count as a raise.
            let raised = answer.granted_total > state.escrow.budget().saturating_add(slack);
            let look = state.exhausted_until_ms > 0;
            if raised && (look || !at_ceiling) {
                self.fruitless_re_asks = 0;
            } else if look && !raised {
                self.fruitless_re_asks = self.fruitless_re_asks.saturating_add(1);
            }
            // A look that raised the total: some region handed back, and
            // will hand back the rest of its margin late in the window.
            if raised && look {
                state.others_hand_back = true;
                if now_ms >= state.late_check_ms() {
                    state.late_look_raised = true;
                }
            }
            // A raise after the surplus check (a quiet region whose demand
            // grew): the late check looks again (the pool may reserve more
            // than it needs) — not at once, or a batch asked for would be
            // handed straight back.
            if answer.granted_total > state.escrow.budget()
                && now_ms >= state.expectation_ends_ms()
                && now_ms < state.late_check_ms()
            {
                state.late_checked = false;
            }
        }
        // Regions handed back late in the window before, as they likely
        // will in this one: a region held at its ceiling looks after the
        // late check (a hundredth of L is worth the call).
        if answer.late_released_before >= (answer.limit / 100).max(1) {
            state.late_look_paid_before = true;
        }
        // Regions that retired keep a margin for their pace and hand back
        // what is left of it at their late check: worth a look after it.
        if answer.retired_kept >= (answer.limit / 20).max(1) {
            state.others_hand_back = true;
        }
        if let Some(standing) = hint {
            if standing.guarantee > 0 {
                self.last_share = standing.guarantee;
            }
            state.guarantee = Some(standing.guarantee);
            state.guarantee_counts_expected = answer.expected.is_some();
            state.guarantee_weight = self.asked_weight;
        }
        // Asking again rejoins the pool with the region's weight.
        state.retired = false;
        if at_ceiling {
            // Look again later, twice as late after each look that found
            // nothing.
            let wait = re_ask_ms
                .max(1)
                .saturating_mul(1u64 << self.fruitless_re_asks.min(16));
            let mut until = now_ms.saturating_add(wait).min(state.deadline_ms);
            let window_ms = state.window.end_ms.saturating_sub(state.window.start_ms);
            // Regions that handed back keep a margin for their pace: they
            // hand back what is left of it an eighth of the window before
            // its end; look again just after.
            let late_look_at = state.late_check_ms().saturating_add(window_ms / 50);
            if state.others_hand_back && now_ms < late_look_at {
                until = late_look_at;
            } else if (state.late_look_paid_before || !joined_ahead) && now_ms < late_look_at {
                until = until.min(late_look_at);
            }
            // But first look again once the leader stops expecting regions
            // and the quiet regions' surplus checks (at that moment) have
            // run.
            let look_at = state.expectation_ends_ms().saturating_add(window_ms / 50);
            if (waiting_on_expected || waiting_on_reserves) && now_ms < look_at {
                until = until.min(look_at);
            }
            state.exhausted_until_ms = until.max(now_ms.saturating_add(1));
        } else {
            state.exhausted_until_ms = 0;
        }
        state
            .escrow
            .observe_grant(answer.window, answer.granted_total);
        state.escrow.budget()
    }
}
