//! When a watch stream sends: the pure rule, apart from the sampling loop.
//!
//! The server samples the watched view every [`SAMPLE_INTERVAL_MS`]. A
//! sample is sent when it is the first, when it differs from the last view
//! sent, or when [`HEARTBEAT_MS`] have passed since the last send. A new
//! window is a change (its bounds differ), so every watched key gets at
//! least one update per window; the heartbeat bounds the silence of a
//! stream whose views do not change.
//!
//! Laws (property-tested below): the first sample is sent; a sample equal
//! to the last sent and within the heartbeat is not; a sample that differs
//! is; and over any run of samples taken every `SAMPLE_INTERVAL_MS`, two
//! consecutive sends are never more than `HEARTBEAT_MS + SAMPLE_INTERVAL_MS`
//! apart.

/// How often a watch samples the served state, in milliseconds.
pub const SAMPLE_INTERVAL_MS: u64 = 250;
/// Longest silence of a watch stream whose view does not change.
pub const HEARTBEAT_MS: u64 = 5_000;

/// The last view a stream sent and when, deciding whether the next goes out.
#[derive(Debug, Clone, Default)]
pub struct Cadence<V> {
    last_sent: Option<(V, u64)>,
}

impl<V: PartialEq> Cadence<V> {
    /// A stream that has sent nothing yet.
    pub fn new() -> Self {
        Cadence { last_sent: None }
    }

    /// Whether a sample `view` taken at `now_ms` should be sent.
    pub fn due(&self, view: &V, now_ms: u64) -> bool {
        match &self.last_sent {
            None => true,
            Some((last, sent_at_ms)) => {
                last != view || now_ms.saturating_sub(*sent_at_ms) >= HEARTBEAT_MS
            }
        }
    }

    /// Records that `view` was sent at `now_ms`.
    pub fn sent(&mut self, view: V, now_ms: u64) {
        self.last_sent = Some((view, now_ms));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_changed_and_heartbeat_samples_are_sent() {
        let mut cadence = Cadence::new();
        assert!(cadence.due(&1, 0));
        cadence.sent(1, 0);
        assert!(!cadence.due(&1, SAMPLE_INTERVAL_MS));
        assert!(cadence.due(&2, SAMPLE_INTERVAL_MS));
        assert!(!cadence.due(&1, HEARTBEAT_MS - 1));
        assert!(cadence.due(&1, HEARTBEAT_MS));
        // A clock that steps back never makes a stream silent for ever.
        assert!(!cadence.due(&1, 0));
    }

    proptest! {
        /// Sends happen exactly on change or heartbeat, and the gap between
        /// two sends never exceeds heartbeat + one sample interval.
        #[test]
        fn sends_follow_changes_and_the_heartbeat(
            views in proptest::collection::vec(0u8..3, 1..200),
            start in 0u64..1_000_000,
        ) {
            let mut cadence = Cadence::new();
            let mut last_send: Option<(u8, u64)> = None;
            let mut send_times = Vec::new();
            for (i, view) in views.iter().enumerate() {
                let now = start + i as u64 * SAMPLE_INTERVAL_MS;
                let due = cadence.due(view, now);
                let expected = match last_send {
                    None => true,
                    Some((last, at)) => last != *view || now - at >= HEARTBEAT_MS,
                };
                prop_assert_eq!(due, expected);
                if due {
                    cadence.sent(*view, now);
                    last_send = Some((*view, now));
                    send_times.push(now);
                }
            }
            prop_assert_eq!(send_times.first().copied(), Some(start));
            for pair in send_times.windows(2) {
                prop_assert!(pair[1] - pair[0] <= HEARTBEAT_MS + SAMPLE_INTERVAL_MS);
            }
        }
    }
}
