//! One `fair` key at an escrow node, sans IO: the region's pool grant for
//! the current window, the weighted-fair split of it among tenants
//! ([`WeightedFairEscrow`]), how much to ask the region fair pool for and
//! when, and reclaim (`PoolRelease`).
//!
//! The caller (the node's key actor, or a simulation) performs what a
//! decision asks for — a `PoolGrant` or a `PoolRelease` — and feeds the
//! answer back; this module never waits and never reads a clock.
//!
//! Rules:
//! - **Deadline**: a pool grant lives until the local monotonic time the
//!   call was sent plus the lifetime the coordinator returned; without a
//!   live grant the key must join the pool again ([`FairStep::Join`]) —
//!   but not before the leader's window has rolled: for the round trip of
//!   the call that set the deadline (at most a fiftieth of the window)
//!   after it, requests are denied until then instead of joining (a join
//!   sent earlier would be answered for the window that is ending).
//! - **Warm start**: a key that held a grant in the window right before
//!   expects to need `min(previous admissions + step, previous guarantee)`
//!   — its guarantee being what the pool reserved for it as of its last
//!   answer ([`PoolStanding`]), scaled by the region weight it joins with
//!   over the weight that guarantee was computed with (a tenant's demand
//!   split moves weight between regions, leaving the sum as it was). When
//!   that guarantee was the leader's *expected* one (it counted the
//!   regions of the window before that had not asked yet:
//!   [`crate::pool::roster`]), it was the region's share among all of them
//!   and the key joins for the whole of it — asking a hundredth of L
//!   beyond, since the scaled guarantee drifts by a few tokens a window
//!   with the demand split and the leader caps the ask at the expected
//!   ceiling anyway: steady demand costs one pool call per window.
//!   Otherwise (a leader that did not say: after a leader
//!   change, an older leader) a guarantee heard early in a window, before
//!   other regions joined, can be too large: a join of the whole would let
//!   the first region of a window take what regions joining a moment later
//!   are owed (the demo's weighted shares then drift by 7–15 %), so the
//!   key joins for half of it and asks for the rest with its next ask, by
//!   when the others have joined and the pool's ceiling protects them. The
//!   join declares the region's weight as the requester's plus the other
//!   tenants of that window. A key without such a history joins for the
//!   request's need alone.
//! - **Batching**: when short, the key asks for a batch beyond the need,
//!   never beyond L: the largest of `lease_size`, a quarter of what the
//!   key admitted in the previous window (`step`) and half its budget.
//! - **Ceiling**: a grant of less than asked, or a grant that the answer's
//!   standing (the expected one when the leader said) puts within `L / 200`
//!   of all the region could hold now (`ceiling ≤ granted + L / 200`: the
//!   pool's rounding is not worth a call), means the region is at its fair
//!   ceiling: the key denies without asking until `re_ask_ms` later (other
//!   regions may release meanwhile), twice as long after each look that
//!   raised nothing — a count that carries into the next window, so a
//!   region held at its share by steady competition stops looking every
//!   window — and says so in `retry_after_ms`. A look that raises the
//!   total by more than the rounding resets the count. When only regions
//!   the leader still expects hold it back (expected ceiling below the
//!   plain one), the key looks again once the leader stops expecting them
//!   (a quarter window in, plus a hundredth for the clocks): a region that
//!   did not come leaves its share to the others.
//! - **Part serves**: unless the request is whole-or-nothing (a `Check`),
//!   a request that cannot have all it asks for is admitted for what the
//!   tenant may still take ([`WeightedFairEscrow::admissible`]), so credits
//!   are not left in the window for want of a full batch.
//! - **Reclaim**: only a key that holds something back releases: tokens
//!   granted and not admitted, or a guarantee above its total (a key that
//!   spent its whole grant at its share has nothing to give). An idle key
//!   keeps what it admitted. Once a window, a quarter in (when the leader
//!   stops expecting regions, plus a hundredth; never before), a busy key
//!   checks its
//!   *surplus*: at its pace so far it will need
//!   `used + used · left / elapsed · 9/8 + max(used / 16, 2)`;
//!   it releases keeping that when it holds a hundredth of L more, or
//!   when the pool reserves a guarantee that much above both the need and
//!   its total while its total nearly covers the need (within a
//!   hundredth of L). A key whose pace needs more than it holds while its
//!   guarantee lies a hundredth of L above that need first *raises* its
//!   total to the need ([`FairKey::take_retiring_raise`], once a window)
//!   and then retires at it: retiring at less would leave it short (once
//!   retired, it could not get its guarantee back), keeping its weight
//!   would keep the whole guarantee reserved for a region that will not
//!   use it. Every key checks once more an eighth of the window before
//!   its end (the *late check*, plus a hundredth for the clocks) and hands
//!   back what it holds beyond its need then (any token, when the release
//!   carries the key's join ahead — a call it makes anyway) — for a
//!   retired key, what is left of its margin, for a key raised since the first check, what the
//!   raise brought beyond its need (checked then, not at once: a batch
//!   asked for would be handed straight back); the rest of the window is
//!   short by then and its count close to its mean, so the need there is
//!   `rest = used · left / elapsed` with no margin (a margin is lost to
//!   the window whenever the count falls short of it; a key whose count
//!   runs above the mean asks again).
//!   A key denied at the pool's ceiling in the window hands nothing back
//!   at either check: its pace is what it was let have, not what it
//!   wants. Regions at their ceiling while others hold reserves they do
//!   not use (`reserved_unheld`) look again just after the first check;
//!   one whose look raised its total, or that heard retired regions keep
//!   a twentieth of L or more (`retired_kept`: their margins), looks once
//!   more just after the late check, and not in between. Every region at
//!   its ceiling that has not joined the next window ahead looks just
//!   after the late check (at the latest), whatever its backoff: the look
//!   carries its join ahead, a call it would make at the next window's
//!   start anyway, and finds the margins handed back at the late checks.
//!   Once joined ahead, a region looks then only when it is likely to
//!   pay: its late look raised its total in the window before, or its
//!   answer says regions handed back a hundredth of L or more in the last
//!   quarter of one of the two windows before (`late_released_before`:
//!   the leader remembers it).
//!   From the window's first quarter on, an ask's batch is capped at what
//!   the key admits by the window's end at its pace so far (the first
//!   surplus check's need): tokens beyond it would sit unspent at the end
//!   while regions at their ceiling go without; a key whose demand runs
//!   faster asks again. A region that joined the next window ahead
//!   (retired or not) and has no request in it by that window's first
//!   surplus check hands the grant joined ahead back then (keeping the 2
//!   tokens the need of no pace has), as one that joined at the start and
//!   fell quiet would.
//!   [`FairKey::begin_release`] lowers the budget to what was
//!   admitted *before* the release is sent, and the release stays pending
//!   until a definitive answer; the caller must resend it (same request id)
//!   before any other pool call ([`FairKey::pending_release`]): a grant
//!   answered between a lost release and its retry could otherwise be
//!   released under the key. A `STALE_TOTAL` answer (another holder of the
//!   region moved its total, or a grant's answer was lost) releases
//!   nothing: the key's budget goes back to what it holds, and it learns
//!   the region's total; `RELEASED` marks the key retired until its next
//!   ask.
//! - **Holdings**: the key spends what its own calls were granted — the
//!   sum of their increments less what it released — never the region's
//!   total, which other holders (another escrow node of the region, an
//!   earlier process of this one) may hold and have spent. Its rules think
//!   in its own totals; [`PoolHolding`] turns asks and releases into the
//!   region's totals on the wire and answers back (ADR 0020). A new key
//!   state holds nothing of the window it joins.
//! - **Joins ahead**: from the late check on, the key's next pool call —
//!   the late check's release, a look or an ask — carries its join of the
//!   next window ([`FairKey::join_ahead`]: once a window, for a key that
//!   admitted something). It asks the warm start with
//!   the admissions projected to the window's end at the key's pace, or,
//!   when the pace needs well under the key's share (the first surplus
//!   check's need, a hundredth of L below it, and not held back at the
//!   ceiling), joins *retired* at that need: weight 0 from the start, so
//!   the regions still asking find the rest at once and nothing is handed
//!   back a quarter in. The answer ([`FairKey::on_ahead_answer`]) becomes
//!   the key's grant once the live one expires — no join call — but not
//!   before the answer's arrival plus what was left of the live window
//!   when it was applied (the next window has surely begun at the
//!   coordinator then; requests are denied until it has). The join
//!   carries the live window's demand report (the counts so far,
//!   projected to the window's end: the key makes no call at the next
//!   window's start, where it would report the window that ended), and
//!   the key reports those same counts for that window afterwards; it
//!   declares the region weight of the split a join at the next window's
//!   start would freeze, which the grant joined ahead then holds.
//! - **Demand split**: the key counts what each tenant asks for per window
//!   ([`FairKey::note_demand`]), reports the last ended window's counts with
//!   its pool asks ([`FairKey::demand_report`]; a join reports the window
//!   that just ended, a join ahead the live one) and learns each tenant's total over all regions for
//!   the window before that one ([`FairKey::on_tenant_demands`], the
//!   *settled* totals of [`crate::pool::demand_board`]: every region active then
//!   has reported it with its first call since or its join ahead, where
//!   the latest window's
//!   totals still miss the regions that have not asked yet — and with one
//!   call per window, a region joining early would never hear the rest).
//!   A tenant declared with weight `w` then weighs `w · d_{t,r} / d_t`
//!   here, over that settled window (its share of its own demand), in
//!   thousandths ([`WEIGHT_SCALE`]) so the split stays exact: a tenant
//!   active in several regions is not served k-fold. Without totals a
//!   tenant weighs its full weight, as before. Weights are hints for
//!   fairness; no weight can make the pool grant past L. The split a key
//!   joins a window with holds for the whole window (totals a join's
//!   answer brings weigh from the next join on): the region weight the
//!   join declared — each tenant of the window before at the weight it
//!   last declared, split anew — and the tenants' weights inside the
//!   region then agree, in every region alike, whether it joined at the
//!   window's start or ahead.

