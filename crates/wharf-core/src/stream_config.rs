//! A stream's configuration: subjects, replicas, limits, discard policy and
//! duplicate window, with their defaults and the rules for edits.
//!
//! Invariants (after [`StreamConfig::with_defaults`] and
//! [`StreamConfig::validate`]): subjects are valid filters that do not
//! overlap each other; replicas is 1 or 3; `max_msg_size` is at most
//! [`MAX_MSG_SIZE_LIMIT`]; the duplicate window is at least
//! [`MIN_DUPLICATE_WINDOW_MS`] and never longer than `max_age_ms` when an age
//! limit is set (a message id cannot be remembered longer than its message).
//! The name and replica count never change after creation.
//!
//! The retention policy is fixed at creation.
//!
//! Left out: `discard_new_per_subject`
//! (with `discard: new` every limit refuses, the per-subject one included),
//! `deny_delete`/`deny_purge`, sealing, mirrors and sources.

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::subject::{
    filters_overlap, subject_matches, validate_filter, validate_name, MAX_FILTERS,
};

/// Replication factor when the user does not ask for one.
pub const DEFAULT_REPLICAS: u8 = 3;
/// Server-wide hard limit on one message's size, 1 MiB.
pub const MAX_MSG_SIZE_LIMIT: u32 = 1024 * 1024;
/// Duplicate window when the user does not ask for one: 2 minutes, like NATS.
pub const DEFAULT_DUPLICATE_WINDOW_MS: u64 = 120_000;
/// Shortest duplicate window accepted, like NATS.
pub const MIN_DUPLICATE_WINDOW_MS: u64 = 100;

/// What a stream does when a publish would go over a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DiscardPolicy {
    /// Remove the oldest messages to make room (the default).
    #[default]
    Old,
    /// Refuse the new message; nothing stored is removed.
    New,
}

impl DiscardPolicy {
    /// `"old"` or `"new"`, as NATS spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscardPolicy::Old => "old",
            DiscardPolicy::New => "new",
        }
    }
}

/// When stored messages leave the stream, besides the limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum RetentionPolicy {
    /// Only the limits remove messages (the default).
    #[default]
    Limits,
    /// A message is removed once the one consumer whose filter matches it
    /// is done with it (acked, termed, or given up on). Consumers may not
    /// overlap; a message no consumer matches stays.
    WorkQueue,
    /// A message is removed once every consumer whose filter matches it is
    /// done with it; with no such consumer it is removed at once.
    Interest,
}

impl RetentionPolicy {
    /// `"limits"`, `"workqueue"` or `"interest"`, as NATS spells them.
    pub fn as_str(self) -> &'static str {
        match self {
            RetentionPolicy::Limits => "limits",
            RetentionPolicy::WorkQueue => "workqueue",
            RetentionPolicy::Interest => "interest",
        }
    }
}

/// A stream's configuration. `-1` (or any value `<= 0`) for `max_msgs`,
/// `max_bytes` and `max_msgs_per_subject`, and `0` for `max_age_ms`, mean
/// "no limit"; `0` for `duplicate_window_ms` means the default.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    /// Stream name, see [`validate_name`].
    pub name: String,
    /// Subject filters the stream captures; they may not overlap.
    pub subjects: Vec<String>,
    /// 1 or 3.
    pub replicas: u8,
    /// Most messages kept; `-1` unlimited.
    pub max_msgs: i64,
    /// Most payload bytes kept; `-1` unlimited.
    pub max_bytes: i64,
    /// Messages older than this are removed; `0` keeps them forever.
    pub max_age_ms: u64,
    /// Largest accepted message; `<= 0` means [`MAX_MSG_SIZE_LIMIT`].
    pub max_msg_size: i32,
    /// Most messages kept per subject (oldest of that subject removed
    /// first); `-1` unlimited.
    pub max_msgs_per_subject: i64,
    /// What happens at a limit: remove old messages or refuse new ones.
    pub discard: DiscardPolicy,
    /// How long a message id is remembered for deduplication.
    pub duplicate_window_ms: u64,
    /// Limits, work queue or interest; fixed at creation.
    pub retention: RetentionPolicy,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            name: String::new(),
            subjects: Vec::new(),
            replicas: 0,
            max_msgs: -1,
            max_bytes: -1,
            max_age_ms: 0,
            max_msg_size: 0,
            max_msgs_per_subject: -1,
            discard: DiscardPolicy::Old,
            duplicate_window_ms: 0,
            retention: RetentionPolicy::Limits,
        }
    }
}

