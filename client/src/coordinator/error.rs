//! The typed errors of coordinator calls, one variant per gRPC outcome the
//! caller may act on differently.

use std::time::Duration;

use leasehold_proto::refusal::{self, Reason};
use leasehold_proto::LeaderHint;
use tonic::{Code, Status};

use crate::transport::DialError;

/// Why a coordinator call failed (after any retries).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoordinatorError {
    /// No endpoint was configured.
    #[error("no coordinator endpoints configured")]
    NoEndpoints,
    /// An endpoint address is malformed.
    #[error(transparent)]
    Address(#[from] DialError),
    /// The request was malformed (`INVALID_ARGUMENT`); retrying will not help.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No policy matches the key (`NOT_FOUND`).
    #[error("not found: {0}")]
    NotFound(String),
    /// The thing to create exists already (`ALREADY_EXISTS`), e.g. the
    /// cluster is initialised.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The call does not fit the current state (`FAILED_PRECONDITION`
    /// without a leader hint), e.g. a pool grant on a `counter` key.
    #[error("failed precondition: {message}")]
    FailedPrecondition {
        /// The refusal's reason (`WRONG_KEY_KIND`, `SESSION_EXPIRED`, …),
        /// when the server sent one.
        reason: Option<Reason>,
        /// The server's message.
        message: String,
    },
    /// The node is not the leader; the hint names the one it believes is.
    /// Returned only when the retry budget ran out while following hints.
    #[error(
        "not the leader ({message}); leader id {:?} at {:?}",
        .hint.leader_id,
        .hint.leader_addr
    )]
    NotLeader {
        /// The leader the node named (id and `host:port`, each if known).
        hint: LeaderHint,
        /// The refusal's reason: `NOT_LEADER`, or `NOT_OWNER` when the
        /// member does not serve the key's shard (the hint then names one
        /// that does); `None` from a server that names none.
        reason: Option<Reason>,
        /// The server's message.
        message: String,
    },
    /// No leader or no quorum (`UNAVAILABLE`), or the node is unreachable.
    #[error("unavailable at {addr}: {message}")]
    Unavailable {
        /// The node that answered (or failed to).
        addr: String,
        /// The refusal's reason when the server answered one (e.g.
        /// `SLOT_MOVING`: the key's slot is changing shards; `NO_QUORUM`);
        /// `None` for a node that could not be reached.
        reason: Option<Reason>,
        /// What it said.
        message: String,
    },
    /// An attempt ran out of time.
    #[error("no answer from {addr} within {after:?}")]
    DeadlineExceeded {
        /// The node that did not answer in time.
        addr: String,
        /// The attempt's deadline (zero when the server reported it).
        after: Duration,
    },
    /// The connection failed underneath the call.
    #[error("transport error talking to {addr}: {message}")]
    Transport {
        /// The node.
        addr: String,
        /// The transport's explanation.
        message: String,
    },
    /// The members reached say the leader is at `leader_addr`, a host name
    /// that does not resolve from this machine (typically a name private to
    /// the cluster's network). Not retryable: pass every member's endpoint as
    /// reachable from here, or make the members advertise such addresses.
    #[error(
        "{via} says the leader is at {leader_addr}, which does not resolve from here; \
         pass every member's endpoint as reachable from this machine"
    )]
    LeaderUnresolvable {
        /// The leader's address as the members advertise it.
        leader_addr: String,
        /// The member that gave the hint.
        via: String,
    },
    /// Any other gRPC status.
    #[error("{code:?}: {message}")]
    Rpc {
        /// The status code.
        code: tonic::Code,
        /// The server's message.
        message: String,
    },
}

impl CoordinatorError {
    /// Whether another attempt (possibly at another node) may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CoordinatorError::NotLeader { .. }
                | CoordinatorError::Unavailable { .. }
                | CoordinatorError::DeadlineExceeded { .. }
                | CoordinatorError::Transport { .. }
        )
    }

    /// Whether the group refused the request's id as of a session it does
    /// not hold (`SESSION_EXPIRED`): nothing was executed under it now.
    pub fn is_session_expired(&self) -> bool {
        matches!(
            self,
            CoordinatorError::FailedPrecondition {
                reason: Some(Reason::SessionExpired),
                ..
            }
        )
    }

    /// Whether the error is a host name that did not resolve (DNS), as
    /// opposed to a host that resolved but did not answer.
    pub fn is_name_resolution_failure(&self) -> bool {
        let message = match self {
            CoordinatorError::Unavailable { message, .. }
            | CoordinatorError::Transport { message, .. } => message,
            _ => return false,
        };
        let lower = message.to_ascii_lowercase();
        lower.contains("dns error")
            || lower.contains("failed to lookup address")
            || lower.contains("name or service not known")
            || lower.contains("no address associated")
    }

    /// The gRPC code this error corresponds to (for re-raising at another edge).
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            CoordinatorError::NoEndpoints
            | CoordinatorError::Address(_)
            | CoordinatorError::InvalidArgument(_) => Code::InvalidArgument,
            CoordinatorError::NotFound(_) => Code::NotFound,
            CoordinatorError::AlreadyExists(_) => Code::AlreadyExists,
            CoordinatorError::FailedPrecondition { .. } | CoordinatorError::NotLeader { .. } => {
                Code::FailedPrecondition
            }
            CoordinatorError::Unavailable { .. }
            | CoordinatorError::Transport { .. }
            | CoordinatorError::LeaderUnresolvable { .. } => Code::Unavailable,
            CoordinatorError::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            CoordinatorError::Rpc { code, .. } => *code,
        }
    }
}

