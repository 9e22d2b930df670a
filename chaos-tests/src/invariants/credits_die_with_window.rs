//! Credits die with their window: no admission spends a credit at or after
//! the end of the window it was granted in, measured on the coordinator's
//! timeline, whatever the clients' clocks say. The coordinator's timeline is
//! simulated real time except where members' clocks run slow: then a window
//! ends up to `coordinator_lag_ms` later in real time, and only admissions
//! past that are violations.

use super::Violation;
use crate::history::History;

/// Admissions made at or after their window's end.
pub fn check_credits_die_with_window(history: &History) -> Vec<Violation> {
    history
        .admissions
        .iter()
        .filter(|a| {
            a.at_ms >= a.window_start_ms + history.window_ms + history.coordinator_lag_ms
        })
        .map(|a| Violation {
            invariant: "credits_die_with_window",
            detail: format!(
                "client {} spent {} of window {} at {} (window ended at {}, clock lag allowed {} ms)",
                a.client,
                a.cost,
                a.window_start_ms,
                a.at_ms,
                a.window_start_ms + history.window_ms,
                history.coordinator_lag_ms
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Admission, SHARED_KEY};

    fn at(at_ms: u64) -> History {
        History {
            limit: 10,
            window_ms: 1_000,
            admissions: vec![Admission {
                client: 0,
                key: SHARED_KEY,
                cost: 1,
                window_start_ms: 1_000,
                at_ms,
            }],
            ..History::default()
        }
    }

    #[test]
    fn spending_inside_the_window_holds() {
        assert!(check_credits_die_with_window(&at(1_000)).is_empty());
        assert!(check_credits_die_with_window(&at(1_999)).is_empty());
    }

    #[test]
    fn spending_at_or_after_the_end_is_caught() {
        assert_eq!(check_credits_die_with_window(&at(2_000)).len(), 1);
        assert_eq!(check_credits_die_with_window(&at(5_000)).len(), 1);
    }

    #[test]
    fn a_slow_coordinator_clock_extends_the_window_by_its_lag_only() {
        let lagging = |at_ms| History {
            coordinator_lag_ms: 300,
            ..at(at_ms)
        };
        assert!(check_credits_die_with_window(&lagging(2_299)).is_empty());
        assert_eq!(check_credits_die_with_window(&lagging(2_300)).len(), 1);
    }
}