use std::collections::BTreeMap;

use crate::decision::Decision;
use crate::ids::TenantId;
use crate::pool::demand_board::MAX_REPORTED_TENANTS;
use crate::pool::fair_pool::PoolStanding;
use crate::pool::roster::EXPECTATION_SHARE;
use crate::wfe::{RecordedAsk, WeightedFairEscrow};
use crate::window::WindowBounds;

use super::{PoolHolding, Served};

/// Tenant and region weights are used in thousandths of the declared
/// weight, so that a demand-proportional share keeps three digits.
pub const WEIGHT_SCALE: u64 = 1_000;

/// What a decision needs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FairStep {
    /// Admitted: hand out these credits.
    Admit {
        /// The credits.
        served: Served,
        /// The tenant's ceiling in the window.
        limit: u64,
    },
    /// Denied by the weighted-fair rules or the pool ceiling.
    Deny {
        /// When asking again may help, ms.
        retry_after_ms: u64,
        /// The tenant's ceiling in the window.
        limit: u64,
        /// End of the window (coordinator ms).
        window_end_ms: u64,
    },
    /// No live grant: join the pool with this ask (or, unreachable, follow
    /// the key's outage policy), then decide again.
    Join {
        /// The region's weight.
        region_weight: u64,
        /// The total to ask for.
        want_total: u64,
    },
    /// Short of budget: ask the pool for this total, then decide again.
    Ask {
        /// The region's weight.
        region_weight: u64,
        /// The total to ask for.
        want_total: u64,
    },
}

