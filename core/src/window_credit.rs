//! The one rule by which a tier credits what the coordinator granted it for
//! a window: the client's wallet (L1, `leasehold_client::wallet`) and the
//! region's escrow (L2, [`crate::escrow::RegionEscrow`]) both decide the
//! fate of every grant here.
//!
//! # The rule
//! - **Credits die with their window, on the coordinator's timeline.** A
//!   grant's local deadline is the monotonic instant its request was *sent*
//!   plus the remaining lifetime the coordinator returned
//!   ([`local_deadline`]; ADR 0003): the coordinator applied the grant after
//!   the send, so the deadline is never later than the window's end.
//! - **One refill in flight.** A tier asks again only once the answer to its
//!   last ask has come (its ticket); the grant decided here is that answer.
//! - **A grant for an older window than the one held is not credited**
//!   ([`GrantFate::OlderWindow`]), nor is **a grant that arrives at or after
//!   its own deadline** ([`GrantFate::Late`]); an older window is checked
//!   first.
//! - **A grant for a newer window replaces the credits held**
//!   ([`GrantFate::NewWindow`]): the coordinator applied it after the held
//!   window ended there, so what is held is dead.
//! - **A grant for the window held joins its credits**
//!   ([`GrantFate::SameWindow`]) under the earlier of the two deadlines while
//!   the held credits live (each is a bound on the same window's end, so a
//!   later grant never extends credits already held), and under its own
//!   deadline once they are dead.
//!
//! What a tier does with a grant the rule does not credit is the outcome
//! the rule hands it, acted on in the tier's own terms: the escrow holds a
//! coordinator lease and hands the tokens back to their own window
//! (`Reconcile`; the coordinator credits them while that window is current
//! and forfeits them otherwise), while the wallet drops them (counted as
//! dropped) — its credits came through its source, which takes tokens back
//! only into a window it still holds.
//!
//! Times are any [`MonotonicTime`]: the escrow's milliseconds (`u64`), the
//! client's `tokio` instants (with the `tokio` feature), or
//! [`std::time::Instant`]. Window starts are the coordinator's epoch
//! milliseconds and are only compared with each other.

/// A monotonic instant that can be compared and advanced by milliseconds.
pub trait MonotonicTime: Copy + Ord {
    /// This instant plus `ms` milliseconds. On overflow an implementation
    /// must return an instant no later than the true sum (saturating or
    /// `self`), so that a deadline is never pushed later than it should be.
    fn plus_millis(self, ms: u64) -> Self;
}

impl MonotonicTime for u64 {
    fn plus_millis(self, ms: u64) -> Self {
        self.saturating_add(ms)
    }
}

impl MonotonicTime for std::time::Instant {
    fn plus_millis(self, ms: u64) -> Self {
        // On overflow, `self`: the credits are then dead on arrival, which is
        // the conservative choice.
        self.checked_add(std::time::Duration::from_millis(ms))
            .unwrap_or(self)
    }
}

#[cfg(feature = "tokio")]
impl MonotonicTime for tokio::time::Instant {
    fn plus_millis(self, ms: u64) -> Self {
        // On overflow, `self`, as for `std::time::Instant`.
        self.checked_add(std::time::Duration::from_millis(ms))
            .unwrap_or(self)
    }
}

/// The local deadline of a grant whose request was sent at `sent_at` and
/// which lives `remaining_lifetime_ms` on the coordinator's clock: its
/// credits may be spent only strictly before it.
pub fn local_deadline<T: MonotonicTime>(sent_at: T, remaining_lifetime_ms: u64) -> T {
    sent_at.plus_millis(remaining_lifetime_ms)
}

/// The credits a tier holds, as the rule reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldWindow<T> {
    /// Start of their window (coordinator epoch milliseconds).
    pub window_start_ms: u64,
    /// Their local deadline; they are dead at and after it.
    pub deadline: T,
}

