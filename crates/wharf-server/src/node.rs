//! A Wharf node: its Raft groups, its catalog view, and the gRPC server.
//!
//! `Node::start` opens the node's one sled database, finds the cluster's
//! founding node set (`bootstrap`: from `--peers`, or from a seed when
//! joining), starts the meta group (empty and waiting to be added when
//! joining), serves the public API and the peer transport on
//! one port, and runs the reconciler: whenever the catalog changes, the node
//! starts the stream and consumer groups placed on it and stops the ones that
//! were deleted. Restarting from the same data dir reopens every group from
//! disk; the catalog replays first, so the same groups come back.
//!
//! A group's replica set can change (`peer remove`): a node that is no
//! longer a replica keeps its replica while it is still in the group's
//! `leaving` list (a Raft voter the group is moving away from), and drops it
//! once the group's leader reported the move done (see `replica_mover`).
//! A node that was removed altogether stops itself once the cluster needs
//! nothing from it any more (see `removal`).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use wharf_core::consumer::ConsumerConfig;
use wharf_raft::{Group, GroupId, NodeId, RaftNode, RaftSettings, Role, SharedStateMachine};

use crate::consumer_runtime::{ConsumerRuntime, RuntimeContext};
use crate::consumer_sm::ConsumerMachine;
use crate::error::{Result, ServerError};
use crate::forward::Peers;
use crate::meta::{Catalog, MetaMachine, META_GROUP};
use crate::stream_sm::StreamMachine;
use crate::stream_writer::StreamWriter;

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: NodeId,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// The nodes a new cluster is founded with, this one included:
    /// id -> "host:port". Read on the first start only (see `bootstrap`);
    /// empty when joining.
    pub peers: BTreeMap<NodeId, String>,
    /// Seeds ("host:port") of an existing cluster to join instead of
    /// founding one; the node then waits to be added by `peer add`.
    pub join: Vec<String>,
    pub raft: RaftSettings,
    /// Where to serve Prometheus `/metrics` over HTTP; `None` serves none.
    pub metrics_listen: Option<SocketAddr>,
    /// Server-wide limits (see `limits`).
    pub limits: crate::limits::Limits,
    /// TLS, peer and client authentication (all off by default).
    pub security: crate::security::SecurityConfig,
}

impl NodeConfig {
    pub fn validate(&self) -> Result<()> {
        if self.node_id == 0 {
            return Err(ServerError::Invalid("node id must be 1 or more".into()));
        }
        self.limits.validate()?;
        if !self.join.is_empty() {
            if !self.peers.is_empty() {
                return Err(ServerError::Invalid(
                    "--join and --peers exclude each other: --peers founds a new cluster, --join joins an existing one".into(),
                ));
            }
            return Ok(());
        }
        if !self.peers.contains_key(&self.node_id) {
            return Err(ServerError::Invalid(format!(
                "--peers must include this node ({})",
                self.node_id
            )));
        }
        Ok(())
    }
}

pub(crate) struct LocalStream {
    pub group_id: GroupId,
    pub group: Group,
    pub sm: Arc<Mutex<StreamMachine>>,
    pub tree: sled::Tree,
    pub last_seq: watch::Receiver<u64>,
    pub writer: StreamWriter,
    /// The catalog's config, which the group's leader makes it apply.
    /// (catalog revision, config) that the group's leader makes it apply.
    pub desired: watch::Sender<(u64, wharf_core::stream::StreamConfig)>,
}

pub(crate) struct LocalConsumer {
    pub group_id: GroupId,
    pub group: Group,
    pub sm: Arc<Mutex<ConsumerMachine>>,
    pub runtime: ConsumerRuntime,
    pub desired: watch::Sender<ConsumerConfig>,
    /// Bumped on every apply of the consumer's state machine.
    pub changes: watch::Receiver<u64>,
}

