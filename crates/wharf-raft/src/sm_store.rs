//! Adapts the server's [`StateMachine`](crate::StateMachine) to openraft, and
//! keeps the group's latest snapshot (meta in its `g{id}.meta` tree, data in
//! a file of the node's snapshot directory: see `SnapshotStore`).
//!
//! The state machine lives in memory (a stream's payloads excepted: they stay
//! in its own sled tree). After a restart it is rebuilt: first from the stored
//! snapshot (`SmStore::new` calls `StateMachine::restore_local`, so openraft
//! finds it applied up to the snapshot), then openraft re-applies the log up
//! to the persisted `committed` index. So the caller must hand a *fresh*
//! state machine to `start_group`.
//!
//! A stored snapshot may leave out what the state machine keeps in its own
//! tree; it is added back only when the snapshot is sent to a peer
//! ([`SnapshotData::into_transfer_bytes`]). A snapshot received from a peer is
//! restored with `StateMachine::restore` and then stored in the local form.
//!
//! Invariants:
//! - `last_applied` and the membership advance together with `apply`, which
//!   runs on openraft's state machine worker (never concurrently with itself).
//! - A snapshot is serialized in `try_create_snapshot_builder`, i.e. on the
//!   worker, so its data matches its `last_log_id` exactly; the builder then
//!   stores it (and waits for a flush) in a separate task.
//! - The stored snapshot never goes backwards: a write is skipped when a newer
//!   one is already stored.
//!
//! Not here: when to snapshot (openraft's `snapshot_policy`), log purging.

use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;

use bytes::Bytes;
use futures::Stream;
use futures::TryStreamExt;
use openraft::storage::EntryResponder;
use openraft::storage::RaftStateMachine;
use openraft::EntryPayload;
use openraft::OptionalSend;
use openraft::RaftSnapshotBuilder;

use crate::flusher::Flusher;
use crate::types::decode;
use crate::types::encode;
use crate::types::io_err;
use crate::types::CmdResponse;
use crate::types::LogId;
use crate::types::Snapshot;
use crate::types::SnapshotData;
use crate::types::SnapshotMeta;
use crate::types::StoredMembership;
use crate::types::TypeConfig;
use crate::GroupId;
use crate::SharedStateMachine;

/// bincode `SnapshotMeta` of the stored snapshot.
const KEY_SNAPSHOT_META: &[u8] = b"snapshot_meta";
/// File name (in the node's snapshot directory) of the stored snapshot's data.
const KEY_SNAPSHOT_FILE: &[u8] = b"snapshot_file";

/// Stores snapshots, never replacing a newer one: the data in a file of the
/// node's snapshot directory (`g{group}.{last index}.snap`), the meta and the
/// file's name in the group's meta tree.
///
/// The data stays out of sled on purpose: sled 0.34 stores a value over
/// about 128 KiB as a separate blob file, and a stream's index or a large
/// consumer's state is often bigger; in a chaos run with simulated power
/// loss (docs/RELIABILITY.md, bug 5) a node's sled then failed a blob's CRC.
/// A file is written, fsynced and renamed into place, and the directory
/// fsynced, before the meta tree names it; older files of the group are
/// removed after that is flushed.
#[derive(Clone)]
pub(crate) struct SnapshotStore {
    group_id: GroupId,
    dir: PathBuf,
    meta_tree: sled::Tree,
    flusher: Flusher,
    /// `last_log_id` of the stored snapshot; the lock orders concurrent writers.
    stored: Arc<Mutex<Option<LogId>>>,
}

impl SnapshotStore {
    pub(crate) fn new(
        group_id: GroupId,
        dir: &Path,
        meta_tree: sled::Tree,
        flusher: Flusher,
    ) -> Self {
        SnapshotStore {
            group_id,
            dir: dir.to_path_buf(),
            meta_tree,
            flusher,
            stored: Arc::new(Mutex::new(None)),
        }
    }

