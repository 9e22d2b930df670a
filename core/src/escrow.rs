//! The escrow of one region for one key (L2), sans IO.
//!
//! The escrow holds credits the coordinator granted for one window and
//! serves them to the region's clients. Rules:
//! - At most one coordinator lease in flight: [`RegionEscrow::send_lease`]
//!   returns a [`LeaseTicket`] only when none is outstanding, so concurrent
//!   shortages wait on it; its grant is credited exactly once, by
//!   [`RegionEscrow::on_grant_for`] with that ticket's id. A grant for any
//!   other id (a duplicate delivery, a lease already given up) is ignored:
//!   neither credited nor returned, which can only strand capacity. The caller
//!   reports each ticket's outcome once, by its id: a grant
//!   ([`RegionEscrow::on_grant_for`]), a failure
//!   ([`RegionEscrow::on_lease_failed_for`]) or a refusal
//!   ([`RegionEscrow::on_lease_refused_for`]).
//! - A refused lease (the coordinator answered with an error about the
//!   request itself — no policy, a wrong key kind, an invalid argument) is
//!   cleared so the next shortage may send a lease at once: it is neither a
//!   failure nor an outage (no probe interval, `leases_failed` unchanged,
//!   and as an answer it ends an outage in progress), nor a grant (nothing
//!   credited, the window not marked exhausted). It stays counted in
//!   `leases_sent` only.
//! - Credits die with their window, on the coordinator's timeline, by the
//!   rule every tier shares ([`crate::window_credit`]): the local deadline is
//!   the monotonic time the lease was *sent* plus the remaining lifetime the
//!   coordinator returned (DESIGN §4). Nothing is served at or after it, and
//!   what is served carries the lifetime that remains.
//! - A grant for a newer window replaces the held credits (the old window is
//!   over on the coordinator); one for the window held joins them under the
//!   earlier deadline. A grant that arrives already dead, or for an older
//!   window than the one held, is not credited: the escrow hands it back to
//!   its own window ([`Reconcile`]), which the coordinator forfeits or
//!   credits. (Dead credits are forgotten, so only live ones are "held".)
//! - Idle credits can be returned early while their window is current.
//! - Outage ([`OutageGate`], the same rules for fair keys): after a failed
//!   lease the escrow probes one call at a time, never per request — the
//!   first a sixteenth of `probe_interval_ms` later, each wait doubling up
//!   to the interval, then one per interval. `fail_closed`
//!   serves what it holds, then denies with a retry hint; `fallback`
//!   additionally admits up to a static share per window while the
//!   coordinator is unreachable.
//! - Lease size: `max(shortage, sizer.size())` where the [`LeaseSizer`] is a
//!   fixed batch or the online EOQ learner; the escrow feeds it the tokens it
//!   served in each window when it first serves from a newer one (windows in
//!   which nothing was served are not observed).
//! - Per-window warm start (learning sizers only): the first lease of a
//!   window that directly follows one this escrow held credits for asks for
//!   at least what the region kept of that window (served minus taken
//!   back), capped by the sizer's largest size — steady demand is leased in
//!   one call per window instead of a ramp of batches.
//! - Exhausted windows: a grant of fewer tokens than asked (0 included)
//!   means the window had no more left (a counter grant is
//!   `min(asked, what is left)`); the escrow does not ask again before that
//!   window's deadline — no coordinator call just to hear "nothing left".
//!   Credits another region hands back later in that window go to regions
//!   still asking; this one asks again in the next window.
//!
//! - Fair throttle (optional, per key): [`EscrowFairGate`] runs before these
//!   rules and can only turn an admission into a denial.
//!
//! [`machine::KeyMachine`] puts one key's rules together — counter and fair
//! keys, tenants, outage policies, shadow, throttle, reclaim and sizing —
//! behind one `handle(event, now) → actions`, which the node's key actor
//! and simulations both drive.
//!
//! Times here are the caller's monotonic milliseconds; window bounds are the
//! coordinator's epoch milliseconds and are only compared with each other.
//! The one exception is the outage fallback, which has no coordinator window
//! and labels what it serves by the caller's wall-clock window.

use crate::policy::OutagePolicy;
use crate::sizer::LeaseSizer;
use crate::window_credit::{grant_fate, local_deadline, ArrivingGrant, GrantFate, HeldWindow};

