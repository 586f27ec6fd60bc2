//! Work-queue and interest retention: which stored messages every interested
//! consumer is done with.
//!
//! A stream with [`RetentionPolicy::WorkQueue`] or
//! [`RetentionPolicy::Interest`] keeps, next to its index, the consumers that
//! hold an interest in it (name, catalog id, filters) and, for each, the
//! latest [`ConsumerProgress`] the consumer group reported. A consumer is
//! *done* with a sequence when it has started, the sequence is at or below its
//! position, and the sequence is neither pending (delivered, unacked; or
//! waiting for its dead-letter copy) nor in its start backlog. Being done is
//! monotone in a consumer's committed history: a message that left `pending`
//! never returns, the position never goes back, the backlog only shrinks. So
//! a report taken from any replica of the consumer group, however far it
//! lags, only ever names messages that really are done; a stale report can
//! delay a removal, never cause a wrong one.
//!
//! A stored message is removed when:
//! - work queue: at least one consumer matches it and every matching
//!   consumer (at most one, since their filters may not overlap) is done;
//! - interest: every matching consumer is done; with none, at once (also at
//!   publish time).
//!
//! Invariants: the limits keep working as before on top; a consumer that is
//! unregistered (deleted) no longer holds anything back, so its
//! unregistration re-checks the messages it matched; a consumer re-created
//! under the same name (a new catalog id) starts with no progress.
//!
//! Left out: a consumer whose deliver policy skips messages below its start
//! without a position (last per subject) keeps the skipped older messages of
//! an interest stream until the limits remove them.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use serde::{Deserialize, Serialize};

use super::StreamState;
use crate::stream_config::RetentionPolicy;
use crate::subject::subject_matches;

/// What one consumer has finished with, as of some committed state of its
/// group (see [`crate::consumer::ConsumerState::progress`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerProgress {
    /// The start position is resolved.
    pub started: bool,
    /// Every stream seq at or below this was delivered or skipped.
    pub position: u64,
    /// Delivered and not settled, or waiting for a dead-letter copy.
    pub pending: BTreeSet<u64>,
    /// Below the position but still to be delivered a first time.
    pub backlog: BTreeSet<u64>,
}

impl ConsumerProgress {
    /// Is the consumer finished with `seq`?
    pub fn is_done(&self, seq: u64) -> bool {
        self.started
            && seq <= self.position
            && !self.pending.contains(&seq)
            && !self.backlog.contains(&seq)
    }
}

/// A consumer with an interest in a stream, as the stream knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterestedConsumer {
    /// The catalog's id of this consumer (a re-created one gets a new id).
    pub id: u64,
    /// Its filters; empty means every subject.
    pub filters: Vec<String>,
    /// The latest progress reported.
    pub progress: ConsumerProgress,
}

impl InterestedConsumer {
    fn matches(&self, subject: &str) -> bool {
        self.filters.is_empty() || self.filters.iter().any(|f| subject_matches(f, subject))
    }
}

/// A consumer to register: (name, catalog id, filters).
pub type ConsumerInterest = (String, u64, Vec<String>);

impl StreamState {
    /// The consumers registered for retention, by name.
    pub fn interested(&self) -> &BTreeMap<String, InterestedConsumer> {
        &self.interest
    }

    /// Makes the registered consumers exactly `consumers`; returns the
    /// sequences that no longer have anyone to wait for (ascending).
    pub fn set_consumers(&mut self, consumers: Vec<ConsumerInterest>) -> Vec<u64> {
        let wanted: BTreeMap<String, (u64, Vec<String>)> = consumers
            .into_iter()
            .map(|(name, id, filters)| (name, (id, filters)))
            .collect();
        let mut dropped = Vec::new();
        self.interest.retain(|name, c| {
            let keep = wanted
                .get(name)
                .is_some_and(|(id, f)| *id == c.id && *f == c.filters);
            if !keep {
                dropped.push(c.clone());
            }
            keep
        });
        for (name, (id, filters)) in wanted {
            self.interest
                .entry(name)
                .or_insert_with(|| InterestedConsumer {
                    id,
                    filters,
                    progress: ConsumerProgress::default(),
                });
        }
        if dropped.is_empty() {
            return Vec::new();
        }
        let candidates: Vec<u64> = (self.msgs.iter())
            .filter(|(_, m)| dropped.iter().any(|c| c.matches(&m.subject)))
            .map(|(&seq, _)| seq)
            .collect();
        self.remove_finished(candidates)
    }

    /// Records a consumer's progress; returns the sequences it finished that
    /// no other consumer holds back any more (ascending). Progress of an
    /// unregistered consumer, or of an older incarnation (`id`), is ignored.
    pub fn record_progress(&mut self, name: &str, id: u64, progress: ConsumerProgress) -> Vec<u64> {
        let Some(consumer) = self.interest.get_mut(name).filter(|c| c.id == id) else {
            return Vec::new();
        };
        let old = std::mem::replace(&mut consumer.progress, progress);
        let new = &consumer.progress;
        let from = if old.started { old.position } else { 0 };
        let mut candidates: Vec<u64> = if new.started && new.position > from {
            (self
                .msgs
                .range((Bound::Excluded(from), Bound::Included(new.position))))
            .map(|(&seq, _)| seq)
            .collect()
        } else {
            Vec::new()
        };
        candidates.extend(old.pending.difference(&new.pending));
        candidates.extend(old.backlog.difference(&new.backlog));
        candidates.sort_unstable();
        candidates.dedup();
        self.remove_finished(candidates)
    }

    /// Is the stored message `seq` (with `subject`) finished by everyone the
    /// retention policy waits for?
    pub(super) fn retention_allows_removal(&self, seq: u64, subject: &str) -> bool {
        let mut matching = (self.interest.values()).filter(|c| c.matches(subject));
        match self.config.retention {
            RetentionPolicy::Limits => false,
            RetentionPolicy::WorkQueue => {
                let mut any = false;
                let all = matching.all(|c| {
                    any = true;
                    c.progress.is_done(seq)
                });
                any && all
            }
            RetentionPolicy::Interest => matching.all(|c| c.progress.is_done(seq)),
        }
    }

    fn remove_finished(&mut self, candidates: Vec<u64>) -> Vec<u64> {
        let mut removed = Vec::new();
        for seq in candidates {
            let finished = (self.msgs.get(&seq))
                .is_some_and(|m| self.retention_allows_removal(seq, &m.subject));
            if finished {
                self.remove_msg(seq, &mut removed);
            }
        }
        removed
    }
}