/// A grant as it arrives, as the rule reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrivingGrant<T> {
    /// Start of the window it was granted in (coordinator epoch milliseconds).
    pub window_start_ms: u64,
    /// When its request was sent: the origin of its lifetime.
    pub sent_at: T,
    /// `window_end − coordinator_now` when the coordinator applied it.
    pub remaining_lifetime_ms: u64,
}

impl<T: MonotonicTime> ArrivingGrant<T> {
    /// Its own local deadline ([`local_deadline`]).
    pub fn deadline(&self) -> T {
        local_deadline(self.sent_at, self.remaining_lifetime_ms)
    }
}

/// What becomes of an arriving grant (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantFate<T> {
    /// For an older window than the one held: not credited.
    OlderWindow,
    /// Arrived at or after its own deadline: not credited.
    Late,
    /// For the window held: added to its credits, which now die at `deadline`.
    SameWindow {
        /// The deadline of all the window's credits from now on.
        deadline: T,
    },
    /// For a newer window, or nothing held: replaces what is held; its
    /// credits die at `deadline`.
    NewWindow {
        /// The grant's own deadline.
        deadline: T,
    },
}

impl<T> GrantFate<T> {
    /// Whether the grant's tokens are credited.
    pub fn is_credited(&self) -> bool {
        matches!(
            self,
            GrantFate::SameWindow { .. } | GrantFate::NewWindow { .. }
        )
    }
}

