//! The crate's single error type.
//!
//! Every fallible public function returns [`RaftError`]. openraft's own error
//! types are converted here and never leak out of the crate: callers see
//! whether to redirect (`NotLeader`), retry later (`Timeout`, `Network`,
//! `Stopped`) or give up on the replica (`Storage`).
//!
//! Not here: mapping to gRPC statuses. That happens once, in the server crate.

use crate::GroupId;
use crate::NodeId;

/// Errors returned by the Raft layer.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// This replica is not the leader. `leader` is the current leader when known.
    ///
    /// Also returned when a proposal was discarded by a leader change: its
    /// outcome is then unknown and a retry may apply the command twice, so
    /// commands must be idempotent or deduplicated by the state machine.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader {
        /// The known leader of the group, if any.
        leader: Option<NodeId>,
    },
    /// The operation did not complete within its deadline.
    #[error("timed out")]
    Timeout,
    /// No group with this id runs on this node.
    #[error("raft group {0} not found")]
    GroupNotFound(GroupId),
    /// The group (or the whole node) is shut down or hit a fatal error.
    #[error("stopped: {0}")]
    Stopped(String),
    /// Reading or writing the local database failed.
    #[error("storage: {0}")]
    Storage(String),
    /// Invalid settings or membership.
    #[error("config: {0}")]
    Config(String),
    /// A peer could not be reached.
    #[error("network: {0}")]
    Network(String),
    /// A membership change was refused for now (another one is in progress,
    /// a learner is missing); retry once the current change has finished.
    #[error("membership change: {0}")]
    Membership(String),
}

impl From<sled::Error> for RaftError {
    fn from(e: sled::Error) -> Self {
        RaftError::Storage(e.to_string())
    }
}
