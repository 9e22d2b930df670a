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
//!   [`crate::pool_roster`]), it was the region's share among all of them
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
//!   released under the key. A `STALE_TOTAL` answer carries the region's
//!   real total, which becomes the budget; `RELEASED` marks the key retired
//!   until its next ask.
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
//!   *settled* totals of [`crate::demand_board`]: every region active then
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
use crate::demand_board::MAX_REPORTED_TENANTS;
use crate::fair_pool::PoolStanding;
use crate::ids::TenantId;
use crate::pool_roster::EXPECTATION_SHARE;
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
    /// window early on ([`crate::pool_roster`]), when it said.
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

/// `answer` and the `want_total` it answered (the region's totals) in the
/// own totals of the holder whose `holding` has counted it: its total is
/// what the holder holds, its standing the part of the region's not held
/// by others, and the want what the ask asked beyond what others hold.
fn own_answer(holding: &PoolHolding, answer: PoolAnswer, want_total: u64) -> (PoolAnswer, u64) {
    let own = PoolAnswer {
        granted_total: holding.own(),
        granted_increment: answer.granted_increment,
        standing: answer.standing.map(|s| holding.own_standing(s)),
        expected: answer.expected.map(|s| holding.own_standing(s)),
        ..answer
    };
    (own, holding.own_part(want_total))
}

