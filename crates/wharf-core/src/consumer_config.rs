//! A pull consumer's configuration: filters, acks, redelivery, deliver and
//! priority policies, dead-letter subject, with their defaults and the rules
//! for edits.
//!
//! Invariants (after [`ConsumerConfig::with_defaults`] and
//! [`ConsumerConfig::validate`]): filters are valid and do not overlap each
//! other; AckWait, MaxAckPending, MaxWaiting and MaxDeliver are in range;
//! BackOff has fewer steps than MaxDeliver; the dead-letter subject (if any)
//! is a subject without wildcards. The name, filters, ack, deliver and
//! priority policies never change after creation.
//!
//! Left out: push-consumer settings (deliver subject, flow control).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::stream::StreamState;
use crate::subject::{validate_filter, validate_name};

/// AckWait when the user does not set one: 30 s.
pub const DEFAULT_ACK_WAIT_MS: u64 = 30_000;
/// MaxAckPending when the user does not set one.
pub const DEFAULT_MAX_ACK_PENDING: i64 = 1000;
/// MaxWaiting (pull requests waiting at once) when the user does not set one.
pub const DEFAULT_MAX_WAITING: i64 = 512;

/// How deliveries are acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AckPolicy {
    /// Each message is acked on its own (the default).
    #[default]
    Explicit,
    /// An ack of stream seq N acks every pending message up to N.
    All,
    /// Nothing is tracked: a delivered message is done.
    None,
}

/// Where a new consumer starts in its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DeliverPolicy {
    /// Every stored message (the default).
    #[default]
    All,
    /// Only messages stored after the consumer starts.
    New,
    /// The last matching message, then new ones.
    Last,
    /// The last message of each matching subject, then new ones.
    LastPerSubject,
    /// From this stream sequence on.
    ByStartSeq(u64),
    /// From the first message stored at or after this time (ms since epoch).
    ByStartTime(i64),
}

/// How the workers of a priority group share a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PriorityPolicy {
    /// Plain round-robin over waiting pulls.
    #[default]
    None,
    /// One worker (session) gets every message until it goes away; then the
    /// next worker that pulls is pinned.
    Pinned,
    /// Pulls may carry thresholds: a standby pull is served only while the
    /// consumer's pending or outstanding count reaches its threshold.
    Overflow,
}

/// Most metadata entries on a consumer, and their sizes.
pub const MAX_METADATA_ENTRIES: usize = 64;
const MAX_METADATA_KEY_BYTES: usize = 256;
const MAX_METADATA_VALUE_BYTES: usize = 4096;
/// Most backoff delays on a consumer (one per redelivery; the last repeats).
pub const MAX_BACKOFF_ENTRIES: usize = 64;

/// A pull consumer's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConsumerConfig {
    /// Consumer name, see [`validate_name`].
    pub name: String,
    /// Only messages matching this filter are delivered; `None` = all.
    pub filter_subject: Option<String>,
    /// How long a delivery may stay unacked before it is redelivered.
    pub ack_wait_ms: u64,
    /// Most unacked deliveries at once; `-1` unlimited.
    pub max_ack_pending: i64,
    /// Most pull requests waiting at once.
    pub max_waiting: i64,
    /// Explicit, all or none.
    pub ack_policy: AckPolicy,
    /// Deliveries of one message before it is given up on; `-1` unlimited.
    pub max_deliver: i64,
    /// Delays before redelivery, by delivery attempt (the last one repeats);
    /// when set it replaces AckWait.
    pub backoff_ms: Vec<u64>,
    /// When a worker's session closes, its unacked messages become available
    /// at once instead of after AckWait (the leader proposes naks for them).
    pub redeliver_on_disconnect: bool,
    /// Where the consumer starts; fixed at creation.
    pub deliver_policy: DeliverPolicy,
    /// No deliveries before this time (ms since epoch); 0: not paused.
    pub pause_until_ms: i64,
    /// Free-form labels for operators.
    pub metadata: BTreeMap<String, String>,
    /// Pinned or overflow sharing; fixed at creation.
    pub priority_policy: PriorityPolicy,
    /// More filters: the consumer delivers messages matching any of these or
    /// `filter_subject`. They may not overlap.
    pub filter_subjects: Vec<String>,
    /// The consumer is deleted when no worker has pulled for this long
    /// (0: never). Enforced by the leader, which proposes the deletion.
    pub inactive_threshold_ms: u64,
    /// Where a message that is termed or reaches MaxDeliver is published,
    /// once, with headers naming its origin (see [`dead_letter`]).
    pub dead_letter_subject: Option<String>,
}

impl ConsumerConfig {
    /// Fills in defaults: ack_wait 0 -> 30 s; max_ack_pending 0 -> 1000,
    /// negative -> -1; max_waiting <= 0 -> 512; empty filter -> `None`.
    pub fn with_defaults(mut self) -> Self {
        if self.ack_wait_ms == 0 {
            self.ack_wait_ms = DEFAULT_ACK_WAIT_MS;
        }
        if self.max_ack_pending == 0 {
            self.max_ack_pending = DEFAULT_MAX_ACK_PENDING;
        } else if self.max_ack_pending < 0 {
            self.max_ack_pending = -1;
        }
        if self.max_waiting <= 0 {
            self.max_waiting = DEFAULT_MAX_WAITING;
        }
        if self.max_deliver <= 0 {
            self.max_deliver = -1;
        }
        if self.filter_subject.as_deref() == Some("") {
            self.filter_subject = None;
        }
        self
    }

