//! Leased mode: spend local credits; refill on shortage.
//!
//! - **Coalescing.** At most one refill (`Acquire`) is in flight per key.
//!   A check that finds too few credits either starts it or waits on it;
//!   when it lands, every waiter re-checks the wallet. The grant is credited
//!   exactly once, by the refill task itself (never by the waiters — the
//!   double credit of the original), and the task runs to completion even
//!   if every waiting check is cancelled.
//! - **Window coupling.** The credits' deadline is the instant the refill
//!   was sent plus the grant's remaining lifetime; the wallet never spends
//!   at or past it.
//! - **Prefetch.** With `low_water > 0`, a spend that leaves at most
//!   `low_water` credits starts a refill in the background; its grant is
//!   dropped if it lands after its deadline or for an older window.

use std::sync::Arc;

use futures::FutureExt;
use leasehold_core::ids::Key;
use tokio::time::Instant;

use super::credit_lane::MAX_LANE_TOKENS;
use super::keys::{KeyCell, KeyState, PendingRefill, RefillReport};
use super::{counter_clock, lock, recent_cells, Inner};
use crate::config::{LeaseOptions, Mode};
use crate::decision::{allowed, denied, Admission};
use crate::error::ClientError;
use crate::source::{AcquireRequest, Grant};
use crate::stats::bump;
use crate::wallet::{
    CreditOutcome, CreditWallet, GrantTerms, MonotonicTime, SpendOutcome, WindowLabel,
};

/// Why a lock-free spend from one cell's lane did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LaneMiss {
    /// The lane cannot cover the check (the full path decides).
    Short,
    /// The cell has left its table: look the key up there.
    Retired,
}

impl Inner {
    /// The whole check when `key` already holds enough live credits: one
    /// lookup in this thread's cache of recent cells (the table's shard read
    /// lock when the key is not cached there), one read of the check clock
    /// and one compare-and-swap on the key's [`CreditLane`] — no key
    /// allocation, no mutex, no timer, no await. `None` sends the check down
    /// the full path (not leased mode, a zero cost, a key never seen, or too
    /// few live credits in the lane), which decides it from scratch.
    #[inline]
    pub(super) fn spend_held_credits(self: &Arc<Self>, key: &str, cost: u64) -> Option<Admission> {
        let Mode::Leased(options) = &self.config.mode else {
            return None;
        };
        if cost == 0 {
            return None;
        }
        let hash = self.keys.hash(key);
        let low_water = options.low_water;
        let spend = |cell: &Arc<KeyCell>| self.spend_from_lane(cell, cost, low_water);
        match recent_cells::with_cached(self.keys.id(), hash, key, spend) {
            Some(Ok(admission)) => Some(admission),
            Some(Err(LaneMiss::Short)) => None,
            // Not cached, or cached but out of the table: the table's cell
            // (only keys that passed validation are in the table), spent
            // from once the shard lock is released (a prefetch takes the
            // cell's mutex).
            Some(Err(LaneMiss::Retired)) | None => {
                let cell = self.keys.with_hashed_cell(hash, key, Arc::clone)?;
                let outcome = spend(&cell);
                recent_cells::remember(hash, key, cell);
                outcome.ok()
            }
        }
    }

    /// Spends `cost` from `cell`'s lane if it holds that many live tokens,
    /// starting a refill when that leaves at most `low_water`.
    #[inline(always)]
    fn spend_from_lane(
        self: &Arc<Self>,
        cell: &Arc<KeyCell>,
        cost: u64,
        low_water: u64,
    ) -> Result<Admission, LaneMiss> {
        let spent = if cell.lane.may_cover(cost) {
            self.lane_now_ns()
                .and_then(|now_ns| cell.lane.try_spend(cost, now_ns))
        } else {
            None
        };
        let Some(spend) = spent else {
            return Err(if cell.is_retired() {
                LaneMiss::Retired
            } else {
                LaneMiss::Short
            });
        };
        if low_water > 0 && spend.remaining <= low_water {
            self.prefetch(cell);
        }
        Ok(Admission {
            decision: allowed(spend.window.limit, spend.remaining, spend.window.end_ms),
            window_start_ms: Some(spend.window.start_ms),
        })
    }

