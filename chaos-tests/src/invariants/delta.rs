//! Δ = 0: for every window, Σ admissions labelled with it, over every
//! client of every region, ≤ L (DESIGN §2).

use super::Violation;
use crate::history::History;

/// Windows whose admissions exceed the limit.
pub fn check_delta(history: &History) -> Vec<Violation> {
    history
        .admitted_per_window()
        .into_iter()
        .filter(|(_, admitted)| *admitted > history.limit)
        .map(|(start, admitted)| Violation {
            invariant: "delta",
            detail: format!(
                "window {start}: {admitted} admitted > limit {}",
                history.limit
            ),
        })
        .collect()
}

/// The largest Σ admitted / L over the windows, as a fraction.
pub fn max_ratio(history: &History) -> f64 {
    let max = history
        .admitted_per_window()
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    max as f64 / history.limit.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Admission;

    fn history(admissions: &[(u64, u64)]) -> History {
        History {
            limit: 10,
            window_ms: 1_000,
            admissions: admissions
                .iter()
                .enumerate()
                .map(|(i, (window, cost))| Admission {
                    client: i % 3,
                    cost: *cost,
                    window_start_ms: *window,
                    at_ms: *window,
                })
                .collect(),
            ..History::default()
        }
    }

    #[test]
    fn exactly_the_limit_holds() {
        assert!(check_delta(&history(&[(0, 4), (0, 6), (1_000, 10)])).is_empty());
    }

    #[test]
    fn one_token_over_across_clients_is_caught() {
        let v = check_delta(&history(&[(0, 4), (0, 6), (0, 1), (1_000, 3)]));
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("window 0: 11"));
        assert!((max_ratio(&history(&[(0, 4), (0, 6), (0, 1)])) - 1.1).abs() < 1e-9);
    }
}
