//! The limits-retention stream index.
//!
//! A [`StreamState`] is the replicated index of one stream: which sequence
//! numbers it holds, each message's subject, size and publish time, and the
//! stream's limits. Payloads are stored elsewhere (the server keeps them in
//! its store keyed by sequence); this crate only decides *which* sequences
//! exist.
//!
//! Invariants:
//! - sequences start at 1, grow by one per append and are never reused, even
//!   after the messages they named were removed;
//! - after every mutation the limits hold: at most `max_msgs` messages, at
//!   most `max_bytes` bytes, nothing older than `max_age_ms` (discard-old:
//!   the oldest messages go first);
//! - everything is deterministic: same calls, same state. Publish times are
//!   clamped to be non-decreasing (`published_ms` = max of `now_ms` and the
//!   previous publish time) so age expiry can stop at the first young
//!   message even if a new leader's clock is behind the old one's.
//!
//! Deliberately left out: discard-new policy, work-queue/interest retention,
//! per-subject limits, deleting single messages and purging (not needed yet).

use std::collections::BTreeMap;
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::subject::validate_subject;
use crate::subject::{filters_overlap, subject_matches, validate_filter, validate_name};

/// Replication factor when the user does not ask for one.
pub const DEFAULT_REPLICAS: u8 = 3;
/// Server-wide hard limit on one message's size, 1 MiB.
pub const MAX_MSG_SIZE_LIMIT: u32 = 1024 * 1024;

/// A stream's configuration. `-1` (or any value `<= 0`) for `max_msgs` and
/// `max_bytes`, and `0` for `max_age_ms`, mean "no limit".
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
        }
    }
}

impl StreamConfig {
    /// Fills in defaults: replicas 0 -> 3, non-positive `max_msgs` and
    /// `max_bytes` -> -1, non-positive `max_msg_size` -> 1 MiB.
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
        if self.max_msg_size <= 0 {
            self.max_msg_size = MAX_MSG_SIZE_LIMIT as i32;
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
        Ok(())
    }

    /// Checks that `new` is a valid replacement for `self`: the name and the
    /// replica count are fixed; subjects and limits may change.
    pub fn check_update(&self, new: &StreamConfig) -> Result<(), CoreError> {
        if new.name != self.name {
            return Err(CoreError::update(
                "stream",
                &self.name,
                format!("the name cannot be changed (to {:?})", new.name),
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
    fn max_msg_size_bytes(&self) -> u64 {
        match u64::try_from(self.max_msg_size) {
            Ok(n) if n > 0 => n,
            _ => u64::from(MAX_MSG_SIZE_LIMIT),
        }
    }
}

/// What the stream remembers about a stored message (the payload is kept
/// elsewhere).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MsgMeta {
    /// Subject it was published to.
    pub subject: String,
    /// Payload size in bytes.
    pub size: u64,
    /// When it was stored.
    pub published_ms: i64,
}

/// Counters about a stream, like NATS's stream state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StreamStats {
    /// Messages stored.
    pub messages: u64,
    /// Payload bytes stored.
    pub bytes: u64,
    /// First stored sequence, or `last_seq + 1` when empty.
    pub first_seq: u64,
    /// Last assigned sequence, 0 if none.
    pub last_seq: u64,
}

/// Result of an append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Appended {
    /// Sequence given to the new message.
    pub seq: u64,
    /// Sequences removed by the limits to make room (ascending).
    pub removed: Vec<u64>,
}

/// The replicated index of one limits-retention stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    config: StreamConfig,
    msgs: BTreeMap<u64, MsgMeta>,
    last_seq: u64,
    bytes: u64,
    /// Latest publish time stored; publish times never go below it.
    last_published_ms: i64,
}

impl StreamState {
    /// An empty stream. The caller has validated `config`.
    pub fn new(config: StreamConfig) -> Self {
        StreamState {
            config,
            msgs: BTreeMap::new(),
            last_seq: 0,
            bytes: 0,
            last_published_ms: i64::MIN,
        }
    }

    /// The current configuration.
    pub fn config(&self) -> &StreamConfig {
        &self.config
    }

    /// Replaces the configuration (see [`StreamConfig::check_update`]) and
    /// enforces the new limits; returns the removed sequences.
    pub fn update_config(
        &mut self,
        config: StreamConfig,
        now_ms: i64,
    ) -> Result<Vec<u64>, CoreError> {
        self.config.check_update(&config)?;
        self.config = config;
        Ok(self.enforce_limits(now_ms))
    }

