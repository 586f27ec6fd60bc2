//! The dead-letter outbox of a consumer, and what the consumer reports to
//! its stream for retention.
//!
//! A consumer with a `dead_letter_subject` puts every message that a worker
//! terms, or that reaches MaxDeliver, into its replicated outbox with the
//! delivery count and the reason. The leader publishes each outbox entry to
//! the dead-letter subject (with a message id derived from stream, consumer
//! and sequence, so a retry inside the duplicate window is stored once) and
//! then commits [`ConsumerState::apply_dead_lettered`], which empties the
//! entry and counts it. A message in the outbox is not finished for
//! retention ([`ConsumerState::progress`] lists it as pending), so a
//! work-queue stream keeps it until its copy is out.
//!
//! Invariants: the outbox only holds messages that left `pending` by a term
//! or MaxDeliver while a dead-letter subject was set; an entry leaves the
//! outbox only through `apply_dead_lettered`, and is counted then, once.
//!
//! Left out: dead-lettering of messages the stream removed before their copy
//! was published (limits retention); the leader then drops the entry as
//! gone and does not count it.

use serde::{Deserialize, Serialize};

use super::ConsumerState;
use crate::stream::ConsumerProgress;

/// Why a message was dead-lettered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeadLetterReason {
    /// A worker termed it, with this reason (may be empty).
    Term(String),
    /// It reached MaxDeliver deliveries without an ack.
    MaxDeliver,
}

impl DeadLetterReason {
    /// `"term: <reason>"`, `"term"` or `"max_deliver"`.
    pub fn describe(&self) -> String {
        match self {
            DeadLetterReason::Term(r) if r.is_empty() => "term".to_string(),
            DeadLetterReason::Term(r) => format!("term: {r}"),
            DeadLetterReason::MaxDeliver => "max_deliver".to_string(),
        }
    }
}

/// A message waiting for its dead-letter copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// How many times it was delivered.
    pub deliveries: u64,
    /// Why it is dead-lettered.
    pub reason: DeadLetterReason,
}

impl ConsumerState {
    pub(super) fn queue_dead_letter(
        &mut self,
        seq: u64,
        deliveries: u64,
        reason: DeadLetterReason,
    ) {
        if self.config.dead_letter_subject.is_some() {
            self.dead_letter_outbox
                .insert(seq, DeadLetter { deliveries, reason });
        }
    }

    /// Messages waiting for their dead-letter copy, by stream seq.
    pub fn dead_letter_outbox(&self) -> impl Iterator<Item = (u64, &DeadLetter)> {
        self.dead_letter_outbox.iter().map(|(s, d)| (*s, d))
    }

    /// How many messages wait for their dead-letter copy.
    pub fn dead_letter_backlog(&self) -> u64 {
        self.dead_letter_outbox.len() as u64
    }

    /// The copies of `published` are out (counted), and `dropped` will never
    /// be (their message is gone; not counted). Returns how many were counted.
    pub fn apply_dead_lettered(&mut self, published: &[u64], dropped: &[u64]) -> u64 {
        let counted = (published.iter())
            .filter(|s| self.dead_letter_outbox.remove(s).is_some())
            .count() as u64;
        for seq in dropped {
            self.dead_letter_outbox.remove(seq);
        }
        self.dead_lettered += counted;
        counted
    }

    /// Dead-letter copies published (cumulative).
    pub fn num_dead_lettered(&self) -> u64 {
        self.dead_lettered
    }

    /// What this consumer is finished with, for its stream's retention.
    pub fn progress(&self) -> ConsumerProgress {
        let mut pending: std::collections::BTreeSet<u64> =
            self.pending.iter().map(|(seq, _)| seq).collect();
        pending.extend(self.dead_letter_outbox.keys().copied());
        ConsumerProgress {
            started: self.started,
            position: self.delivered.stream_seq,
            pending,
            backlog: self.backlog.clone(),
        }
    }
}
