//! Whether this member reaches each peer, as pure logic: one log line when
//! the link to a peer is lost and one when it is restored, instead of one
//! per failed Raft call (openraft retries every heartbeat).
//!
//! A link counts as lost after [`LOST_AFTER_FAILURES`] failed calls in a
//! row, and as restored at the next successful call. Laws (property-tested):
//! for each peer the changes alternate Lost, Restored, Lost, … starting
//! with Lost; a Lost follows at least `LOST_AFTER_FAILURES` failures in a
//! row; a Restored follows a success; peers do not affect each other.

use std::collections::HashMap;

/// Failed calls in a row after which a link counts as lost (a single
/// timeout on a loaded machine is not an outage).
pub const LOST_AFTER_FAILURES: u32 = 3;

/// A change of one peer link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkChange {
    /// The peer stopped answering.
    Lost {
        /// The peer's node id.
        peer: u64,
        /// The last call's error.
        error: String,
    },
    /// The peer answers again.
    Restored {
        /// The peer's node id.
        peer: u64,
        /// How long it was lost, milliseconds.
        down_ms: u64,
        /// Calls that failed while it was lost (and the ones that lost it).
        failed_calls: u64,
    },
}

#[derive(Debug, Clone, Copy)]
enum Link {
    Up { failures_in_a_row: u32 },
    Down { since_ms: u64, failed_calls: u64 },
}

/// The links of one member to its peers.
#[derive(Debug, Clone, Default)]
pub struct PeerLinks {
    links: HashMap<u64, Link>,
}

impl PeerLinks {
    /// A call to `peer` succeeded at `now_ms`.
    pub fn on_success(&mut self, peer: u64, now_ms: u64) -> Option<LinkChange> {
        let previous = self.links.insert(
            peer,
            Link::Up {
                failures_in_a_row: 0,
            },
        );
        match previous {
            Some(Link::Down {
                since_ms,
                failed_calls,
            }) => Some(LinkChange::Restored {
                peer,
                down_ms: now_ms.saturating_sub(since_ms),
                failed_calls,
            }),
            _ => None,
        }
    }

    /// A call to `peer` failed at `now_ms` with `error` (described lazily).
    pub fn on_failure(
        &mut self,
        peer: u64,
        now_ms: u64,
        error: impl FnOnce() -> String,
    ) -> Option<LinkChange> {
        let link = self.links.entry(peer).or_insert(Link::Up {
            failures_in_a_row: 0,
        });
        match link {
            Link::Up { failures_in_a_row } => {
                *failures_in_a_row += 1;
                if *failures_in_a_row < LOST_AFTER_FAILURES {
                    return None;
                }
                let failed_calls = u64::from(*failures_in_a_row);
                *link = Link::Down {
                    since_ms: now_ms,
                    failed_calls,
                };
                Some(LinkChange::Lost {
                    peer,
                    error: error(),
                })
            }
            Link::Down { failed_calls, .. } => {
                *failed_calls += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn three_failures_lose_a_link_and_one_success_restores_it() {
        let mut links = PeerLinks::default();
        assert_eq!(links.on_failure(2, 0, || "timeout".into()), None);
        assert_eq!(links.on_failure(2, 50, || "timeout".into()), None);
        assert_eq!(
            links.on_failure(2, 100, || "timeout".into()),
            Some(LinkChange::Lost {
                peer: 2,
                error: "timeout".into()
            })
        );
        for t in 0..100 {
            assert_eq!(
                links.on_failure(2, 150 + t, String::new),
                None,
                "one line, not one per retry"
            );
        }
        assert_eq!(
            links.on_success(2, 1_100),
            Some(LinkChange::Restored {
                peer: 2,
                down_ms: 1_000,
                failed_calls: 103
            })
        );
        assert_eq!(links.on_success(2, 1_150), None);
    }

    proptest! {
        #[test]
        fn changes_alternate_per_peer_and_need_failures_in_a_row(
            calls in prop::collection::vec((0u64..3, any::<bool>()), 0..300)
        ) {
            let mut links = PeerLinks::default();
            let mut last: HashMap<u64, bool> = HashMap::new(); // peer -> last change was Lost
            let mut in_a_row: HashMap<u64, u32> = HashMap::new();
            for (now, (peer, ok)) in calls.into_iter().enumerate() {
                let now = now as u64;
                let change = if ok {
                    in_a_row.insert(peer, 0);
                    links.on_success(peer, now)
                } else {
                    *in_a_row.entry(peer).or_default() += 1;
                    links.on_failure(peer, now, String::new)
                };
                match change {
                    Some(LinkChange::Lost { peer: p, .. }) => {
                        prop_assert_eq!(p, peer);
                        prop_assert!(!ok);
                        prop_assert!(in_a_row[&peer] >= LOST_AFTER_FAILURES);
                        prop_assert_ne!(last.insert(peer, true), Some(true));
                    }
                    Some(LinkChange::Restored { peer: p, failed_calls, .. }) => {
                        prop_assert_eq!(p, peer);
                        prop_assert!(ok);
                        prop_assert!(failed_calls >= u64::from(LOST_AFTER_FAILURES));
                        prop_assert_eq!(last.insert(peer, false), Some(true));
                    }
                    None => {}
                }
            }
        }
    }
}
