//! The lock-free side of one key's credits: what a check with credits held
//! touches, so that it spends with one compare-and-swap and no lock.
//!
//! A [`CreditLane`] holds credits lent out of the key's wallet
//! ([`CreditWallet::lend`](crate::wallet::CreditWallet::lend)) together with
//! their deadline and window. Only the holder of the key's state mutex
//! changes what the lane holds, in two steps: [`CreditLane::drain`] takes
//! every unspent token back (after which no spend can succeed), and
//! [`CreditLane::publish`] installs a new loan. Spenders
//! ([`CreditLane::try_spend`]) never lock.
//!
//! The spendable tokens share one 64-bit word with a generation that every
//! drain and publish advances: a spender reads the word, then the loan's
//! deadline and window, then swaps the word for one with `cost` fewer
//! tokens. The swap fails if the word changed meanwhile, so a spend is
//! decided on the deadline and window of the very loan it draws from, and
//! never takes more tokens than the loan has left.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::wallet::WindowLabel;

/// Low bits of the word: the spendable tokens.
const TOKEN_BITS: u32 = 40;
const TOKEN_MASK: u64 = (1 << TOKEN_BITS) - 1;
/// The most tokens one loan may hold (the rest stay in the wallet).
pub(crate) const MAX_LANE_TOKENS: u64 = TOKEN_MASK;

/// A successful lock-free spend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneSpend {
    /// Tokens left for the key after the spend (lane and wallet together).
    pub remaining: u64,
    /// The window of the spent credits.
    pub window: WindowLabel,
}

/// One key's lent credits; one cache line, apart from the key's mutex.
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct CreditLane {
    /// Generation (high bits) and spendable tokens (low [`TOKEN_BITS`]).
    word: AtomicU64,
    /// The loan's deadline, nanoseconds since the limiter's clock origin.
    deadline_ns: AtomicU64,
    window_start_ms: AtomicU64,
    window_end_ms: AtomicU64,
    window_limit: AtomicU64,
    /// Tokens the wallet kept back when the loan was made (more than a
    /// lane holds), reported in a decision's `remaining`.
    reserve: AtomicU64,
    /// The last check of this key, nanoseconds since the clock origin.
    last_use_ns: AtomicU64,
    /// Checks admitted by [`try_spend`](Self::try_spend) not yet added to
    /// the limiter's counters.
    admitted: AtomicU64,
}

impl CreditLane {
    /// A lane holding nothing, last used at `now_ns`.
    pub(crate) fn new(now_ns: u64) -> Self {
        let lane = CreditLane::default();
        lane.last_use_ns.store(now_ns, Ordering::Relaxed);
        lane
    }

    /// Whether the lane may hold `cost` tokens (a cheap test before the
    /// clock is read; [`try_spend`](Self::try_spend) decides).
    #[inline]
    pub(crate) fn may_cover(&self, cost: u64) -> bool {
        self.word.load(Ordering::Relaxed) & TOKEN_MASK >= cost
    }

    /// Spends `cost` tokens if the lane holds that many and its loan is
    /// live at `now_ns` (strictly before the deadline); records the check
    /// as this key's last use.
    #[inline]
    pub(crate) fn try_spend(&self, cost: u64, now_ns: u64) -> Option<LaneSpend> {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let tokens = word & TOKEN_MASK;
            if tokens < cost || cost == 0 {
                return None;
            }
            // Read after the word: a publish stores these before the word,
            // and a drain or publish after our read changes the word, which
            // fails the swap below.
            if now_ns >= self.deadline_ns.load(Ordering::Acquire) {
                return None;
            }
            let window = WindowLabel {
                start_ms: self.window_start_ms.load(Ordering::Acquire),
                end_ms: self.window_end_ms.load(Ordering::Acquire),
                limit: self.window_limit.load(Ordering::Acquire),
            };
            let reserve = self.reserve.load(Ordering::Acquire);
            match self.word.compare_exchange_weak(
                word,
                word - cost,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.last_use_ns.store(now_ns, Ordering::Relaxed);
                    self.admitted.fetch_add(1, Ordering::Relaxed);
                    return Some(LaneSpend {
                        remaining: (tokens - cost).saturating_add(reserve),
                        window,
                    });
                }
                Err(current) => word = current,
            }
        }
    }

    /// Takes back every unspent token; until the next
    /// [`publish`](Self::publish) no spend succeeds. Call with the key's
    /// state mutex held.
    pub(crate) fn drain(&self) -> u64 {
        let generation = self.word.load(Ordering::Relaxed) >> TOKEN_BITS;
        let drained = self
            .word
            .swap(next_generation(generation), Ordering::AcqRel);
        drained & TOKEN_MASK
    }

    /// Installs a loan of `tokens` (at most [`MAX_LANE_TOKENS`]) of `window`,
    /// spendable strictly before `deadline_ns`, with `reserve` more tokens
    /// held by the wallet. Call with the key's state mutex held, after a
    /// [`drain`](Self::drain).
    pub(crate) fn publish(&self, tokens: u64, reserve: u64, deadline_ns: u64, window: WindowLabel) {
        debug_assert!(tokens <= MAX_LANE_TOKENS);
        debug_assert_eq!(self.word.load(Ordering::Relaxed) & TOKEN_MASK, 0);
        self.deadline_ns.store(deadline_ns, Ordering::Release);
        self.window_start_ms
            .store(window.start_ms, Ordering::Release);
        self.window_end_ms.store(window.end_ms, Ordering::Release);
        self.window_limit.store(window.limit, Ordering::Release);
        self.reserve.store(reserve, Ordering::Release);
        let generation = self.word.load(Ordering::Relaxed) >> TOKEN_BITS;
        self.word.store(
            next_generation(generation) | (tokens & TOKEN_MASK),
            Ordering::Release,
        );
    }

    /// Records a check of this key at `now_ns`.
    pub(crate) fn touch(&self, now_ns: u64) {
        self.last_use_ns.store(now_ns, Ordering::Relaxed);
    }

    /// The last check of this key, nanoseconds since the clock origin.
    pub(crate) fn last_use_ns(&self) -> u64 {
        self.last_use_ns.load(Ordering::Relaxed)
    }

    /// Takes the count of lock-free admissions not yet reported.
    pub(crate) fn take_admitted(&self) -> u64 {
        self.admitted.swap(0, Ordering::Relaxed)
    }
}