    /// The time a lane spend is judged at, nanoseconds since the clock
    /// origin (never earlier than the clock; `None` before the origin).
    #[inline(always)]
    fn lane_now_ns(&self) -> Option<u64> {
        match self.lane_clock.counter_origin_ns() {
            None => self.nanos_since_origin(Instant::now()),
            Some(origin_ns) => counter_clock::now_ns().checked_sub(origin_ns),
        }
    }

    /// Starts a background refill of `cell` unless one is in flight.
    #[cold]
    fn prefetch(self: &Arc<Self>, cell: &Arc<KeyCell>) {
        let Ok(key) = Key::new(&*cell.key) else {
            return;
        };
        let mut state = lock(&cell.state);
        if state.pending.is_none() {
            let tokens = state.sizer.size();
            // Fire and forget: the task credits the grant itself.
            drop(self.start_refill(cell, &mut state, &key, tokens, Instant::now(), true));
        }
    }

    /// Nanoseconds from this limiter's clock origin to `t` (`None` before
    /// the origin or past `u64`: the lane is then not used).
    #[inline]
    pub(super) fn nanos_since_origin(&self, t: Instant) -> Option<u64> {
        let since = t.checked_duration_since(self.clock_origin)?;
        since
            .as_secs()
            .checked_mul(1_000_000_000)?
            .checked_add(u64::from(since.subsec_nanos()))
    }

    /// Takes the key's lent credits back into its wallet (what the lane
    /// spent is counted as admitted tokens). Every use of the wallet starts
    /// with this.
    pub(super) fn settle_lane(&self, cell: &KeyCell, state: &mut KeyState, now: Instant) {
        if state.wallet.lent() == 0 {
            return;
        }
        let unspent = cell.lane.drain();
        let spent = state.wallet.repay(unspent, now);
        bump(&self.stats.admitted_tokens, spent);
        self.report_expired(state);
    }

    /// Lends the key's live credits to its lane, so that the next checks
    /// spend them without the mutex. Every use of the wallet ends with this.
    pub(super) fn lend_to_lane(&self, cell: &KeyCell, state: &mut KeyState, now: Instant) {
        if cell.is_retired() {
            return;
        }
        let Some(loan) = state.wallet.lend(now, MAX_LANE_TOKENS) else {
            return;
        };
        match self.nanos_since_origin(loan.deadline) {
            Some(deadline_ns) => {
                let reserve = state.wallet.balance(now);
                cell.lane
                    .publish(loan.tokens, reserve, deadline_ns, loan.window);
            }
            None => {
                state.wallet.repay(loan.tokens, now);
            }
        }
    }

    /// Settles a cell that left the table and adds its lock-free
    /// admissions to the counters.
    pub(super) fn retire_cell(&self, cell: &KeyCell) {
        let mut state = lock(&cell.state);
        cell.retire();
        self.settle_lane(cell, &mut state, Instant::now());
        bump(&self.stats.admitted, cell.lane.take_admitted());
    }

    /// Brings the counters up to date with the lock-free admissions of
    /// every key (settling and re-lending each key's credits).
    pub(super) fn fold_lane_counters(&self) {
        for cell in self.keys.snapshot() {
            let mut state = lock(&cell.state);
            let now = Instant::now();
            self.settle_lane(&cell, &mut state, now);
            bump(&self.stats.admitted, cell.lane.take_admitted());
            self.lend_to_lane(&cell, &mut state, now);
        }
    }

