//! What a failed command tells its user: a stable error code, the message,
//! a hint saying what to do, and the process exit code. Printed as text on
//! stderr, or under `--output json` as one JSON document on stdout (so a
//! script reading stdout always gets JSON).
//!
//! Exit codes (also in docs/operations.md):
//! - `0` success;
//! - `1` the cluster refused or the command failed (not found, exists
//!   already with other contents, wrong key kind, permission denied, …);
//! - `2` bad usage or input (flags, configuration, invalid arguments), or
//!   a setup no retry can fix: TLS on one side only, a certificate one side
//!   refuses, another service on the port (see [`super::diagnose`]);
//! - `3` unavailable: no leader, no quorum, unreachable or slow members —
//!   the same command may succeed later.

use serde_json::{json, Value};

use super::error::CliError;
use crate::error::NodeError;
use leasehold_client::coordinator::CoordinatorError;
use leasehold_proto::refusal::Reason;

/// Exit code of a refused or failed command.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of bad usage or input.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the cluster could not be reached or had no leader.
pub const EXIT_UNAVAILABLE: u8 = 3;

/// A failed command, described for its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Stable, machine-readable kind (`not_found`, `wrong_service`, …).
    pub code: &'static str,
    /// What went wrong.
    pub message: String,
    /// What to do about it, when there is something to say.
    pub hint: Option<String>,
    /// The process exit code.
    pub exit_code: u8,
}

impl Failure {
    fn new(code: &'static str, message: String, exit_code: u8) -> Self {
        Self {
            code,
            message,
            hint: None,
            exit_code,
        }
    }

    fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// The JSON document printed under `--output json`.
    pub fn to_json(&self) -> Value {
        json!({"error": {
            "code": self.code,
            "message": self.message,
            "hint": self.hint,
            "exit_code": self.exit_code,
        }})
    }

    /// The lines printed on stderr otherwise.
    pub fn to_text(&self) -> String {
        match &self.hint {
            Some(hint) => format!("error: {}\nhint: {hint}", self.message),
            None => format!("error: {}", self.message),
        }
    }
}

const SLOT_MOVING: &str = "the key's slot is changing shards (a `leasehold shard split` or \
     `move` in progress, or a new shard still forming): retry in a few seconds; \
     `leasehold shard list` shows the placement";

const SLOT_ELSEWHERE: &str = "another shard serves the key and its members did not answer \
     from here: `leasehold shard list` shows the key's shard and replicas; pass every \
     member's endpoint (--endpoint host1:7100,host2:7100,host3:7100)";

const EVERY_ENDPOINT: &str = "pass every member's endpoint, as reachable from this machine \
     (--endpoint host1:7100,host2:7100,host3:7100 or LEASEHOLD_ENDPOINT), so the command \
     finds the leader while a member is down";

/// Describes `error` for the user of a command that talked to `endpoints`.
pub fn describe(error: &CliError, endpoints: &[String]) -> Failure {
    let message = error.to_string();
    match error {
        CliError::Usage(_) => Failure::new("usage", message, EXIT_USAGE),
        CliError::Config(_) => Failure::new("config", message, EXIT_USAGE),
        CliError::Node(NodeError::Config(_)) => Failure::new("config", message, EXIT_USAGE),
        CliError::Node(_) => Failure::new("node", message, EXIT_FAILED),
        CliError::Failed(_) => Failure::new("failed", message, EXIT_FAILED),
        CliError::Conflict(_) => Failure::new("conflict", message, EXIT_FAILED),
        CliError::NotFound(_) => Failure::new("not_found", message, EXIT_FAILED),
        CliError::Coordinator(e) => describe_coordinator(e, message, endpoints),
        CliError::Diagnosed(diagnosis) => {
            Failure::new(diagnosis.code(), message, EXIT_USAGE).hint(diagnosis.hint())
        }
    }
}

