//! The meta group's state machine: the cluster catalog.
//!
//! Every member node is a voter of the meta group (group 0). Its state says which
//! streams and consumers exist, with what configuration, and which nodes host
//! each one's Raft group (placement). Each node watches this catalog and starts
//! or stops its local groups to match (see `reconcile`).
//!
//! Invariants:
//! - Group ids are never reused: `next_group_id` only grows, so a stream
//!   deleted and created again gets fresh sled trees.
//! - A consumer is placed on exactly its stream's replicas, so its leader can
//!   read committed messages from a local stream replica.
//! - Placement is a pure function of the catalog (fewest hosted groups first,
//!   then lowest node id), so every replica computes the same answer.
//! - Every validation happens inside `apply`, so a command that raced another
//!   one is judged against the state it actually lands on.
//!
//! - `nodes` is the placement set: changed only by `AddNode` and
//!   `RemoveNode` entries (the initial set is the one the cluster was
//!   bootstrapped with, the same on every node: see `bootstrap`).
//!
//! Node membership (`AddNode`, `RemoveNode`, `MoveDone`) and re-placement
//! live in `meta_nodes`.
//!
//! Snapshot encoding: the catalog gained `leaving`, `initialize_on` and
//! `removed_nodes`, so a catalog snapshot written before them does not
//! decode (snapshots are off by default; log entries decode unchanged).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use wharf_core::consumer::{AckPolicy, ConsumerConfig, DeliverPolicy};
use wharf_core::stream::{RetentionPolicy, StreamConfig};
use wharf_core::subject::filters_overlap;
use wharf_raft::{GroupId, NodeId, StateMachine};

use crate::error::{Result, ServerError};

