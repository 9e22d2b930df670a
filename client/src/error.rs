//! The errors of the client crate.
//!
//! A denial is never an error: it is a [`Decision`](crate::Decision) with
//! `allowed == false`. Errors mean the question could not be answered:
//! bad input from the caller, an unreachable or failing backend, or a
//! deadline that passed. Each kind carries a [`Detail`]: the message, the
//! refusal [`Reason`] when a server sent one (`google.rpc.ErrorInfo`), and
//! the gRPC status it came from as the error's [`source`](std::error::Error::source).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

pub use leasehold_proto::refusal::Reason;

/// Why a limiter call (or a backend call under it) failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// The caller's input was rejected (empty key, zero cost, bad config).
    /// Retrying the same call cannot succeed.
    InvalidInput(Detail),
    /// No policy matches the key (gRPC `NOT_FOUND`, reason `NO_POLICY`).
    NoPolicy(Detail),
    /// The backend cannot serve this kind of request (for example a `fair`
    /// key leased directly from the coordinator).
    Unsupported(Detail),
    /// The backend could not be reached or has no quorum; retrying later
    /// may succeed.
    Unavailable(Detail),
    /// The call did not finish within its deadline.
    DeadlineExceeded(Duration),
    /// The backend answered something this client cannot use.
    Protocol(Detail),
}

impl ClientError {
    /// Whether retrying the same call later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unavailable(_) | ClientError::DeadlineExceeded(_)
        )
    }

    /// What the error says beyond its kind (`None` for a deadline).
    pub fn detail(&self) -> Option<&Detail> {
        match self {
            ClientError::InvalidInput(d)
            | ClientError::NoPolicy(d)
            | ClientError::Unsupported(d)
            | ClientError::Unavailable(d)
            | ClientError::Protocol(d) => Some(d),
            ClientError::DeadlineExceeded(_) => None,
        }
    }

    /// The server's refusal reason (`NO_POLICY`, `WRONG_KEY_KIND`,
    /// `RESOURCE_LIMIT`, …), when a server refused the call and said why.
    pub fn reason(&self) -> Option<Reason> {
        self.detail().and_then(Detail::reason)
    }

    /// The gRPC status a server answered with, when the error is one.
    pub fn status(&self) -> Option<&tonic::Status> {
        self.detail().and_then(Detail::status)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::InvalidInput(d) => write!(f, "invalid input: {d}"),
            ClientError::NoPolicy(d) => write!(f, "no policy for key: {d}"),
            ClientError::Unsupported(d) => write!(f, "unsupported: {d}"),
            ClientError::Unavailable(d) => write!(f, "backend unreachable: {d}"),
            ClientError::DeadlineExceeded(after) => write!(f, "deadline of {after:?} exceeded"),
            ClientError::Protocol(d) => write!(f, "backend protocol error: {d}"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.status()
            .map(|status| status as &(dyn std::error::Error + 'static))
    }
}

/// What a [`ClientError`] says: a message, the refusal [`Reason`] when a
/// server gave one, and the gRPC status it came from. Reads as its message
/// (`Deref<Target = str>`).
#[derive(Debug, Clone)]
pub struct Detail {
    message: String,
    reason: Option<Reason>,
    status: Option<Arc<tonic::Status>>,
}

impl Detail {
    /// A detail with only a message.
    pub fn new(message: impl Into<String>) -> Self {
        Detail {
            message: message.into(),
            reason: None,
            status: None,
        }
    }

    /// The same detail naming the server's refusal reason.
    pub fn with_reason(mut self, reason: Option<Reason>) -> Self {
        self.reason = reason;
        self
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The server's refusal reason, when it sent one.
    pub fn reason(&self) -> Option<Reason> {
        self.reason
    }

    /// The gRPC status this came from, when a server answered.
    pub fn status(&self) -> Option<&tonic::Status> {
        self.status.as_deref()
    }
}

/// Two details are equal when they say the same: message and reason (a
/// status's trailers are not compared).
impl PartialEq for Detail {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message && self.reason == other.reason
    }
}

impl Eq for Detail {}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(reason) = self.reason {
            write!(f, " [{}]", reason.as_str())?;
        }
        Ok(())
    }
}

impl Deref for Detail {
    type Target = str;

    fn deref(&self) -> &str {
        &self.message
    }
}

impl From<String> for Detail {
    fn from(message: String) -> Self {
        Detail::new(message)
    }
}

impl From<&str> for Detail {
    fn from(message: &str) -> Self {
        Detail::new(message)
    }
}

impl From<leasehold_core::ids::IdError> for ClientError {
    fn from(e: leasehold_core::ids::IdError) -> Self {
        ClientError::InvalidInput(e.to_string().into())
    }
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        use tonic::Code;
        let code = status.code();
        let message = match code {
            Code::InvalidArgument
            | Code::OutOfRange
            | Code::NotFound
            | Code::Unimplemented
            | Code::DeadlineExceeded => status.message().to_string(),
            other => format!("{other:?}: {}", status.message()),
        };
        let detail = Detail {
            message,
            reason: leasehold_proto::refusal::reason_of(&status),
            status: Some(Arc::new(status)),
        };
        match code {
            Code::InvalidArgument | Code::OutOfRange => ClientError::InvalidInput(detail),
            Code::NotFound => ClientError::NoPolicy(detail),
            Code::Unimplemented => ClientError::Unsupported(detail),
            Code::DeadlineExceeded => ClientError::DeadlineExceeded(Duration::ZERO),
            Code::Unavailable
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::FailedPrecondition
            | Code::Unknown => ClientError::Unavailable(detail),
            _ => ClientError::Protocol(detail),
        }
    }
}

/// Why a limiter configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid limiter configuration: {0}")]
pub struct ConfigError(pub String);

impl From<ConfigError> for ClientError {
    fn from(e: ConfigError) -> Self {
        ClientError::InvalidInput(e.0.into())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_refusal_keeps_its_reason_and_its_status_as_the_source() {
        let status = leasehold_proto::refusal::refusal(Reason::NoPolicy, "no policy matches \"k\"");
        let error = ClientError::from(status);
        assert!(matches!(error, ClientError::NoPolicy(_)), "{error:?}");
        assert_eq!(error.reason(), Some(Reason::NoPolicy));
        assert_eq!(
            error.status().map(tonic::Status::code),
            Some(tonic::Code::NotFound)
        );
        let source = error.source().expect("the status is the source");
        assert!(source.to_string().contains("no policy matches"), "{source}");
        assert!(error.to_string().contains("[NO_POLICY]"), "{error}");
        assert!(!error.is_transient());
    }

    #[test]
    fn a_status_without_error_info_has_no_reason() {
        let error = ClientError::from(tonic::Status::unavailable("no quorum"));
        assert!(error.is_transient());
        assert_eq!(error.reason(), None);
        assert!(error.source().is_some());
        let local = ClientError::InvalidInput("cost must be positive".into());
        assert!(local.source().is_none() && local.reason().is_none());
        assert_eq!(local.to_string(), "invalid input: cost must be positive");
    }
}
