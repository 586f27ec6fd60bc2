//! [`RaftNode`]: one per process. Owns the sled `Db`, the journal and its
//! group-commit flusher, the peer channel pool and the registry of running
//! groups. Opening a node first replays the journal into sled (`journal`).
//!
//! Group lifecycle: `start_group` opens the group's trees, builds its openraft
//! instance (which replays the stored snapshot and committed log into the fresh
//! state machine) and, when the storage is pristine, calls openraft's
//! `initialize` with the given voters. openraft documents that calling
//! `initialize` on several nodes with the *identical* membership is safe (the
//! vote decides one leader), so every member does it; a node that already
//! received the group's log from a peer gets `NotAllowed`, which is ignored.
//! A group is registered (visible to peers) only after that step.
//!
//! Invariants:
//! - Starts and stops are serialized by one async lock, so a group id never has
//!   two openraft instances over the same trees.
//! - After `shutdown`, every group is stopped, the database flushed and the
//!   flusher gone; once the last `Arc<RaftNode>` (and every `Group` clone) is
//!   dropped, the `Db` is closed and the same path can be reopened.
//!
//! `enable_leader_restore` is off. `committed` is persisted but only as durable
//! as the last group-commit flush, so after a crash it may lag what a restored
//! leader had already acknowledged; with restore on, that leader would resume
//! (and serve reads) with a state machine behind its own earlier answers.
//! With it off, a restarted node learns the commit index from an election or
//! from the current leader, at the price of one election after a lone
//! leader's restart (in a multi-node group the others elect during the
//! restart anyway).

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::RwLock;
use std::time::Duration;

use openraft::errors::InitializeError;
use openraft::BasicNode;
use openraft::Config;
use openraft::SnapshotPolicy;
use wharf_proto::v1::raft::raft_transport_client::RaftTransportClient;
use wharf_proto::v1::raft::raft_transport_server::RaftTransport;
use wharf_proto::v1::raft::raft_transport_server::RaftTransportServer;
use wharf_proto::v1::raft::RaftFrame;

use crate::flusher::Flusher;
use crate::flusher::FlusherTask;
use crate::journal;
use crate::journal::JournalBuffer;
use crate::journal::JournalFile;
use crate::journal::Record;
use crate::log_store::remove_purged_entries;
use crate::log_store::tree_names;
use crate::log_store::LogStore;
use crate::network::NetworkFactory;
use crate::network::PeerPool;
use crate::network::MAX_MESSAGE_BYTES;
use crate::peer_auth::PeerCredentials;
use crate::sm_store::remove_snapshot_files;
use crate::sm_store::SmStore;
use crate::sm_store::SnapshotStore;
use crate::transport::TransportService;
use crate::types::WharfRaft;
use crate::Group;
use crate::GroupId;
use crate::NodeId;
use crate::RaftError;
use crate::RaftSettings;
use crate::SharedStateMachine;

/// Deadline for each 1 MiB snapshot chunk on the wire.
const SNAPSHOT_CHUNK_TIMEOUT_MS: u64 = 3000;
/// Log entries kept after a snapshot, for followers that lag a little.
const LOGS_KEPT_AFTER_SNAPSHOT: u64 = 1000;
/// Purge in batches: each purge is one sled batch.
const PURGE_BATCH_ENTRIES: u64 = 256;
/// The node's journal, in its data directory (see `journal`).
const JOURNAL_FILE: &str = "raft.journal";

/// Replays the journal at `path` into `db` (see `journal`) and opens it for
/// appending; the flusher's first checkpoint then empties it.
fn open_journal(db: &sled::Db, path: &Path) -> Result<JournalFile, RaftError> {
    let storage = |e: std::io::Error| RaftError::Storage(format!("{}: {e}", path.display()));
    let replayed = journal::replay(path, db).map_err(storage)?;
    for group in &replayed.groups {
        remove_purged_entries(db, *group).map_err(storage)?;
    }
    if replayed.records > 0 || replayed.torn_bytes > 0 {
        tracing::info!(
            records = replayed.records,
            groups = replayed.groups.len(),
            torn_bytes = replayed.torn_bytes,
            "replayed the journal"
        );
    }
    JournalFile::open(path).map_err(storage)
}

