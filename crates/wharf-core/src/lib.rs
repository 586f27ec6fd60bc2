//! Wharf's broker logic: subjects, the stream index, consumer state and
//! dispatch of messages to waiting pull requests.
//!
//! Everything here is pure: no I/O, no clock, no randomness, no async. Time
//! is always passed in as `now_ms` (milliseconds since the Unix epoch). The
//! replicated types ([`StreamState`], [`ConsumerState`]) are deterministic so
//! they can run inside Raft state machines: the same commands in the same
//! order give the same state on every replica. They are `serde` types so they
//! can be snapshotted.
//!
//! Deliberately left out: storage of payloads, networking, Raft itself and
//! anything about time-keeping; the server crate provides those.

pub mod consumer;
pub mod dedup;
pub mod dispatch;
pub mod error;
pub mod stream;
mod stream_config;
pub mod subject;

pub use consumer::{
    start_position, AckPolicy, ConsumerConfig, ConsumerState, DeliverPolicy, Delivery, Pending,
    PriorityPolicy, SeqPair,
};
pub use consumer::{DeadLetter, DeadLetterReason};
pub use dispatch::{
    Assignment, Dispatcher, FinishedPull, Plan, PullEnd, SessionId, Thresholds, WaitingPull,
};
pub use error::CoreError;
pub use stream::{
    Appended, ConsumerProgress, DiscardPolicy, MsgMeta, Purge, RetentionPolicy, StreamConfig,
    StreamState, StreamStats,
};
pub use subject::{
    filters_overlap, subject_matches, validate_filter, validate_name, validate_subject,
};
