//! The stream index: what is stored, the limits, and (see [`retention`])
//! work-queue and interest retention.
//!
//! A [`StreamState`] is the replicated index of one stream: which sequence
//! numbers it holds, each message's subject, size and publish time, the
//! sequences per subject, the message ids of the duplicate window
//! ([`DedupWindow`]) and the stream's configuration ([`StreamConfig`]).
//! Payloads are stored elsewhere (the server keeps them in its store keyed
//! by sequence); this crate only decides *which* sequences exist.
//!
//! Invariants:
//! - sequences start at 1, grow by one per stored message and are never
//!   reused, even after the messages they named were removed;
//! - `subjects` indexes exactly the stored messages (each stored sequence is
//!   listed under its subject, in ascending order; no empty lists) and
//!   `bytes` is the sum of their sizes;
//! - after every mutation the limits hold: at most `max_msgs` messages, at
//!   most `max_bytes` bytes, at most `max_msgs_per_subject` per subject,
//!   nothing older than `max_age_ms`. With `discard: old` the oldest messages
//!   (of the subject, for the per-subject limit) go first; with
//!   `discard: new` a publish that would go over a limit is refused and
//!   changes nothing;
//! - a publish whose message id is inside the duplicate window stores
//!   nothing and answers the original sequence;
//! - everything is deterministic: same calls, same state. Publish times are
//!   clamped to be non-decreasing (`published_ms` = max of `now_ms` and the
//!   previous publish time) so age expiry can stop at the first young
//!   message even if a new leader's clock is behind the old one's.
//!
//! Deliberately left out: `num_deleted`
//! bookkeeping, and `discard_new_per_subject` (see [`StreamConfig`]).

use std::collections::{BTreeMap, VecDeque};

#[path = "retention.rs"]
pub mod retention;
pub use retention::{ConsumerInterest, ConsumerProgress, InterestedConsumer};
use std::ops::Bound;

use serde::{Deserialize, Serialize};

pub use crate::dedup::DedupWindow;
use crate::error::CoreError;
pub use crate::stream_config::{
    DiscardPolicy, RetentionPolicy, StreamConfig, DEFAULT_DUPLICATE_WINDOW_MS, DEFAULT_REPLICAS,
    MAX_MSG_SIZE_LIMIT, MIN_DUPLICATE_WINDOW_MS,
};
use crate::subject::{subject_matches, validate_filter, validate_subject};

/// Longest message id accepted, in bytes.
pub const MAX_MSG_ID_BYTES: usize = 1024;

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
    /// Distinct subjects among the stored messages.
    pub num_subjects: u64,
}

/// Result of an append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Appended {
    /// Sequence given to the new message (for a duplicate: the original's).
    pub seq: u64,
    /// Sequences removed by the limits to make room (ascending).
    pub removed: Vec<u64>,
    /// The message id was inside the duplicate window: nothing was stored.
    pub duplicate: bool,
}

/// Which messages a purge removes. With nothing set, every message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Purge {
    /// Only messages whose subject matches this filter.
    pub filter: Option<String>,
    /// Keep the newest `keep` (matching) messages.
    pub keep: Option<u64>,
    /// Only messages with a sequence below this one (exclusive), like NATS'
    /// `seq`. Cannot be combined with `keep`.
    pub below_seq: Option<u64>,
}

/// The replicated index of one stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    config: StreamConfig,
    msgs: BTreeMap<u64, MsgMeta>,
    /// Stored sequences per subject, ascending.
    subjects: BTreeMap<String, VecDeque<u64>>,
    dedup: DedupWindow,
    last_seq: u64,
    bytes: u64,
    /// Latest publish time stored; publish times never go below it.
    last_published_ms: i64,
    /// Consumers registered for work-queue or interest retention.
    interest: BTreeMap<String, InterestedConsumer>,
}

