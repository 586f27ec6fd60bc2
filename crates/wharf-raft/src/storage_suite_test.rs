//! Runs openraft's storage conformance suite against the sled log store and
//! the state machine adapter (over a trivial in-memory state machine).
//!
//! Each case gets a fresh sled `Db` in its own temporary directory, with its
//! own flusher, so appends and votes really go through group commit + fsync.

use std::sync::Arc;
use std::sync::Mutex;

use openraft::testing::log::StoreBuilder;
use openraft::testing::log::Suite;
use openraft::type_config::TypeConfigExt;
use openraft::StorageError;

use crate::flusher::Flusher;
use crate::flusher::FlusherTask;
use crate::log_store::LogStore;
use crate::sm_store::SmStore;
use crate::sm_store::SnapshotStore;
use crate::types::TypeConfig;
use crate::StateMachine;

/// Remembers the commands it applied.
#[derive(Default)]
struct ListSm {
    applied: Vec<Vec<u8>>,
}

impl StateMachine for ListSm {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        self.applied.push(command.to_vec());
        command.to_vec()
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        bincode::serialize(&self.applied).map_err(|e| e.to_string())
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        self.applied = bincode::deserialize(data).map_err(|e| e.to_string())?;
        Ok(())
    }
}

/// Keeps the temporary directory and the flusher alive for one case.
struct Guard {
    _flusher: FlusherTask,
    _dir: tempfile::TempDir,
}

struct SledBuilder;

fn storage_err<E: std::error::Error + 'static>(e: E) -> StorageError<TypeConfig> {
    StorageError::read(TypeConfig::err_from_error(&e))
}

impl StoreBuilder<TypeConfig, LogStore, SmStore, Guard> for SledBuilder {
    async fn build(&self) -> Result<(Guard, LogStore, SmStore), StorageError<TypeConfig>> {
        let dir = tempfile::tempdir().map_err(storage_err)?;
        let db = sled::Config::new()
            .path(dir.path().join("sled"))
            .open()
            .map_err(storage_err)?;
        let (flusher, task, journal) =
            Flusher::spawn_for_tests(db.clone(), &dir.path().join("sled")).map_err(storage_err)?;
        let (log, meta) =
            LogStore::open(&db, 1, 1, journal, flusher.clone(), None).map_err(storage_err)?;
        let snapshots = SnapshotStore::new(1, &dir.path().join("snapshots"), meta, flusher);
        let sm = SmStore::new(Arc::new(Mutex::new(ListSm::default())), snapshots)
            .map_err(storage_err)?;
        Ok((
            Guard {
                _flusher: task,
                _dir: dir,
            },
            log,
            sm,
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openraft_storage_suite_passes() {
    if let Err(e) = Suite::test_all(SledBuilder).await {
        panic!("storage suite failed: {e}");
    }
}