/// A pool grant as answered by the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolAnswer {
    /// The region's total for the window: what every holder of the
    /// region holds there (see [`PoolHolding`]).
    pub granted_total: u64,
    /// What the call added to the region's total: this holder's part.
    pub granted_increment: u64,
    /// The key's limit.
    pub limit: u64,
    /// The window.
    pub window: WindowBounds,
    /// The window's remaining lifetime, counted from the send.
    pub remaining_lifetime_ms: u64,
    /// Where the region stands in the pool after the grant, when the
    /// coordinator said.
    pub standing: Option<PoolStanding>,
    /// The same, also counting the regions the leader expects to join the
    /// window early on ([`crate::pool::roster`]), when it said.
    pub expected: Option<PoolStanding>,
    /// What the pool reserves for the other regions beyond what they hold
    /// (0 when the leader did not say).
    pub reserved_unheld: u64,
    /// What the other regions that retired from the window keep (0 when
    /// the leader did not say).
    pub retired_kept: u64,
    /// The most regions handed back in the last quarter of one of the two
    /// windows before (0 when the leader did not say).
    pub late_released_before: u64,
}

/// A pool release as answered by the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseAnswer {
    /// Applied: `released` tokens went back to the pool.
    Released {
        /// Tokens handed back.
        released: u64,
        /// The region's total after the release.
        granted_total: u64,
    },
    /// Not applied: the region's total is `granted_total`.
    StaleTotal {
        /// The region's real total.
        granted_total: u64,
    },
    /// Not applied: the window is over.
    WindowEnded,
}