impl StreamConfig {
    /// Fills in defaults: replicas 0 -> 3, non-positive `max_msgs`,
    /// `max_bytes` and `max_msgs_per_subject` -> -1, non-positive
    /// `max_msg_size` -> 1 MiB, duplicate window 0 -> 2 minutes (or
    /// `max_age_ms` if that is shorter).
    pub fn with_defaults(mut self) -> Self {
        if self.replicas == 0 {
            self.replicas = DEFAULT_REPLICAS;
        }
        if self.max_msgs <= 0 {
            self.max_msgs = -1;
        }
        if self.max_bytes <= 0 {
            self.max_bytes = -1;
        }
        if self.max_msgs_per_subject <= 0 {
            self.max_msgs_per_subject = -1;
        }
        if self.max_msg_size <= 0 {
            self.max_msg_size = MAX_MSG_SIZE_LIMIT as i32;
        }
        if self.duplicate_window_ms == 0 {
            self.duplicate_window_ms = match self.max_age_ms {
                0 => DEFAULT_DUPLICATE_WINDOW_MS,
                age => DEFAULT_DUPLICATE_WINDOW_MS.min(age),
            };
        }
        self
    }

    /// Checks the configuration (call after [`Self::with_defaults`]).
    pub fn validate(&self) -> Result<(), CoreError> {
        validate_name("stream", &self.name)?;
        if self.subjects.is_empty() {
            return Err(CoreError::config(
                "stream",
                "a stream needs at least one subject",
            ));
        }
        if self.subjects.len() > MAX_FILTERS {
            return Err(CoreError::config(
                "stream",
                format!(
                    "{} subjects given; a stream may have at most {MAX_FILTERS}",
                    self.subjects.len()
                ),
            ));
        }
        for s in &self.subjects {
            validate_filter(s)?;
        }
        for (i, a) in self.subjects.iter().enumerate() {
            for b in &self.subjects[i + 1..] {
                if a == b {
                    return Err(CoreError::config(
                        "stream",
                        format!("subject {a:?} is listed twice"),
                    ));
                }
                if filters_overlap(a, b) {
                    return Err(CoreError::config(
                        "stream",
                        format!("subjects {a:?} and {b:?} overlap"),
                    ));
                }
            }
        }
        if self.replicas != 1 && self.replicas != 3 {
            return Err(CoreError::config(
                "stream",
                format!("replicas must be 1 or 3, not {}", self.replicas),
            ));
        }
        if i64::from(self.max_msg_size) > i64::from(MAX_MSG_SIZE_LIMIT) {
            return Err(CoreError::config(
                "stream",
                format!(
                    "max_msg_size {} exceeds the server limit of {MAX_MSG_SIZE_LIMIT}",
                    self.max_msg_size
                ),
            ));
        }
        if self.duplicate_window_ms < MIN_DUPLICATE_WINDOW_MS {
            return Err(CoreError::config(
                "stream",
                format!(
                    "duplicate window {}ms is shorter than the minimum of {MIN_DUPLICATE_WINDOW_MS}ms",
                    self.duplicate_window_ms
                ),
            ));
        }
        if self.max_age_ms > 0 && self.duplicate_window_ms > self.max_age_ms {
            return Err(CoreError::config(
                "stream",
                format!(
                    "duplicate window {}ms is longer than max age {}ms",
                    self.duplicate_window_ms, self.max_age_ms
                ),
            ));
        }
        Ok(())
    }

    /// Checks that `new` is a valid replacement for `self`: the name and the
    /// replica count and retention are fixed; subjects, limits, discard policy and
    /// duplicate window may change.
    pub fn check_update(&self, new: &StreamConfig) -> Result<(), CoreError> {
        if new.name != self.name {
            return Err(CoreError::update(
                "stream",
                &self.name,
                format!("the name cannot be changed (to {:?})", new.name),
            ));
        }
        if new.retention != self.retention {
            return Err(CoreError::update(
                "stream",
                &self.name,
                format!(
                    "retention cannot be changed ({} -> {})",
                    self.retention.as_str(),
                    new.retention.as_str()
                ),
            ));
        }
        if new.replicas != self.replicas {
            return Err(CoreError::update(
                "stream",
                &self.name,
                format!(
                    "replicas cannot be changed ({} -> {})",
                    self.replicas, new.replicas
                ),
            ));
        }
        new.validate()
    }

    /// Does any of the stream's subjects match `subject`?
    pub fn matches(&self, subject: &str) -> bool {
        self.subjects.iter().any(|f| subject_matches(f, subject))
    }

    /// Effective max_msg_size in bytes.
    pub(crate) fn max_msg_size_bytes(&self) -> u64 {
        match u64::try_from(self.max_msg_size) {
            Ok(n) if n > 0 => n,
            _ => u64::from(MAX_MSG_SIZE_LIMIT),
        }
    }
}