/// Credits of `granted` tokens in `window`, living `remaining` ms more.
fn admitted(granted: u64, window: WindowBounds, remaining: u64, limit: u64) -> FairStep {
    FairStep::Admit {
        served: Served {
            granted,
            window_start_ms: window.start_ms,
            window_end_ms: window.end_ms,
            remaining_lifetime_ms: remaining,
            from_fallback: false,
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

/// Demand counts as reported: at most [`MAX_REPORTED_TENANTS`], the
/// largest first (ties by tenant).
fn largest_first(counts: &BTreeMap<TenantId, u64>) -> Vec<(TenantId, u64)> {
    let mut largest: Vec<(TenantId, u64)> = counts.iter().map(|(t, d)| (t.clone(), *d)).collect();
    largest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    largest.truncate(MAX_REPORTED_TENANTS);
    largest
}

/// `weight` (declared, in whole units) in thousandths, split by a
/// tenant's (own, total) demand when it spans regions: `w · own / total`,
/// at least 1.
fn split_by(weight: u64, shares: Option<(u64, u64)>) -> u64 {
    let scaled = weight.max(1).saturating_mul(WEIGHT_SCALE);
    match shares {
        Some((own, total)) if own > 0 && total > own => {
            let share = u128::from(scaled) * u128::from(own) / u128::from(total);
            u64::try_from(share).unwrap_or(scaled).max(1)
        }
        _ => scaled,
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

    /// Counts `cost` tokens asked for by `tenant` in the current window
    /// (once per request, admitted or not; at most `max_tenants` tenants).
    pub fn note_demand(&mut self, tenant: &TenantId, cost: u64) {
        if let Some(d) = self.demand.get_mut(tenant) {
            *d = d.saturating_add(cost);
        } else if self.demand.len() < self.max_tenants {
            self.demand.insert(tenant.clone(), cost);
        }
    }

    /// The demand to report with a pool ask at monotonic `now_ms`: the
    /// counts of the last window that ended — the granted window's own
    /// once its grant has expired (the ask then joins the next window),
    /// otherwise the previous window's — with its start, at most
    /// [`MAX_REPORTED_TENANTS`] tenants, the largest first.
    pub fn demand_report(&self, now_ms: u64) -> Option<(u64, Vec<(TenantId, u64)>)> {
        let ended = self
            .granted
            .as_ref()
            .filter(|g| now_ms >= g.deadline_ms)
            .map(|g| (g.window.start_ms, &self.demand));
        let (start, counts) = ended.or(self.previous.as_ref().map(|(s, c)| (*s, c)))?;
        if let Some((_, reported)) = self.reported_ahead.as_ref().filter(|(s, _)| *s == start) {
            return Some((start, reported.clone()));
        }
        Some((start, largest_first(counts)))
    }

    /// The live window's demand so far projected to its end at monotonic
    /// `now_ms` (`elapsed_ms` of `window_ms` gone), the largest first:
    /// the report a join ahead carries.
    fn projected_report(&self, elapsed_ms: u64, window_ms: u64) -> Vec<(TenantId, u64)> {
        let elapsed_ms = elapsed_ms.clamp(1, window_ms.max(1));
        let projected: BTreeMap<TenantId, u64> = self
            .demand
            .iter()
            .map(|(tenant, d)| {
                let scaled = u128::from(*d) * u128::from(window_ms.max(1)) / u128::from(elapsed_ms);
                (tenant.clone(), u64::try_from(scaled).unwrap_or(u64::MAX))
            })
            .collect();
        largest_first(&projected)
    }

    /// Takes the tenants' demand totals over all regions for the window
    /// starting at `window_start_ms`: the settled totals a pool answer
    /// carries for the window two before the granted one. The split uses
    /// them once they match the window of the key's settled counts. The
    /// [`TOTALS_WINDOWS`] latest windows are kept, at most
    /// [`MAX_REPORTED_TENANTS`] tenants each (the leader answers no more
    /// than a report names), whatever the answer carries.
    pub fn on_tenant_demands(&mut self, window_start_ms: u64, totals: Vec<(TenantId, u64)>) {
        if totals.is_empty() {
            return;
        }
        let older_than_kept = self.totals.len() >= TOTALS_WINDOWS
            && !self.totals.contains_key(&window_start_ms)
            && self
                .totals
                .keys()
                .next()
                .is_some_and(|oldest| *oldest > window_start_ms);
        if older_than_kept {
            return;
        }
        let held = self.totals.entry(window_start_ms).or_default();
        for (tenant, total) in totals.into_iter().take(MAX_REPORTED_TENANTS) {
            if held.len() < MAX_REPORTED_TENANTS || held.contains_key(&tenant) {
                held.insert(tenant, total);
            }
        }
        while self.totals.len() > TOTALS_WINDOWS {
            self.totals.pop_first();
        }
    }

    /// The weight `tenant` declared as `weight` has here, in thousandths:
    /// its share of its own demand in the settled window (two before the
    /// current one) when that window's totals are known — as they were
    /// when the key joined the current window, so that the split does not
    /// move under the region weight the join declared (a join's answer
    /// brings the next settled totals; they take effect at the next join).
    pub fn split_weight(&self, tenant: &TenantId, weight: u64) -> u64 {
        split_by(weight, self.shares_under(self.basis.as_ref(), tenant))
    }

    /// `tenant`'s (own, total) demand under `basis`, or in the settled
    /// window without one.
    fn shares_under(&self, basis: Option<&SplitBasis>, tenant: &TenantId) -> Option<(u64, u64)> {
        match basis {
            Some(basis) => basis.get(tenant).copied(),
            None => self.live_share(tenant),
        }
    }

    /// `tenant`'s (own, total) demand in the settled window, when its
    /// totals are known.
    fn live_share(&self, tenant: &TenantId) -> Option<(u64, u64)> {
        let (start, counts) = self.settled.as_ref()?;
        let total = self.totals.get(start)?.get(tenant).copied()?;
        Some((counts.get(tenant).copied()?, total))
    }

    /// The split of the settled window: what a window joined now is
    /// weighed by (see [`Self::split_weight`]).
    fn settled_basis(&self) -> SplitBasis {
        self.settled
            .as_ref()
            .map(|(_, counts)| {
                counts
                    .keys()
                    .filter_map(|tenant| Some((tenant.clone(), self.live_share(tenant)?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Freezes the split for the window being joined (see
    /// [`Self::split_weight`]).
    fn freeze_split(&mut self) {
        self.basis = Some(self.settled_basis());
        self.ahead_basis = None;
    }

    /// The region weight of the live window's tenants other than `except`
    /// under `basis`: each at the weight it last declared, split by the
    /// basis (the weight its requests carry, for a tenant whose
    /// declaration is not kept).
    fn tenants_weight(&self, basis: Option<&SplitBasis>, except: Option<&TenantId>) -> u64 {
        let Some(state) = self.granted.as_ref() else {
            return 0;
        };
        state
            .escrow
            .tenants()
            .filter(|(tenant, _, _)| Some(*tenant) != except)
            .fold(0u64, |sum, (tenant, weight, _)| {
                let split = match self.declared.get(tenant) {
                    Some(declared) => split_by(*declared, self.shares_under(basis, tenant)),
                    None => weight,
                };
                sum.saturating_add(split)
            })
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
            return admitted(cost, window, remaining, decision.limit);
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
                        return admitted(part, window, remaining, served.limit);
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

    /// Makes the answered join ahead the key's grant (no join call).
    fn adopt_ahead(&mut self, ahead: AheadGrant) {
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
    fn due_ahead(&self, now_ms: u64) -> Option<AheadGrant> {
        let state = self.granted.as_ref()?;
        self.ahead_of_granted()
            .filter(|_| now_ms >= state.deadline_ms)
    }

    /// The answered join ahead of the window right after the granted one.
    fn ahead_of_granted(&self) -> Option<AheadGrant> {
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
            window_start_ms: next_start,
            retire,
            demands,
        })
    }

    /// Whether the key may join the next window ahead with a call it makes
    /// now or later in this window (see [`Self::join_ahead`], whose time
    /// condition — from the late check on — this leaves out).
    fn may_join_ahead(&self) -> bool {
        let Some(state) = self.granted.as_ref() else {
            return false;
        };
        !self.joined_ahead_of(state.window.end_ms) && state.escrow.total_used() > 0
    }

    /// Whether the key has joined (or is joining) the window starting at
    /// `next_start_ms` ahead.
    fn joined_ahead_of(&self, next_start_ms: u64) -> bool {
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

    /// The region weight to join a new window with: the requesting
    /// tenant's (split) `weight` plus, when the key held the window right
    /// before, the weights of that window's other tenants — they are most
    /// likely active again, and a join may be the window's only pool call,
    /// so the region must not weigh one tenant alone all window.
    fn join_weight(&self, tenant: &TenantId, weight: u64, now_ms: u64) -> u64 {
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
    fn warm_start(&self, lease_size: u64, region_weight: u64, now_ms: u64) -> (u64, bool) {
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
    fn on_sole_answer(
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
    fn on_sole_ahead_answer(
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
    fn absorb_grant(
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
    fn live_release_at(&self, last_request_ms: u64, idle_ms: u64, now_ms: u64) -> Option<u64> {
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
}

#[cfg(test)]
mod tests;
