//! Errors of the Raft store, and their translation into openraft's
//! [`StorageError`](crate::StorageError) (which makes openraft stop the node:
//! a store that cannot read or persist must not keep voting).

use openraft::{AnyError, ErrorSubject, ErrorVerb, StorageIOError};

use crate::codec::CodecError;
use crate::engine::EngineError;
use crate::types::{NodeId, StorageError};

/// Failure to open, read or write the Raft store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The storage engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A stored value could not be encoded or decoded (including an unknown
    /// format version).
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A received snapshot's envelope disagrees with its metadata.
    #[error("snapshot envelope says last applied {envelope}, its metadata says {meta}")]
    SnapshotMismatch {
        /// Last applied log id recorded inside the snapshot data.
        envelope: String,
        /// Last log id of the snapshot metadata.
        meta: String,
    },
    /// The data directory holds an earlier build's sled store and this
    /// build cannot read sled.
    #[error(
        "{path} holds the Raft store of an earlier build (sled); this build reads only \
         segment files. Start this member once with a build made with \
         `--features migrate-sled` (it moves the store and removes the sled directory), \
         then with this build (docs/operations.md, \"Upgrading from a sled store\")"
    )]
    SledStoreFound {
        /// The sled directory.
        path: String,
    },
}

impl StoreError {
    /// Wraps this error as openraft's storage error about `subject`.
    pub(crate) fn into_storage(
        self,
        subject: ErrorSubject<NodeId>,
        verb: ErrorVerb,
    ) -> StorageError {
        StorageIOError::new(subject, verb, AnyError::new(&self)).into()
    }
}

/// Adds `.or_storage(subject, verb)` to results of the store's own errors.
// openraft's storage error is large; its size is not ours to choose.
#[allow(clippy::result_large_err)]
pub(crate) trait OrStorageError<T> {
    /// Converts the error into openraft's storage error about `subject`.
    fn or_storage(self, subject: ErrorSubject<NodeId>, verb: ErrorVerb) -> Result<T, StorageError>;
}

impl<T, E: Into<StoreError>> OrStorageError<T> for Result<T, E> {
    fn or_storage(self, subject: ErrorSubject<NodeId>, verb: ErrorVerb) -> Result<T, StorageError> {
        self.map_err(|error| error.into().into_storage(subject, verb))
    }
}
