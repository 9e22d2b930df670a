//! openraft's storage conformance suite, run against the store on every
//! engine.

#[cfg(feature = "migrate-sled")]
use leasehold_raft_store::open_sled;
use leasehold_raft_store::{
    open_segments, open_with_engine, LogStore, PowerLossDisk, StateMachineStore, StorageError,
    TypeConfig,
};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{AnyError, StorageIOError};

fn storage_error(error: &impl std::error::Error) -> StorageError {
    StorageIOError::write(AnyError::error(error)).into()
}

/// Each store on a fresh sled directory, removed when the test drops it.
#[cfg(feature = "migrate-sled")]
struct OnSled;

#[cfg(feature = "migrate-sled")]
impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for OnSled {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| storage_error(&e))?;
        let (log_store, state_machine) = open_sled(dir.path()).map_err(|e| storage_error(&e))?;
        Ok((dir, log_store, state_machine))
    }
}

/// Each store on a fresh segment directory, removed when the test drops it.
struct OnSegments;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for OnSegments {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| storage_error(&e))?;
        let (log_store, state_machine) =
            open_segments(dir.path()).map_err(|e| storage_error(&e))?;
        Ok((dir, log_store, state_machine))
    }
}

/// Each store on a fresh simulated disk.
struct OnPowerLossDisk;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore> for OnPowerLossDisk {
    async fn build(&self) -> Result<((), LogStore, StateMachineStore), StorageError> {
        let engine = PowerLossDisk::new().open_engine();
        let (log_store, state_machine) = open_with_engine(engine).map_err(|e| storage_error(&e))?;
        Ok(((), log_store, state_machine))
    }
}

#[test]
fn segment_store_passes_the_openraft_storage_suite() {
    Suite::test_all(OnSegments).expect("storage suite on segments");
}

#[cfg(feature = "migrate-sled")]
#[test]
fn sled_store_passes_the_openraft_storage_suite() {
    Suite::test_all(OnSled).expect("storage suite on sled");
}

#[test]
fn power_loss_store_passes_the_openraft_storage_suite() {
    Suite::test_all(OnPowerLossDisk).expect("storage suite on the power-loss engine");
}