impl StreamState {
    /// An empty stream. The caller has validated `config`.
    pub fn new(config: StreamConfig) -> Self {
        StreamState {
            config,
            msgs: BTreeMap::new(),
            subjects: BTreeMap::new(),
            dedup: DedupWindow::default(),
            last_seq: 0,
            bytes: 0,
            last_published_ms: i64::MIN,
            interest: BTreeMap::new(),
        }
    }

    /// The current configuration.
    pub fn config(&self) -> &StreamConfig {
        &self.config
    }

    /// Replaces the configuration (see [`StreamConfig::check_update`]) and
    /// enforces the new limits (whatever the discard policy, lowered limits
    /// remove the oldest messages); returns the removed sequences.
    pub fn update_config(
        &mut self,
        config: StreamConfig,
        now_ms: i64,
    ) -> Result<Vec<u64>, CoreError> {
        self.config.check_update(&config)?;
        self.config = config;
        self.prune_dedup(now_ms);
        let mut removed = Vec::new();
        self.enforce_limits(now_ms, None, &mut removed);
        if let Some(per_subject) = positive(self.config.max_msgs_per_subject) {
            let over: Vec<u64> = (self.subjects.values())
                .filter(|seqs| seqs.len() as u64 > per_subject)
                .flat_map(|seqs| seqs.iter().take(seqs.len() - per_subject as usize))
                .copied()
                .collect();
            for seq in over {
                self.remove_msg(seq, &mut removed);
            }
            removed.sort_unstable();
        }
        Ok(removed)
    }

    /// Stores a new message's metadata without a message id; see
    /// [`Self::append_msg`].
    pub fn append(&mut self, subject: &str, size: u64, now_ms: i64) -> Result<Appended, CoreError> {
        self.append_msg(subject, size, None, now_ms)
    }

    /// Stores a new message's metadata and enforces the limits. A message id
    /// still inside the duplicate window stores nothing and answers the
    /// original sequence with `duplicate: true`.
    pub fn append_msg(
        &mut self,
        subject: &str,
        size: u64,
        msg_id: Option<&str>,
        now_ms: i64,
    ) -> Result<Appended, CoreError> {
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
        if msg_id.is_some_and(|id| id.len() > MAX_MSG_ID_BYTES) {
            return Err(CoreError::InvalidRequest(format!(
                "message id is longer than {MAX_MSG_ID_BYTES} bytes"
            )));
        }
        let at_ms = now_ms.max(self.last_published_ms);
        self.prune_dedup(at_ms);
        if let Some(seq) = msg_id.and_then(|id| self.dedup.get(id)) {
            return Ok(Appended {
                seq,
                removed: Vec::new(),
                duplicate: true,
            });
        }
        if self.config.discard == DiscardPolicy::New {
            self.check_room(subject, size, now_ms)?;
        }
        self.last_seq += 1;
        let seq = self.last_seq;
        self.last_published_ms = at_ms;
        self.msgs.insert(
            seq,
            MsgMeta {
                subject: subject.to_string(),
                size,
                published_ms: at_ms,
            },
        );
        match self.subjects.get_mut(subject) {
            Some(seqs) => seqs.push_back(seq),
            None => {
                self.subjects
                    .insert(subject.to_string(), VecDeque::from([seq]));
            }
        }
        self.bytes = self.bytes.saturating_add(size);
        if let Some(id) = msg_id {
            self.dedup.record(id, seq, at_ms);
        }
        let mut removed = Vec::new();
        // Interest retention: with nobody interested the message goes at once.
        if self.config.retention == RetentionPolicy::Interest
            && self.retention_allows_removal(seq, subject)
        {
            self.remove_msg(seq, &mut removed);
        }
        self.enforce_limits(now_ms, Some(subject), &mut removed);
        Ok(Appended {
            seq,
            removed,
            duplicate: false,
        })
    }

