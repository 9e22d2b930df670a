//! Δ = 0: for every key and window, Σ admissions labelled with it, over
//! every client of every region (hostile ones included), ≤ L (DESIGN §2).
//! Every key of a run has the same policy (limit L). A key whose outage
//! policy is `fallback` may exceed L by the regions' fallback shares
//! ([`History::outage_allowance`]), exactly what the policy documents.
//!
//! Keys governed by a shadow-mode policy are left out, explicitly
//! ([`History::shadow_keys`]): shadow mode admits beyond L by design and
//! counts the excess as would-deny instead. Every other key is checked.

use super::Violation;
use crate::history::History;

/// (Key, window)s whose admissions exceed the limit.
pub fn check_delta(history: &History) -> Vec<Violation> {
    history
        .enforced_per_key_window()
        .into_iter()
        .filter(|(_, admitted)| *admitted > history.limit + history.outage_allowance)
        .map(|((key, start), admitted)| Violation {
            invariant: "delta",
            detail: format!(
                "key {key} window {start}: {admitted} admitted > limit {} (+ outage allowance {})",
                history.limit, history.outage_allowance
            ),
        })
        .collect()
}

/// The largest Σ admitted / L over the enforced (key, window)s (shadow keys
/// left out), as a fraction.
pub fn max_ratio(history: &History) -> f64 {
    let max = history
        .enforced_per_key_window()
        .values()
        .copied()
        .max()
        .unwrap_or(0);
    max as f64 / history.limit.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Admission, SHARED_KEY};

    fn history(admissions: &[(u64, u64)]) -> History {
        keyed_history(
            &admissions
                .iter()
                .map(|(window, cost)| (SHARED_KEY, *window, *cost))
                .collect::<Vec<_>>(),
        )
    }

    fn keyed_history(admissions: &[(&'static str, u64, u64)]) -> History {
        History {
            limit: 10,
            window_ms: 1_000,
            admissions: admissions
                .iter()
                .enumerate()
                .map(|(i, &(key, window, cost))| Admission {
                    client: i % 3,
                    key,
                    cost,
                    window_start_ms: window,
                    at_ms: window,
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

    #[test]
    fn shadow_keys_are_left_out_and_only_they() {
        let mut over = keyed_history(&[
            (SHARED_KEY, 0, 10),
            ("chaos/shadow", 0, 30),
            ("chaos/side", 0, 11),
        ]);
        assert_eq!(
            check_delta(&over).len(),
            2,
            "both over-admitted keys caught"
        );
        over.shadow_keys.insert("chaos/shadow");
        let v = check_delta(&over);
        assert_eq!(v.len(), 1, "the shadow key is excluded: {v:?}");
        assert!(v[0].detail.contains("key chaos/side"));
        assert!((max_ratio(&over) - 1.1).abs() < 1e-9);
    }

    #[test]
    fn each_key_has_its_own_limit() {
        let within = keyed_history(&[(SHARED_KEY, 0, 10), ("chaos/side", 0, 10)]);
        assert!(check_delta(&within).is_empty());
        assert!((max_ratio(&within) - 1.0).abs() < 1e-9);
        let over = keyed_history(&[
            (SHARED_KEY, 0, 10),
            ("chaos/side", 0, 6),
            ("chaos/side", 0, 5),
        ]);
        let v = check_delta(&over);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("key chaos/side window 0: 11"));
    }
}