/// A release sent and not yet definitively answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingRelease<Id> {
    /// Its request id: every resend carries it.
    pub request_id: Id,
    /// The region's total as the key knew it.
    pub from_total: u64,
    /// What the key keeps (what it admitted).
    pub keep_total: u64,
    /// The window of those totals.
    pub window: WindowBounds,
    /// The join of the next window the release carries (every resend
    /// carries the same), if any.
    pub join_next: Option<JoinAhead<Id>>,
}

/// A join of the key's next window carried by a pool call late in the
/// live one (the proto's `NextWindowJoin`; see [`FairKey::join_ahead`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinAhead<Id> {
    /// Its own request id.
    pub request_id: Id,
    /// The region's weight.
    pub region_weight: u64,
    /// The total asked for in the next window.
    pub want_total: u64,
    /// How much more than the region holds there this holder asks for:
    /// all of `want_total`, as it holds nothing there yet (the wire's
    /// `NextWindowJoin.want_more`; the region's other holders may have
    /// joined already).
    pub want_more: u64,
    /// The next window's start (the live window's end).
    pub window_start_ms: u64,
    /// Join retired: hold the total granted and reserve nothing beyond it.
    pub retire: bool,
    /// The key's demand report of the live window: each tenant's demand
    /// so far, projected to the window's end.
    pub demands: Vec<(TenantId, u64)>,
}

/// A join ahead, answered: the grant in the next window, adopted when the
/// live grant expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AheadGrant {
    /// The answer in this holder's own totals.
    answer: PoolAnswer,
    /// What this holder holds of the region's total there.
    holding: PoolHolding,
    /// Whether the join retired the region at its total.
    retired: bool,
    want_total: u64,
    sent_ms: u64,
    received_ms: u64,
    re_ask_ms: u64,
}

impl AheadGrant {
    /// The joined window's length.
    fn window_ms(&self) -> u64 {
        let window = self.answer.window;
        window.end_ms.saturating_sub(window.start_ms)
    }

    /// From when, on the monotonic clock here, the next window has
    /// certainly started at the coordinator: the answer's arrival plus
    /// what was left of the live window when the join was applied.
    fn starts_at_ms(&self) -> u64 {
        self.received_ms.saturating_add(
            self.answer
                .remaining_lifetime_ms
                .saturating_sub(self.window_ms()),
        )
    }

    /// When, on the monotonic clock here, the joined window's first
    /// quarter is over (its surplus check: [`Granted::expectation_ends_ms`]
    /// of the grant it becomes), and not before it has started.
    fn expectation_ends_ms(&self) -> u64 {
        let deadline_ms = self
            .sent_ms
            .saturating_add(self.answer.remaining_lifetime_ms);
        expectation_ends_ms(deadline_ms, self.window_ms()).max(self.starts_at_ms())
    }
}

/// When, on the monotonic clock here, the leader stops expecting regions
/// in a window of `window_ms` whose grant dies at `deadline_ms`: its first
/// quarter, plus a hundredth of it for the clocks.
fn expectation_ends_ms(deadline_ms: u64, window_ms: u64) -> u64 {
    let expecting_for = window_ms - window_ms / EXPECTATION_SHARE;
    deadline_ms
        .saturating_sub(expecting_for)
        .saturating_add(window_ms / 100)
}

