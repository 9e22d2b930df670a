//! Reclaim of a fair key: when a release falls due (idle, the surplus
//! checks a quarter in and an eighth before the end, a join ahead nobody
//! took up), what it keeps, the raise to retire at the need, and the
//! answers (see the parent module's doc, Reclaim).

use super::*;

impl<Id: Clone> FairKey<Id> {
    /// When reclaim falls due (monotonic ms): a pending release one probe
    /// interval after `tried_ms`; otherwise `idle_ms` after the key's last
    /// request, while a live grant is held and not yet released. `None`
    /// when `idle_ms` is 0 (reclaim off) or nothing is held.
    pub fn release_at(
        &self,
        last_request_ms: u64,
        idle_ms: u64,
        tried_ms: u64,
        probe_interval_ms: u64,
        now_ms: u64,
    ) -> Option<u64> {
        if idle_ms == 0 {
            return None;
        }
        if self.pending.is_some() {
            return Some(tried_ms.saturating_add(probe_interval_ms.max(1)));
        }
        // Joined ahead: unless a request makes the join the key's grant
        // first, its surplus check a quarter into the joined window hands
        // back what it holds, as a region that joined at the window's
        // start and fell quiet would.
        let ahead_due = self.ahead_of_granted().map(|a| a.expectation_ends_ms());
        match (
            self.live_release_at(last_request_ms, idle_ms, now_ms),
            ahead_due,
        ) {
            (Some(live), Some(ahead)) => Some(live.min(ahead)),
            (live, ahead) => live.or(ahead),
        }
    }

    /// [`Self::release_at`] for the live grant alone.
    pub(super) fn live_release_at(
        &self,
        last_request_ms: u64,
        idle_ms: u64,
        now_ms: u64,
    ) -> Option<u64> {
        let state = self.granted.as_ref()?;
        if now_ms >= state.deadline_ms {
            return None;
        }
        if !state.holds_back_anything() {
            // Too little to be worth a call of its own, but the late
            // check's release carries the key's join of the next window,
            // which is a call anyway: then any token held back goes back.
            let rides = self.may_join_ahead() && state.holds_unspent_tokens();
            return (rides && !state.late_checked).then(|| state.late_check_ms());
        }
        // A retired region holds only what it kept for its pace: the late
        // check hands back what it will not need.
        if state.retired {
            return (!state.late_checked).then(|| state.late_check_ms());
        }
        let idle_at = last_request_ms.saturating_add(idle_ms);
        if !state.surplus_checked {
            return Some(idle_at.min(state.expectation_ends_ms()));
        }
        if !state.late_checked {
            return Some(idle_at.min(state.late_check_ms()));
        }
        Some(idle_at)
    }