pub const META_GROUP: GroupId = 0;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StreamEntry {
    /// The current config; the stream group follows it (`stream_runtime`).
    pub config: StreamConfig,
    /// The config the stream was created with: the stream group's state
    /// machine starts from it, so replaying its log gives the same state.
    pub created_config: StreamConfig,
    /// Bumped by every `UpdateStream`; 0 for the created config.
    pub config_revision: u64,
    pub group_id: GroupId,
    /// The nodes that host (or are about to host) the group, sorted.
    pub replicas: Vec<NodeId>,
    pub created_ms: i64,
    /// Nodes still voters of the group's Raft membership while a replica
    /// moves away from them (`peer remove`); empty once the group's leader
    /// reported the membership change done (`MoveDone`).
    pub leaving: Vec<NodeId>,
    /// The nodes that form the group by calling Raft `initialize` (the
    /// replicas at creation, minus any node a replica moved away from). A
    /// replica placed later starts empty and waits to be added as a learner.
    pub initialize_on: Vec<NodeId>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConsumerEntry {
    pub stream: String,
    pub config: ConsumerConfig,
    /// The configuration at creation: a consumer group replays its log from
    /// this one, and later edits arrive as entries of that log.
    pub created_config: ConsumerConfig,
    pub group_id: GroupId,
    /// The nodes that host (or are about to host) the group, sorted.
    pub replicas: Vec<NodeId>,
    pub created_ms: i64,
    /// Nodes still voters of the group's Raft membership while a replica
    /// moves away from them (`peer remove`); empty once the group's leader
    /// reported the membership change done (`MoveDone`).
    pub leaving: Vec<NodeId>,
    /// The nodes that form the group by calling Raft `initialize` (the
    /// replicas at creation, minus any node a replica moved away from). A
    /// replica placed later starts empty and waits to be added as a learner.
    pub initialize_on: Vec<NodeId>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Catalog {
    pub nodes: BTreeMap<NodeId, String>,
    pub streams: BTreeMap<String, StreamEntry>,
    /// Keyed by (stream, consumer).
    pub consumers: BTreeMap<(String, String), ConsumerEntry>,
    pub next_group_id: GroupId,
    /// Nodes removed by `peer remove`, with their last address: the meta
    /// leader takes them out of the meta group once no replica is moving.
    pub removed_nodes: BTreeMap<NodeId, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MetaCommand {
    AddStream {
        config: StreamConfig,
        now_ms: i64,
    },
    DeleteStream {
        name: String,
    },
    AddConsumer {
        stream: String,
        config: ConsumerConfig,
        now_ms: i64,
    },
    UpdateConsumer {
        stream: String,
        config: ConsumerConfig,
    },
    DeleteConsumer {
        stream: String,
        name: String,
    },
    /// Replace a stream's editable settings; its group's leader follows.
    UpdateStream {
        config: StreamConfig,
    },
    /// `command` (an add) refused with RESOURCE_EXHAUSTED when it would
    /// create a stream or consumer beyond these cluster-wide counts (see
    /// `limits`). Carrying the limits in the entry keeps every replica's
    /// answer the same. Last variant, so older entries decode unchanged.
    Bounded {
        max_streams: u32,
        max_consumers: u32,
        command: Box<MetaCommand>,
    },
    /// A node joined the meta group as a voter (`peer add`): new groups may
    /// be placed on it.
    AddNode {
        id: NodeId,
        addr: String,
    },
    /// `peer remove`: the node leaves the placement set at once, and every
    /// group with a replica on it gets a replacement (see `meta_nodes`).
    RemoveNode {
        id: NodeId,
    },
    /// The leader of group `group_id` finished the membership change to the
    /// catalog's replicas: the nodes it left may drop their replica.
    MoveDone {
        group_id: GroupId,
    },
}

/// What `apply` answers: the group id touched, or why the command was refused.
pub type MetaResponse = std::result::Result<GroupId, ServerError>;

impl Catalog {
    pub fn new(nodes: BTreeMap<NodeId, String>) -> Self {
        Catalog {
            nodes,
            next_group_id: 1,
            ..Default::default()
        }
    }

    /// The stream whose subjects match `subject`, if any.
    pub fn stream_for_subject(&self, subject: &str) -> Option<&StreamEntry> {
        self.streams.values().find(|s| s.config.matches(subject))
    }

    pub fn stream(&self, name: &str) -> Result<&StreamEntry> {
        self.streams
            .get(name)
            .ok_or_else(|| ServerError::NotFound(format!("stream {name:?} not found")))
    }

    pub fn consumer(&self, stream: &str, name: &str) -> Result<&ConsumerEntry> {
        self.stream(stream)?;
        self.consumers
            .get(&(stream.to_string(), name.to_string()))
            .ok_or_else(|| {
                ServerError::NotFound(format!("consumer {name:?} not found on stream {stream:?}"))
            })
    }

    pub fn consumers_of<'a>(&'a self, stream: &'a str) -> impl Iterator<Item = &'a ConsumerEntry> {
        self.consumers.values().filter(move |c| c.stream == stream)
    }

    /// Nodes with the fewest hosted groups first, ties broken by node id.
    /// Only live nodes (`nodes`: removed ones are gone from it) are used.
    fn place(&self, replicas: usize) -> Result<Vec<NodeId>> {
        if replicas > self.nodes.len() {
            return Err(ServerError::Invalid(format!(
                "replicas {replicas} is more than the {} nodes of the cluster",
                self.nodes.len()
            )));
        }
        let load = self.load();
        let mut nodes: Vec<(usize, NodeId)> = load.into_iter().map(|(n, l)| (l, n)).collect();
        nodes.sort();
        let mut chosen: Vec<NodeId> = nodes.into_iter().take(replicas).map(|(_, n)| n).collect();
        chosen.sort();
        Ok(chosen)
    }

    pub fn apply(&mut self, cmd: MetaCommand) -> MetaResponse {
        match cmd {
            MetaCommand::AddStream { config, now_ms } => self.add_stream(config, now_ms),
            MetaCommand::DeleteStream { name } => {
                let entry = self.stream(&name)?.clone();
                self.streams.remove(&name);
                self.consumers.retain(|_, c| c.stream != name);
                Ok(entry.group_id)
            }
            MetaCommand::AddConsumer {
                stream,
                config,
                now_ms,
            } => self.add_consumer(stream, config, now_ms),
            MetaCommand::UpdateConsumer { stream, config } => {
                let key = (stream.clone(), config.name.clone());
                let entry = self.consumer(&stream, &config.name)?;
                entry.config.check_update(&config)?;
                let entry = self.consumers.get_mut(&key).expect("checked above");
                entry.config = config;
                Ok(entry.group_id)
            }
            MetaCommand::DeleteConsumer { stream, name } => {
                let gid = self.consumer(&stream, &name)?.group_id;
                self.consumers.remove(&(stream, name));
                Ok(gid)
            }
            MetaCommand::UpdateStream { config } => self.update_stream(config),
            MetaCommand::Bounded {
                max_streams,
                max_consumers,
                command,
            } => {
                self.check_counts(&command, max_streams, max_consumers)?;
                self.apply(*command)
            }
            MetaCommand::AddNode { id, addr } => self.add_node(id, addr),
            MetaCommand::RemoveNode { id } => self.remove_node(id),
            MetaCommand::MoveDone { group_id } => {
                self.move_done(group_id);
                Ok(group_id)
            }
        }
    }

    /// Would `command` add a stream or consumer beyond the counts? Re-adding
    /// an existing one is not a new one.
    fn check_counts(
        &self,
        command: &MetaCommand,
        max_streams: u32,
        max_consumers: u32,
    ) -> Result<()> {
        match command {
            MetaCommand::AddStream { config, .. }
                if !self.streams.contains_key(&config.name)
                    && self.streams.len() >= max_streams as usize =>
            {
                Err(ServerError::Exhausted(format!(
                    "cannot add stream {:?}: the cluster has {} streams and max_streams is {max_streams}",
                    config.name,
                    self.streams.len()
                )))
            }
            MetaCommand::AddConsumer { stream, config, .. }
                if !self
                    .consumers
                    .contains_key(&(stream.clone(), config.name.clone()))
                    && self.consumers.len() >= max_consumers as usize =>
            {
                Err(ServerError::Exhausted(format!(
                    "cannot add consumer {:?}: the cluster has {} consumers and max_consumers is {max_consumers}",
                    config.name,
                    self.consumers.len()
                )))
            }
            _ => Ok(()),
        }
    }

    /// The subjects of `config` may not overlap any other stream's.
    /// A work-queue stream hands each message to one consumer: consumers
    /// must deliver all, ack, and not overlap each other's filters.
    fn check_work_queue_consumer(&self, stream: &str, config: &ConsumerConfig) -> Result<()> {
        if config.deliver_policy != DeliverPolicy::All {
            return Err(ServerError::Invalid(format!(
                "consumers of work-queue stream {stream:?} must use deliver policy all"
            )));
        }
        if config.ack_policy == AckPolicy::None {
            return Err(ServerError::Invalid(format!(
                "consumers of work-queue stream {stream:?} must ack (ack policy explicit or all)"
            )));
        }
        let all = [">"];
        let mine = config.filters();
        let mine: &[&str] = if mine.is_empty() { &all } else { &mine };
        for other in self.consumers_of(stream) {
            let theirs = other.config.filters();
            let theirs: &[&str] = if theirs.is_empty() { &all } else { &theirs };
            for a in mine {
                if let Some(b) = theirs.iter().find(|b| filters_overlap(a, b)) {
                    return Err(ServerError::Conflict(format!(
                        "work-queue stream {stream:?}: consumer {:?} would overlap consumer {:?} ({a:?} and {b:?}); consumers of a work queue may not share subjects",
                        config.name, other.config.name
                    )));
                }
            }
        }
        Ok(())
    }

    fn check_no_overlap(&self, config: &StreamConfig) -> Result<()> {
        for other in self.streams.values() {
            if other.config.name == config.name {
                continue;
            }
            for a in &config.subjects {
                if let Some(b) = other.config.subjects.iter().find(|b| filters_overlap(a, b)) {
                    return Err(ServerError::Conflict(format!(
                        "subjects overlap with stream {:?} ({a:?} and {b:?})",
                        other.config.name
                    )));
                }
            }
        }
        Ok(())
    }

    fn update_stream(&mut self, config: StreamConfig) -> MetaResponse {
        let entry = self.stream(&config.name)?;
        entry.config.check_update(&config)?;
        self.check_no_overlap(&config)?;
        let entry = self.streams.get_mut(&config.name).expect("checked above");
        entry.config = config;
        entry.config_revision += 1;
        Ok(entry.group_id)
    }

    fn add_stream(&mut self, config: StreamConfig, now_ms: i64) -> MetaResponse {
        config.validate()?;
        if let Some(existing) = self.streams.get(&config.name) {
            if existing.config == config {
                return Ok(existing.group_id);
            }
            return Err(ServerError::AlreadyExists(format!(
                "stream name {:?} already in use with a different configuration",
                config.name
            )));
        }
        self.check_no_overlap(&config)?;
        let replicas = self.place(config.replicas as usize)?;
        let group_id = self.next_group_id;
        self.next_group_id += 1;
        let name = config.name.clone();
        self.streams.insert(
            name,
            StreamEntry {
                created_config: config.clone(),
                config_revision: 0,
                config,
                group_id,
                initialize_on: replicas.clone(),
                leaving: Vec::new(),
                replicas,
                created_ms: now_ms,
            },
        );
        Ok(group_id)
    }

    fn add_consumer(
        &mut self,
        stream: String,
        config: ConsumerConfig,
        now_ms: i64,
    ) -> MetaResponse {
        config.validate()?;
        let stream_entry = self.stream(&stream)?;
        for filter in config.filters() {
            let bound = stream_entry
                .config
                .subjects
                .iter()
                .any(|s| filters_overlap(s, filter));
            if !bound {
                return Err(ServerError::Invalid(format!(
                    "filter subject {filter:?} matches no subject of stream {stream:?}"
                )));
            }
        }
        let replicas = stream_entry.replicas.clone();
        let key = (stream.clone(), config.name.clone());
        if let Some(existing) = self.consumers.get(&key) {
            if existing.config == config {
                return Ok(existing.group_id);
            }
            return Err(ServerError::AlreadyExists(format!(
                "consumer {:?} already exists on stream {stream:?} with a different configuration",
                config.name
            )));
        }
        if self.stream(&stream)?.config.retention == RetentionPolicy::WorkQueue {
            self.check_work_queue_consumer(&stream, &config)?;
        }
        let group_id = self.next_group_id;
        self.next_group_id += 1;
        self.consumers.insert(
            key,
            ConsumerEntry {
                stream,
                created_config: config.clone(),
                config,
                group_id,
                initialize_on: replicas.clone(),
                leaving: Vec::new(),
                replicas,
                created_ms: now_ms,
            },
        );
        Ok(group_id)
    }
}

/// The catalog as a Raft state machine. Each apply bumps `version` so the
/// reconciler and request handlers can wait for changes.
pub struct MetaMachine {
    catalog: Catalog,
    version: watch::Sender<u64>,
}

impl MetaMachine {
    pub fn new(nodes: BTreeMap<NodeId, String>) -> (Self, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0);
        (
            MetaMachine {
                catalog: Catalog::new(nodes),
                version: tx,
            },
            rx,
        )
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }
}

impl StateMachine for MetaMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        let response: MetaResponse = match bincode::deserialize::<MetaCommand>(command) {
            Ok(cmd) => self.catalog.apply(cmd),
            Err(e) => Err(ServerError::Internal(format!(
                "undecodable meta command: {e}"
            ))),
        };
        self.bump();
        bincode::serialize(&response).unwrap_or_default()
    }

    fn snapshot(&self) -> std::result::Result<Vec<u8>, String> {
        bincode::serialize(&self.catalog).map_err(|e| e.to_string())
    }

    fn restore(&mut self, data: &[u8]) -> std::result::Result<(), String> {
        self.catalog = bincode::deserialize(data).map_err(|e| e.to_string())?;
        self.bump();
        Ok(())
    }
}

