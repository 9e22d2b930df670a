//! Hostile callers get refusals, never effects (DESIGN §7a): a request id
//! reused for another request (other key, region or amount) is refused
//! (`ALREADY_EXISTS`, reason `REQUEST_ID_REUSED`; or `FAILED_PRECONDITION`,
//! reason `SESSION_EXPIRED`, when the session no longer remembers it), a
//! retry of the same request gets the first answer or that expired
//! refusal, and an escrow node accepts back at most what the caller held.
//! A `RESOURCE_EXHAUSTED` refusal (a bound reached before the request was
//! looked at) is allowed too: nothing was executed.
//! The tokens a hostile client is told it got are also recorded as its
//! admissions, so an answer that hands out uncounted tokens shows up in
//! [`check_delta`](super::check_delta) as well. A Raft message forged by a
//! hostile peer (a retired member's, a stranger's or an impostor's
//! certificate, any term) is never handed to Raft: refused, or its
//! connection closed.

use super::Violation;
use crate::history::{Expected, History, HostileProbe, PeerAnswer, ProbeAnswer};

/// `ALREADY_EXISTS` with reason `REQUEST_ID_REUSED`, or `FAILED_PRECONDITION`
/// with reason `SESSION_EXPIRED`: the refusals a reused id may get.
fn is_reuse_refusal(code: &str, reason: &str) -> bool {
    is_expired_refusal(code, reason)
        || (code == "AlreadyExists"
            && reason == leasehold_proto::refusal::Reason::RequestIdReused.as_str())
}

/// `FAILED_PRECONDITION` with reason `SESSION_EXPIRED`, or a bound.
fn is_expired_refusal(code: &str, reason: &str) -> bool {
    is_bound_refusal(code)
        || (code == "FailedPrecondition"
            && reason == leasehold_proto::refusal::Reason::SessionExpired.as_str())
}

/// A resource bound refused the request before it was looked at.
fn is_bound_refusal(code: &str) -> bool {
    code == "ResourceExhausted"
}

fn probe_violation(probe: &HostileProbe) -> Option<String> {
    match (&probe.expected, &probe.answer) {
        (Expected::Fresh, _) | (_, ProbeAnswer::NoAnswer) => None,
        (Expected::ReplayOf(first), ProbeAnswer::Answered(again)) => (first != again)
            .then(|| format!("a retry was answered {again}, the first answer was {first}")),
        (Expected::ReplayOf(first), ProbeAnswer::Refused { code, reason }) => {
            (!is_expired_refusal(code, reason)).then(|| {
                format!("a retry was refused {code} ({reason:?}), the first answer was {first}")
            })
        }
        (Expected::Refusal, ProbeAnswer::Answered(effect)) => Some(format!(
            "an id reused for another request was answered {effect} instead of refused"
        )),
        (Expected::Refusal, ProbeAnswer::Refused { code, reason }) => {
            (!is_reuse_refusal(code, reason)).then(|| {
                format!("an id reused for another request was refused {code} ({reason:?}), not as reused or expired")
            })
        }
    }
}

/// Hostile requests answered with something other than what their id allows,
/// and returns accepted beyond what the caller held.
pub fn check_hostile(history: &History) -> Vec<Violation> {
    let probes = history.hostile_probes.iter().filter_map(|probe| {
        probe_violation(probe).map(|what| Violation {
            invariant: "hostile",
            detail: format!(
                "hostile client {} ({}), request {} [{}]: {what}",
                probe.client, probe.trick, probe.request_id, probe.request
            ),
        })
    });
    let returns = history
        .over_returns
        .iter()
        .filter(|r| r.accepted > r.held)
        .map(|r| Violation {
            invariant: "hostile",
            detail: format!(
                "hostile client {} held {} of window {} and offered {} back: the escrow node accepted {}",
                r.client, r.held, r.window_start_ms, r.offered, r.accepted
            ),
        });
    let peers = history
        .peer_probes
        .iter()
        .filter(|p| p.answer == PeerAnswer::Accepted)
        .map(|p| Violation {
            invariant: "hostile",
            detail: format!(
                "a forged {} from {} at term {} was accepted by member {}",
                p.message, p.from, p.term, p.to
            ),
        });
    probes.chain(returns).chain(peers).collect()
}