#[derive(Default)]
pub(crate) struct Local {
    pub streams: HashMap<String, Arc<LocalStream>>,
    pub consumers: HashMap<(String, String), Arc<LocalConsumer>>,
    /// Groups already taken out of the maps above whose stop (and data
    /// drop) is still under way: a removed node waits for them too
    /// (`removal`), so it lets go of its replicas before it says it stops.
    pub stopping: usize,
}

/// One group counted in [`Local::stopping`] until this is dropped. Made
/// under the `local` lock; dropped after it is released (it takes the lock).
struct StoppingGuard<'a>(&'a NodeInner);

impl<'a> StoppingGuard<'a> {
    fn new(node: &'a NodeInner, local: &mut Local) -> Self {
        local.stopping += 1;
        StoppingGuard(node)
    }
}

impl Drop for StoppingGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut l) = self.0.local.lock() {
            l.stopping = l.stopping.saturating_sub(1);
        }
    }
}

pub(crate) struct NodeInner {
    pub config: NodeConfig,
    pub raft: Arc<RaftNode>,
    pub meta: Group,
    pub meta_sm: Arc<Mutex<MetaMachine>>,
    pub meta_version: watch::Receiver<u64>,
    /// The node set the cluster was founded with (see `bootstrap`).
    pub initial_nodes: BTreeMap<NodeId, String>,
    /// Groups whose membership change this node is driving right now
    /// (`replica_mover`), so a reconcile pass does not start a second one.
    pub moving: Mutex<std::collections::HashSet<GroupId>>,
    pub local: Mutex<Local>,
    pub peers: Peers,
    /// Loaded TLS settings, peer and client guards.
    pub security: Arc<crate::security::Security>,
    pub next_session: AtomicU64,
    /// Set when shutdown begins: health turns NOT_SERVING.
    pub draining: std::sync::atomic::AtomicBool,
    /// Turns true when the server stops: open response streams end.
    pub shutdown: watch::Receiver<bool>,
    /// gRPC call counts and latencies, filled by the server's layer.
    pub grpc_metrics: Arc<crate::grpc_metrics::GrpcMetrics>,
    /// Open pull sessions per client (`max_pulls_per_client`).
    pub pull_sessions: Arc<crate::limits::ClientCounts>,
    /// Turns true once this node learned that it was removed from the
    /// cluster and that the removal is done (`removal`).
    pub removed: watch::Sender<bool>,
}

impl NodeInner {
    pub fn id(&self) -> NodeId {
        self.config.node_id
    }

    /// A copy of the catalog. Hot paths (publish, sessions) use
    /// [`Self::with_catalog`] instead: a copy costs O(streams + consumers).
    pub fn catalog(&self) -> Catalog {
        self.with_catalog(Catalog::clone)
    }

    /// Read the catalog in place, under the meta state machine's lock (keep
    /// `f` short: the meta group's apply waits for it).
    pub fn with_catalog<R>(&self, f: impl FnOnce(&Catalog) -> R) -> R {
        match self.meta_sm.lock() {
            Ok(m) => f(m.catalog()),
            Err(_) => f(&Catalog::default()),
        }
    }

    pub fn local_stream(&self, name: &str) -> Option<Arc<LocalStream>> {
        self.local.lock().ok()?.streams.get(name).cloned()
    }

    pub fn local_consumer(&self, stream: &str, name: &str) -> Option<Arc<LocalConsumer>> {
        self.local
            .lock()
            .ok()?
            .consumers
            .get(&(stream.to_string(), name.to_string()))
            .cloned()
    }
}

/// A running node. Dropping it does not stop it; call `shutdown`.
pub struct Node {
    pub(crate) inner: Arc<NodeInner>,
    shutdown_tx: watch::Sender<bool>,
    server: tokio::task::JoinHandle<()>,
    local_addr: SocketAddr,
}