#[cfg(test)]
mod update_stream_tests {
    use super::*;

    fn config(name: &str, subjects: &[&str]) -> StreamConfig {
        StreamConfig {
            name: name.into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            ..StreamConfig::default()
        }
        .with_defaults()
    }

    #[test]
    fn update_stream_is_validated_in_apply_and_bumps_the_revision() {
        let nodes = (1..=3).map(|n| (n, format!("n{n}:1"))).collect();
        let mut c = Catalog::new(nodes);
        let orders = config("ORDERS", &["orders.>"]);
        c.apply(MetaCommand::AddStream {
            config: orders.clone(),
            now_ms: 0,
        })
        .unwrap();
        c.apply(MetaCommand::AddStream {
            config: config("OTHER", &["other.>"]),
            now_ms: 0,
        })
        .unwrap();
        let update = |c: &mut Catalog, config: StreamConfig| {
            c.apply(MetaCommand::UpdateStream { config })
                .map_err(|e| e.to_string())
        };

        let unknown = update(&mut c, config("NOPE", &["nope"])).unwrap_err();
        assert_eq!(unknown, "stream \"NOPE\" not found");
        let overlap = update(&mut c, config("ORDERS", &["orders.>", "other.x"])).unwrap_err();
        assert!(
            overlap.contains("overlap with stream \"OTHER\""),
            "{overlap}"
        );
        let r1 = StreamConfig {
            replicas: 1,
            ..orders.clone()
        };
        assert!(update(&mut c, r1)
            .unwrap_err()
            .contains("replicas cannot be changed"));
        assert_eq!(c.streams["ORDERS"].config_revision, 0);

        let edited = StreamConfig {
            max_msgs: 5,
            ..config("ORDERS", &["orders.>", "returns.>"])
        };
        update(&mut c, edited.clone()).unwrap();
        let entry = &c.streams["ORDERS"];
        assert_eq!((&entry.config, &entry.created_config), (&edited, &orders));
        assert_eq!(entry.config_revision, 1);
    }
}

