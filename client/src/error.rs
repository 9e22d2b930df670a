//! The errors of the client crate.
//!
//! A denial is never an error: it is a [`Decision`](crate::Decision) with
//! `allowed == false`. Errors mean the question could not be answered:
//! bad input from the caller, an unreachable or failing backend, or a
//! deadline that passed.

use std::time::Duration;

/// Why a limiter call (or a backend call under it) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The caller's input was rejected (empty key, zero cost, bad config).
    /// Retrying the same call cannot succeed.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// No policy matches the key (gRPC `NOT_FOUND`).
    #[error("no policy for key: {0}")]
    NoPolicy(String),
    /// The backend cannot serve this kind of request (for example a `fair`
    /// key leased directly from the coordinator).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The backend could not be reached or has no quorum; retrying later
    /// may succeed.
    #[error("backend unreachable: {0}")]
    Unavailable(String),
    /// The call did not finish within its deadline.
    #[error("deadline of {0:?} exceeded")]
    DeadlineExceeded(Duration),
    /// The backend answered something this client cannot use.
    #[error("backend protocol error: {0}")]
    Protocol(String),
}

impl ClientError {
    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unavailable(_) | ClientError::DeadlineExceeded(_)
        )
    }
}

impl From<leasehold_core::ids::IdError> for ClientError {
    fn from(e: leasehold_core::ids::IdError) -> Self {
        ClientError::InvalidInput(e.to_string())
    }
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        use tonic::Code;
        let message = status.message().to_string();
        match status.code() {
            Code::InvalidArgument | Code::OutOfRange => ClientError::InvalidInput(message),
            Code::NotFound => ClientError::NoPolicy(message),
            Code::Unimplemented => ClientError::Unsupported(message),
            Code::DeadlineExceeded => ClientError::DeadlineExceeded(Duration::ZERO),
            Code::Unavailable
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::FailedPrecondition
            | Code::Unknown => ClientError::Unavailable(format!("{:?}: {message}", status.code())),
            other => ClientError::Protocol(format!("{other:?}: {message}")),
        }
    }
}

/// Why a limiter configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid limiter configuration: {0}")]
pub struct ConfigError(pub String);

impl From<ConfigError> for ClientError {
    fn from(e: ConfigError) -> Self {
        ClientError::InvalidInput(e.0)
    }
}