    fn is_newer(&self, meta: &SnapshotMeta) -> io::Result<bool> {
        let stored = self
            .stored
            .lock()
            .map_err(|_| io_err("snapshot lock poisoned"))?;
        // Equal means the same snapshot (e.g. re-installed at startup).
        Ok(stored.is_none() || *stored < meta.last_log_id)
    }

    /// `data` is shared, not copied, with the task that writes the file: a
    /// stream's snapshot is its whole index (38 MiB at a million messages).
    async fn save(&self, meta: &SnapshotMeta, data: Bytes) -> io::Result<()> {
        if !self.is_newer(meta)? {
            return Ok(());
        }
        let index = meta.last_log_id.as_ref().map_or(0, |l| l.index);
        let name = format!("g{}.{index}.snap", self.group_id);
        let (dir, file, bytes) = (self.dir.clone(), name.clone(), data);
        tokio::task::spawn_blocking(move || write_durably(&dir, &file, &bytes))
            .await
            .map_err(|e| io_err(format!("snapshot write task: {e}")))??;
        {
            let mut stored = self
                .stored
                .lock()
                .map_err(|_| io_err("snapshot lock poisoned"))?;
            if stored.is_some() && *stored >= meta.last_log_id {
                return Ok(()); // a newer one was stored meanwhile
            }
            // One batch: the meta and the file name change together.
            let mut batch = sled::Batch::default();
            batch.insert(KEY_SNAPSHOT_META, encode(meta).map_err(io_err)?);
            batch.insert(KEY_SNAPSHOT_FILE, name.as_bytes());
            self.meta_tree.apply_batch(batch).map_err(io_err)?;
            *stored = meta.last_log_id;
        }
        self.flusher.flush().await?;
        let (dir, group_id) = (self.dir.clone(), self.group_id);
        tokio::task::spawn_blocking(move || remove_snapshot_files(&dir, group_id, Some(&name)))
            .await
            .map_err(|e| io_err(format!("snapshot cleanup task: {e}")))?
    }

    fn load_meta(&self) -> io::Result<Option<SnapshotMeta>> {
        match self.meta_tree.get(KEY_SNAPSHOT_META).map_err(io_err)? {
            Some(v) => decode(&v).map(Some).map_err(io_err),
            None => Ok(None),
        }
    }

    fn load(&self) -> io::Result<Option<(SnapshotMeta, Vec<u8>)>> {
        let Some(meta) = self.load_meta()? else {
            return Ok(None);
        };
        let name = self.meta_tree.get(KEY_SNAPSHOT_FILE).map_err(io_err)?;
        let name = name.ok_or_else(|| io_err("snapshot meta without a file"))?;
        let path = self.dir.join(String::from_utf8_lossy(&name).as_ref());
        let data = std::fs::read(&path)
            .map_err(|e| io_err(format!("snapshot {}: {e}", path.display())))?;
        Ok(Some((meta, data)))
    }
}

