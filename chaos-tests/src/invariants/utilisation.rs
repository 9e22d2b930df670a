//! Utilisation: the share of L admitted per window, averaged over the
//! windows of a healthy stretch. Reported, with a per-scenario floor.

use crate::history::History;

/// Mean Σ admitted / L over the complete windows in `[from_ms, to_ms)`.
pub fn utilisation(history: &History, from_ms: u64, to_ms: u64) -> f64 {
    let per_window = history.admitted_per_window();
    let w = history.window_ms.max(1);
    let first = from_ms.div_ceil(w) * w;
    let mut total = 0.0;
    let mut count = 0u32;
    let mut start = first;
    while start + w <= to_ms {
        total += per_window.get(&start).copied().unwrap_or(0) as f64 / history.limit.max(1) as f64;
        count += 1;
        start += w;
    }
    if count == 0 {
        0.0
    } else {
        total / f64::from(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Admission, SHARED_KEY};

    #[test]
    fn averages_complete_windows_only() {
        let h = History {
            limit: 10,
            window_ms: 1_000,
            admissions: vec![
                Admission {
                    client: 0,
                    key: SHARED_KEY,
                    cost: 10,
                    window_start_ms: 1_000,
                    at_ms: 1_100,
                },
                Admission {
                    client: 1,
                    key: SHARED_KEY,
                    cost: 5,
                    window_start_ms: 2_000,
                    at_ms: 2_100,
                },
                Admission {
                    client: 1,
                    key: SHARED_KEY,
                    cost: 7,
                    window_start_ms: 3_000,
                    at_ms: 3_100,
                },
            ],
            ..History::default()
        };
        assert!((utilisation(&h, 1_000, 3_000) - 0.75).abs() < 1e-9);
        assert!((utilisation(&h, 500, 3_500) - 0.75).abs() < 1e-9);
        assert_eq!(utilisation(&h, 0, 500), 0.0);
    }
}
