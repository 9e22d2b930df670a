//! No forgotten grant: every grant the coordinator acknowledged is still
//! counted after any crash, restart or leader change. A linearizable read of
//! a window sent at time t must count at least every grant of that window
//! acknowledged before t (`granted` never decreases within a window).
//! Except in the windows a forced new cluster sealed
//! ([`History::forgotten_before_ms`]): the unsafe recovery forgets what
//! only the lost members held, by design; Δ still covers those windows.

use super::Violation;
use crate::history::History;

/// Reads that count less than was acknowledged before them.
pub fn check_no_forgotten_grant(history: &History) -> Vec<Violation> {
    history
        .observations
        .iter()
        .filter(|seen| {
            history
                .forgotten_before_ms
                .is_none_or(|sealed| seen.window_start_ms >= sealed)
        })
        .filter_map(|seen| {
            let acked: u64 = history
                .acked_grants
                .iter()
                .filter(|g| g.window_start_ms == seen.window_start_ms && g.at_ms < seen.read_at_ms)
                .map(|g| g.granted)
                .sum();
            (seen.granted < acked).then(|| Violation {
                invariant: "no_forgotten_grant",
                detail: format!(
                    "window {}: a read at {} counts {} granted, {acked} were acknowledged before it",
                    seen.window_start_ms, seen.read_at_ms, seen.granted
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{AckedGrant, WindowObservation};

    fn history(acked_at: &[(u64, u64)], read_at_ms: u64, granted: u64) -> History {
        History {
            limit: 100,
            window_ms: 1_000,
            acked_grants: acked_at
                .iter()
                .map(|(g, at)| AckedGrant {
                    granted: *g,
                    window_start_ms: 0,
                    at_ms: *at,
                })
                .collect(),
            observations: vec![WindowObservation {
                window_start_ms: 0,
                read_at_ms,
                granted,
            }],
            ..History::default()
        }
    }

    #[test]
    fn counting_every_earlier_grant_holds() {
        assert!(check_no_forgotten_grant(&history(&[(10, 100), (20, 200)], 300, 30)).is_empty());
        // A grant acknowledged after the read need not be counted by it.
        assert!(check_no_forgotten_grant(&history(&[(10, 100), (20, 400)], 300, 10)).is_empty());
    }

    #[test]
    fn a_lost_grant_is_caught() {
        let v = check_no_forgotten_grant(&history(&[(10, 100), (20, 200)], 300, 10));
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("30 were acknowledged"));
    }

    #[test]
    fn only_windows_a_forced_new_cluster_sealed_may_forget() {
        let forgetting = history(&[(10, 100), (20, 200)], 300, 10);
        let sealed = History {
            forgotten_before_ms: Some(1_000),
            ..forgetting.clone()
        };
        assert!(check_no_forgotten_grant(&sealed).is_empty());
        let later = History {
            forgotten_before_ms: Some(0),
            ..forgetting
        };
        assert_eq!(check_no_forgotten_grant(&later).len(), 1);
    }
}