/// Maps a gRPC status to a typed error, reading the leader hint.
pub(crate) fn classify(addr: &str, status: Status) -> CoordinatorError {
    let message = status.message().to_string();
    match status.code() {
        Code::InvalidArgument => CoordinatorError::InvalidArgument(message),
        Code::NotFound => CoordinatorError::NotFound(message),
        Code::AlreadyExists => CoordinatorError::AlreadyExists(message),
        Code::FailedPrecondition => {
            let hint = LeaderHint::from_status(&status);
            let reason = refusal::reason_of(&status);
            if !hint.is_empty() || reason == Some(Reason::NotLeader) {
                CoordinatorError::NotLeader {
                    hint,
                    reason,
                    message,
                }
            } else {
                CoordinatorError::FailedPrecondition { reason, message }
            }
        }
        Code::Unavailable => CoordinatorError::Unavailable {
            addr: addr.to_string(),
            reason: refusal::reason_of(&status),
            message: with_causes(message, &status),
        },
        // The server cancels a call whose grpc-timeout expired.
        Code::DeadlineExceeded | Code::Cancelled => CoordinatorError::DeadlineExceeded {
            addr: addr.to_string(),
            after: Duration::ZERO,
        },
        Code::Unknown | Code::Aborted | Code::Internal if is_transport_message(&message) => {
            CoordinatorError::Transport {
                addr: addr.to_string(),
                message: with_causes(message, &status),
            }
        }
        code => CoordinatorError::Rpc { code, message },
    }
}

/// `message` followed by the explanations under `status`, when it came from
/// the connection rather than the server: tonic keeps the transport's error
/// as the status's source, and its message alone ("transport error") names
/// no cause. Each explanation once, outermost first, e.g. `transport error:
/// connection error: received fatal alert: UnknownCA` or `tcp connect
/// error: transport error: Connection refused (os error 111)`. A status the
/// server sent has no source: its message is kept as it is.
fn with_causes(message: String, status: &Status) -> String {
    let mut causes: Vec<String> = Vec::new();
    let mut next = std::error::Error::source(status);
    while let Some(error) = next {
        let text = error.to_string();
        // An error wrapping another often displays the same text.
        if !text.is_empty() && !message.contains(&text) && !causes.iter().any(|c| c.contains(&text))
        {
            causes.push(text);
        }
        next = error.source();
    }
    if causes.is_empty() {
        message
    } else {
        format!("{message}: {}", causes.join(": "))
    }
}

/// Whether a non-standard status came from the connection rather than the server.
fn is_transport_message(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    [
        "transport",
        "connection",
        "broken pipe",
        "h2 protocol",
        "operation was canceled",
        "reset",
    ]
    .iter()
    .any(|needle| lower.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a cause, as hyper's connector wraps an IO error.
    #[derive(Debug)]
    struct Wrapping(&'static str, std::io::Error);

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.1)
        }
    }

    #[test]
    fn a_connection_failure_keeps_its_causes_and_a_server_status_its_message() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        let status = Status::from_error(Box::new(tonic::ConnectError(Box::new(Wrapping(
            "tcp connect error",
            refused,
        )))));
        match classify("n1:7100", status) {
            CoordinatorError::Unavailable { addr, message, .. } => {
                assert_eq!(addr, "n1:7100");
                assert_eq!(message, "tcp connect error: refused here");
            }
            other => panic!("expected unavailable, got {other:?}"),
        }
        match classify("n1:7100", Status::unavailable("no quorum")) {
            CoordinatorError::Unavailable { message, .. } => assert_eq!(message, "no quorum"),
            other => panic!("expected unavailable, got {other:?}"),
        }
    }
}
