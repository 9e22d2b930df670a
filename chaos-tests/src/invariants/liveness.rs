//! Liveness: once the last fault has healed, admissions resume within a
//! stated bound (when the load runs long enough after the heal to tell),
//! and every operator action (membership change) completes.

use super::Violation;
use crate::history::History;

/// A violation if no admission happened within `bound_ms` after the heal
/// although the load ran past `heal + bound_ms`.
/// Also a violation per operator action that never completed.
pub fn check_liveness(history: &History, bound_ms: u64) -> Vec<Violation> {
    let mut out: Vec<Violation> = history
        .unfinished
        .iter()
        .map(|what| Violation {
            invariant: "liveness",
            detail: format!("operator action never completed: {what}"),
        })
        .collect();
    let Some(healed) = history.healed_at_ms else {
        return out;
    };
    if history.load_end_ms < healed + bound_ms {
        return out;
    }
    let resumed = history
        .admissions
        .iter()
        .any(|a| a.at_ms >= healed && a.at_ms < healed + bound_ms);
    if !resumed {
        out.push(Violation {
            invariant: "liveness",
            detail: format!("no admission within {bound_ms} ms after the heal at {healed}"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Admission, SHARED_KEY};

    fn history(admission_at: Option<u64>) -> History {
        History {
            limit: 10,
            window_ms: 1_000,
            admissions: admission_at
                .map(|at_ms| Admission {
                    client: 0,
                    key: SHARED_KEY,
                    cost: 1,
                    window_start_ms: at_ms - at_ms % 1_000,
                    at_ms,
                })
                .into_iter()
                .collect(),
            healed_at_ms: Some(10_000),
            load_end_ms: 20_000,
            ..History::default()
        }
    }

    #[test]
    fn resuming_in_time_holds() {
        assert!(check_liveness(&history(Some(12_000)), 5_000).is_empty());
    }

    #[test]
    fn an_unfinished_membership_change_is_caught() {
        let mut h = history(Some(12_000));
        h.unfinished.push("JoinSpares".into());
        let violations = check_liveness(&h, 5_000);
        assert_eq!(violations.len(), 1);
        assert!(violations[0].detail.contains("JoinSpares"));
    }

    #[test]
    fn never_resuming_is_caught() {
        assert_eq!(check_liveness(&history(None), 5_000).len(), 1);
        assert_eq!(check_liveness(&history(Some(16_000)), 5_000).len(), 1);
    }
}
