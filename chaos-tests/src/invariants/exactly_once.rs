//! Exactly-once effects: every reply to the same request id reports the
//! same effect, so a retried or duplicated request never takes tokens twice
//! (DESIGN §2).

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
}
