//! The sans-IO credit bookkeeping of one key in leased mode.
//!
//! A [`CreditWallet`] holds the credits a limiter leased for one key, the
//! window they belong to, and the local deadline after which they are dead.
//! It performs no IO and reads no clock: every operation takes `now`, in any
//! monotonic time type implementing [`MonotonicTime`] (the limiter uses
//! `tokio::time::Instant`; tests use plain milliseconds).
//!
//! # Laws (property-tested in this module)
//! - **Credits die with their window.** A grant's local deadline is the
//!   instant its request was *sent* plus the grant's remaining lifetime
//!   (DESIGN §4). [`CreditWallet::spend`] never spends at or after the
//!   deadline of the credits it holds.
//! - **Credited once.** A refill is represented by a [`RefillTicket`], which
//!   is neither `Clone` nor `Copy` and is consumed by [`CreditWallet::credit`]
//!   or [`CreditWallet::abandon`]; at most one ticket is outstanding.
//! - **Conservation.** `balance = credited − spent − expired − withdrawn` at
//!   all times; in particular `Σ spent ≤ Σ credited` and the balance is never
//!   negative (it is a `u64` and every subtraction is checked first).
//! - **Late grants are dropped.** Whether a grant is credited, and until
//!   when, is decided by the rule every tier shares
//!   ([`leasehold_core::window_credit`]): a grant that arrives at or after
//!   its own deadline, or that belongs to an older window than the credits
//!   already held, is not credited, and the wallet drops it; one for the
//!   window held joins its credits under the earlier live deadline; one for
//!   a newer window replaces them.
//! - **Loans are repaid before anything else.** [`CreditWallet::lend`] moves
//!   live credits out to a spender that works without the wallet (the
//!   limiter's lock-free per-key credit cell), which may spend them only
//!   before the loan's deadline; [`CreditWallet::repay`] takes back what it
//!   did not spend and counts the rest as spent. While a loan is out, the
//!   conservation law reads `balance + lent = credited − spent − expired −
//!   withdrawn`; callers repay before any other operation.

use leasehold_core::window_credit::{grant_fate, ArrivingGrant, GrantFate, HeldWindow};

/// A monotonic instant the wallet can compare and advance by milliseconds
/// (the shared rule's time, implemented for `u64` milliseconds,
/// `tokio::time::Instant` and `std::time::Instant`).
pub use leasehold_core::window_credit::MonotonicTime;

/// The coordinator window some credits belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLabel {
    /// Window start, coordinator epoch milliseconds: the label of every
    /// admission spent from these credits.
    pub start_ms: u64,
    /// Window end, coordinator epoch milliseconds (the decisions' `reset_at`).
    pub end_ms: u64,
    /// The key's limit for this window.
    pub limit: u64,
}

/// What a backend granted for one refill, as the wallet needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantTerms {
    /// Tokens granted (0 is a valid, empty grant).
    pub granted: u64,
    /// The window the tokens belong to.
    pub window: WindowLabel,
    /// Lifetime of the tokens, counted from when the request was sent.
    pub remaining_lifetime_ms: u64,
}

/// Proof that one refill is in flight. Consumed exactly once by
/// [`CreditWallet::credit`] or [`CreditWallet::abandon`].
#[derive(Debug)]
#[must_use = "a ticket must be credited or abandoned, or the key never refills again"]
pub struct RefillTicket<T> {
    seq: u64,
    sent_at: T,
}

impl<T: MonotonicTime> RefillTicket<T> {
    /// When the refill request was (about to be) sent: the origin of the
    /// grant's lifetime.
    pub fn sent_at(&self) -> T {
        self.sent_at
    }
}

/// The result of [`CreditWallet::spend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpendOutcome {
    /// `cost` tokens were spent from credits of `window`.
    Spent {
        /// Live balance left after the spend.
        remaining: u64,
        /// The window the spent credits belong to (the admission's label).
        window: WindowLabel,
    },
    /// Not enough live credits; nothing was spent.
    Short {
        /// Live balance held (less than the cost).
        balance: u64,
    },
}

/// The result of [`CreditWallet::credit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditOutcome {
    /// The grant was added to the balance.
    Credited {
        /// Tokens added.
        tokens: u64,
        /// When the grant opened a new window: tokens served in the previous
        /// window (the demand a lease sizer learns from).
        closed_window_served: Option<u64>,
    },
    /// The grant was empty (`granted == 0`); the window is still recorded.
    Empty,
    /// The grant arrived at or after its own deadline and was dropped.
    DroppedLate {
        /// Tokens dropped.
        tokens: u64,
    },
    /// The grant belongs to an older window than the credits held; dropped.
    DroppedStaleWindow {
        /// Tokens dropped.
        tokens: u64,
    },
}

