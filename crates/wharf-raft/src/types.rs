//! The one openraft type configuration shared by every group, and the wire
//! envelope used on the peer transport.
//!
//! Everything here is crate-private: openraft types never reach the public API.
//! Commands and responses are opaque bytes (`bytes::Bytes`, serialized by serde
//! as a byte string, so bincode stores them as length + raw bytes).

use std::fmt;

use bytes::Bytes;
use serde::Deserialize;
use serde::Serialize;

use crate::SnapshotExpander;

/// An opaque command proposed by the server; the state machine interprets it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Cmd(pub(crate) Bytes);

impl fmt::Debug for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cmd({} bytes)", self.0.len())
    }
}

/// The state machine's answer to one applied command.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CmdResponse(pub(crate) Bytes);

impl fmt::Debug for CmdResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "resp({} bytes)", self.0.len())
    }
}

openraft::declare_raft_types!(
    /// The type configuration of every Wharf Raft group.
    pub(crate) TypeConfig:
        D = Cmd,
        R = CmdResponse,
        NodeId = u64,
        Node = openraft::BasicNode,
);

/// The openraft handle of one group.
pub(crate) type WharfRaft = openraft::Raft<TypeConfig, crate::sm_store::SmStore>;

pub(crate) type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub(crate) type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub(crate) type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub(crate) type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub(crate) type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
pub(crate) type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotData>;

/// The data of a snapshot as openraft passes it around.
///
/// A state machine may keep part of its state durable in storage of its own
/// (a stream's payloads) and leave it out of the snapshot it stores; that part
/// is read back only when the snapshot is sent to another node
/// ([`SnapshotData::into_transfer_bytes`]), not when it is built or restored
/// locally.
pub(crate) struct SnapshotData {
    /// The bytes as stored (local) or as received (a transfer).
    pub(crate) bytes: Vec<u8>,
    /// `Some` for this node's own snapshots: adds the state machine's own
    /// storage for a transfer. `None` for a received snapshot.
    pub(crate) expander: Option<SnapshotExpander>,
}

impl SnapshotData {
    /// A snapshot received from a peer: already complete.
    pub(crate) fn received(bytes: Vec<u8>) -> Self {
        SnapshotData {
            bytes,
            expander: None,
        }
    }

    /// The bytes to send to a peer.
    pub(crate) fn into_transfer_bytes(self) -> Result<Vec<u8>, String> {
        match self.expander {
            Some(expand) => expand(&self.bytes),
            None => Ok(self.bytes),
        }
    }
}

/// What a server puts in a reply frame: the openraft response, or the text of
/// a fatal error on the remote side (the client treats it as unreachable).
pub(crate) type WireResult<T> = Result<T, String>;

/// Encodes with bincode; the result is private to this crate's peers.
pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, String> {
    bincode::serialize(v).map_err(|e| format!("encode: {e}"))
}

/// Decodes what [`encode`] produced.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, String> {
    bincode::deserialize(b).map_err(|e| format!("decode: {e}"))
}

/// An `io::Error` carrying a message, for the storage traits.
pub(crate) fn io_err(msg: impl fmt::Display) -> std::io::Error {
    std::io::Error::other(msg.to_string())
}