    pub(super) async fn check_leased(
        self: &Arc<Self>,
        key: Key,
        cost: u64,
        options: &LeaseOptions,
    ) -> Result<Admission, ClientError> {
        self.ensure_sweeper(options);
        let cell = self.cell(&key, options);
        let mut last_refill: Option<RefillReport> = None;
        for round in 0..=options.max_refill_rounds {
            let now = Instant::now();
            let waiting = {
                let mut state = lock(&cell.state);
                self.settle_lane(&cell, &mut state, now);
                let last_round = round == options.max_refill_rounds;
                let step = self.leased_round(
                    &cell,
                    &mut state,
                    &key,
                    cost,
                    options,
                    now,
                    last_refill,
                    last_round,
                );
                self.lend_to_lane(&cell, &mut state, now);
                match step {
                    Round::Decided(admission) => return Ok(admission),
                    Round::Wait(pending) => pending,
                }
            };
            last_refill = Some(waiting.await?);
        }
        // The loop always returns on its last round.
        Err(ClientError::Protocol(
            "refill loop ended without a decision".into(),
        ))
    }
    /// One round of a leased check, with the key's wallet settled: spend,
    /// or decide a denial, or name the refill to wait for.
    #[allow(clippy::too_many_arguments)]
    fn leased_round(
        self: &Arc<Self>,
        cell: &Arc<KeyCell>,
        state: &mut KeyState,
        key: &Key,
        cost: u64,
        options: &LeaseOptions,
        now: Instant,
        last_refill: Option<RefillReport>,
        last_round: bool,
    ) -> Round {
        if let Some(now_ns) = self.nanos_since_origin(now) {
            cell.lane.touch(now_ns);
        }
        let spent = state.wallet.spend(now, cost);
        self.report_expired(state);
        match spent {
            SpendOutcome::Spent { remaining, window } => {
                if options.low_water > 0
                    && remaining <= options.low_water
                    && state.pending.is_none()
                {
                    let tokens = state.sizer.size();
                    // Fire and forget: the task credits the grant itself.
                    drop(self.start_refill(cell, state, key, tokens, now, true));
                }
                Round::Decided(Admission {
                    decision: allowed(window.limit, remaining, window.end_ms),
                    window_start_ms: Some(window.start_ms),
                })
            }
            SpendOutcome::Short { balance } => {
                if let Some(denial) = cached_empty_grant(state, balance, now) {
                    return Round::Decided(Admission {
                        decision: denial,
                        window_start_ms: None,
                    });
                }
                let exhausted = last_refill.is_some_and(|r| r.granted == 0);
                if exhausted || last_round {
                    return Round::Decided(Admission {
                        decision: self.denial(&state.wallet, balance, last_refill, now),
                        window_start_ms: None,
                    });
                }
                Round::Wait(match &state.pending {
                    Some(pending) => pending.clone(),
                    None => {
                        let tokens = state.sizer.size().max(cost.saturating_sub(balance));
                        self.start_refill(cell, state, key, tokens, now, false)
                    }
                })
            }
        }
    }

    /// The denial for a check that could not be served.
    fn denial(
        &self,
        wallet: &CreditWallet<Instant>,
        balance: u64,
        last_refill: Option<RefillReport>,
        now: Instant,
    ) -> crate::Decision {
        let window = wallet.window();
        let limit = last_refill
            .map(|r| r.limit)
            .or(window.map(|w| w.limit))
            .unwrap_or(0);
        let reset_at_ms = last_refill
            .map(|r| r.window_end_ms)
            .or(window.map(|w| w.end_ms))
            .unwrap_or(0);
        let retry_after_ms = match last_refill {
            Some(r) if r.retry_after_ms > 0 => r.retry_after_ms,
            // An empty grant with no hint: the window is exhausted until it ends.
            Some(r) if r.granted == 0 => millis_until(now, r.deadline),
            _ => 1,
        };
        denied(limit, balance, reset_at_ms, retry_after_ms)
    }

    /// A forecast of `key`'s next window, for its sizer.
    pub(super) fn predict(&self, key: &Key, options: &LeaseOptions, demand: u64) -> bool {
        let cell = self.cell(key, options);
        let mut state = lock(&cell.state);
        let serving = state.wallet.window().is_some();
        state.sizer.forecast(demand, serving)
    }

    /// The cell of `key`, created on first use.
    fn cell(&self, key: &Key, options: &LeaseOptions) -> Arc<KeyCell> {
        let now_ns = self.nanos_since_origin(Instant::now()).unwrap_or(0);
        let (cell, evicted) = self.keys.get_or_insert(key.as_str(), now_ns, || KeyState {
            wallet: CreditWallet::new(),
            pending: None,
            sizer: options.sizing.sizer(),
            expired_reported: 0,
            empty_until: None,
        });
        if let Some(evicted) = evicted {
            self.retire_cell(&evicted);
        }
        cell
    }

    /// Counts credits that died unspent since the last report.
    pub(super) fn report_expired(&self, state: &mut KeyState) {
        let expired = state.wallet.totals().expired;
        bump(
            &self.stats.tokens_expired,
            expired.saturating_sub(state.expired_reported),
        );
        state.expired_reported = expired;
    }