mod types;

mod holders;

mod fair_gate;

mod outage_gate;

mod fair_key;

mod pool_holding;

pub mod machine;

pub use fair_key::{
    FairKey, FairStep, JoinAhead, PendingRelease, PoolAnswer, ReleaseAnswer, WEIGHT_SCALE,
};
pub use outage_gate::OutageGate;
pub use pool_holding::PoolHolding;

pub use fair_gate::{EscrowFairGate, FairGateCounters, GateVerdict};

pub use holders::{
    AcquireTicket, Admission, Fingerprint, Holder, HolderBook, HolderCounters, HolderHeld,
    HolderLimits, HolderRefusal, ReturnClaim, ReturnSettled,
};
pub use types::{CoordinatorGrant, EscrowCounters, EscrowStatus, LeaseTicket, Reconcile, Served};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    window_start_ms: u64,
    window_end_ms: u64,
    balance: u64,
    deadline_ms: u64,
    /// Tokens served to clients from this window's credits.
    served: u64,
    /// Tokens clients gave back into this window (≤ `served`).
    taken_back: u64,
}

/// The last window this escrow held credits for, once its credits are gone:
/// what the warm start of the next window reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ClosedWindow {
    /// Local deadline of its credits.
    deadline_ms: u64,
    /// Its length.
    window_ms: u64,
    /// Served minus taken back.
    kept: u64,
}

/// One region's escrow of one key.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionEscrow {
    sizer: LeaseSizer,
    outage: OutageGate,
    held: Option<Held>,
    in_flight: Option<LeaseTicket>,
    next_lease_id: u64,
    /// (window start, tokens served in it) for the sizer.
    served_window: Option<(u64, u64)>,
    /// The window whose credits were held last, for the warm start.
    closed: Option<ClosedWindow>,
    /// Local deadline of a window the coordinator said is exhausted.
    exhausted_until_ms: Option<u64>,
    counters: EscrowCounters,
}

impl RegionEscrow {
    /// An empty escrow leasing `batch` tokens at a time (at least 1).
    pub fn new(batch: u64, probe_interval_ms: u64, outage_policy: OutagePolicy) -> Self {
        Self::with_sizer(LeaseSizer::Fixed(batch), probe_interval_ms, outage_policy)
    }

    /// An empty escrow whose lease size comes from `sizer`. After a failed
    /// lease it asks again at most once per `probe_interval_ms` (≥ 1).
    pub fn with_sizer(
        sizer: LeaseSizer,
        probe_interval_ms: u64,
        outage_policy: OutagePolicy,
    ) -> Self {
        RegionEscrow {
            sizer,
            outage: OutageGate::new(probe_interval_ms, outage_policy),
            held: None,
            in_flight: None,
            next_lease_id: 0,
            served_window: None,
            closed: None,
            exhausted_until_ms: None,
            counters: EscrowCounters::default(),
        }
    }

    /// A forecast of the demand (tokens) of this key's next window — the
    /// one after the window being served, or the first if none has been —
    /// for a predictive sizer, which gets it when that window starts.
    /// Returns whether the sizer takes forecasts (only the predictive one).
    pub fn forecast(&mut self, demand: u64) -> bool {
        self.sizer.forecast(demand, self.served_window.is_some())
    }

    /// Changes the outage policy (a policy update from the coordinator).
    pub fn set_outage_policy(&mut self, outage_policy: OutagePolicy) {
        self.outage.set_policy(outage_policy);
    }

    /// The lease size the sizer recommends now (≥ 1).
    pub fn lease_size(&self) -> u64 {
        self.sizer.size()
    }