#[derive(Debug, Clone)]
struct Granted {
    escrow: WeightedFairEscrow,
    window: WindowBounds,
    deadline_ms: u64,
    exhausted_until_ms: u64,
    /// The region's guarantee as of the latest answer in this window.
    guarantee: Option<u64>,
    /// Whether that guarantee counted the regions the leader expected
    /// (so it is the region's share among all of them, not only among
    /// those that had asked by then).
    guarantee_counts_expected: bool,
    /// The region weight that guarantee was computed with.
    guarantee_weight: u64,
    /// The round trip of the call whose answer set the deadline: the
    /// leader's window ends up to that much after the deadline here.
    round_trip_ms: u64,
    /// Whether this window's surplus check (see [`FairKey::release_at`])
    /// has run.
    surplus_checked: bool,
    /// A raise to the projected need, to retire at it (see
    /// [`FairKey::take_retiring_raise`]): waiting to be sent, and whether
    /// one went out in this window (once a window).
    retiring_raise: Option<u64>,
    raised_to_retire: bool,
    /// Whether the window's late surplus check (an eighth of the window
    /// before its end) has run.
    late_checked: bool,
    /// Whether a look at the ceiling raised the total in this window:
    /// some region hands back, and may hand back its margin late.
    others_hand_back: bool,
    /// Whether a look after the late check raised the total in this
    /// window: regions hand back margins late, as they likely will in the
    /// next window (carried into its `late_look_paid_before`).
    late_look_raised: bool,
    /// Whether it did in the window before, or the leader said regions
    /// handed back late lately (`late_released_before`): look after the
    /// late check at the latest.
    late_look_paid_before: bool,
    /// Whether a request was denied at the pool's ceiling in this window:
    /// the region's pace so far is what it was let have, not what it
    /// wants, so its late check hands nothing back.
    held_back: bool,
    retired: bool,
}

/// Credits of `granted` tokens in `window`, living `remaining` ms more,
/// with `held_after` of the region's grant still unspent.
fn admitted(
    granted: u64,
    window: WindowBounds,
    remaining: u64,
    limit: u64,
    held_after: u64,
) -> FairStep {
    FairStep::Admit {
        served: Served {
            granted,
            window_start_ms: window.start_ms,
            window_end_ms: window.end_ms,
            remaining_lifetime_ms: remaining,
            from_fallback: false,
            held_after,
        },
        limit,
    }
}

impl Granted {
    /// When, on the monotonic clock here, the leader stops expecting
    /// regions in this window: its first quarter, plus a hundredth of it
    /// for the clocks.
    fn expectation_ends_ms(&self) -> u64 {
        let window_ms = self.window.end_ms.saturating_sub(self.window.start_ms);
        expectation_ends_ms(self.deadline_ms, window_ms)
    }

    /// When, on the monotonic clock here, the late surplus check runs: an
    /// eighth of the window before its end, plus a hundredth for the clocks.
    fn late_check_ms(&self) -> u64 {
        let window_ms = self.window.end_ms.saturating_sub(self.window.start_ms);
        self.deadline_ms
            .saturating_sub(window_ms / 8)
            .saturating_add(window_ms / 100)
    }

    /// At `now_ms`: what the region admitted in the window, the ms of it
    /// gone (at least 1) and the ms left, on the clock here.
    fn pace_at(&self, now_ms: u64) -> (u64, u64, u64) {
        let window_ms = self.window.end_ms.saturating_sub(self.window.start_ms);
        let started = self.deadline_ms.saturating_sub(window_ms);
        let elapsed = now_ms.saturating_sub(started).max(1);
        let left = self.deadline_ms.saturating_sub(now_ms);
        (self.escrow.total_used(), elapsed, left)
    }

    /// What a region that keeps asking at its pace so far still needs
    /// this window at `now_ms`, with a margin: its admissions per ms so
    /// far times the time left (`rest`), plus an eighth, plus a sixteenth
    /// of what it admitted (at least 2 tokens); from the late check on,
    /// `rest` alone.
    fn projected_need(&self, now_ms: u64) -> u64 {
        let (used, elapsed, left) = self.pace_at(now_ms);
        if now_ms >= self.late_check_ms() {
            // Late in the window the rest is short and its count close to
            // its mean: keep the mean. A margin kept here is lost to the
            // window whenever the count falls short of it (half a standard
            // deviation and 2 tokens lost about 4 a light region a window);
            // a region whose count runs above the mean asks again and is
            // served what the pool still has (the regions at their ceiling
            // have taken the rest by then): a few requests at the window's
            // end, against the window's budget left unused.
            let rest = u128::from(used) * u128::from(left) / u128::from(elapsed);
            return u64::try_from(rest).unwrap_or(u64::MAX);
        }
        self.paced_need(now_ms)
    }