/// The fate of `grant`, arriving at `now`, when the tier holds `held` (dead
/// credits count for the order of windows; a tier that forgets them once
/// they die passes `None`).
pub fn grant_fate<T: MonotonicTime>(
    held: Option<HeldWindow<T>>,
    grant: ArrivingGrant<T>,
    now: T,
) -> GrantFate<T> {
    if held.is_some_and(|h| grant.window_start_ms < h.window_start_ms) {
        return GrantFate::OlderWindow;
    }
    let deadline = grant.deadline();
    if now >= deadline {
        return GrantFate::Late;
    }
    match held {
        Some(h) if h.window_start_ms == grant.window_start_ms => GrantFate::SameWindow {
            deadline: if now < h.deadline {
                h.deadline.min(deadline)
            } else {
                deadline
            },
        },
        _ => GrantFate::NewWindow { deadline },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn held() -> impl Strategy<Value = Option<HeldWindow<u64>>> {
        proptest::option::of(
            (0u64..5, 0u64..2_000).prop_map(|(window, deadline)| HeldWindow {
                window_start_ms: window * 1_000,
                deadline,
            }),
        )
    }

    fn arriving() -> impl Strategy<Value = ArrivingGrant<u64>> {
        (
            0u64..5,
            0u64..1_000,
            prop_oneof![Just(0u64), 0u64..1_500, Just(u64::MAX)],
        )
            .prop_map(|(window, sent_at, remaining_lifetime_ms)| ArrivingGrant {
                window_start_ms: window * 1_000,
                sent_at,
                remaining_lifetime_ms,
            })
    }

    proptest! {
        /// The deadline is the send plus the lifetime, never later.
        #[test]
        fn the_deadline_is_the_send_plus_the_lifetime(sent_at in any::<u64>(), lifetime in any::<u64>()) {
            let deadline = local_deadline(sent_at, lifetime);
            prop_assert_eq!(deadline, sent_at.saturating_add(lifetime));
            prop_assert!(u128::from(deadline) <= u128::from(sent_at) + u128::from(lifetime));
        }

        /// A grant is refused exactly when it is for an older window than
        /// the one held or arrives at or after its own deadline, the older
        /// window named first.
        #[test]
        fn a_grant_is_refused_exactly_when_older_or_late(
            held in held(),
            grant in arriving(),
            now in 0u64..3_000,
        ) {
            let older = held.is_some_and(|h| grant.window_start_ms < h.window_start_ms);
            let late = now >= grant.deadline();
            let fate = grant_fate(held, grant, now);
            prop_assert_eq!(fate.is_credited(), !older && !late);
            if older {
                prop_assert_eq!(fate, GrantFate::OlderWindow);
            } else if late {
                prop_assert_eq!(fate, GrantFate::Late);
            }
        }

        /// A credited grant is usable on arrival, never outlives its own
        /// deadline, and never extends the life of credits held.
        #[test]
        fn credited_tokens_live_no_longer_than_either_deadline(
            held in held(),
            grant in arriving(),
            now in 0u64..3_000,
        ) {
            match grant_fate(held, grant, now) {
                GrantFate::SameWindow { deadline } => {
                    let h = held.expect("a same window is held");
                    prop_assert_eq!(h.window_start_ms, grant.window_start_ms);
                    prop_assert!(now < deadline);
                    prop_assert!(deadline <= grant.deadline());
                    if now < h.deadline {
                        prop_assert!(deadline <= h.deadline);
                    }
                }
                GrantFate::NewWindow { deadline } => {
                    prop_assert!(held.is_none_or(|h| h.window_start_ms < grant.window_start_ms));
                    prop_assert_eq!(deadline, grant.deadline());
                    prop_assert!(now < deadline);
                }
                GrantFate::OlderWindow | GrantFate::Late => {}
            }
        }

        /// Waiting never rescues a grant: refused at `now`, refused later too.
        #[test]
        fn a_refused_grant_stays_refused_later(
            held in held(),
            grant in arriving(),
            now in 0u64..3_000,
            wait in 0u64..3_000,
        ) {
            if !grant_fate(held, grant, now).is_credited() {
                prop_assert!(!grant_fate(held, grant, now + wait).is_credited());
            }
        }
    }

    /// Each boundary of the rule, exactly at it: a grant arriving at its
    /// own deadline is late; one arriving when the held credits die is for
    /// a window whose credits are dead (its own deadline alone); one for
    /// the held window itself is not older; one a window back is.
    #[test]
    fn the_fate_of_a_grant_at_each_boundary() {
        let grant = |window_start_ms: u64| ArrivingGrant {
            window_start_ms,
            sent_at: 100u64,
            remaining_lifetime_ms: 800,
        };
        let held = |deadline: u64| {
            Some(HeldWindow {
                window_start_ms: 1_000,
                deadline,
            })
        };
        assert_eq!(grant_fate(None, grant(1_000), 900), GrantFate::Late);
        assert_eq!(
            grant_fate(None, grant(1_000), 899),
            GrantFate::NewWindow { deadline: 900 }
        );
        assert_eq!(
            grant_fate(held(500), grant(1_000), 500),
            GrantFate::SameWindow { deadline: 900 }
        );
        assert_eq!(
            grant_fate(held(501), grant(1_000), 500),
            GrantFate::SameWindow { deadline: 501 }
        );
        assert_eq!(grant_fate(held(500), grant(0), 200), GrantFate::OlderWindow);
        assert_eq!(
            grant_fate(held(500), grant(2_000), 200),
            GrantFate::NewWindow { deadline: 900 }
        );
    }

    /// The client's clock: tokio instants advance the same way.
    #[cfg(feature = "tokio")]
    #[test]
    fn tokio_instants_advance_by_milliseconds_and_saturate_to_themselves() {
        let now = tokio::time::Instant::now();
        assert_eq!(
            now.plus_millis(1_500),
            now + std::time::Duration::from_millis(1_500)
        );
        assert!(now.plus_millis(u64::MAX) >= now);
        assert!(now.plus_millis(1) > now);
    }

    #[test]
    fn instants_advance_by_milliseconds_and_saturate_to_themselves() {
        let now = std::time::Instant::now();
        assert_eq!(
            now.plus_millis(1_500),
            now + std::time::Duration::from_millis(1_500)
        );
        assert!(now.plus_millis(u64::MAX) >= now);
        let sent = std::time::Instant::now();
        let fate = grant_fate(
            None,
            ArrivingGrant {
                window_start_ms: 0,
                sent_at: sent,
                remaining_lifetime_ms: 60_000,
            },
            sent,
        );
        assert_eq!(
            fate,
            GrantFate::NewWindow {
                deadline: sent + std::time::Duration::from_secs(60)
            }
        );
    }
}