    /// Starts the one refill of this key (the caller checked none is in
    /// flight) and returns the future every waiter awaits.
    fn start_refill(
        self: &Arc<Self>,
        cell: &Arc<KeyCell>,
        state: &mut KeyState,
        key: &Key,
        tokens: u64,
        now: Instant,
        prefetch: bool,
    ) -> PendingRefill {
        if let Some(pending) = &state.pending {
            return pending.clone();
        }
        // Before this refill's credits are dated.
        self.lane_clock.recheck();
        let Some(ticket) = state.wallet.begin_refill(now) else {
            // The wallet and `pending` move together under the cell's lock,
            // so this cannot happen; fail the check rather than the process.
            let err = ClientError::Protocol("refill bookkeeping out of step".into());
            return futures::future::ready(Err(err)).boxed().shared();
        };
        bump(&self.stats.refills, 1);
        bump(&self.stats.backend_calls, 1);
        if prefetch {
            bump(&self.stats.prefetches, 1);
        }
        let request = AcquireRequest {
            key: key.clone(),
            tenant: self.config.tenant.clone(),
            weight: self.config.weight,
            tokens,
            request_id: self.next_request_id(),
        };
        let inner = Arc::clone(self);
        let task_cell = Arc::clone(cell);
        let task = tokio::spawn(async move {
            let timeout = inner.config.call_timeout;
            let sent = Instant::now();
            let answer = match tokio::time::timeout(timeout, inner.source.acquire(request)).await {
                Ok(answer) => answer,
                Err(_) => Err(ClientError::DeadlineExceeded(timeout)),
            };
            inner.stats.record_backend_answer(&answer, sent.elapsed());
            let arrived = Instant::now();
            let mut state = lock(&task_cell.state);
            inner.settle_lane(&task_cell, &mut state, arrived);
            state.pending = None;
            let checked = answer.and_then(|grant| checked_terms(grant, tokens).map(|t| (grant, t)));
            let report = match checked {
                Err(e) => {
                    state.wallet.abandon(ticket);
                    Err(e)
                }
                Ok((grant, terms)) => {
                    let deadline = ticket.sent_at().plus_millis(usable_lifetime_ms(&grant));
                    let credited = match terms {
                        Some(terms) => {
                            let outcome = state.wallet.credit(ticket, terms, arrived);
                            inner.account_credit(&mut state, outcome)
                        }
                        // An empty grant naming no window (e.g. the node is
                        // cut off from the coordinator): nothing to record.
                        None => {
                            state.wallet.abandon(ticket);
                            0
                        }
                    };
                    Ok(RefillReport {
                        granted: grant.granted,
                        credited,
                        limit: grant.limit,
                        window_end_ms: grant.window_end_ms,
                        retry_after_ms: grant.retry_after_ms,
                        deadline,
                    })
                }
            };
            if let Ok(r) = &report {
                remember_empty_grant(&mut state, r, arrived);
            }
            inner.report_expired(&mut state);
            inner.lend_to_lane(&task_cell, &mut state, arrived);
            report
        });
        let pending: PendingRefill = async move {
            task.await.unwrap_or_else(|e| {
                Err(ClientError::Protocol(
                    format!("refill task failed: {e}").into(),
                ))
            })
        }
        .boxed()
        .shared();
        state.pending = Some(pending.clone());
        pending
    }

    /// Updates counters and the sizer after a grant landed; returns the
    /// tokens credited.
    fn account_credit(&self, state: &mut KeyState, outcome: CreditOutcome) -> u64 {
        match outcome {
            CreditOutcome::Credited {
                tokens,
                closed_window_served,
            } => {
                bump(&self.stats.tokens_leased, tokens);
                if let Some(served) = closed_window_served {
                    state.sizer.observe_window_demand(served);
                }
                tokens
            }
            CreditOutcome::Empty => 0,
            CreditOutcome::DroppedLate { tokens }
            | CreditOutcome::DroppedStaleWindow { tokens } => {
                bump(&self.stats.late_grants_dropped, 1);
                bump(&self.stats.late_tokens_dropped, tokens);
                0
            }
        }
    }

    pub(super) fn local_balance(&self, key: &str) -> u64 {
        let Some(cell) = self.keys.get(key) else {
            return 0;
        };
        let mut state = lock(&cell.state);
        let now = Instant::now();
        self.settle_lane(&cell, &mut state, now);
        let balance = state.wallet.balance(now);
        self.lend_to_lane(&cell, &mut state, now);
        balance
    }
}

/// What one round of a leased check decided.
enum Round {
    Decided(Admission),
    /// Wait for this refill, then try again.
    Wait(PendingRefill),
}