/// Writes `dir/name` so that it is on disk, whole, when this returns.
fn write_durably(dir: &Path, name: &str, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes the group's snapshot files in `dir`, except `keep`.
pub(crate) fn remove_snapshot_files(
    dir: &Path,
    group_id: GroupId,
    keep: Option<&str>,
) -> io::Result<()> {
    let prefix = format!("g{group_id}.");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && Some(name.as_ref()) != keep {
            match std::fs::remove_file(dir.join(name.as_ref())) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// openraft's view of a group's state machine.
pub(crate) struct SmStore {
    sm: SharedStateMachine,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    snapshots: SnapshotStore,
}

impl SmStore {
    /// `sm` must be fresh (empty); see the module docs. It is restored here
    /// from the stored snapshot, if any ([`StateMachine::restore_local`]), so
    /// openraft finds it applied up to that snapshot and only replays the log
    /// after it.
    pub(crate) fn new(sm: SharedStateMachine, snapshots: SnapshotStore) -> io::Result<Self> {
        let mut last_applied = None;
        let mut membership = StoredMembership::default();
        if let Some((meta, data)) = snapshots.load()? {
            sm.lock()
                .map_err(|_| io_err("state machine lock poisoned"))?
                .restore_local(&data)
                .map_err(|e| io_err(format!("state machine restore from own snapshot: {e}")))?;
            last_applied = meta.last_log_id;
            membership = meta.last_membership;
        }
        *snapshots
            .stored
            .lock()
            .map_err(|_| io_err("snapshot lock poisoned"))? = last_applied;
        Ok(SmStore {
            sm,
            last_applied,
            membership,
            snapshots,
        })
    }

    /// Marks a snapshot as this node's own (see `install_snapshot`).
    fn expander(&self) -> crate::SnapshotExpander {
        let own = self.sm.lock().ok().and_then(|sm| sm.snapshot_expander());
        own.unwrap_or_else(|| Arc::new(|stored: &[u8]| Ok(stored.to_vec())))
    }

    fn apply_command(&self, index: u64, command: &[u8]) -> io::Result<Vec<u8>> {
        let mut sm = self
            .sm
            .lock()
            .map_err(|_| io_err("state machine lock poisoned"))?;
        Ok(sm.apply(index, command))
    }
}

/// Stores a snapshot that was serialized on the state machine worker.
pub(crate) struct SnapshotBuilder {
    meta: SnapshotMeta,
    data: Result<Vec<u8>, String>,
    expander: crate::SnapshotExpander,
    snapshots: SnapshotStore,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        // Taken, not cloned: openraft builds each builder's snapshot once.
        let taken = std::mem::replace(&mut self.data, Err("already built".to_string()));
        let data = Bytes::from(taken.map_err(|e| io_err(format!("state machine snapshot: {e}")))?);
        self.snapshots.save(&self.meta, data.clone()).await?;
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: SnapshotData {
                // No copy: the writing task has dropped its share by now.
                bytes: Vec::from(data),
                expander: Some(self.expander.clone()),
            },
        })
    }
}

/// Run `f`, which blocks for a while, without stalling the other tasks of
/// this runtime worker (on a multi-threaded runtime; elsewhere just runs it).
fn blocking_in_place<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

impl RaftStateMachine<TypeConfig> for SmStore {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            crate::timeline::mark("apply", entry.log_id.index);
            let response = match entry.payload {
                EntryPayload::Blank => Vec::new(),
                EntryPayload::Normal(cmd) => self.apply_command(entry.log_id.index, &cmd.0)?,
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    Vec::new()
                }
            };
            self.last_applied = Some(entry.log_id);
            if let Some(r) = responder {
                r.send(CmdResponse(Bytes::from(response)));
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let data = match self.sm.lock() {
            Ok(sm) => sm.snapshot(),
            Err(_) => Err("state machine lock poisoned".to_string()),
        };
        SnapshotBuilder {
            meta: SnapshotMeta {
                last_log_id: self.last_applied,
                last_membership: self.membership.clone(),
            },
            data,
            expander: self.expander(),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        // Restoring a big stream takes seconds: let the runtime move this
        // worker's other tasks (RPCs, heartbeats) elsewhere meanwhile.
        let local = blocking_in_place(|| {
            let mut sm = self
                .sm
                .lock()
                .map_err(|_| io_err("state machine lock poisoned"))?;
            if snapshot.expander.is_some() {
                // This node's own snapshot (openraft restoring at startup):
                // what it left out is still in the state machine's storage.
                sm.restore_local(&snapshot.bytes)
                    .map_err(|e| io_err(format!("state machine restore: {e}")))?;
                Ok(snapshot.bytes)
            } else {
                sm.restore(&snapshot.bytes)
                    .map_err(|e| io_err(format!("state machine restore: {e}")))?;
                // Store it the way this node's own snapshots are stored.
                sm.snapshot()
                    .map_err(|e| io_err(format!("state machine snapshot: {e}")))
            }
        })?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.snapshots.save(meta, Bytes::from(local)).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let Some((meta, bytes)) = self.snapshots.load()? else {
            return Ok(None);
        };
        Ok(Some(Snapshot {
            meta,
            snapshot: SnapshotData {
                bytes,
                expander: Some(self.expander()),
            },
        }))
    }
}