    /// Discard-new: would one more message of `size` on `subject` go over a
    /// limit, once what has aged out at `now_ms` is gone? Mutates nothing.
    fn check_room(&self, subject: &str, size: u64, now_ms: i64) -> Result<(), CoreError> {
        let (mut msgs, mut bytes) = (self.msgs.len() as u64, self.bytes);
        let mut aged_on_subject = 0u64;
        if let Some(max_age_ms) = self.max_age_ms() {
            for meta in self.msgs.values() {
                if meta.published_ms.saturating_add(max_age_ms) > now_ms {
                    break;
                }
                msgs -= 1;
                bytes = bytes.saturating_sub(meta.size);
                aged_on_subject += u64::from(meta.subject == subject);
            }
        }
        let full = |limit: &str| CoreError::StreamFull {
            stream: self.config.name.clone(),
            limit: limit.to_string(),
        };
        if positive(self.config.max_msgs).is_some_and(|m| msgs + 1 > m) {
            return Err(full("messages"));
        }
        if positive(self.config.max_bytes).is_some_and(|m| bytes.saturating_add(size) > m) {
            return Err(full("bytes"));
        }
        let on_subject = self.subjects.get(subject).map_or(0, |s| s.len() as u64);
        if positive(self.config.max_msgs_per_subject)
            .is_some_and(|m| on_subject - aged_on_subject + 1 > m)
        {
            return Err(full("messages per subject"));
        }
        Ok(())
    }

    /// Removes messages whose age limit has run out at `now_ms`
    /// (`published_ms + max_age_ms <= now_ms`) and forgets message ids older
    /// than the duplicate window; returns the removed sequences.
    pub fn expire(&mut self, now_ms: i64) -> Vec<u64> {
        self.prune_dedup(now_ms);
        let mut removed = Vec::new();
        self.expire_into(now_ms, &mut removed);
        removed
    }

    /// Would [`Self::expire`] at `now_ms` change anything?
    pub fn has_expired(&self, now_ms: i64) -> bool {
        let window_ms = i64::try_from(self.config.duplicate_window_ms).unwrap_or(i64::MAX);
        let ids = (self.dedup.oldest_ms()).is_some_and(|t| t.saturating_add(window_ms) <= now_ms);
        let msgs = self.max_age_ms().is_some_and(|age| {
            (self.msgs.first_key_value())
                .is_some_and(|(_, m)| m.published_ms.saturating_add(age) <= now_ms)
        });
        ids || msgs
    }

    fn prune_dedup(&mut self, now_ms: i64) {
        self.dedup.prune(now_ms, self.config.duplicate_window_ms);
    }

    fn max_age_ms(&self) -> Option<i64> {
        match self.config.max_age_ms {
            0 => None,
            age => Some(i64::try_from(age).unwrap_or(i64::MAX)),
        }
    }

    fn expire_into(&mut self, now_ms: i64, removed: &mut Vec<u64>) {
        let Some(max_age_ms) = self.max_age_ms() else {
            return;
        };
        // Publish times are non-decreasing in sequence order, so stop at the
        // first message still young enough.
        while let Some((&seq, meta)) = self.msgs.first_key_value() {
            if meta.published_ms.saturating_add(max_age_ms) > now_ms {
                break;
            }
            self.remove_msg(seq, removed);
        }
    }

    /// Age first, then the per-subject limit on `subject` (if given), then
    /// the stream-wide counts; `removed` stays ascending.
    fn enforce_limits(&mut self, now_ms: i64, subject: Option<&str>, removed: &mut Vec<u64>) {
        self.expire_into(now_ms, removed);
        if let (Some(max), Some(subject)) = (positive(self.config.max_msgs_per_subject), subject) {
            while let Some(seqs) = self.subjects.get(subject) {
                if seqs.len() as u64 <= max {
                    break;
                }
                let oldest = seqs[0];
                self.remove_msg(oldest, removed);
            }
        }
        let max_msgs = positive(self.config.max_msgs);
        let max_bytes = positive(self.config.max_bytes);
        while let Some((&seq, _)) = self.msgs.first_key_value() {
            let too_many = max_msgs.is_some_and(|m| self.msgs.len() as u64 > m);
            let too_big = max_bytes.is_some_and(|m| self.bytes > m);
            if !too_many && !too_big {
                break;
            }
            self.remove_msg(seq, removed);
        }
        removed.sort_unstable();
    }