/// Validates a grant against what was asked and converts it for the
/// wallet; `None` for an empty grant that names no window.
fn checked_terms(grant: Grant, asked: u64) -> Result<Option<GrantTerms>, ClientError> {
    if grant.granted > asked {
        return Err(ClientError::Protocol(
            format!(
                "granted {} tokens, more than the {asked} asked",
                grant.granted
            )
            .into(),
        ));
    }
    if grant.window_end_ms <= grant.window_start_ms {
        if grant.granted == 0 {
            return Ok(None);
        }
        return Err(ClientError::Protocol(
            format!(
                "grant window [{}, {}) is empty",
                grant.window_start_ms, grant.window_end_ms
            )
            .into(),
        ));
    }
    Ok(Some(GrantTerms {
        granted: grant.granted,
        window: WindowLabel {
            start_ms: grant.window_start_ms,
            end_ms: grant.window_end_ms,
            limit: grant.limit,
        },
        remaining_lifetime_ms: usable_lifetime_ms(&grant),
    }))
}

/// The local denial for a shortage while an empty grant's retry hint runs.
fn cached_empty_grant(state: &mut KeyState, balance: u64, now: Instant) -> Option<crate::Decision> {
    let (until, report) = state.empty_until?;
    if now >= until {
        state.empty_until = None;
        return None;
    }
    Some(denied(
        report.limit,
        balance,
        report.window_end_ms,
        millis_until(now, until),
    ))
}

/// After a refill: an empty grant starts (or refreshes) the local denial
/// period; credited tokens end it.
fn remember_empty_grant(state: &mut KeyState, report: &RefillReport, arrived: Instant) {
    if report.credited > 0 {
        state.empty_until = None;
    } else if report.granted == 0 {
        let hint_ms = if report.retry_after_ms > 0 {
            report.retry_after_ms
        } else {
            let left = report.deadline.saturating_duration_since(arrived);
            u64::try_from(left.as_millis()).unwrap_or(u64::MAX)
        };
        if hint_ms > 0 {
            state.empty_until = Some((arrived.plus_millis(hint_ms), *report));
        }
    }
}

/// Margin taken off every grant's lifetime. The coordinator stamps time in
/// whole milliseconds, so a request sent within the millisecond of the stamp
/// could otherwise see a deadline up to 1 ms past the window's end.
const LIFETIME_MARGIN_MS: u64 = 1;

/// The lifetime the wallet uses for a grant: its reported remaining
/// lifetime minus [`LIFETIME_MARGIN_MS`].
fn usable_lifetime_ms(grant: &Grant) -> u64 {
    grant
        .remaining_lifetime_ms
        .saturating_sub(LIFETIME_MARGIN_MS)
}

