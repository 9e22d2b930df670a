//! Exactly-once effects: every reply to the same request id reports the
//! same effect, so a retried or duplicated request never takes tokens twice
//! (DESIGN §2).
//!
//! Except across a forced new cluster ([`History::forgotten_before_ms`]):
//! the unsafe recovery forgets the sessions only the lost members held, so
//! a retry of a request they answered is executed again by the survivor —
//! in a window the recovery sealed, where it is granted nothing. A later
//! reply of `0@w` with `w` sealed is therefore no second effect; any other
//! difference still is.

use std::collections::BTreeMap;

use super::Violation;
use crate::history::History;

/// Request ids that were answered with different effects.
pub fn check_exactly_once(history: &History) -> Vec<Violation> {
    let mut first_reply: BTreeMap<&str, &str> = BTreeMap::new();
    let mut violations = Vec::new();
    for recorded in &history.replies {
        match first_reply.get(recorded.request_id.as_str()) {
            None => {
                first_reply.insert(&recorded.request_id, &recorded.reply);
            }
            Some(first) if *first == recorded.reply => {}
            Some(_) if forgotten_and_sealed(history, &recorded.reply) => {}
            Some(first) => violations.push(Violation {
                invariant: "exactly_once",
                detail: format!(
                    "request {}: answered {first} and later {}",
                    recorded.request_id, recorded.reply
                ),
            }),
        }
    }
    violations
}

/// Whether `reply` (`granted@window_start`, then `~lifetime` where the
/// recorder knows it) grants nothing in a window a forced new cluster
/// sealed.
fn forgotten_and_sealed(history: &History, reply: &str) -> bool {
    let Some(sealed_before) = history.forgotten_before_ms else {
        return false;
    };
    match reply.split_once('@') {
        Some(("0", rest)) => rest
            .split('~')
            .next()
            .and_then(|window| window.parse::<u64>().ok())
            .is_some_and(|start| start < sealed_before),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::RecordedReply;

    fn history(replies: &[(&str, &str)]) -> History {
        History {
            replies: replies
                .iter()
                .map(|(id, reply)| RecordedReply {
                    request_id: id.to_string(),
                    reply: reply.to_string(),
                })
                .collect(),
            ..History::default()
        }
    }

    #[test]
    fn identical_replies_to_duplicates_hold() {
        let h = history(&[
            ("c1/1", "5@0"),
            ("c1/1", "5@0"),
            ("c1/2", "3@0"),
            ("c2/1", "0@0"),
        ]);
        assert!(check_exactly_once(&h).is_empty());
    }

    #[test]
    fn a_duplicate_granted_again_is_caught() {
        let h = history(&[("c1/1", "5@0"), ("c1/2", "3@0"), ("c1/1", "4@0")]);
        let v = check_exactly_once(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("c1/1"));
        assert!(v[0].detail.contains("4@0"));
    }

    #[test]
    fn a_second_execution_granting_as_much_in_the_window_is_caught_by_its_lifetime() {
        let h = history(&[("c1/1", "3@0~900"), ("c1/1", "3@0~900")]);
        assert!(check_exactly_once(&h).is_empty(), "a replay of the answer");
        let h = history(&[("c1/1", "3@0~900"), ("c1/1", "3@0~400")]);
        assert_eq!(check_exactly_once(&h).len(), 1, "executed again later");
    }

    #[test]
    fn a_forced_recovery_may_answer_nothing_in_a_sealed_window_and_nothing_else() {
        let mut h = history(&[
            ("c1/1", "5@1000~900"),
            ("c1/1", "0@1000~400"),
            ("c1/2", "3@1000"),
        ]);
        assert_eq!(check_exactly_once(&h).len(), 1, "no recovery: a violation");
        h.forgotten_before_ms = Some(2_000);
        assert!(
            check_exactly_once(&h).is_empty(),
            "sealed: nothing granted twice"
        );
        h.forgotten_before_ms = Some(1_000);
        assert_eq!(check_exactly_once(&h).len(), 1, "the window was not sealed");
        let mut granted_again = history(&[("c1/1", "5@1000"), ("c1/1", "4@1000")]);
        granted_again.forgotten_before_ms = Some(2_000);
        assert_eq!(
            check_exactly_once(&granted_again).len(),
            1,
            "a second grant never passes"
        );
    }
}
