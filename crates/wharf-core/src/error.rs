//! The one error type of `wharf-core`.
//!
//! Every fallible function in the crate returns [`CoreError`]. Messages are
//! written to be shown to a user as they are (the server forwards them in
//! gRPC statuses), so they name the offending value and say what is allowed.
//!
//! Invariants: variants carry owned data only (no borrowed input), so errors
//! can cross thread and Raft boundaries; the type is `Clone + PartialEq` so
//! tests and state machines can compare results.
//!
//! Deliberately left out: error codes for the wire protocol (the server maps
//! variants to gRPC codes) and any I/O errors (this crate does no I/O).

use thiserror::Error;

/// Everything that can go wrong in the broker's pure logic.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoreError {
    /// A stream or consumer name breaks the naming rules.
    #[error("{kind} name {name:?} is invalid: {reason}")]
    InvalidName {
        /// "stream" or "consumer".
        kind: String,
        /// The name as given.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },

    /// A publish subject breaks the subject rules.
    #[error("subject {subject:?} is invalid: {reason}")]
    InvalidSubject {
        /// The subject as given.
        subject: String,
        /// Which rule it breaks.
        reason: String,
    },

    /// A subject filter breaks the filter rules.
    #[error("subject filter {filter:?} is invalid: {reason}")]
    InvalidFilter {
        /// The filter as given.
        filter: String,
        /// Which rule it breaks.
        reason: String,
    },

    /// A stream or consumer configuration is not acceptable.
    #[error("invalid {kind} configuration: {reason}")]
    InvalidConfig {
        /// "stream" or "consumer".
        kind: String,
        /// What is wrong.
        reason: String,
    },

    /// A configuration update tries to change something that is fixed.
    #[error("cannot update {kind} {name:?}: {reason}")]
    ForbiddenUpdate {
        /// "stream" or "consumer".
        kind: String,
        /// Name of the stream or consumer being updated.
        name: String,
        /// What may not change.
        reason: String,
    },

    /// A message was published to a subject the stream does not capture.
    #[error("subject {subject:?} is not bound to stream {stream:?}")]
    SubjectNotInStream {
        /// The published subject.
        subject: String,
        /// The stream it was sent to.
        stream: String,
    },

    /// A message is larger than the stream accepts.
    #[error("message size {size_bytes} exceeds the stream's {limit} of {max_bytes}")]
    MessageTooLarge {
        /// Size of the refused message.
        size_bytes: u64,
        /// Which limit: "maximum" (max_msg_size) or "max_bytes".
        limit: String,
        /// The limit's value.
        max_bytes: u64,
    },

    /// A publish would go over a limit of a `discard: new` stream.
    #[error(
        "maximum {limit} exceeded: stream {stream:?} refuses new messages (discard policy new)"
    )]
    StreamFull {
        /// The stream.
        stream: String,
        /// Which limit: "messages", "bytes" or "messages per subject".
        limit: String,
    },

    /// No stored message has the asked-for sequence.
    #[error("no message with sequence {seq} in stream {stream:?}")]
    NoMessage {
        /// The stream.
        stream: String,
        /// The sequence asked for.
        seq: u64,
    },

    /// A request's arguments do not go together (e.g. purge with keep and seq).
    #[error("{0}")]
    InvalidRequest(String),

    /// A pull request asked for zero messages.
    #[error("pull batch must be at least 1")]
    InvalidBatch,

    /// A pull with the same id is already waiting on the session.
    #[error("pull {pull_id} is already waiting on session {session}")]
    DuplicatePull {
        /// The session.
        session: u64,
        /// The repeated pull id.
        pull_id: u64,
    },

    /// MaxWaiting pull requests are already waiting on the consumer.
    #[error("too many waiting pull requests: the consumer allows at most {max_waiting}")]
    TooManyWaiting {
        /// The consumer's max_waiting.
        max_waiting: i64,
    },
}

impl CoreError {
    pub(crate) fn config(kind: &str, reason: impl Into<String>) -> Self {
        CoreError::InvalidConfig {
            kind: kind.to_string(),
            reason: reason.into(),
        }
    }

    pub(crate) fn update(kind: &str, name: &str, reason: impl Into<String>) -> Self {
        CoreError::ForbiddenUpdate {
            kind: kind.to_string(),
            name: name.to_string(),
            reason: reason.into(),
        }
    }
}
