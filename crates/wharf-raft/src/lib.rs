//! Many Raft groups per node on openraft, one sled database, and a multiplexed
//! gRPC peer transport.
//!
//! A process opens one [`RaftNode`]: it owns the node's single `sled::Db`, the
//! journal that makes log writes durable and its group-commit flusher (one
//! fsync of the journal covers the pending writes of every group),
//! the pool of peer channels (one tonic channel per peer node, shared by every
//! group) and the registry of running [`Group`]s. The server mounts
//! [`RaftNode::transport_service`] on its gRPC port and starts groups with a
//! [`StateMachine`] of its own.
//!
//! Invariants:
//! - openraft types never appear in this crate's public API.
//! - An append or a vote is reported durable only after the journal holding
//!   it was fsynced; sled's own files are flushed at checkpoints.
//! - A group's state machine lives in memory and is rebuilt at start from the
//!   stored snapshot and the committed log.
//!
//! Membership changes (`Group::add_learner`, `Group::set_voters`) are the
//! caller's to sequence: learner first, voter once caught up.
//!
//! Left out: per-group supervision and re-placement after a storage error
//! (the caller sees `Role::Shutdown`).

mod append_stream;
mod direct_io;
mod error;
mod fault;
mod flusher;
mod group;
mod journal;
mod log_store;
mod membership;
mod network;
mod node;
mod peer_auth;
mod sled_files;
mod sm_store;
pub mod timeline;
mod transport;
mod types;

#[cfg(test)]
mod sled_scan_bug_test;
#[cfg(test)]
mod storage_suite_test;

use std::sync::Arc;

pub use error::RaftError;
pub use group::Group;
pub use node::RaftNode;
pub use peer_auth::{PeerAuth, PeerChannel, PeerCredentials, PEER_SECRET_HEADER};
pub use sled_files::sync_sled_write;

/// Identifies a node of the cluster.
pub type NodeId = u64;
/// Identifies a Raft group. Group 0 is the meta group by the caller's convention.
pub type GroupId = u64;

/// A replicated state machine supplied by the server. Deterministic: the same
/// commands in the same order must produce the same state and responses.
pub trait StateMachine: Send + Sync + 'static {
    /// Apply one committed normal entry; returns the response handed to the writer.
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8>;
    /// Serialize the state for the snapshot this node stores. It may leave
    /// out what the state machine keeps durable in its own sled tree: the
    /// snapshot is stored only after a flush of the whole database, so that
    /// tree then holds at least everything up to the snapshot's index.
    fn snapshot(&self) -> Result<Vec<u8>, String>;
    /// Replace the whole state from a snapshot received from another node
    /// (the bytes a [`Self::snapshot_expander`] produced, or `snapshot`'s).
    fn restore(&mut self, data: &[u8]) -> Result<(), String>;
    /// Restore from this node's own stored snapshot when the group starts:
    /// the state machine's own storage is still there (and may be ahead of
    /// the snapshot; the log replayed after it repeats those writes). The
    /// default is [`Self::restore`].
    fn restore_local(&mut self, data: &[u8]) -> Result<(), String> {
        self.restore(data)
    }
    /// Adds the left-out part to a stored snapshot when it is sent to
    /// another node; `None` (the default) sends the stored bytes as they are.
    /// It runs on the sending task, without this state machine's lock, so
    /// it reads the state machine's storage as it is at that time (see the
    /// stream state machine for why that is enough).
    fn snapshot_expander(&self) -> Option<SnapshotExpander> {
        None
    }
}

/// Turns a stored snapshot into the bytes sent to another node.
pub type SnapshotExpander = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

/// A state machine shared between its group and the server.
pub type SharedStateMachine = Arc<std::sync::Mutex<dyn StateMachine>>;

/// Timing, snapshot and cache settings, the same for every group of a node.
#[derive(Clone, Debug)]
pub struct RaftSettings {
    /// Leader heartbeat interval; also the deadline of replication RPCs.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_min_ms: u64,
    /// Upper bound of the randomized election timeout.
    pub election_max_ms: u64,
    /// Build a snapshot (and purge the log) every this many applied entries;
    /// `None` never snapshots.
    pub snapshot_every_entries: Option<u64>,
    /// Source address of every outgoing peer connection (the node's own
    /// listen address when it is a specific one), so that network faults can
    /// be injected per link by address. `None` lets the OS choose.
    pub bind_ip: Option<std::net::IpAddr>,
    /// sled's page cache, a soft limit shared by every group of the node:
    /// one part of a node's memory; the backlogs held are another
    /// (docs/CONFIG.md, "Memory").
    pub cache_bytes: u64,
}

/// The default of [`RaftSettings::cache_bytes`].
pub const DEFAULT_CACHE_BYTES: u64 = 256 * 1024 * 1024;

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            // Measured with bench/failover.sh (docs/BENCHMARKS.md): openraft's
            // leader lease is election_max_ms, during which followers vote
            // for no one, so it bounds how fast a dead leader is replaced.
            heartbeat_ms: 150,
            election_min_ms: 500,
            election_max_ms: 900,
            // A stream's stored snapshot is its message index, without the
            // payloads, so building one costs O(messages), not O(bytes).
            snapshot_every_entries: Some(10_000),
            bind_ip: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// The role of this node in a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Accepts writes.
    Leader,
    /// Replicates from a leader.
    Follower,
    /// Campaigning.
    Candidate,
    /// Not a voter (or not initialized yet).
    Learner,
    /// Stopped on purpose.
    Shutdown,
    /// Stopped by a fatal error (a storage failure); only this group is
    /// affected. `GroupStatus::error` says why.
    Failed,
}

/// A snapshot of a group's Raft state, as seen by this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group.
    pub group_id: GroupId,
    /// This node's role.
    pub role: Role,
    /// The leader known to this node.
    pub leader: Option<NodeId>,
    /// The current term.
    pub term: u64,
    /// Index of the last entry in the local log (0 when empty).
    pub last_log_index: u64,
    /// Index of the last committed entry known here (0 when none).
    pub committed: u64,
    /// Index of the last entry applied to the state machine (0 when none).
    pub last_applied: u64,
    /// Index of the last entry in this node's latest snapshot (0 when none).
    pub snapshot_index: u64,
    /// Index of the last entry purged from this node's log (0 when none):
    /// the log holds `purged_index + 1 ..= last_log_index`.
    pub purged_index: u64,
    /// Voters of the current membership.
    pub voters: Vec<NodeId>,
    /// Learners of the current membership (nodes catching up before they
    /// become voters).
    pub learners: Vec<NodeId>,
    /// Why the group failed (with [`Role::Failed`]).
    pub error: Option<String>,
    /// How many times this node has seen the group's known leader change
    /// to another node since the group started here (a counter for metrics).
    pub leader_changes: u64,
}