    /// What the region will admit in the rest of the window at its pace
    /// so far (at `now_ms`), with a margin: `rest · 9/8 + max(used / 16,
    /// 2)`.
    fn paced_need(&self, now_ms: u64) -> u64 {
        let (used, elapsed, left) = self.pace_at(now_ms);
        let pace = u128::from(used) * u128::from(left) * 9 / 8 / u128::from(elapsed);
        u64::try_from(pace)
            .unwrap_or(u64::MAX)
            .saturating_add((used / 16).max(2))
    }

    /// Whether retiring would hand anything worth a call back (a
    /// hundredth of L): tokens granted and not admitted, or a guarantee (as
    /// last heard) above the region's total that the pool keeps reserving
    /// for it. A region that spent its whole grant at or about its
    /// guarantee — one whose clients only wait out a denial — has nothing
    /// to give and sends no release (retiring would only drop its weight).
    fn holds_back_anything(&self) -> bool {
        let worth = (self.escrow.limit() / 100).max(1);
        let total = self.escrow.budget();
        // (A retired region's guarantee is the one it had before: the pool
        // reserves nothing for it any more.)
        self.escrow.total_used().saturating_add(worth) <= total
            || !self.retired
                && self
                    .guarantee
                    .is_some_and(|g| g >= total.saturating_add(worth))
    }

    /// Whether any token granted is not admitted (what a late release that
    /// carries a join ahead hands back, however few).
    fn holds_unspent_tokens(&self) -> bool {
        self.escrow.total_used() < self.escrow.budget()
    }
}

/// One fair key's state at an escrow node (see the module doc).
#[derive(Debug, Clone)]
pub struct FairKey<Id> {
    max_tenants: usize,
    granted: Option<Granted>,
    /// What this holder holds of the region's total in the granted window:
    /// the key's rules think in its own totals, the wire in the region's.
    holding: PoolHolding,
    pending: Option<PendingRelease<Id>>,
    /// Tokens each tenant asked for in the current window.
    demand: BTreeMap<TenantId, u64>,
    /// The previous window's start and its demand counts (reported).
    previous: Option<(u64, BTreeMap<TenantId, u64>)>,
    /// The window before that and its counts: what the split weighs.
    settled: Option<(u64, BTreeMap<TenantId, u64>)>,
    /// Each tenant's demand over all regions, per window start: the
    /// [`TOTALS_WINDOWS`] latest windows heard (the split reads the
    /// settled one's).
    totals: BTreeMap<u64, BTreeMap<TenantId, u64>>,
    /// The weight each tenant last declared here (at most `max_tenants`).
    declared: BTreeMap<TenantId, u64>,
    /// The live window's demand as its join ahead reported it (projected
    /// to the window's end): the key reports these same counts for that
    /// window afterwards, so every region reads one report of it.
    reported_ahead: Option<(u64, Vec<(TenantId, u64)>)>,
    /// Tokens admitted in the previous window: asks step by a quarter of it.
    previous_used: u64,
    /// What the last join expected to need (the warm start): the join asks
    /// all of it, or half when the guarantee it rests on did not count the
    /// expected regions (the first ask after it then asks the rest).
    warm_target: u64,
    /// Looks at the ceiling in a row that raised nothing (across windows):
    /// the next waits `re_ask_ms` doubled that many times.
    fruitless_re_asks: u32,
    /// The region weight of the pool call in flight (or the last one).
    asked_weight: u64,
    /// Each split tenant's (own, total) demand as the key last joined a
    /// window: the split holds for that whole window, so the region's
    /// pool weight (declared at the join) and its tenants' weights agree
    /// (`None` before any join: the live settled window).
    basis: Option<SplitBasis>,
    /// The split the next window was joined ahead with: the basis once
    /// the grant there is adopted.
    ahead_basis: Option<SplitBasis>,
    /// The next window joined ahead: the window start asked for (once a
    /// window), and the grant there once answered.
    ahead_asked: Option<u64>,
    /// Whether the join ahead asked last retires the region at its total.
    ahead_retires: bool,
    ahead: Option<AheadGrant>,
    /// The region's guarantee as last heard while it held a pool weight
    /// (a region that joined retired hears 0 there).
    last_share: u64,
}

/// Each split tenant's (own, total) demand in the settled window a join
/// weighs its tenants by.
type SplitBasis = BTreeMap<TenantId, (u64, u64)>;