    /// Starts reclaiming the live grant under `request_id`: the budget drops
    /// to what was admitted at once, and the release is pending until
    /// answered. `None` (nothing to send) when a release is already
    /// pending, no live grant is held, or it was released already.
    pub fn begin_release(
        &mut self,
        request_id: Id,
        idle: bool,
        now_ms: u64,
    ) -> Option<&PendingRelease<Id>> {
        if self.pending.is_some() {
            return None;
        }
        // A join ahead no request has made the key's grant yet: it is the
        // grant a release hands back once the window has begun, joined
        // retired or not (nothing was admitted from it: the need its pace
        // kept is gone with the pace).
        if let Some(ahead) = self
            .due_ahead(now_ms)
            .filter(|a| now_ms >= a.starts_at_ms())
        {
            self.adopt_ahead(AheadGrant {
                retired: false,
                ..ahead
            });
        }
        // From the late check on, a release carries the key's join of the
        // next window, a call the key makes anyway: any token is worth it.
        let rides = !idle
            && self
                .granted
                .as_ref()
                .is_some_and(|g| now_ms >= g.late_check_ms())
            && self.may_join_ahead();
        let state = self.granted.as_mut().filter(|g| {
            now_ms < g.deadline_ms && (g.holds_back_anything() || rides && g.holds_unspent_tokens())
        })?;
        if state.retired && (idle || state.late_checked || now_ms < state.late_check_ms()) {
            return None;
        }
        // No surplus check before the first quarter is over: a pace from a
        // few ms of a window says nothing (a raise answered late, in the
        // next window, would otherwise retire the region at once).
        if !idle && now_ms < state.expectation_ends_ms() {
            return None;
        }
        let from_total = state.escrow.budget();
        let used = state.escrow.total_used().min(from_total);
        let keep_total = if idle {
            used
        } else {
            // The surplus checks, a quarter in and an eighth before the
            // end: hand back what the pace so far will not need, when that
            // is worth a call.
            let late_check_done = state.late_checked;
            if now_ms >= state.late_check_ms() {
                state.late_checked = true;
            }
            state.surplus_checked = true;
            // Denied at the pool's ceiling: it would use whatever it holds.
            if state.held_back {
                return None;
            }
            let need = used.saturating_add(state.projected_need(now_ms));
            let keep = need.min(from_total);
            // Worth a call: a hundredth of L unspent beyond the need, or a
            // guarantee that much above both the need and what it holds
            // while what it holds nearly covers the need (the pool reserves
            // the guarantee for the region whatever it holds; the little
            // it may lack it asks for again). A region whose pace needs
            // more than it holds must not retire its weight: it could not
            // get its guarantee back.
            let worth = (state.escrow.limit() / 100).max(1);
            let surplus = from_total - keep >= if rides { 1 } else { worth };
            // (After the late check only tokens are worth a call: the
            // regions at their ceiling have had their last look.)
            let idle_reserve = !state.retired
                && !late_check_done
                && need <= from_total.saturating_add(worth)
                && state
                    .guarantee
                    .is_some_and(|g| g >= need.max(from_total).saturating_add(worth));
            if !surplus && !idle_reserve {
                // Its pace needs more than it holds, but the pool reserves
                // well beyond that need: raise the total to the need, then
                // retire at it (once a window) — the reserve beyond goes to
                // the regions still asking.
                let reserve_beyond_need = need > from_total.saturating_add(worth)
                    && state
                        .guarantee
                        .is_some_and(|g| g >= need.saturating_add(worth));
                if reserve_beyond_need && !state.raised_to_retire {
                    state.raised_to_retire = true;
                    state.retiring_raise = Some(need.min(state.escrow.limit()));
                }
                return None;
            }
            keep
        };
        state.escrow.retire(state.window, keep_total);
        state.exhausted_until_ms = 0;
        // On the wire, the region's totals: the other holders' part stays.
        let others = self.holding.others();
        self.pending = Some(PendingRelease {
            request_id,
            from_total: from_total.saturating_add(others),
            keep_total: keep_total.saturating_add(others),
            window: state.window,
            join_next: None,
        });
        self.pending.as_ref()
    }

    /// Attaches to the pending release, when it has no join yet, the join
    /// of the next window it should carry ([`Self::join_ahead`], under
    /// `request_id`). Not for a release of an idle key.
    pub fn attach_join_ahead(&mut self, request_id: Id, lease_size: u64, now_ms: u64) {
        if self.pending.as_ref().is_none_or(|p| p.join_next.is_some()) {
            return;
        }
        let join = self.join_ahead(request_id, lease_size, now_ms);
        if let Some(pending) = self.pending.as_mut() {
            pending.join_next = join;
        }
    }

    /// The raise the surplus check asked for, if any, as a pool ask's
    /// (region weight, total): its answer is followed at once by another
    /// surplus check, which retires the region at the need it was raised to.
    pub fn take_retiring_raise(&mut self, now_ms: u64) -> Option<(u64, u64)> {
        let weight = self.asked_weight;
        let state = self.granted.as_mut().filter(|g| now_ms < g.deadline_ms)?;
        let want_total = state.retiring_raise.take()?;
        (weight > 0 && want_total > state.escrow.budget())
            .then(|| (weight, self.holding.wire_want(want_total)))
    }

    /// The release that must be resent before any other pool call.
    pub fn pending_release(&self) -> Option<&PendingRelease<Id>> {
        self.pending.as_ref()
    }

    /// Settles the pending release with the coordinator's answer.
    pub fn on_release_answer(&mut self, answer: ReleaseAnswer) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        let Some(state) = self.granted.as_mut().filter(|g| g.window == pending.window) else {
            return;
        };
        if self.holding.window() != Some(pending.window) {
            return;
        }
        match answer {
            ReleaseAnswer::Released {
                released,
                granted_total,
            } => {
                self.holding.on_released(released, granted_total);
                state.retired = true;
            }
            ReleaseAnswer::StaleTotal { granted_total } => {
                // Nothing changed at the coordinator: the key holds what it
                // held (another holder moved the region's total).
                self.holding.on_stale(granted_total);
                state
                    .escrow
                    .observe_grant(pending.window, self.holding.own());
            }
            ReleaseAnswer::WindowEnded => {}
        }
    }

    /// Drops the pending release after a definitive refusal (not applied,
    /// or never applied again): the budget stays at what was kept until
    /// the pool answers a grant.
    pub fn on_release_refused(&mut self) {
        self.pending = None;
    }
}