#[cfg(test)]
mod bounded_tests {
    use super::*;

    fn add_stream(name: &str) -> MetaCommand {
        let config = StreamConfig {
            name: name.into(),
            subjects: vec![format!("{}.>", name.to_lowercase())],
            ..Default::default()
        }
        .with_defaults();
        MetaCommand::AddStream { config, now_ms: 0 }
    }

    fn add_consumer(stream: &str, name: &str) -> MetaCommand {
        let config = ConsumerConfig {
            name: name.into(),
            ..Default::default()
        }
        .with_defaults();
        MetaCommand::AddConsumer {
            stream: stream.into(),
            config,
            now_ms: 0,
        }
    }

    fn bounded(cmd: MetaCommand) -> MetaCommand {
        MetaCommand::Bounded {
            max_streams: 1,
            max_consumers: 1,
            command: Box::new(cmd),
        }
    }

    #[test]
    fn counts_are_refused_and_nothing_changes() {
        let nodes = (1..=3).map(|n| (n, format!("n{n}:1"))).collect();
        let mut c = Catalog::new(nodes);
        c.apply(bounded(add_stream("A"))).unwrap();
        // Re-adding the same stream is not a new one.
        c.apply(bounded(add_stream("A"))).unwrap();
        let err = c.apply(bounded(add_stream("B"))).unwrap_err();
        assert!(matches!(err, ServerError::Exhausted(ref m) if m.contains("max_streams is 1")));
        c.apply(bounded(add_consumer("A", "c1"))).unwrap();
        let err = c.apply(bounded(add_consumer("A", "c2"))).unwrap_err();
        assert!(matches!(err, ServerError::Exhausted(ref m) if m.contains("max_consumers is 1")));
        assert_eq!((c.streams.len(), c.consumers.len()), (1, 1));
        // Unbounded commands are not counted.
        c.apply(add_stream("B")).unwrap();
    }
}