/// Windows of demand totals a key keeps: the settled one it splits by and
/// the two after it (a join ahead's answer brings the totals of the window
/// after the settled one before the key moves on to it).
pub const TOTALS_WINDOWS: usize = 3;

impl<Id: Clone> FairKey<Id> {
    /// A key that has asked nothing yet; at most `max_tenants` tenants tracked.
    pub fn new(max_tenants: usize) -> Self {
        FairKey {
            max_tenants,
            granted: None,
            holding: PoolHolding::new(),
            pending: None,
            demand: BTreeMap::new(),
            previous: None,
            settled: None,
            totals: BTreeMap::new(),
            declared: BTreeMap::new(),
            reported_ahead: None,
            previous_used: 0,
            warm_target: 0,
            fruitless_re_asks: 0,
            asked_weight: 0,
            basis: None,
            ahead_basis: None,
            ahead_asked: None,
            ahead_retires: false,
            ahead: None,
            last_share: 0,
        }
    }

    /// Decides `cost` tokens for `tenant` (weight ≥ 1) at monotonic
    /// `now_ms`; `lease_size` is the batch to ask beyond the need. Unless
    /// `whole_or_nothing`, a request that cannot have all `cost` tokens
    /// (and may not ask the pool for more) is admitted for what the tenant
    /// may still take, when that is at least one.
    pub fn decide(
        &mut self,
        tenant: &TenantId,
        weight: u64,
        cost: u64,
        lease_size: u64,
        whole_or_nothing: bool,
        now_ms: u64,
    ) -> FairStep {
        let cost = cost.max(1);
        let declared = weight;
        if self.declared.contains_key(tenant) || self.declared.len() < self.max_tenants {
            self.declared.insert(tenant.clone(), declared);
        }
        // The next window joined ahead: its grant is the key's once the
        // live one has expired and the window has started at the
        // coordinator (no join call).
        if let Some(ahead) = self.due_ahead(now_ms) {
            let starts_at = ahead.starts_at_ms();
            if now_ms < starts_at {
                return FairStep::Deny {
                    retry_after_ms: starts_at - now_ms,
                    limit: ahead.answer.limit,
                    window_end_ms: ahead.answer.window.start_ms,
                };
            }
            self.adopt_ahead(ahead);
        }
        if let Some(state) = self.granted.as_ref() {
            // The grant has just expired here, but the leader's window ends
            // up to a round trip later: a join now would be answered for
            // the old window. Wait until it has rolled.
            let window_ms = state.window.end_ms.saturating_sub(state.window.start_ms);
            let rolled_at = state
                .deadline_ms
                .saturating_add(state.round_trip_ms.min(window_ms / 50));
            if now_ms >= state.deadline_ms && now_ms < rolled_at {
                return FairStep::Deny {
                    retry_after_ms: rolled_at - now_ms,
                    limit: state.escrow.limit(),
                    window_end_ms: state.window.end_ms,
                };
            }
        }
        if !self.is_live(now_ms) {
            self.freeze_split();
        }
        let weight = self.split_weight(tenant, declared);
        let Some(state) = self.granted.as_mut().filter(|g| now_ms < g.deadline_ms) else {
            let region_weight = self.join_weight(tenant, weight, now_ms);
            let (target, whole) = self.warm_start(lease_size, region_weight, now_ms);
            self.warm_target = target;
            self.asked_weight = region_weight;
            // A whole join asks a hundredth of L beyond its target: the
            // guarantee it scales drifts with the demand split by a few
            // tokens a window, and the leader caps the ask at the expected
            // ceiling anyway (a join short of it would ask again soon).
            let allowance = self.granted.as_ref().map_or(0, |g| g.escrow.limit() / 100);
            let want_total = if whole {
                target
                    .saturating_add(allowance)
                    .min(self.granted.as_ref().map_or(u64::MAX, |g| g.escrow.limit()))
            } else {
                target / 2
            };
            return FairStep::Join {
                region_weight,
                want_total: cost.max(want_total),
            };
        };
        let remaining = state.deadline_ms - now_ms;
        let coordinator_now = state.window.end_ms.saturating_sub(remaining);
        let window = state.window;
        let mut ask = RecordedAsk {
            current: state.escrow.budget(),
            asked: None,
        };
        let decision: Decision =
            state
                .escrow
                .check(tenant, weight, cost, window, coordinator_now, &mut ask);
        if decision.allowed {
            let unspent = state
                .escrow
                .budget()
                .saturating_sub(state.escrow.total_used());
            return admitted(cost, window, remaining, decision.limit, unspent);
        }
        let at_ceiling = now_ms < state.exhausted_until_ms;
        match ask.asked.filter(|_| !at_ceiling) {
            Some((region_weight, want)) => {
                // A batch beyond the need: the lease size, a quarter of
                // what the last window admitted, or half the budget (a
                // ramp from nothing takes a few asks, not L / lease_size),
                // whichever is larger.
                let limit = state.escrow.limit();
                let step = lease_size
                    .max(self.previous_used / 4)
                    .max(state.escrow.budget() / 2);
                let mut batch = state
                    .escrow
                    .budget()
                    .saturating_add(step)
                    .max(self.warm_target);
                // Once the window's first quarter is over the pace is
                // known: a batch beyond what the region admits at it
                // before the window ends (with the surplus check's margin)
                // would only sit unspent while regions at their ceiling go
                // without; a region whose demand runs faster asks again.
                // (Its admissions, not its requests: a region denied at
                // its ceiling that took every token freed late in the
                // window would leave the next region at its ceiling
                // nothing — asking for its pace shares them out.)
                if now_ms >= state.expectation_ends_ms() {
                    let usable = state
                        .escrow
                        .total_used()
                        .saturating_add(state.paced_need(now_ms));
                    batch = batch.min(usable);
                }
                let want_total = want.max(batch).min(limit.max(want));
                self.asked_weight = region_weight;
                FairStep::Ask {
                    region_weight,
                    want_total: self.holding.wire_want(want_total),
                }
            }
            None => {
                // Credits may be served in part: what the tenant may still
                // take, when that is less than asked.
                let part = if whole_or_nothing {
                    0
                } else {
                    state.escrow.admissible(tenant, cost - 1)
                };
                if part > 0 {
                    let mut ask = RecordedAsk {
                        current: state.escrow.budget(),
                        asked: None,
                    };
                    let served =
                        state
                            .escrow
                            .check(tenant, weight, part, window, coordinator_now, &mut ask);
                    if served.allowed {
                        let unspent = state
                            .escrow
                            .budget()
                            .saturating_sub(state.escrow.total_used());
                        return admitted(part, window, remaining, served.limit, unspent);
                    }
                }
                if at_ceiling {
                    state.held_back = true;
                }
                FairStep::Deny {
                    retry_after_ms: if at_ceiling {
                        state.exhausted_until_ms - now_ms
                    } else {
                        decision.retry_after_ms
                    },
                    limit: decision.limit,
                    window_end_ms: window.end_ms,
                }
            }
        }
    }

