//! Why a command failed ([`CliError`]); `failure` turns it into what is
//! printed and the exit code.

use leasehold_client::coordinator::CoordinatorError;

use super::diagnose::diagnosis;
use crate::config::ConfigError;
use crate::error::NodeError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A member failed to start or run.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A call to the cluster failed.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// The arguments do not make sense together.
    #[error("{0}")]
    Usage(String),
    /// Any other failure, explained.
    #[error("{0}")]
    Failed(String),
    /// The cluster's state conflicts with what the command asked for (e.g.
    /// `cluster init` with another member list than the one initialised).
    #[error("{0}")]
    Conflict(String),
    /// The thing the command acts on does not exist (e.g. `policy delete`
    /// of a prefix with no policy, without `--if-exists`).
    #[error("{0}")]
    NotFound(String),
    /// A call failed because of how this command and the endpoint connect
    /// (TLS on one side only, a certificate one side refuses) or because
    /// the endpoint is not a coordinator member: the cause a probe of the
    /// endpoint found after the call failed ([`super::diagnose`]).
    #[error("{0}")]
    Diagnosed(diagnosis::Diagnosis),
}