    /// A snapshot for status pages (expired credits are dropped first).
    pub fn status(&mut self, now_ms: u64) -> EscrowStatus {
        self.expire(now_ms);
        EscrowStatus {
            balance: self.held.map_or(0, |h| h.balance),
            window_start_ms: self.held.map(|h| h.window_start_ms),
            remaining_lifetime_ms: self
                .held
                .map_or(0, |h| h.deadline_ms.saturating_sub(now_ms)),
            lease_in_flight: self.in_flight.is_some(),
            coordinator_unreachable: self.coordinator_unreachable(),
            lease_size: self.lease_size(),
            counters: self.counters(),
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> EscrowCounters {
        EscrowCounters {
            outage_denials: self.outage.outage_denials(),
            fallback_tokens: self.outage.fallback_tokens(),
            ..self.counters
        }
    }

    /// The key's outage state, for calls this escrow does not make itself
    /// (a fair key's pool grants follow the same probe cadence and outage
    /// policy, and count into the same counters).
    pub fn outage_mut(&mut self) -> &mut OutageGate {
        &mut self.outage
    }

    /// Whether the last lease failed and no grant has arrived since.
    pub fn coordinator_unreachable(&self) -> bool {
        self.outage.is_unreachable()
    }

    /// Credits usable at `now_ms` (expired ones are dropped first).
    pub fn balance(&mut self, now_ms: u64) -> u64 {
        self.expire(now_ms);
        self.held.map_or(0, |h| h.balance)
    }

    fn expire(&mut self, now_ms: u64) {
        if let Some(h) = self.held {
            if now_ms >= h.deadline_ms {
                self.counters.tokens_expired += h.balance;
                self.close(h);
                self.held = None;
            }
        }
    }

    /// Remembers `h`'s window for the next window's warm start.
    fn close(&mut self, h: Held) {
        self.closed = Some(ClosedWindow {
            deadline_ms: h.deadline_ms,
            window_ms: h.window_end_ms.saturating_sub(h.window_start_ms),
            kept: h.served.saturating_sub(h.taken_back),
        });
    }

    /// Tokens the first lease of a new window should ask for at least: what
    /// the region kept of the window just before (0 while credits are held,
    /// when the last window is not the one just before, or when the sizer
    /// does not learn).
    fn warm_start(&self, now_ms: u64) -> u64 {
        match (self.held, self.closed) {
            (None, Some(closed))
                if now_ms < closed.deadline_ms.saturating_add(closed.window_ms) =>
            {
                self.sizer.warm_start(closed.kept)
            }
            _ => 0,
        }
    }

    /// Serves up to `tokens` from held credits.
    pub fn serve(&mut self, tokens: u64, now_ms: u64) -> Option<Served> {
        self.expire(now_ms);
        let h = self.held.as_mut()?;
        let granted = tokens.min(h.balance);
        if granted == 0 {
            return None;
        }
        h.balance -= granted;
        // Never wraps: Σ served ≤ Σ credited + Σ taken back, and each
        // taken-back token was served first; saturation would only lower
        // what may come back.
        h.served = h.served.saturating_add(granted);
        let (window_start_ms, window_end_ms, deadline_ms, held_after) =
            (h.window_start_ms, h.window_end_ms, h.deadline_ms, h.balance);
        self.counters.tokens_served += granted;
        self.note_demand(window_start_ms, granted);
        Some(Served {
            granted,
            window_start_ms,
            window_end_ms,
            remaining_lifetime_ms: deadline_ms - now_ms,
            from_fallback: false,
            held_after,
        })
    }

    /// Counts served demand per window; a newer window closes the previous
    /// one for the sizer.
    fn note_demand(&mut self, window_start_ms: u64, tokens: u64) {
        match self.served_window {
            Some((w, served)) if w == window_start_ms => {
                self.served_window = Some((w, served.saturating_add(tokens)));
            }
            Some((w, served)) if w < window_start_ms => {
                self.sizer.observe(served);
                self.served_window = Some((window_start_ms, tokens));
            }
            Some(_) => {}
            None => self.served_window = Some((window_start_ms, tokens)),
        }
    }

    /// The lease to send now for a shortage of `want` tokens, if any: none
    /// while one is in flight, or while an outage waits for its next probe.
    /// Its size is `max(want, lease_size())`. The caller must report the
    /// result with [`on_grant_for`](Self::on_grant_for),
    /// [`on_lease_failed_for`](Self::on_lease_failed_for) or
    /// [`on_lease_refused_for`](Self::on_lease_refused_for) and the ticket's
    /// id.
    pub fn send_lease(&mut self, want: u64, now_ms: u64) -> Option<LeaseTicket> {
        if self.in_flight.is_some() {
            return None;
        }
        match self.exhausted_until_ms {
            Some(until) if now_ms < until => return None,
            Some(_) => self.exhausted_until_ms = None,
            None => {}
        }
        if !self.outage.may_call(now_ms) {
            return None;
        }
        self.expire(now_ms);
        self.next_lease_id += 1;
        let ticket = LeaseTicket {
            id: self.next_lease_id,
            tokens: want.max(self.sizer.size()).max(self.warm_start(now_ms)),
            sent_at_ms: now_ms,
        };
        self.in_flight = Some(ticket);
        self.counters.leases_sent += 1;
        Some(ticket)
    }

    /// Whether a lease is outstanding.
    pub fn lease_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// A grant arrived for lease `lease_id`. Credits it once, or returns it
    /// to its own window when the shared rule
    /// ([`grant_fate`]) does not credit it
    /// (arrived at or after its deadline, or for an older window than the
    /// one held). A grant for a lease that is not outstanding is ignored and
    /// counted.
    pub fn on_grant_for(
        &mut self,
        lease_id: u64,
        grant: CoordinatorGrant,
        now_ms: u64,
    ) -> Option<Reconcile> {
        let (sent_at_ms, asked) = match self.in_flight {
            Some(ticket) if ticket.id == lease_id => (ticket.sent_at_ms, ticket.tokens),
            _ => {
                self.counters.unexpected_grants += 1;
                self.counters.tokens_not_credited += grant.granted;
                return None;
            }
        };
        self.in_flight = None;
        self.outage.on_answer();
        self.expire(now_ms);
        let deadline_ms = local_deadline(sent_at_ms, grant.remaining_lifetime_ms);
        if grant.granted < asked && now_ms < deadline_ms {
            self.exhausted_until_ms = Some(deadline_ms);
        }
        if grant.granted == 0 {
            return None;
        }
        let held = self.held.map(|h| HeldWindow {
            window_start_ms: h.window_start_ms,
            deadline: h.deadline_ms,
        });
        let arriving = ArrivingGrant {
            window_start_ms: grant.window_start_ms,
            sent_at: sent_at_ms,
            remaining_lifetime_ms: grant.remaining_lifetime_ms,
        };
        let not_credited = Reconcile {
            window_start_ms: grant.window_start_ms,
            leftover: grant.granted,
        };
        match (grant_fate(held, arriving, now_ms), self.held.as_mut()) {
            (GrantFate::OlderWindow | GrantFate::Late, _) => {
                self.counters.tokens_not_credited += grant.granted;
                return Some(not_credited);
            }
            (GrantFate::SameWindow { deadline }, Some(h)) => {
                let Some(balance) = h.balance.checked_add(grant.granted) else {
                    // Cannot happen with grants ≤ L; refusing to credit is safe.
                    self.counters.tokens_not_credited += grant.granted;
                    return Some(not_credited);
                };
                h.balance = balance;
                h.deadline_ms = deadline;
                self.counters.tokens_credited += grant.granted;
            }
            (GrantFate::SameWindow { deadline } | GrantFate::NewWindow { deadline }, _) => {
                self.counters.tokens_credited += grant.granted;
                if let Some(old) = self.held {
                    self.counters.tokens_expired += old.balance;
                    self.close(old);
                }
                self.held = Some(Held {
                    window_start_ms: grant.window_start_ms,
                    window_end_ms: grant.window_end_ms,
                    balance: grant.granted,
                    deadline_ms: deadline,
                    served: 0,
                    taken_back: 0,
                });
            }
        }
        None
    }

    /// Lease `lease_id` failed (unreachable, timeout, no quorum): the
    /// coordinator counts as unreachable and is probed again only after
    /// `probe_interval_ms`. Ignored if that lease is not outstanding.
    pub fn on_lease_failed_for(&mut self, lease_id: u64, now_ms: u64) {
        if self.in_flight.map(|t| t.id) != Some(lease_id) {
            return;
        }
        self.in_flight = None;
        self.counters.leases_failed += 1;
        self.outage.on_failure(now_ms);
    }

    /// The coordinator refused lease `lease_id` (no policy for the key, a
    /// wrong key kind, an invalid argument): the lease is cleared, so the
    /// next shortage may send one at once. Not a failure — no probe
    /// interval, `leases_failed` unchanged — and, being an answer, it ends
    /// an outage in progress; nothing is credited and the window is not
    /// marked exhausted; credits dead at `now_ms` are dropped, as on a
    /// grant. Ignored if that lease is not outstanding.
    pub fn on_lease_refused_for(&mut self, lease_id: u64, now_ms: u64) {
        if self.in_flight.map(|t| t.id) != Some(lease_id) {
            return;
        }
        self.in_flight = None;
        self.outage.on_answer();
        self.expire(now_ms);
    }

    /// While the coordinator is unreachable: serve from the fallback share
    /// (policy `fallback`) for the caller's wall-clock window containing
    /// `wall_now_ms`, with the lifetime left in that window, or count a
    /// denial (`fail_closed`).
    pub fn serve_outage_at(
        &mut self,
        tokens: u64,
        wall_now_ms: u64,
        window_ms: u64,
    ) -> Option<Served> {
        self.outage.serve_at(tokens, wall_now_ms, window_ms)
    }

    /// Credits a shadow policy hands out where this escrow would deny
    /// (see [`crate::shadow`]): `tokens` for the rest of the caller's
    /// wall-clock window containing `wall_now_ms`, like fallback credits —
    /// not from a coordinator grant, never taken back, never counted in the
    /// escrow's balance.
    pub fn serve_shadow_at(tokens: u64, wall_now_ms: u64, window_ms: u64) -> Served {
        let window_ms = window_ms.max(1);
        let start = wall_now_ms - wall_now_ms % window_ms;
        let end = start.saturating_add(window_ms);
        Served {
            granted: tokens,
            window_start_ms: start,
            window_end_ms: end,
            remaining_lifetime_ms: end - wall_now_ms,
            from_fallback: true,
            held_after: 0,
        }
    }

    /// Takes back up to `tokens` returned for `window_start_ms` and returns
    /// how many were accepted: only while that window's credits are alive
    /// here, and never more than this escrow served from that window minus
    /// what already came back. So whatever any caller claims, Σ served −
    /// Σ taken back ≥ 0 per window and the balance never exceeds what the
    /// coordinator credited. The rest is refused and counted
    /// (`return_tokens_refused`). Callers that serve several holders cap
    /// each holder first ([`HolderBook`]); this is the region-wide cap.
    pub fn take_back(&mut self, tokens: u64, window_start_ms: u64, now_ms: u64) -> u64 {
        self.expire(now_ms);
        let accepted = match self.held.as_mut() {
            Some(h) if h.window_start_ms == window_start_ms => {
                let outstanding = h.served.saturating_sub(h.taken_back);
                let accepted = tokens.min(outstanding);
                match (
                    h.balance.checked_add(accepted),
                    h.taken_back.checked_add(accepted),
                ) {
                    (Some(balance), Some(taken_back)) => {
                        h.balance = balance;
                        h.taken_back = taken_back;
                        accepted
                    }
                    _ => 0,
                }
            }
            _ => 0,
        };
        self.counters.tokens_taken_back = self.counters.tokens_taken_back.saturating_add(accepted);
        self.counters.return_tokens_refused = self
            .counters
            .return_tokens_refused
            .saturating_add(tokens - accepted);
        accepted
    }

    /// Hands every held credit back to the coordinator (idle return or
    /// eviction). Returns what to reconcile, if anything.
    pub fn return_all(&mut self, now_ms: u64) -> Option<Reconcile> {
        self.expire(now_ms);
        let h = self.held.take()?;
        self.counters.tokens_returned += h.balance;
        (h.balance > 0).then_some(Reconcile {
            window_start_ms: h.window_start_ms,
            leftover: h.balance,
        })
    }

    /// Milliseconds until the next probe may be sent (0 when it may now).
    pub fn retry_after_ms(&self, now_ms: u64) -> u64 {
        if let Some(until) = self.exhausted_until_ms.filter(|until| now_ms < *until) {
            return until - now_ms;
        }
        self.outage.retry_after_ms(now_ms).unwrap_or_else(|| {
            self.held
                .map_or(1, |h| h.deadline_ms.saturating_sub(now_ms).max(1))
        })
    }
}

#[cfg(test)]
mod tests;