impl Node {
    pub async fn start(config: NodeConfig) -> Result<Node> {
        config.validate()?;
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            ServerError::Invalid(format!("cannot create data dir {:?}: {e}", config.data_dir))
        })?;
        let security = crate::security::Security::load(&config.security)?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| {
                ServerError::Invalid(format!("cannot listen on {}: {e}", config.listen))
            })?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| ServerError::Internal(e.to_string()))?;
        let metrics_listener = match config.metrics_listen {
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                ServerError::Invalid(format!("cannot listen for metrics on {addr}: {e}"))
            })?),
            None => None,
        };
        let mut settings = config.raft.clone();
        if settings.bind_ip.is_none() && !config.listen.ip().is_unspecified() {
            settings.bind_ip = Some(config.listen.ip());
        }
        let raft = RaftNode::open(config.node_id, &config.data_dir, settings.clone())?;
        raft.set_peer_credentials(security.peer_credentials())?;

        let peers = Peers::new(
            config.peers.clone(),
            settings.bind_ip,
            security.peer_credentials(),
        );
        let initial_nodes = crate::bootstrap::initial_nodes(&raft, &config, &peers).await?;
        peers.learn(&initial_nodes);
        let (meta_machine, meta_version) = MetaMachine::new(initial_nodes.clone());
        let meta_sm = Arc::new(Mutex::new(meta_machine));
        let shared: SharedStateMachine = meta_sm.clone();
        // A joining node is not in the founding set: its meta replica starts
        // empty and waits for the leader to add it (`peer add`).
        let meta = raft
            .start_group(META_GROUP, initial_nodes.clone(), shared)
            .await?;

        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let inner = Arc::new(NodeInner {
            shutdown: shutdown_rx.clone(),
            peers,
            initial_nodes,
            moving: Default::default(),
            security,
            config,
            raft,
            meta,
            meta_sm,
            meta_version,
            local: Mutex::new(Local::default()),
            next_session: AtomicU64::new(1),
            draining: Default::default(),
            grpc_metrics: Default::default(),
            pull_sessions: Default::default(),
            removed: watch::Sender::new(false),
        });
        let server = tokio::spawn(crate::service::serve(
            inner.clone(),
            listener,
            shutdown_rx.clone(),
        ));
        if let Some(listener) = metrics_listener {
            if let Ok(addr) = listener.local_addr() {
                tracing::info!(%addr, "serving Prometheus metrics at /metrics");
            }
            let serve = crate::metrics_http::serve(inner.clone(), listener, shutdown_rx.clone());
            tokio::spawn(serve);
        }
        tokio::spawn(reconcile_loop(inner.clone(), shutdown_rx.clone()));
        tokio::spawn(crate::removal::watch(inner.clone(), shutdown_rx));
        tracing::info!(node = inner.id(), addr = %local_addr, "wharf node started");
        Ok(Node {
            inner,
            shutdown_tx,
            server,
            local_addr,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn node_id(&self) -> NodeId {
        self.inner.id()
    }

    /// Resolves once this node was removed from the cluster (`peer remove`)
    /// and the cluster needs nothing from it any more: every replica moved
    /// and it left the meta group (see `removal`). The caller then shuts it
    /// down.
    pub async fn removed(&self) {
        let mut removed = self.inner.removed.subscribe();
        let _ = removed.wait_for(|r| *r).await;
    }

    /// Hand leadership of every group this node leads to another replica,
    /// then stop serving, stop every group and flush the database. Clients see
    /// leaders move, not errors: the node keeps forwarding while it hands over.
    pub async fn shutdown(self) {
        self.inner
            .draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        hand_over_leadership(&self.inner).await;
        let _ = self.shutdown_tx.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server).await;
        self.inner.raft.shutdown().await;
    }
}

/// How long shutdown waits for leadership to move away, in all.
const HANDOVER_DEADLINE: Duration = Duration::from_secs(10);
/// How long one transfer to one target may take before the next is tried.
const TRANSFER_WAIT: Duration = Duration::from_secs(3);