/// Credits taken out of the wallet to be given back to the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Withdrawal {
    /// Tokens withdrawn.
    pub tokens: u64,
    /// The window they belong to.
    pub window: WindowLabel,
}

/// Credits lent out of the wallet (see [`CreditWallet::lend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loan<T> {
    /// Tokens lent.
    pub tokens: u64,
    /// The window they belong to (the label of every admission they pay).
    pub window: WindowLabel,
    /// They may be spent only strictly before this instant.
    pub deadline: T,
}

/// Running totals of a wallet, for conservation checks and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WalletTotals {
    /// Σ tokens credited.
    pub credited: u64,
    /// Σ tokens spent (admitted).
    pub spent: u64,
    /// Σ tokens that died at their deadline unspent.
    pub expired: u64,
    /// Σ tokens withdrawn for return.
    pub withdrawn: u64,
    /// Σ tokens of grants dropped on arrival (late or stale).
    pub dropped: u64,
}

/// One key's leased credits (see the module docs for the laws).
#[derive(Debug, Clone)]
pub struct CreditWallet<T> {
    balance: u64,
    deadline: Option<T>,
    window: Option<WindowLabel>,
    served_in_window: u64,
    in_flight: Option<u64>,
    next_ticket: u64,
    lent: u64,
    totals: WalletTotals,
}

impl<T: MonotonicTime> Default for CreditWallet<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: MonotonicTime> CreditWallet<T> {
    /// An empty wallet with no window.
    pub fn new() -> Self {
        CreditWallet {
            balance: 0,
            deadline: None,
            window: None,
            served_in_window: 0,
            in_flight: None,
            next_ticket: 0,
            lent: 0,
            totals: WalletTotals::default(),
        }
    }

    /// Drops credits whose deadline has passed (`now ≥ deadline`).
    fn expire(&mut self, now: T) {
        if self.balance > 0 && self.deadline.is_some_and(|d| now >= d) {
            self.totals.expired = self.totals.expired.saturating_add(self.balance);
            self.balance = 0;
        }
    }

    /// Whether credits held (if any) are still live at `now`.
    fn live(&self, now: T) -> bool {
        self.deadline.is_some_and(|d| now < d)
    }

    /// The live balance at `now` (zero once the deadline has passed).
    pub fn balance(&self, now: T) -> u64 {
        if self.live(now) {
            self.balance
        } else {
            0
        }
    }

    /// The window of the credits held or last granted, if any.
    pub fn window(&self) -> Option<WindowLabel> {
        self.window
    }

    /// The local deadline of the credits held, if any.
    pub fn deadline(&self) -> Option<T> {
        self.deadline
    }

    /// Tokens spent from the current window's credits so far.
    pub fn served_in_window(&self) -> u64 {
        self.served_in_window
    }

    /// Running totals.
    pub fn totals(&self) -> WalletTotals {
        self.totals
    }

    /// Tokens out on loan (0 when no loan is outstanding).
    pub fn lent(&self) -> u64 {
        self.lent
    }

    /// Whether a refill ticket is outstanding.
    pub fn refill_in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Spends `cost` tokens if that many live credits are held at `now`.
    /// Dead credits are dropped first. A `cost` of zero is a no-op spend.
    pub fn spend(&mut self, now: T, cost: u64) -> SpendOutcome {
        self.expire(now);
        match self.window {
            Some(window) if self.live(now) && self.balance >= cost => {
                self.balance -= cost;
                self.totals.spent = self.totals.spent.saturating_add(cost);
                self.served_in_window = self.served_in_window.saturating_add(cost);
                SpendOutcome::Spent {
                    remaining: self.balance,
                    window,
                }
            }
            _ => SpendOutcome::Short {
                balance: self.balance(now),
            },
        }
    }