/// One node of the cluster: every Raft group this process hosts.
pub struct RaftNode {
    node_id: NodeId,
    config: Arc<Config>,
    /// Where groups keep their snapshots' data (`data_dir/snapshots`).
    snapshot_dir: PathBuf,
    read_timeout: Duration,
    lease_wait: Duration,
    db: sled::Db,
    /// Records of log and meta writes, synced by the flusher (`journal`).
    journal: Arc<JournalBuffer>,
    flusher: Flusher,
    flusher_task: tokio::sync::Mutex<FlusherTask>,
    pool: Arc<PeerPool>,
    groups: RwLock<HashMap<GroupId, Group>>,
    /// Serializes starts and stops; `true` once the node is shut down.
    lifecycle: tokio::sync::Mutex<bool>,
    /// Injected answer delay of AppendEntries (tests only; see `fault`).
    slow_append: Option<Duration>,
    /// Refuse `AppendStream` as an older node would (tests only; `fault`).
    no_append_stream: bool,
}

fn raft_config(s: &RaftSettings) -> Result<Config, RaftError> {
    let mut c = Config {
        cluster_name: "wharf".to_string(),
        heartbeat_interval: s.heartbeat_ms,
        election_timeout_min: s.election_min_ms,
        election_timeout_max: s.election_max_ms,
        install_snapshot_timeout: SNAPSHOT_CHUNK_TIMEOUT_MS,
        // Never more than the snapshot interval, so the log stays within
        // twice the interval (a small interval is for tests and tiny disks).
        max_in_snapshot_log_to_keep: LOGS_KEPT_AFTER_SNAPSHOT
            .min(s.snapshot_every_entries.unwrap_or(u64::MAX)),
        purge_batch_size: PURGE_BATCH_ENTRIES.min(s.snapshot_every_entries.unwrap_or(u64::MAX)),
        ..Config::default()
    };
    c.snapshot_policy = match s.snapshot_every_entries {
        Some(n) => SnapshotPolicy::LogsSinceLast(n),
        None => SnapshotPolicy::Never,
    };
    // See the module docs for why.
    c.enable_leader_restore = Some(false);
    // Pre-vote cures bug 2 of docs/RELIABILITY.md (a follower resumed after
    // SIGSTOP deposed a healthy leader; regression test
    // `chaos_regressions::resumed_follower_does_not_depose_a_healthy_leader`
    // fails without it). One loaded CI run with it on once saw a new stream
    // group without a leader for over 10 s; not reproduced since (48 new
    // groups elected within 0.91 s), and a harness port collision that
    // killed a node at start was found meanwhile (RELIABILITY.md).
    c.enable_pre_vote = Some(true);
    c.validate().map_err(|e| RaftError::Config(e.to_string()))
}