async fn hand_over_leadership(node: &NodeInner) {
    let me = node.id();
    let mut transfers = Vec::new();
    for group in node.raft.groups() {
        let status = group.status();
        if status.role != Role::Leader {
            continue;
        }
        let targets: Vec<NodeId> = status.voters.iter().copied().filter(|v| *v != me).collect();
        transfers.push(async move {
            for to in targets {
                if let Err(e) = group.transfer_leader(to).await {
                    tracing::warn!(group = group.id(), to, "transfer leadership: {e}");
                    continue;
                }
                let moved = |s: &wharf_raft::GroupStatus| s.leader.is_some_and(|l| l != me);
                if group.wait_for(TRANSFER_WAIT, moved).await.is_ok() {
                    tracing::info!(group = group.id(), to, "leadership handed over");
                    return;
                }
            }
        });
    }
    if tokio::time::timeout(HANDOVER_DEADLINE, futures::future::join_all(transfers))
        .await
        .is_err()
    {
        tracing::warn!("leadership handover did not finish within {HANDOVER_DEADLINE:?}");
    }
}

/// How often the reconciler runs without a catalog change.
const RECONCILE_TICK: Duration = Duration::from_secs(2);
/// The same while some group's replicas are moving.
const MOVING_TICK: Duration = Duration::from_millis(200);