    /// Starts a refill sent at `now`, unless one is already in flight (then
    /// `None`: wait for it instead of issuing another — coalescing).
    pub fn begin_refill(&mut self, now: T) -> Option<RefillTicket<T>> {
        if self.in_flight.is_some() {
            return None;
        }
        let seq = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1);
        self.in_flight = Some(seq);
        Some(RefillTicket { seq, sent_at: now })
    }

    /// Ends a refill that produced no grant (error, timeout).
    pub fn abandon(&mut self, ticket: RefillTicket<T>) {
        if self.in_flight == Some(ticket.seq) {
            self.in_flight = None;
        }
    }

    /// Credits the grant of `ticket`'s refill, arriving at `now`, as the
    /// shared rule decides ([`grant_fate`]): its deadline is
    /// `ticket.sent_at + remaining_lifetime_ms`; it is dropped if `now` is at
    /// or past that deadline, or if it belongs to an older window than the
    /// one held (its last window, even once its credits died). A grant for
    /// the window held joins its credits (and may lower its limit); one for
    /// a newer window replaces the old credits (they are dead by then: the
    /// coordinator applied the new grant after the old window ended).
    pub fn credit(&mut self, ticket: RefillTicket<T>, terms: GrantTerms, now: T) -> CreditOutcome {
        if self.in_flight == Some(ticket.seq) {
            self.in_flight = None;
        }
        self.expire(now);
        let held = self
            .window
            .zip(self.deadline)
            .map(|(window, deadline)| HeldWindow {
                window_start_ms: window.start_ms,
                deadline,
            });
        let arriving = ArrivingGrant {
            window_start_ms: terms.window.start_ms,
            sent_at: ticket.sent_at,
            remaining_lifetime_ms: terms.remaining_lifetime_ms,
        };
        let mut closed_window_served = None;
        match grant_fate(held, arriving, now) {
            GrantFate::OlderWindow => {
                self.totals.dropped = self.totals.dropped.saturating_add(terms.granted);
                return CreditOutcome::DroppedStaleWindow {
                    tokens: terms.granted,
                };
            }
            GrantFate::Late => {
                self.totals.dropped = self.totals.dropped.saturating_add(terms.granted);
                return CreditOutcome::DroppedLate {
                    tokens: terms.granted,
                };
            }
            GrantFate::SameWindow { deadline } => {
                self.deadline = Some(deadline);
                if let Some(held) = self.window.filter(|held| terms.window.limit < held.limit) {
                    self.window = Some(WindowLabel {
                        limit: terms.window.limit,
                        ..held
                    });
                }
            }
            GrantFate::NewWindow { deadline } => {
                if self.window.is_some() {
                    closed_window_served = Some(self.served_in_window);
                }
                if self.balance > 0 {
                    // Unreachable in real time (the held window is over) but never carried.
                    self.totals.expired = self.totals.expired.saturating_add(self.balance);
                    self.balance = 0;
                }
                self.served_in_window = 0;
                self.window = Some(terms.window);
                self.deadline = Some(deadline);
            }
        }
        if terms.granted == 0 {
            return CreditOutcome::Empty;
        }
        self.balance = self.balance.saturating_add(terms.granted);
        self.totals.credited = self.totals.credited.saturating_add(terms.granted);
        CreditOutcome::Credited {
            tokens: terms.granted,
            closed_window_served,
        }
    }

    /// Lends up to `max_tokens` live credits (`None` when a loan is already
    /// out, or nothing live is held at `now`). The borrower may spend them
    /// only strictly before the loan's deadline, and must hand back what is
    /// left with [`repay`](Self::repay) before the wallet is used again.
    pub fn lend(&mut self, now: T, max_tokens: u64) -> Option<Loan<T>> {
        self.expire(now);
        if self.lent > 0 || self.balance == 0 || !self.live(now) {
            return None;
        }
        let window = self.window?;
        let deadline = self.deadline?;
        let tokens = self.balance.min(max_tokens);
        if tokens == 0 {
            return None;
        }
        self.balance -= tokens;
        self.lent = tokens;
        Some(Loan {
            tokens,
            window,
            deadline,
        })
    }

    /// Ends the outstanding loan: `unspent` tokens (capped at the loan)
    /// come back, the rest are counted as spent in the current window; then
    /// credits dead at `now` are dropped. Returns the tokens the loan spent
    /// (0 when no loan was out).
    pub fn repay(&mut self, unspent: u64, now: T) -> u64 {
        let lent = std::mem::take(&mut self.lent);
        let unspent = unspent.min(lent);
        let spent = lent - unspent;
        self.balance = self.balance.saturating_add(unspent);
        self.totals.spent = self.totals.spent.saturating_add(spent);
        self.served_in_window = self.served_in_window.saturating_add(spent);
        self.expire(now);
        spent
    }

    /// Takes every live credit out of the wallet (to give it back to the
    /// backend). `None` when nothing live is held.
    pub fn withdraw_all(&mut self, now: T) -> Option<Withdrawal> {
        self.expire(now);
        let window = self.window?;
        if self.balance == 0 || !self.live(now) {
            return None;
        }
        let tokens = std::mem::take(&mut self.balance);
        self.totals.withdrawn = self.totals.withdrawn.saturating_add(tokens);
        Some(Withdrawal { tokens, window })
    }
}

#[cfg(test)]
mod tests;