    /// Removes one stored message from every index.
    fn remove_msg(&mut self, seq: u64, removed: &mut Vec<u64>) {
        let Some(meta) = self.msgs.remove(&seq) else {
            return;
        };
        self.bytes = self.bytes.saturating_sub(meta.size);
        if let Some(seqs) = self.subjects.get_mut(&meta.subject) {
            if seqs.front() == Some(&seq) {
                seqs.pop_front();
            } else if let Ok(i) = seqs.binary_search(&seq) {
                seqs.remove(i);
            }
            if seqs.is_empty() {
                self.subjects.remove(&meta.subject);
            }
        }
        removed.push(seq);
    }

    /// Deletes the message with sequence `seq` (`nats stream rmm`).
    pub fn delete(&mut self, seq: u64) -> Result<(), CoreError> {
        if !self.msgs.contains_key(&seq) {
            return Err(CoreError::NoMessage {
                stream: self.config.name.clone(),
                seq,
            });
        }
        self.remove_msg(seq, &mut Vec::new());
        Ok(())
    }

    /// Removes the messages `purge` selects; returns their sequences
    /// (ascending).
    pub fn purge(&mut self, purge: &Purge) -> Result<Vec<u64>, CoreError> {
        if purge.keep.is_some() && purge.below_seq.is_some() {
            return Err(CoreError::InvalidRequest(
                "a purge takes keep or seq, not both".into(),
            ));
        }
        if let Some(f) = &purge.filter {
            validate_filter(f)?;
        }
        let below = purge.below_seq.unwrap_or(u64::MAX);
        let mut candidates: Vec<u64> = match purge.filter.as_deref() {
            None | Some(">") => self.msgs.range(..below).map(|(&s, _)| s).collect(),
            Some(f) => {
                let mut seqs: Vec<u64> = (self.subjects.iter())
                    .filter(|(subject, _)| subject_matches(f, subject))
                    .flat_map(|(_, seqs)| seqs.iter().copied().filter(|&s| s < below))
                    .collect();
                seqs.sort_unstable();
                seqs
            }
        };
        if let Some(keep) = purge.keep {
            let keep = usize::try_from(keep).unwrap_or(usize::MAX);
            candidates.truncate(candidates.len().saturating_sub(keep));
        }
        let mut removed = Vec::with_capacity(candidates.len());
        for seq in candidates {
            self.remove_msg(seq, &mut removed);
        }
        Ok(removed)
    }

    /// Message count, bytes, sequence range and subject count.
    pub fn stats(&self) -> StreamStats {
        StreamStats {
            messages: self.msgs.len() as u64,
            bytes: self.bytes,
            first_seq: self
                .msgs
                .first_key_value()
                .map_or(self.last_seq.saturating_add(1), |(&seq, _)| seq),
            last_seq: self.last_seq,
            num_subjects: self.subjects.len() as u64,
        }
    }

    /// Subjects of stored messages matching `filter` (all with `None`), with
    /// their message counts, in subject order, at most `limit` of them.
    pub fn subject_counts(&self, filter: Option<&str>, limit: usize) -> Vec<(String, u64)> {
        (self.subjects.iter())
            .filter(|(s, _)| filter.is_none_or(|f| subject_matches(f, s)))
            .take(limit)
            .map(|(s, seqs)| (s.clone(), seqs.len() as u64))
            .collect()
    }

    /// How many message ids the duplicate window remembers.
    pub fn num_msg_ids(&self) -> usize {
        self.dedup.len()
    }

    /// The stored message with sequence `seq`, if the stream still holds it.
    pub fn get(&self, seq: u64) -> Option<&MsgMeta> {
        self.msgs.get(&seq)
    }

    /// The last sequence assigned (0 if none): a `seq` above it is not
    /// stored *yet* as far as this copy of the stream knows (a replica that
    /// trails its leader), which is not the same as removed.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
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

#[cfg(test)]
#[path = "stream_limits_tests.rs"]
mod limits_tests;