/// Whole milliseconds from `now` until `deadline`, rounded up, at least 1.
pub(super) fn millis_until(now: Instant, deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(now);
    let ms = left.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use futures::future::BoxFuture;
    use futures::FutureExt;
    use leasehold_core::ids::ClientId;

    use crate::source::{CheckReply, CheckRequest, CreditSource, Grant, ReturnRequest};
    use crate::{
        AcquireRequest, ClientError, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode,
    };

    /// A source with a fixed pool of tokens for one long window.
    struct Pool {
        left: AtomicU64,
    }

    impl CreditSource for Pool {
        fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
            let granted = self
                .left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                    Some(left - left.min(request.tokens))
                })
                .map_or(0, |left| left.min(request.tokens));
            async move {
                Ok(Grant {
                    granted,
                    limit: 1 << 20,
                    window_start_ms: 0,
                    window_end_ms: 3_600_000,
                    remaining_lifetime_ms: 3_600_000,
                    retry_after_ms: if granted == 0 { 1 } else { 0 },
                })
            }
            .boxed()
        }

        fn check(&self, _request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
            async { Err(ClientError::Protocol("leased mode only".into())) }.boxed()
        }

        fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
            async move { Ok(request.tokens) }.boxed()
        }
    }

    /// A source whose first grant lives `lifetime_ms`; every later ask
    /// gets nothing.
    struct OneShortGrant {
        tokens: u64,
        lifetime_ms: u64,
        asked: AtomicU64,
    }

    impl CreditSource for OneShortGrant {
        fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
            let first = self.asked.fetch_add(1, Ordering::AcqRel) == 0;
            let granted = if first {
                self.tokens.min(request.tokens)
            } else {
                0
            };
            let lifetime_ms = self.lifetime_ms;
            async move {
                Ok(Grant {
                    granted,
                    limit: 1_000,
                    window_start_ms: 0,
                    window_end_ms: lifetime_ms,
                    remaining_lifetime_ms: lifetime_ms,
                    retry_after_ms: if granted == 0 { 1_000 } else { 0 },
                })
            }
            .boxed()
        }

        fn check(&self, _request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
            async { Err(ClientError::Protocol("leased mode only".into())) }.boxed()
        }

        fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
            async move { Ok(request.tokens) }.boxed()
        }
    }

    /// Credits held in a key's lane are spent without a lock or an await
    /// until their deadline (the grant's lifetime less the 1 ms margin,
    /// from the refill's send) and refused from that instant on: the
    /// lock-free path reads the same clock the deadline was computed on.
    #[tokio::test(start_paused = true)]
    async fn credits_held_past_their_deadline_are_refused() {
        let source = OneShortGrant {
            tokens: 100,
            lifetime_ms: 50,
            asked: AtomicU64::new(0),
        };
        let options = LeaseOptions {
            sizing: LeaseSizing::Fixed(100),
            ..LeaseOptions::default()
        };
        let config = LimiterConfig::new(
            Mode::Leased(options),
            ClientId::new("deadline-test").expect("client id"),
        );
        let limiter = Limiter::new(source, config).expect("limiter");
        let refill_sent = tokio::time::Instant::now();
        assert!(limiter.check("k", 1).await.expect("check").allowed);
        let held = || limiter.check("k", 1).now_or_never();
        let spent = held().expect("decided on the first poll").expect("check");
        assert!(spent.allowed, "held credits are live");
        tokio::time::advance(Duration::from_millis(48)).await;
        let spent = held().expect("decided on the first poll").expect("check");
        assert!(spent.allowed, "1 ms before the deadline the credits live");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(
            tokio::time::Instant::now() - refill_sent,
            Duration::from_millis(49),
            "at the deadline"
        );
        let refused = limiter.check("k", 1).await.expect("check");
        assert!(!refused.allowed, "credits at their deadline are dead");
        let stats = limiter.stats();
        assert_eq!(stats.admitted_tokens, 3);
        assert_eq!(stats.tokens_expired, 97);
    }

    /// OS threads checking one key at once — lock-free spends racing the
    /// refills and settlements of the slow path — never admit more tokens
    /// than the pool granted, and the counters agree with what they saw.
    #[test]
    fn threads_spending_one_key_never_overdraw_its_credits() {
        const POOL: u64 = 20_000;
        const THREADS: u64 = 4;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let options = LeaseOptions {
            sizing: LeaseSizing::Fixed(97),
            low_water: 5,
            ..LeaseOptions::default()
        };
        let config = LimiterConfig::new(
            Mode::Leased(options),
            ClientId::new("lane-test").expect("client id"),
        );
        let pool = Pool {
            left: AtomicU64::new(POOL),
        };
        let limiter = Limiter::new(pool, config).expect("limiter");
        let admitted_tokens = Arc::new(AtomicU64::new(0));
        let admitted_checks = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                let limiter = limiter.clone();
                let handle = runtime.handle().clone();
                let admitted_tokens = Arc::clone(&admitted_tokens);
                let admitted_checks = Arc::clone(&admitted_checks);
                std::thread::spawn(move || {
                    let _entered = handle.enter();
                    let cost = 1 + thread % 2;
                    let mut denials_in_a_row = 0;
                    while denials_in_a_row < 50 {
                        let decision =
                            futures::executor::block_on(limiter.check("hot", cost)).expect("check");
                        if decision.allowed {
                            denials_in_a_row = 0;
                            admitted_tokens.fetch_add(cost, Ordering::Relaxed);
                            admitted_checks.fetch_add(1, Ordering::Relaxed);
                        } else {
                            denials_in_a_row += 1;
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("thread");
        }
        let spent = admitted_tokens.load(Ordering::Relaxed);
        assert!(spent <= POOL, "admitted {spent} tokens of {POOL}");
        assert!(spent + 1 >= POOL, "only {spent} of {POOL} tokens admitted");
        let stats = limiter.stats();
        assert_eq!(stats.admitted_tokens, spent);
        assert_eq!(stats.admitted, admitted_checks.load(Ordering::Relaxed));
        assert!(stats.tokens_leased <= POOL);
        assert_eq!(limiter.local_balance("hot"), stats.tokens_leased - spent);
    }
}