    /// Stores a new message's metadata and enforces the limits.
    pub fn append(&mut self, subject: &str, size: u64, now_ms: i64) -> Result<Appended, CoreError> {
        validate_subject(subject)?;
        if !self.config.matches(subject) {
            return Err(CoreError::SubjectNotInStream {
                subject: subject.to_string(),
                stream: self.config.name.clone(),
            });
        }
        let max_size = self.config.max_msg_size_bytes();
        if size > max_size {
            return Err(CoreError::MessageTooLarge {
                size_bytes: size,
                limit: "maximum".to_string(),
                max_bytes: max_size,
            });
        }
        if let Some(max_bytes) = positive(self.config.max_bytes) {
            // It would be removed at once by discard-old; refuse it instead.
            if size > max_bytes {
                return Err(CoreError::MessageTooLarge {
                    size_bytes: size,
                    limit: "max_bytes".to_string(),
                    max_bytes,
                });
            }
        }
        self.last_seq += 1;
        let seq = self.last_seq;
        self.last_published_ms = self.last_published_ms.max(now_ms);
        self.msgs.insert(
            seq,
            MsgMeta {
                subject: subject.to_string(),
                size,
                published_ms: self.last_published_ms,
            },
        );
        self.bytes = self.bytes.saturating_add(size);
        let removed = self.enforce_limits(now_ms);
        Ok(Appended { seq, removed })
    }

    /// Removes messages whose age limit has run out at `now_ms`
    /// (`published_ms + max_age_ms <= now_ms`); returns their sequences.
    pub fn expire(&mut self, now_ms: i64) -> Vec<u64> {
        let mut removed = Vec::new();
        self.expire_into(now_ms, &mut removed);
        removed
    }

    fn expire_into(&mut self, now_ms: i64, removed: &mut Vec<u64>) {
        if self.config.max_age_ms == 0 {
            return;
        }
        let max_age_ms = i64::try_from(self.config.max_age_ms).unwrap_or(i64::MAX);
        // Publish times are non-decreasing in sequence order, so stop at the
        // first message still young enough.
        while let Some((&seq, meta)) = self.msgs.first_key_value() {
            if meta.published_ms.saturating_add(max_age_ms) > now_ms {
                break;
            }
            self.remove_first(seq, removed);
        }
    }

    fn enforce_limits(&mut self, now_ms: i64) -> Vec<u64> {
        let mut removed = Vec::new();
        self.expire_into(now_ms, &mut removed);
        let max_msgs = positive(self.config.max_msgs);
        let max_bytes = positive(self.config.max_bytes);
        while let Some((&seq, _)) = self.msgs.first_key_value() {
            let too_many = max_msgs.is_some_and(|m| self.msgs.len() as u64 > m);
            let too_big = max_bytes.is_some_and(|m| self.bytes > m);
            if !too_many && !too_big {
                break;
            }
            self.remove_first(seq, &mut removed);
        }
        removed
    }

    fn remove_first(&mut self, seq: u64, removed: &mut Vec<u64>) {
        if let Some(meta) = self.msgs.remove(&seq) {
            self.bytes = self.bytes.saturating_sub(meta.size);
            removed.push(seq);
        }
    }

    /// Message count, bytes and sequence range.
    pub fn stats(&self) -> StreamStats {
        StreamStats {
            messages: self.msgs.len() as u64,
            bytes: self.bytes,
            first_seq: self
                .msgs
                .first_key_value()
                .map_or(self.last_seq.saturating_add(1), |(&seq, _)| seq),
            last_seq: self.last_seq,
        }
    }

    /// The stored message with sequence `seq`, if the stream still holds it.
    pub fn get(&self, seq: u64) -> Option<&MsgMeta> {
        self.msgs.get(&seq)
    }

    /// First stored sequence after `after_seq` whose subject matches `filter`
    /// (`None` matches everything).
    pub fn next_matching(&self, after_seq: u64, filter: Option<&str>) -> Option<u64> {
        self.msgs
            .range((Bound::Excluded(after_seq), Bound::Unbounded))
            .find(|(_, meta)| filter.is_none_or(|f| subject_matches(f, &meta.subject)))
            .map(|(&seq, _)| seq)
    }

    /// How many stored messages after `after_seq` match `filter` (a
    /// consumer's num_pending).
    pub fn count_matching_after(&self, after_seq: u64, filter: Option<&str>) -> u64 {
        let range = self
            .msgs
            .range((Bound::Excluded(after_seq), Bound::Unbounded));
        match filter {
            None => range.count() as u64,
            Some(f) => range
                .filter(|(_, meta)| subject_matches(f, &meta.subject))
                .count() as u64,
        }
    }
}

fn positive(limit: i64) -> Option<u64> {
    u64::try_from(limit).ok().filter(|&n| n > 0)
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
