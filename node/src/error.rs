//! Why a node process could not start or stopped with an error.

use std::path::PathBuf;

use crate::config::ConfigError;

/// A failure to start or run a member.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The data directory could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The stores could not be opened (locked by another process, unreadable format, ...).
    #[error("cannot open the stores in {path}: {message}")]
    Storage {
        /// The data directory.
        path: PathBuf,
        /// The store's explanation.
        message: String,
    },
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The IO error.
        source: std::io::Error,
    },
    /// The gRPC reflection service could not be built from the schema.
    #[error("cannot build the gRPC reflection service: {0}")]
    Reflection(String),
    /// Raft could not start.
    #[error("raft failed to start: {0}")]
    Raft(String),
    /// An escrow node's configuration was refused.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// The TLS material could not be loaded.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}