async fn reconcile_loop(node: Arc<NodeInner>, mut shutdown: watch::Receiver<bool>) {
    // A node restarted after its removal (its stored catalog knows of it)
    // starts no group.
    if crate::removal::done_at_start(&node).await {
        return;
    }
    let mut version = node.meta_version.clone();
    loop {
        if node.is_removed() {
            return;
        }
        if let Err(e) = reconcile(&node).await {
            tracing::warn!("reconcile: {e}");
        }
        if let Err(e) = delete_inactive_consumers(&node).await {
            tracing::warn!("inactive consumers: {e}");
        }
        // Also retry periodically: a group that failed to start gets another
        // go. While replicas move, more often: a group's new leader picks
        // up the move on its next pass.
        let moving = !node.catalog().moving_groups().is_empty();
        let tick = if moving { MOVING_TICK } else { RECONCILE_TICK };
        tokio::select! {
            _ = version.changed() => {}
            _ = tokio::time::sleep(tick) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// Consumers led here with an inactive threshold that nobody has pulled from
/// for that long are deleted through the catalog, like `consumer rm`.
async fn delete_inactive_consumers(node: &Arc<NodeInner>) -> Result<()> {
    let now = crate::util::now_ms();
    let expired: Vec<(String, String)> = {
        let local = node
            .local
            .lock()
            .map_err(|_| ServerError::Internal("poisoned".into()))?;
        local
            .consumers
            .iter()
            .filter(|(_, c)| c.group.status().role == Role::Leader)
            .filter(|(_, c)| {
                c.runtime
                    .num_waiting
                    .load(std::sync::atomic::Ordering::Relaxed)
                    == 0
            })
            .filter(|(_, c)| {
                let threshold =
                    c.sm.lock()
                        .map(|s| s.state().config().inactive_threshold_ms)
                        .unwrap_or(0);
                let idle = now
                    - c.runtime
                        .last_active_ms
                        .load(std::sync::atomic::Ordering::Relaxed);
                threshold > 0 && idle >= i64::try_from(threshold).unwrap_or(i64::MAX)
            })
            .map(|(k, _)| k.clone())
            .collect()
    };
    for (stream, name) in expired {
        tracing::info!(%stream, consumer = %name, "deleting consumer past its inactive threshold");
        match node.route_meta().await? {
            crate::routing::Route::Local => {
                let cmd = crate::meta::MetaCommand::DeleteConsumer { stream, name };
                node.meta_write(cmd).await?;
            }
            crate::routing::Route::Remote(n) => {
                let req = wharf_proto::v1::DeleteConsumerRequest { stream, name };
                node.peers.client(n)?.delete_consumer(req).await?;
            }
        }
    }
    Ok(())
}

/// The membership a group is initialized with: its `initialize_on` nodes.
/// A node outside it gets an empty map and waits to be added as a learner.
fn members(
    node: &NodeInner,
    catalog: &Catalog,
    initialize_on: &[NodeId],
) -> BTreeMap<NodeId, String> {
    initialize_on
        .iter()
        .filter_map(|n| {
            let addr = catalog.nodes.get(n).or_else(|| node.initial_nodes.get(n));
            addr.map(|a| (*n, a.clone()))
        })
        .collect()
}

/// Bring the local groups in line with the catalog.
async fn reconcile(node: &Arc<NodeInner>) -> Result<()> {
    let catalog = node.catalog();
    let me = node.id();
    node.peers.learn(&catalog.nodes);
    // A replica stays while this node is a replica or still a Raft voter
    // the group is moving away from.
    let hosts =
        |replicas: &[NodeId], leaving: &[NodeId]| replicas.contains(&me) || leaving.contains(&me);

    // Stop what is gone (or was recreated under a new group id, or moved
    // to another node).
    let (stale_streams, stale_consumers) = {
        let local = node
            .local
            .lock()
            .map_err(|_| ServerError::Internal("poisoned".into()))?;
        let streams: Vec<(String, GroupId)> = local
            .streams
            .iter()
            .filter(|(name, s)| {
                !catalog
                    .streams
                    .get(*name)
                    .is_some_and(|e| e.group_id == s.group_id && hosts(&e.replicas, &e.leaving))
            })
            .map(|(n, s)| (n.clone(), s.group_id))
            .collect();
        let consumers: Vec<((String, String), GroupId)> = local
            .consumers
            .iter()
            .filter(|(k, c)| {
                !catalog
                    .consumers
                    .get(*k)
                    .is_some_and(|e| e.group_id == c.group_id && hosts(&e.replicas, &e.leaving))
            })
            .map(|(k, c)| (k.clone(), c.group_id))
            .collect();
        (streams, consumers)
    };
    for (key, gid) in stale_consumers {
        let (removed, _stopping) = match node.local.lock() {
            Ok(mut l) => {
                let removed = l.consumers.remove(&key);
                (removed, Some(StoppingGuard::new(node, &mut l)))
            }
            Err(_) => (None, None),
        };
        // A consumer that moved to another node is not deleted: its
        // sessions end with "reconnect" when its group stops below.
        let deleted = !catalog.consumers.contains_key(&key);
        if let Some(consumer) = removed.filter(|_| deleted) {
            let _ = consumer
                .runtime
                .send(crate::consumer_runtime::Event::Deleted)
                .await;
        }
        node.raft.stop_group(gid, true).await?;
        tracing::info!(stream = %key.0, consumer = %key.1, "consumer group removed");
    }
    for (name, gid) in stale_streams {
        let _stopping = node.local.lock().ok().map(|mut l| {
            l.streams.remove(&name);
            StoppingGuard::new(node, &mut l)
        });
        node.raft.stop_group(gid, true).await?;
        drop_payload_tree(node.raft.db().clone(), gid).await;
        tracing::info!(stream = %name, "stream group removed");
    }

    // Start what is placed here and not running.
    for (name, entry) in &catalog.streams {
        if !hosts(&entry.replicas, &entry.leaving) {
            continue;
        }
        if let Some(existing) = node.local_stream(name) {
            existing.desired.send_if_modified(|(revision, c)| {
                let changed = *revision != entry.config_revision;
                *revision = entry.config_revision;
                *c = entry.config.clone();
                changed
            });
            continue;
        }
        let tree = node.raft.db().open_tree(payload_tree(entry.group_id))?;
        // The log is replayed from the config the group was created with;
        // later configs arrive as UpdateConfig entries.
        let (machine, last_seq) = StreamMachine::new(entry.created_config.clone(), tree.clone());
        let sm = Arc::new(Mutex::new(machine));
        let shared: SharedStateMachine = sm.clone();
        let group = node
            .raft
            .start_group(
                entry.group_id,
                members(node, &catalog, &entry.initialize_on),
                shared,
            )
            .await?;
        let writer = StreamWriter::spawn(group.clone());
        let (desired, desired_rx) = watch::channel((entry.config_revision, entry.config.clone()));
        crate::stream_runtime::spawn(group.clone(), sm.clone(), desired_rx);
        if entry.config.retention != wharf_core::stream::RetentionPolicy::Limits {
            crate::stream_retention::spawn(
                Arc::downgrade(node),
                name.clone(),
                group.clone(),
                sm.clone(),
            );
        }
        let local = LocalStream {
            group_id: entry.group_id,
            group,
            sm,
            tree,
            last_seq,
            writer,
            desired,
        };
        node.local
            .lock()
            .map(|mut l| l.streams.insert(name.clone(), Arc::new(local)))
            .ok();
        tracing::info!(stream = %name, group = entry.group_id, "stream group started");
    }
    for (key, entry) in &catalog.consumers {
        if !hosts(&entry.replicas, &entry.leaving) {
            continue;
        }
        if let Some(existing) = node.local_consumer(&key.0, &key.1) {
            existing.desired.send_if_modified(|c| {
                let changed = *c != entry.config;
                *c = entry.config.clone();
                changed
            });
            continue;
        }
        let Some(stream) = node.local_stream(&entry.stream) else {
            continue;
        };
        let (machine, changes) = ConsumerMachine::new(entry.created_config.clone());
        let sm = Arc::new(Mutex::new(machine));
        let shared: SharedStateMachine = sm.clone();
        let group = node
            .raft
            .start_group(
                entry.group_id,
                members(node, &catalog, &entry.initialize_on),
                shared,
            )
            .await?;
        let (desired, desired_rx) = watch::channel(entry.config.clone());
        crate::dead_letter::DeadLetterTask {
            node: Arc::downgrade(node),
            stream: key.0.clone(),
            consumer: key.1.clone(),
            consumer_id: entry.group_id,
            group: group.clone(),
            sm: sm.clone(),
            changes: changes.clone(),
            stream_tree: stream.tree.clone(),
            stream_last_seq: stream.last_seq.clone(),
        }
        .spawn();
        let runtime = ConsumerRuntime::spawn(RuntimeContext {
            stream: key.0.clone(),
            name: key.1.clone(),
            group: group.clone(),
            consumer: sm.clone(),
            consumer_changes: changes.clone(),
            stream_sm: stream.sm.clone(),
            stream_tree: stream.tree.clone(),
            stream_last_seq: stream.last_seq.clone(),
            desired_config: desired_rx,
        });
        let local = LocalConsumer {
            group_id: entry.group_id,
            group,
            sm,
            runtime,
            desired,
            changes,
        };
        node.local
            .lock()
            .map(|mut l| l.consumers.insert(key.clone(), Arc::new(local)))
            .ok();
        tracing::info!(stream = %key.0, consumer = %key.1, group = entry.group_id, "consumer group started");
    }
    crate::replica_mover::follow_catalog(node, &catalog);
    Ok(())
}

pub(crate) fn payload_tree(group_id: GroupId) -> String {
    format!("s{group_id}.msgs")
}

/// Drops a removed stream's payload tree, emptied key by key first: sled
/// 0.34's `drop_tree` frees a tree's pages under one epoch guard, so every
/// page of a big stream was in memory at once (173 MiB per node for a
/// million 128 B messages, `bench/results/heap-20261208.txt`), where each
/// `remove` frees as it goes. On a blocking thread: a big stream's tree
/// takes seconds. A failure is logged and the reconciler goes on, as it
/// did when `drop_tree`'s error was ignored.
async fn drop_payload_tree(db: sled::Db, gid: GroupId) {
    let name = payload_tree(gid);
    let dropped = tokio::task::spawn_blocking(move || {
        db.open_tree(&name)?.clear()?;
        db.drop_tree(&name)
    })
    .await;
    if !matches!(dropped, Ok(Ok(_))) {
        tracing::warn!(
            group = gid,
            ?dropped,
            "a removed stream's payloads were not all dropped"
        );
    }
}
