//! What each caller was charged on each key in the current window, so that
//! a refund (Envoy's `is_negative_hits`) gives back only what that caller
//! was charged there (pure).
//!
//! An escrow node takes back at most what it served in a window and has
//! not taken back (the cap every return has), which keeps Σ admitted ≤ L
//! whoever refunds. This book adds the caller's own cap: a refund by one
//! caller never gives back what another was charged. Per (key, caller) it
//! keeps the charges of one window, the latest; a charge in a later
//! window starts afresh, and a refund names no window: it is for the
//! window the caller was last charged in, and only while that window
//! lasts. Bounded: at most [`MAX_REFUNDABLE`] (key, caller) entries; when
//! full, entries of windows that ended go first, and a charge that still
//! finds no room is not recorded — its refund is then refused, never
//! granted blind.

use std::collections::HashMap;

/// Most (key, caller) entries kept.
pub const MAX_REFUNDABLE: usize = 65_536;

/// One (key, caller)'s charges in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Charged {
    window_start_ms: u64,
    window_end_ms: u64,
    /// Charged and not refunded.
    outstanding: u64,
}

/// A refund to make: this many tokens, in this window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refundable {
    /// The window the caller was charged in.
    pub window_start_ms: u64,
    /// At most this many tokens (what it was charged and not refunded).
    pub tokens: u64,
}

/// See the module doc. `C` names a caller (its principal, in the node).
#[derive(Debug, Clone)]
pub struct RefundBook<C> {
    entries: HashMap<(String, C), Charged>,
    capacity: usize,
}

impl<C: std::hash::Hash + Eq + Clone> Default for RefundBook<C> {
    fn default() -> Self {
        Self::with_capacity(MAX_REFUNDABLE)
    }
}

impl<C: std::hash::Hash + Eq + Clone> RefundBook<C> {
    /// A book of at most `capacity` entries.
    pub fn with_capacity(capacity: usize) -> Self {
        RefundBook {
            entries: HashMap::new(),
            capacity,
        }
    }

    /// Records that `caller` was charged `tokens` on `key` in the window
    /// `[window_start_ms, window_end_ms)`, at `now_ms`. Returns whether it
    /// was recorded (no room: not refundable).
    pub fn charge(
        &mut self,
        (key, caller): (&str, &C),
        (window_start_ms, window_end_ms): (u64, u64),
        tokens: u64,
        now_ms: u64,
    ) -> bool {
        if tokens == 0 {
            return true;
        }
        let id = (key.to_string(), caller.clone());
        if !self.entries.contains_key(&id) && self.entries.len() >= self.capacity {
            self.entries
                .retain(|_, charged| charged.window_end_ms > now_ms);
            if self.entries.len() >= self.capacity {
                return false;
            }
        }
        let charged = self.entries.entry(id).or_insert(Charged {
            window_start_ms,
            window_end_ms,
            outstanding: 0,
        });
        if charged.window_start_ms != window_start_ms {
            if window_start_ms < charged.window_start_ms {
                // A charge of an older window than the one kept: not
                // refundable (the newer window's charges stay).
                return false;
            }
            *charged = Charged {
                window_start_ms,
                window_end_ms,
                outstanding: 0,
            };
        }
        charged.outstanding = charged.outstanding.saturating_add(tokens);
        true
    }

    /// What a refund of `tokens` by `caller` on `key` at `now_ms` may give
    /// back: at most what it was charged there, in a window not yet over.
    pub fn refundable(
        &self,
        key: &str,
        caller: &C,
        tokens: u64,
        now_ms: u64,
    ) -> Option<Refundable> {
        let charged = self.entries.get(&(key.to_string(), caller.clone()))?;
        (charged.window_end_ms > now_ms && charged.outstanding > 0).then_some(Refundable {
            window_start_ms: charged.window_start_ms,
            tokens: tokens.min(charged.outstanding),
        })
    }

    /// Records that `tokens` of `caller`'s charges on `key` in the window
    /// starting at `window_start_ms` were given back.
    pub fn refunded(&mut self, key: &str, caller: &C, window_start_ms: u64, tokens: u64) {
        if let Some(charged) = self.entries.get_mut(&(key.to_string(), caller.clone())) {
            if charged.window_start_ms == window_start_ms {
                charged.outstanding = charged.outstanding.saturating_sub(tokens);
            }
        }
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_refund_gives_back_at_most_the_callers_own_charges_in_a_live_window() {
        let mut book = RefundBook::default();
        assert!(book.charge(("k", &"a"), (0, 1_000), 40, 10));
        assert!(book.charge(("k", &"a"), (0, 1_000), 2, 20));
        assert!(book.charge(("k", &"b"), (0, 1_000), 5, 20));
        let refund = book.refundable("k", &"a", 100, 30).unwrap();
        assert_eq!((refund.window_start_ms, refund.tokens), (0, 42));
        book.refunded("k", &"a", 0, 42);
        assert_eq!(book.refundable("k", &"a", 1, 30), None, "nothing left");
        assert_eq!(book.refundable("k", &"c", 1, 30), None, "never charged");
        assert_eq!(book.refundable("k", &"b", 1, 1_000), None, "window over");
        // A later window starts afresh; an older one is not recorded.
        assert!(book.charge(("k", &"b"), (1_000, 2_000), 3, 1_100));
        assert!(!book.charge(("k", &"b"), (0, 1_000), 3, 1_100));
        assert_eq!(book.refundable("k", &"b", 9, 1_100).unwrap().tokens, 3);
    }

    #[test]
    fn a_full_book_makes_room_from_ended_windows_or_records_nothing() {
        let mut book = RefundBook::with_capacity(2);
        assert!(book.charge(("k1", &1), (0, 100), 1, 0));
        assert!(book.charge(("k2", &1), (0, 200), 1, 0));
        assert!(
            !book.charge(("k3", &1), (0, 300), 1, 50),
            "no room, nothing ended"
        );
        assert_eq!(book.refundable("k3", &1, 1, 50), None);
        assert!(
            book.charge(("k3", &1), (100, 300), 1, 150),
            "k1's window ended"
        );
        assert_eq!(book.len(), 2);
    }

    proptest! {
        /// Whatever the charges and refunds, what a caller is refunded on
        /// a key in a window never exceeds what it was charged there.
        #[test]
        fn refunds_never_exceed_the_callers_charges(
            steps in proptest::collection::vec((0u8..2, 0usize..3, 0u64..3, 0u64..50, any::<bool>()), 1..80),
        ) {
            let mut book = RefundBook::with_capacity(4);
            let mut charged = std::collections::HashMap::<(String, usize, u64), u64>::new();
            let mut refunded = std::collections::HashMap::<(String, usize, u64), u64>::new();
            let mut now = 0u64;
            for (key, caller, window, tokens, advance) in steps {
                if advance {
                    now += 400;
                }
                let window = now / 1_000 + window;
                let key = format!("k{key}");
                let bounds = (window * 1_000, window * 1_000 + 1_000);
                if book.charge((&key, &caller), bounds, tokens, now) {
                    *charged.entry((key.clone(), caller, bounds.0)).or_default() += tokens;
                }
                if let Some(refund) = book.refundable(&key, &caller, tokens, now) {
                    book.refunded(&key, &caller, refund.window_start_ms, refund.tokens);
                    *refunded.entry((key.clone(), caller, refund.window_start_ms)).or_default() += refund.tokens;
                }
            }
            for (id, tokens) in refunded {
                prop_assert!(tokens <= charged.get(&id).copied().unwrap_or(0));
            }
        }
    }
}
