//! The server crate's one error type, and its one conversion to a gRPC status.
//!
//! Errors decided inside a replicated state machine (a duplicate stream name, an
//! unknown consumer) travel back to the proposer inside the apply response, so
//! `ServerError` is serializable. Everything a client sees goes through
//! `impl From<ServerError> for tonic::Status`; no handler builds a `Status` by hand.

use serde::{Deserialize, Serialize};
use wharf_raft::RaftError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ServerError {
    /// The request itself is wrong (bad name, bad subject, bad config).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The request conflicts with current state (e.g. overlapping subjects).
    #[error("{0}")]
    Conflict(String),
    /// A limit was hit (message too large, too many waiting pulls).
    #[error("{0}")]
    Exhausted(String),
    /// Retry elsewhere or later: no leader, node shutting down, peer unreachable.
    #[error("{0}")]
    Unavailable(String),
    /// This node is not the leader of the group it was asked to change.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<u64> },
    #[error("internal error: {0}")]
    Internal(String),
    /// No credentials, or wrong ones.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is known but may not do this.
    #[error("{0}")]
    PermissionDenied(String),
}

pub type Result<T, E = ServerError> = std::result::Result<T, E>;

impl From<wharf_core::CoreError> for ServerError {
    fn from(e: wharf_core::CoreError) -> Self {
        match e {
            wharf_core::CoreError::TooManyWaiting { .. } => ServerError::Exhausted(e.to_string()),
            wharf_core::CoreError::StreamFull { .. } => ServerError::Exhausted(e.to_string()),
            wharf_core::CoreError::NoMessage { .. } => ServerError::NotFound(e.to_string()),
            _ => ServerError::Invalid(e.to_string()),
        }
    }
}

impl From<RaftError> for ServerError {
    fn from(e: RaftError) -> Self {
        match e {
            RaftError::NotLeader { leader } => ServerError::NotLeader { leader },
            RaftError::Timeout => ServerError::Unavailable("raft group timed out".into()),
            RaftError::GroupNotFound(id) => {
                ServerError::Unavailable(format!("raft group {id} is not running on this node"))
            }
            RaftError::Stopped(m) => ServerError::Unavailable(format!("raft group stopped: {m}")),
            RaftError::Network(m) => ServerError::Unavailable(format!("peer unreachable: {m}")),
            RaftError::Storage(m) => ServerError::Internal(format!("storage: {m}")),
            RaftError::Config(m) => ServerError::Internal(format!("raft config: {m}")),
            RaftError::Membership(m) => {
                ServerError::Unavailable(format!("membership change refused for now: {m}"))
            }
        }
    }
}

impl From<bincode::Error> for ServerError {
    fn from(e: bincode::Error) -> Self {
        ServerError::Internal(format!("codec: {e}"))
    }
}

impl From<sled::Error> for ServerError {
    fn from(e: sled::Error) -> Self {
        ServerError::Internal(format!("storage: {e}"))
    }
}

impl From<ServerError> for tonic::Status {
    fn from(e: ServerError) -> Self {
        use tonic::Code;
        let code = match &e {
            ServerError::Invalid(_) => Code::InvalidArgument,
            ServerError::NotFound(_) => Code::NotFound,
            ServerError::AlreadyExists(_) => Code::AlreadyExists,
            ServerError::Conflict(_) => Code::FailedPrecondition,
            ServerError::Exhausted(_) => Code::ResourceExhausted,
            ServerError::Unavailable(_) | ServerError::NotLeader { .. } => Code::Unavailable,
            ServerError::Internal(_) => Code::Internal,
            ServerError::Unauthenticated(_) => Code::Unauthenticated,
            ServerError::PermissionDenied(_) => Code::PermissionDenied,
        };
        tonic::Status::new(code, e.to_string())
    }
}

/// Statuses coming back from a peer we forwarded to keep their code and text.
impl From<tonic::Status> for ServerError {
    fn from(s: tonic::Status) -> Self {
        use tonic::Code;
        let m = s.message().to_string();
        match s.code() {
            Code::InvalidArgument | Code::OutOfRange => ServerError::Invalid(m),
            Code::NotFound => ServerError::NotFound(m),
            Code::AlreadyExists => ServerError::AlreadyExists(m),
            Code::FailedPrecondition => ServerError::Conflict(m),
            Code::ResourceExhausted => ServerError::Exhausted(m),
            Code::Unauthenticated => ServerError::Unauthenticated(m),
            Code::PermissionDenied => ServerError::PermissionDenied(m),
            Code::Internal | Code::DataLoss | Code::Unknown if !m.contains("transport") => {
                ServerError::Internal(m)
            }
            _ => ServerError::Unavailable(m),
        }
    }
}
