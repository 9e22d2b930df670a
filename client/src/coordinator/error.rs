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
        /// The server's message.
        message: String,
    },
    /// No leader or no quorum (`UNAVAILABLE`), or the node is unreachable.
    #[error("unavailable at {addr}: {message}")]
    Unavailable {
        /// The node that answered (or failed to).
        addr: String,
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
                CoordinatorError::NotLeader { hint, message }
            } else {
                CoordinatorError::FailedPrecondition { reason, message }
            }
        }
        Code::Unavailable => CoordinatorError::Unavailable {
            addr: addr.to_string(),
            message,
        },
        // The server cancels a call whose grpc-timeout expired.
        Code::DeadlineExceeded | Code::Cancelled => CoordinatorError::DeadlineExceeded {
            addr: addr.to_string(),
            after: Duration::ZERO,
        },
        Code::Unknown | Code::Aborted | Code::Internal if is_transport_message(&message) => {
            CoordinatorError::Transport {
                addr: addr.to_string(),
                message,
            }
        }
        code => CoordinatorError::Rpc { code, message },
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