/// The word of the generation after `generation`, holding no tokens.
fn next_generation(generation: u64) -> u64 {
    (generation.wrapping_add(1) << TOKEN_BITS) & !TOKEN_MASK
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    const WINDOW: WindowLabel = WindowLabel {
        start_ms: 0,
        end_ms: 1_000,
        limit: 1_000,
    };

    #[test]
    fn spends_only_what_the_loan_holds_and_only_before_its_deadline() {
        let lane = CreditLane::new(0);
        assert_eq!(lane.try_spend(1, 0), None, "an empty lane spends nothing");
        lane.drain();
        lane.publish(5, 7, 100, WINDOW);
        let spend = lane.try_spend(3, 10).expect("live credits");
        assert_eq!(spend.remaining, 2 + 7);
        assert_eq!(spend.window, WINDOW);
        assert_eq!(lane.try_spend(3, 10), None, "only 2 left");
        assert_eq!(lane.try_spend(1, 100), None, "at the deadline: dead");
        assert_eq!(lane.try_spend(0, 10), None, "a zero cost is not a spend");
        assert_eq!(lane.last_use_ns(), 10);
        assert_eq!(lane.take_admitted(), 1);
        assert_eq!(lane.drain(), 2);
        assert_eq!(lane.try_spend(1, 10), None, "drained");
    }

    #[test]
    fn generations_wrap_without_touching_the_tokens() {
        let lane = CreditLane::new(0);
        lane.word.store(!TOKEN_MASK, Ordering::Relaxed);
        lane.publish(MAX_LANE_TOKENS, 0, 100, WINDOW);
        assert_eq!(lane.drain(), MAX_LANE_TOKENS);
        assert_eq!(lane.word.load(Ordering::Relaxed) & TOKEN_MASK, 0);
    }

    /// Spenders on several threads race a lender that drains and publishes
    /// loans of changing windows: the tokens spent never exceed the tokens
    /// lent, every spend is labelled with the window of the loan it came
    /// from, and nothing is lost.
    #[test]
    fn concurrent_spends_never_overdraw_a_loan() {
        const SPENDERS: usize = 3;
        const LOANS: u64 = 1_000;
        let lane = Arc::new(CreditLane::new(0));
        let done = Arc::new(AtomicBool::new(false));
        // Tokens spent per window start, as the spenders saw them.
        let spent_by_window = Arc::new(Mutex::new(std::collections::HashMap::<u64, u64>::new()));
        let spenders: Vec<_> = (0..SPENDERS)
            .map(|i| {
                let lane = Arc::clone(&lane);
                let done = Arc::clone(&done);
                let spent_by_window = Arc::clone(&spent_by_window);
                std::thread::spawn(move || {
                    let mut local = std::collections::HashMap::<u64, u64>::new();
                    let cost = 1 + i as u64 % 3;
                    while !done.load(Ordering::Acquire) {
                        if let Some(spend) = lane.try_spend(cost, 1) {
                            assert_eq!(spend.window.end_ms, spend.window.start_ms + 1);
                            assert_eq!(spend.window.limit, spend.window.start_ms * 3);
                            *local.entry(spend.window.start_ms).or_default() += cost;
                        }
                    }
                    let mut all = spent_by_window.lock().unwrap();
                    for (window, tokens) in local {
                        *all.entry(window).or_default() += tokens;
                    }
                })
            })
            .collect();
        let mut spent_seen_by_lender = std::collections::HashMap::<u64, u64>::new();
        let mut previous: Option<(u64, u64)> = None;
        for loan in 0..LOANS {
            let unspent = lane.drain();
            if let Some((window, lent)) = previous {
                assert!(unspent <= lent, "a loan of {lent} came back with {unspent}");
                spent_seen_by_lender.insert(window, lent - unspent);
            }
            let lent = 1 + loan % 50;
            let window = WindowLabel {
                start_ms: loan,
                end_ms: loan + 1,
                limit: loan * 3,
            };
            lane.publish(lent, 0, 2, window);
            previous = Some((loan, lent));
            std::thread::yield_now();
        }
        done.store(true, Ordering::Release);
        for spender in spenders {
            spender.join().expect("spender");
        }
        let unspent = lane.drain();
        let (window, lent) = previous.expect("a loan was made");
        spent_seen_by_lender.insert(window, lent - unspent);
        let spent_by_window = spent_by_window.lock().unwrap();
        for (window, tokens) in spent_by_window.iter() {
            assert_eq!(
                spent_seen_by_lender.get(window).copied().unwrap_or(0),
                *tokens,
                "window {window}: the spenders' count and the lender's differ"
            );
        }
        let total_spent: u64 = spent_seen_by_lender.values().sum();
        assert_eq!(total_spent, spent_by_window.values().sum::<u64>());
    }
}