fn describe_coordinator(
    error: &CoordinatorError,
    message: String,
    endpoints: &[String],
) -> Failure {
    let at = endpoints.join(",");
    match error {
        CoordinatorError::NoEndpoints | CoordinatorError::Address(_) => {
            Failure::new("invalid_endpoint", message, EXIT_USAGE)
                .hint("endpoints are host:port, e.g. --endpoint 10.0.0.1:7100")
        }
        CoordinatorError::InvalidArgument(_) => {
            Failure::new("invalid_argument", message, EXIT_USAGE)
        }
        CoordinatorError::NotFound(_) => Failure::new("not_found", message, EXIT_FAILED).hint(
            "no policy matches the key: `leasehold policy list` shows the prefixes, \
             `leasehold policy set` adds one",
        ),
        CoordinatorError::AlreadyExists(_) => Failure::new("already_exists", message, EXIT_FAILED),
        CoordinatorError::FailedPrecondition { .. } => {
            Failure::new("failed_precondition", message, EXIT_FAILED)
        }
        CoordinatorError::NotLeader {
            reason: Some(Reason::NotOwner),
            ..
        } => Failure::new("not_owner", message, EXIT_UNAVAILABLE).hint(SLOT_ELSEWHERE),
        CoordinatorError::Unavailable {
            reason: Some(Reason::SlotMoving),
            ..
        } => Failure::new("slot_moving", message, EXIT_UNAVAILABLE).hint(SLOT_MOVING),
        CoordinatorError::NotLeader { hint, .. } => {
            let hint = match &hint.leader_addr {
                Some(addr) => format!(
                    "the leader is said to be at {addr}, which did not answer from here: {EVERY_ENDPOINT}"
                ),
                None => EVERY_ENDPOINT.to_string(),
            };
            Failure::new("not_leader", message, EXIT_UNAVAILABLE).hint(hint)
        }
        CoordinatorError::LeaderUnresolvable { .. } => {
            Failure::new("leader_unresolvable", message, EXIT_UNAVAILABLE).hint(EVERY_ENDPOINT)
        }
        CoordinatorError::Unavailable { message: said, .. }
        | CoordinatorError::Transport { message: said, .. } => {
            let lower = said.to_ascii_lowercase();
            let failure = Failure::new("unavailable", message, EXIT_UNAVAILABLE);
            if error.is_name_resolution_failure() {
                failure.hint(format!(
                    "{at} does not resolve from this machine: {EVERY_ENDPOINT}"
                ))
            } else if lower.contains("h2 protocol") || lower.contains("frame") {
                failure.hint(
                    "the server may require mutual TLS: pass --ca, --cert and --cert-key \
                     (docs/security.md) instead of --insecure",
                )
            } else if lower.contains("tls") || lower.contains("certificate") {
                failure.hint(
                    "TLS failed: check that --ca is the cluster's CA and that the server \
                     runs TLS (drop --ca/--cert/--cert-key and pass --insecure for a \
                     plaintext cluster)",
                )
            } else if endpoints.len() < 2 {
                failure.hint(format!(
                    "is a member running at {at}? (`leasehold cluster status`); {EVERY_ENDPOINT}"
                ))
            } else {
                failure.hint(
                    "no member answered as leader: check that a majority of members is \
                     up (`leasehold cluster status`) and that the cluster was initialised \
                     (`leasehold cluster init`)",
                )
            }
        }
        CoordinatorError::DeadlineExceeded { .. } => {
            Failure::new("deadline_exceeded", message, EXIT_UNAVAILABLE).hint(
                "the members did not answer in time: check that a majority is up \
                 (`leasehold cluster status`), or raise --timeout-ms",
            )
        }
        CoordinatorError::Rpc { code, .. } => match code {
            tonic::Code::Unimplemented => Failure::new(
                "wrong_service",
                format!(
                    "the server at {at} does not serve this API (gRPC UNIMPLEMENTED): \
                     it is not a coordinator member"
                ),
                EXIT_USAGE,
            )
            .hint(
                "point --endpoint at a coordinator member (the address `leasehold serve \
                 --listen` binds, port 7100 in deploy/), not an escrow node (7200) or \
                 another service",
            ),
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                Failure::new("permission_denied", message, EXIT_FAILED).hint(
                    "admin commands need an operator certificate \
                 (spiffe://leasehold/operator/NAME; `leasehold certs mint --operators NAME`); \
                 lease and reconcile need the region's certificate",
                )
            }
            tonic::Code::ResourceExhausted => {
                Failure::new("resource_exhausted", message, EXIT_UNAVAILABLE)
            }
            _ => Failure::new("rpc", message, EXIT_FAILED),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_client::coordinator::LeaderHint;
    use proptest::prelude::*;

    fn endpoints() -> Vec<String> {
        vec!["127.0.0.1:7200".to_string()]
    }

    #[test]
    fn a_coordinator_call_to_another_service_names_the_problem_and_the_fix() {
        let error = CliError::Coordinator(CoordinatorError::Rpc {
            code: tonic::Code::Unimplemented,
            message: String::new(),
        });
        let failure = describe(&error, &endpoints());
        assert_eq!(failure.code, "wrong_service");
        assert!(failure.message.contains("127.0.0.1:7200"));
        assert!(failure.message.contains("not a coordinator member"));
        assert!(failure
            .hint
            .as_deref()
            .unwrap_or("")
            .contains("escrow node"));
        assert_eq!(failure.exit_code, EXIT_USAGE);
    }

    #[test]
    fn a_key_whose_slot_moves_or_lives_elsewhere_says_so_not_that_a_leader_is_unreachable() {
        let moving = CliError::Coordinator(CoordinatorError::Unavailable {
            addr: "n1:7100".into(),
            reason: Some(Reason::SlotMoving),
            message: "shard 1 is still forming on this member; retry shortly".into(),
        });
        let failure = describe(&moving, &["n1:7100".to_string()]);
        assert_eq!(failure.code, "slot_moving");
        assert_eq!(failure.exit_code, EXIT_UNAVAILABLE);
        let hint = failure.hint.unwrap_or_default();
        assert!(
            hint.contains("changing shards") && !hint.contains("leader"),
            "{hint}"
        );
        let elsewhere = CliError::Coordinator(CoordinatorError::NotLeader {
            hint: LeaderHint::new(Some(2), Some("n2:7100".into())),
            reason: Some(Reason::NotOwner),
            message: "this member does not serve shard 1".into(),
        });
        let failure = describe(&elsewhere, &["n1:7100".to_string()]);
        assert_eq!(failure.code, "not_owner");
        assert!(failure.hint.unwrap_or_default().contains("shard list"));
    }

    #[test]
    fn an_unresolvable_endpoint_hints_at_every_member() {
        let error = CliError::Coordinator(CoordinatorError::Unavailable {
            addr: "leasehold-2:7100".into(),
            reason: None,
            message: "dns error: failed to lookup address information".into(),
        });
        let failure = describe(&error, &["leasehold-2:7100".to_string()]);
        assert_eq!(failure.exit_code, EXIT_UNAVAILABLE);
        let hint = failure.hint.unwrap_or_default();
        assert!(hint.contains("does not resolve"), "{hint}");
        assert!(hint.contains("every member's endpoint"), "{hint}");
    }

    #[test]
    fn a_diagnosed_cause_is_a_setup_error_with_its_own_code_and_hint() {
        use crate::cli::diagnose::{Diagnosis, Refusal};
        for diagnosis in [
            Diagnosis::ServerSpeaksTls {
                addr: "127.0.0.1:7100".into(),
            },
            Diagnosis::ClientCertificateRefused {
                addr: "127.0.0.1:7100".into(),
                cert: "/certs/operator-admin.pem".into(),
                why: Refusal::Closed,
            },
            Diagnosis::WrongService {
                addr: "127.0.0.1:7200".into(),
                escrow: true,
            },
        ] {
            let failure = describe(&CliError::Diagnosed(diagnosis.clone()), &endpoints());
            assert_eq!(failure.exit_code, EXIT_USAGE, "{diagnosis}");
            assert_eq!(failure.code, diagnosis.code());
            assert_eq!(failure.message, diagnosis.to_string());
            assert_eq!(failure.hint, Some(diagnosis.hint()));
        }
    }

    #[test]
    fn json_errors_carry_code_message_hint_and_exit_code() {
        let failure = describe(&CliError::NotFound("no policy \"x\"".into()), &endpoints());
        let json = failure.to_json();
        assert_eq!(json["error"]["code"], "not_found");
        assert_eq!(json["error"]["exit_code"], 1);
        assert!(json["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("x"));
    }

    fn any_coordinator_error() -> impl Strategy<Value = CoordinatorError> {
        let text = ".{0,40}";
        prop_oneof![
            Just(CoordinatorError::NoEndpoints),
            text.prop_map(CoordinatorError::InvalidArgument),
            text.prop_map(CoordinatorError::NotFound),
            text.prop_map(CoordinatorError::AlreadyExists),
            text.prop_map(|message| CoordinatorError::FailedPrecondition {
                reason: None,
                message
            }),
            (proptest::option::of(text), text, any::<bool>()).prop_map(
                |(leader_addr, message, not_owner)| CoordinatorError::NotLeader {
                    hint: LeaderHint::new(None, leader_addr),
                    reason: Some(if not_owner {
                        Reason::NotOwner
                    } else {
                        Reason::NotLeader
                    }),
                    message,
                }
            ),
            (text, text, any::<bool>()).prop_map(|(addr, message, moving)| {
                CoordinatorError::Unavailable {
                    addr,
                    reason: moving.then_some(Reason::SlotMoving),
                    message,
                }
            }),
            (text, text).prop_map(|(addr, message)| CoordinatorError::Transport { addr, message }),
            (text, text).prop_map(|(leader_addr, via)| CoordinatorError::LeaderUnresolvable {
                leader_addr,
                via
            }),
            (0..17i32, text).prop_map(|(code, message)| CoordinatorError::Rpc {
                code: tonic::Code::from(code),
                message,
            }),
        ]
    }

    proptest! {
        /// Every failure exits non-zero with a known code, and exactly the
        /// retryable errors exit 3 (so scripts can retry on 3 alone).
        #[test]
        fn every_failure_exits_non_zero_and_retryable_ones_exit_3(error in any_coordinator_error()) {
            let retryable = error.is_retryable() || matches!(error, CoordinatorError::LeaderUnresolvable { .. });
            let failure = describe(&CliError::Coordinator(error), &endpoints());
            prop_assert!(failure.exit_code != 0);
            prop_assert!(!failure.code.is_empty());
            if retryable {
                prop_assert_eq!(failure.exit_code, EXIT_UNAVAILABLE);
            }
            let json = failure.to_json();
            prop_assert_eq!(json["error"]["code"].as_str(), Some(failure.code));
        }
    }
}