    /// Every filter of the consumer; empty means every subject of the stream.
    pub fn filters(&self) -> Vec<&str> {
        self.filter_subject
            .iter()
            .chain(self.filter_subjects.iter())
            .map(String::as_str)
            .collect()
    }

    /// Whether `subject` is one the consumer delivers.
    pub fn matches(&self, subject: &str) -> bool {
        let filters = self.filters();
        filters.is_empty()
            || filters
                .iter()
                .any(|f| crate::subject::subject_matches(f, subject))
    }

    /// First stored sequence after `after_seq` the consumer delivers.
    pub fn next_matching(&self, stream: &StreamState, after_seq: u64) -> Option<u64> {
        let filters = self.filters();
        if filters.is_empty() {
            return stream.next_matching(after_seq, None);
        }
        filters
            .iter()
            .filter_map(|f| stream.next_matching(after_seq, Some(f)))
            .min()
    }

    /// How many stored messages after `after_seq` the consumer delivers
    /// (its filters do not overlap, so the counts add up).
    pub fn count_matching_after(&self, stream: &StreamState, after_seq: u64) -> u64 {
        let filters = self.filters();
        if filters.is_empty() {
            return stream.count_matching_after(after_seq, None);
        }
        filters
            .iter()
            .map(|f| stream.count_matching_after(after_seq, Some(f)))
            .sum()
    }

    /// Checks the configuration (call after [`Self::with_defaults`]).
    pub fn validate(&self) -> Result<(), CoreError> {
        validate_name("consumer", &self.name)?;
        let filters = self.filters();
        if filters.len() > crate::subject::MAX_FILTERS {
            return Err(CoreError::config(
                "consumer",
                format!(
                    "{} filter subjects given; a consumer may have at most {}",
                    filters.len(),
                    crate::subject::MAX_FILTERS
                ),
            ));
        }
        for (i, f) in filters.iter().enumerate() {
            validate_filter(f)?;
            if let Some(other) = filters[i + 1..]
                .iter()
                .find(|o| crate::subject::filters_overlap(f, o))
            {
                return Err(CoreError::config(
                    "consumer",
                    format!("filter subjects {f:?} and {other:?} overlap"),
                ));
            }
        }
        if self.ack_wait_ms == 0 {
            return Err(CoreError::config(
                "consumer",
                "ack_wait_ms must be at least 1",
            ));
        }
        if self.max_ack_pending == 0 {
            return Err(CoreError::config(
                "consumer",
                "max_ack_pending must be -1 (unlimited) or at least 1",
            ));
        }
        if self.max_waiting <= 0 {
            return Err(CoreError::config(
                "consumer",
                "max_waiting must be at least 1",
            ));
        }
        if self.max_deliver == 0 || self.max_deliver < -1 {
            return Err(CoreError::config(
                "consumer",
                "max_deliver must be -1 (unlimited) or at least 1",
            ));
        }
        if self.backoff_ms.len() > MAX_BACKOFF_ENTRIES {
            return Err(CoreError::config(
                "consumer",
                format!("at most {MAX_BACKOFF_ENTRIES} backoff delays"),
            ));
        }
        if self.backoff_ms.contains(&0) {
            return Err(CoreError::config(
                "consumer",
                "backoff delays must be at least 1ms",
            ));
        }
        if self.max_deliver > 0 && self.backoff_ms.len() as i64 >= self.max_deliver {
            return Err(CoreError::config(
                "consumer",
                "max_deliver must be greater than the number of backoff delays",
            ));
        }
        if self.deliver_policy == DeliverPolicy::ByStartSeq(0) {
            return Err(CoreError::config(
                "consumer",
                "a start sequence must be at least 1",
            ));
        }
        if let Some(subject) = &self.dead_letter_subject {
            crate::subject::validate_subject(subject)?;
        }
        if self.metadata.len() > MAX_METADATA_ENTRIES {
            return Err(CoreError::config(
                "consumer",
                format!("at most {MAX_METADATA_ENTRIES} metadata entries"),
            ));
        }
        for (k, v) in &self.metadata {
            if k.is_empty()
                || k.len() > MAX_METADATA_KEY_BYTES
                || v.len() > MAX_METADATA_VALUE_BYTES
            {
                return Err(CoreError::config(
                    "consumer",
                    format!("metadata keys must be 1 to {MAX_METADATA_KEY_BYTES} bytes and values at most {MAX_METADATA_VALUE_BYTES}"),
                ));
            }
        }
        Ok(())
    }

    /// Checks that `new` may replace `self`: name and filter are fixed;
    /// ack_wait_ms, max_ack_pending and max_waiting may change.
    pub fn check_update(&self, new: &ConsumerConfig) -> Result<(), CoreError> {
        if new.name != self.name {
            return Err(CoreError::update(
                "consumer",
                &self.name,
                format!("the name cannot be changed (to {:?})", new.name),
            ));
        }
        if new.filter_subject != self.filter_subject || new.filter_subjects != self.filter_subjects
        {
            return Err(CoreError::update(
                "consumer",
                &self.name,
                "filter subject cannot be changed",
            ));
        }
        if new.ack_policy != self.ack_policy {
            return Err(CoreError::update(
                "consumer",
                &self.name,
                "ack policy cannot be changed",
            ));
        }
        if new.priority_policy != self.priority_policy {
            return Err(CoreError::update(
                "consumer",
                &self.name,
                "priority policy cannot be changed",
            ));
        }
        if new.deliver_policy != self.deliver_policy {
            return Err(CoreError::update(
                "consumer",
                &self.name,
                "deliver policy cannot be changed",
            ));
        }
        new.validate()
    }
}