    /// The weighted-fair escrow of the current grant, if any.
    pub fn escrow(&self) -> Option<&WeightedFairEscrow> {
        self.granted.as_ref().map(|g| &g.escrow)
    }

    /// The window of the current grant, if any.
    pub fn window(&self) -> Option<WindowBounds> {
        self.granted.as_ref().map(|g| g.window)
    }

    /// Whether a live grant is held at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.granted
            .as_ref()
            .is_some_and(|g| now_ms < g.deadline_ms)
    }

    /// How much more than its region holds this holder asks for with a
    /// pool ask of the region total `want_total` at monotonic `now_ms`
    /// (the wire's `PoolGrantRequest.want_more`): its own want less what
    /// it holds, in the live window. The leader asks for the region's
    /// total when it plans the call plus this, so an ask is not lost to
    /// what another holder added meanwhile. 0 — by totals alone — when no
    /// grant is live: a join cannot tell which window the leader will take
    /// it up in (the one ending, on a clock a little ahead, would be asked
    /// for more than it needs at its very end), and a join of the next
    /// window ahead says its own ([`JoinAhead::want_more`]).
    pub fn want_more(&self, want_total: u64, now_ms: u64) -> u64 {
        if self.is_live(now_ms) {
            want_total.saturating_sub(self.holding.region_total())
        } else {
            0
        }
    }
}

mod ahead;
mod grant;
mod release;
mod split;

#[cfg(test)]
mod tests;