/// Hostile requests whose answer was checked against their id's history
/// (retries and reused ids that got an answer or a refusal).
pub fn hostile_probes_checked(history: &History) -> u64 {
    history
        .hostile_probes
        .iter()
        .filter(|p| p.expected != Expected::Fresh && p.answer != ProbeAnswer::NoAnswer)
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::OverReturn;

    fn probe(expected: Expected, answer: ProbeAnswer) -> History {
        History {
            hostile_probes: vec![HostileProbe {
                client: 1_000,
                trick: "changed_payload",
                request_id: "h0/3".into(),
                request: "chaos/budget region-h0 tokens 7".into(),
                expected,
                answer,
            }],
            ..History::default()
        }
    }

    fn refused(code: &str, reason: &str) -> ProbeAnswer {
        ProbeAnswer::Refused {
            code: code.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn refusing_a_reused_id_holds() {
        for answer in [
            refused("AlreadyExists", "REQUEST_ID_REUSED"),
            refused("FailedPrecondition", "SESSION_EXPIRED"),
            refused("ResourceExhausted", "SESSIONS_EXHAUSTED"),
            ProbeAnswer::NoAnswer,
        ] {
            let h = probe(Expected::Refusal, answer);
            assert!(check_hostile(&h).is_empty());
        }
        let h = probe(
            Expected::Refusal,
            refused("AlreadyExists", "REQUEST_ID_REUSED"),
        );
        assert_eq!(hostile_probes_checked(&h), 1);
    }

    #[test]
    fn executing_a_reused_id_is_caught() {
        let v = check_hostile(&probe(
            Expected::Refusal,
            ProbeAnswer::Answered("7@1000".into()),
        ));
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("h0/3"));
        assert!(v[0].detail.contains("answered 7@1000 instead of refused"));
    }

    #[test]
    fn refusing_a_reused_id_for_another_reason_is_caught() {
        let v = check_hostile(&probe(Expected::Refusal, refused("NotFound", "")));
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("refused NotFound"));
        // Right code, wrong (missing) reason.
        assert_eq!(
            check_hostile(&probe(Expected::Refusal, refused("AlreadyExists", ""))).len(),
            1
        );
    }

    #[test]
    fn a_retry_gets_the_first_answer_or_expires() {
        let same = probe(
            Expected::ReplayOf("5@1000".into()),
            ProbeAnswer::Answered("5@1000".into()),
        );
        assert!(check_hostile(&same).is_empty());
        let expired = probe(
            Expected::ReplayOf("5@1000".into()),
            refused("FailedPrecondition", "SESSION_EXPIRED"),
        );
        assert!(check_hostile(&expired).is_empty());
        let other = probe(
            Expected::ReplayOf("5@1000".into()),
            ProbeAnswer::Answered("3@1000".into()),
        );
        assert_eq!(check_hostile(&other).len(), 1);
        let reused = probe(
            Expected::ReplayOf("5@1000".into()),
            refused("AlreadyExists", "REQUEST_ID_REUSED"),
        );
        assert_eq!(check_hostile(&reused).len(), 1);
    }

    #[test]
    fn a_fresh_id_may_get_any_answer() {
        let h = probe(Expected::Fresh, ProbeAnswer::Answered("9@0".into()));
        assert!(check_hostile(&h).is_empty());
        assert_eq!(hostile_probes_checked(&h), 0);
    }

    fn returned(held: u64, accepted: u64) -> History {
        History {
            over_returns: vec![OverReturn {
                client: 1_000,
                window_start_ms: 2_000,
                held,
                offered: 1_000_000,
                accepted,
            }],
            ..History::default()
        }
    }

    #[test]
    fn accepting_back_at_most_what_was_held_holds() {
        assert!(check_hostile(&returned(1, 1)).is_empty());
        assert!(check_hostile(&returned(1, 0)).is_empty());
    }

    #[test]
    fn accepting_back_more_than_was_held_is_caught() {
        let v = check_hostile(&returned(1, 1_000_000));
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("accepted 1000000"));
    }
}