impl RaftNode {
    /// Opens (or creates) the node's single sled::Db at `data_dir/sled`,
    /// replays the journal `data_dir/raft.journal` into it and starts the
    /// flusher. Must be called inside a tokio runtime.
    pub fn open(
        node_id: NodeId,
        data_dir: &Path,
        settings: RaftSettings,
    ) -> Result<Arc<Self>, RaftError> {
        let config = raft_config(&settings)?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(RaftError::Config(
                "RaftNode::open must run inside a tokio runtime".into(),
            ));
        }
        std::fs::create_dir_all(data_dir)
            .map_err(|e| RaftError::Storage(format!("{}: {e}", data_dir.display())))?;
        let sled_dir = data_dir.join("sled");
        let db = sled::Config::new()
            .path(&sled_dir)
            .cache_capacity(settings.cache_bytes)
            // Only the node's flusher syncs (see `sled_files`): sled's own
            // periodic fsync would make a pointer durable before its blob.
            .flush_every_ms(None)
            .open()?;
        let journal_path = data_dir.join(JOURNAL_FILE);
        let journal = open_journal(&db, &journal_path)?;
        let journal_buffer = Arc::new(JournalBuffer::default());
        let (flusher, flusher_task) =
            Flusher::spawn(db.clone(), &sled_dir, journal_buffer.clone(), journal)
                .map_err(|e| RaftError::Storage(format!("{}: {e}", sled_dir.display())))?;
        Ok(Arc::new(RaftNode {
            node_id,
            config: Arc::new(config),
            snapshot_dir: data_dir.join("snapshots"),
            read_timeout: Duration::from_millis(settings.election_max_ms.saturating_mul(3)),
            lease_wait: Duration::from_millis(settings.election_max_ms),
            db,
            journal: journal_buffer,
            flusher,
            flusher_task: tokio::sync::Mutex::new(flusher_task),
            pool: Arc::new(PeerPool::new(node_id, settings.bind_ip)),
            groups: RwLock::new(HashMap::new()),
            lifecycle: tokio::sync::Mutex::new(false),
            slow_append: crate::fault::slow_append_from_env(),
            no_append_stream: crate::fault::no_append_stream_from_env(),
        }))
    }

    /// This node's id.
    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The injected AppendEntries answer delay, if any (see `fault`).
    pub(crate) fn slow_append(&self) -> Option<Duration> {
        self.slow_append
    }

    /// Whether this node refuses `AppendStream` (see `fault`).
    pub(crate) fn no_append_stream(&self) -> bool {
        self.no_append_stream
    }

    /// The node's database; the server opens its own trees in it.
    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    /// Await a flush of the whole Db through the group-commit flusher.
    pub async fn flush(&self) -> Result<(), RaftError> {
        self.flusher
            .flush()
            .await
            .map_err(|e| RaftError::Storage(e.to_string()))
    }

    /// The tonic service to mount on the node's gRPC server.
    pub fn transport_service(self: &Arc<Self>) -> RaftTransportServer<impl RaftTransport> {
        RaftTransportServer::new(TransportService::new(self))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    /// Start (or reopen from disk) a group. `members` maps node id to the
    /// "host:port" of every voter. Idempotent: a running group is returned as
    /// is. A node that is not in `members` (or given none) starts
    /// uninitialized, waiting to be added by the group's leader as a learner;
    /// it must then never be initialized with another membership.
    pub async fn start_group(
        &self,
        group_id: GroupId,
        members: BTreeMap<NodeId, String>,
        sm: SharedStateMachine,
    ) -> Result<Group, RaftError> {
        let closed = self.lifecycle.lock().await;
        if *closed {
            return Err(RaftError::Stopped("node is shut down".into()));
        }
        if let Some(g) = self.group(group_id) {
            return Ok(g);
        }
        let fault = crate::fault::AppendFault::from_env(self.node_id, group_id);
        let (log_store, meta_tree) = LogStore::open(
            &self.db,
            self.node_id,
            group_id,
            self.journal.clone(),
            self.flusher.clone(),
            fault,
        )?;
        let snapshots = SnapshotStore::new(
            group_id,
            &self.snapshot_dir,
            meta_tree,
            self.flusher.clone(),
        );
        let sm_store =
            SmStore::new(sm.clone(), snapshots).map_err(|e| RaftError::Storage(e.to_string()))?;
        let network = NetworkFactory {
            group_id,
            pool: self.pool.clone(),
        };
        let raft = WharfRaft::new(
            self.node_id,
            self.config.clone(),
            network,
            log_store,
            sm_store,
        )
        .await
        .map_err(|e| RaftError::Storage(format!("group {group_id}: {e}")))?;
        if members.contains_key(&self.node_id) {
            if let Err(e) = self.initialize(&raft, &members).await {
                if let Err(join) = raft.shutdown().await {
                    tracing::warn!(group_id, error = %join, "shutting down a group that failed to start");
                }
                return Err(e);
            }
        }
        let group = Group::new(group_id, raft, sm, self.read_timeout, self.lease_wait);
        self.groups_write().insert(group_id, group.clone());
        tracing::info!(group_id, node_id = self.node_id, "raft group started");
        Ok(group)
    }

    async fn initialize(
        &self,
        raft: &WharfRaft,
        members: &BTreeMap<NodeId, String>,
    ) -> Result<(), RaftError> {
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| RaftError::Stopped(e.to_string()))?;
        if initialized {
            return Ok(());
        }
        let nodes: BTreeMap<NodeId, BasicNode> = members
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        match raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            // A peer replicated to us first: the group is already formed.
            Err(openraft::errors::RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(openraft::errors::RaftError::APIError(e)) => Err(RaftError::Config(e.to_string())),
            Err(openraft::errors::RaftError::Fatal(f)) => Err(RaftError::Stopped(f.to_string())),
        }
    }

    /// Shut a group down; with `destroy`, also drop its sled trees (a group
    /// that is not running is then only destroyed). Not running and not
    /// `destroy` -> `GroupNotFound`.
    pub async fn stop_group(&self, group_id: GroupId, destroy: bool) -> Result<(), RaftError> {
        let _lifecycle = self.lifecycle.lock().await;
        let group = self.groups_write().remove(&group_id);
        match group {
            Some(g) => g.shutdown().await?,
            None if !destroy => return Err(RaftError::GroupNotFound(group_id)),
            None => {}
        }
        if destroy {
            let (log_name, meta_name) = tree_names(group_id);
            self.db.drop_tree(log_name)?;
            self.db.drop_tree(meta_name)?;
            // Recorded, or a replay of earlier records would bring the
            // trees back if the node crashed before the flush below.
            self.journal
                .push(&Record::DropGroup { group: group_id })
                .map_err(|e| RaftError::Storage(e.to_string()))?;
            self.flush().await?;
            remove_snapshot_files(&self.snapshot_dir, group_id, None)
                .map_err(|e| RaftError::Storage(format!("snapshot files: {e}")))?;
        }
        tracing::info!(group_id, destroy, "raft group stopped");
        Ok(())
    }

    /// Present `credentials` on every peer channel (mutual TLS or the
    /// cluster secret). Call once, right after `open`, before any group starts.
    pub fn set_peer_credentials(&self, credentials: PeerCredentials) -> Result<(), RaftError> {
        self.pool
            .set_credentials(credentials)
            .map_err(RaftError::Config)
    }

    /// The running group `group_id`, if any.
    pub fn group(&self, group_id: GroupId) -> Option<Group> {
        self.groups_read().get(&group_id).cloned()
    }

    /// Every running group.
    pub fn groups(&self) -> Vec<Group> {
        self.groups_read().values().cloned().collect()
    }

    /// Probe a peer over the transport (Ping RPC); true when it answered in time.
    pub async fn ping(&self, addr: &str, timeout: Duration) -> bool {
        let Ok(mut client): Result<RaftTransportClient<_>, _> = self.pool.client(addr) else {
            return false;
        };
        let mut request = tonic::Request::new(RaftFrame {
            group_id: 0,
            payload: Default::default(),
            from_node: self.node_id,
        });
        request.set_timeout(timeout);
        matches!(
            tokio::time::timeout(timeout, client.ping(request)).await,
            Ok(Ok(_))
        )
    }

    /// Shut every group down, flush, and stop the flusher. Idempotent.
    pub async fn shutdown(&self) {
        let mut closed = self.lifecycle.lock().await;
        let groups: Vec<Group> = self.groups_write().drain().map(|(_, g)| g).collect();
        for g in groups {
            if let Err(e) = g.shutdown().await {
                tracing::warn!(group_id = g.id(), error = %e, "group shutdown failed");
            }
        }
        if !*closed {
            if let Err(e) = self.flush().await {
                tracing::error!(error = %e, "final flush failed");
            }
        }
        self.flusher_task.lock().await.stop().await;
        *closed = true;
        tracing::info!(node_id = self.node_id, "raft node shut down");
    }

    fn groups_read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<GroupId, Group>> {
        // A poisoned lock only means a panic elsewhere; the map itself is intact.
        self.groups.read().unwrap_or_else(|p| p.into_inner())
    }

    fn groups_write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<GroupId, Group>> {
        self.groups.write().unwrap_or_else(|p| p.into_inner())
    }
}
