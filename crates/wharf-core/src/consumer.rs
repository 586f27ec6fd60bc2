//! Replicated consumer state: one shared position for all workers.
//!
//! A [`ConsumerState`] records what a pull consumer has delivered and what is
//! still waiting for an ack. All workers pulling from the consumer share it,
//! so each message goes to one worker at a time. The leader decides *which*
//! messages to deliver (see [`crate::dispatch`]) and proposes them through
//! Raft; [`ConsumerState::apply_deliver`] and [`ConsumerState::apply_ack`]
//! are the state machine's commands.
//!
//! Invariants:
//! - `delivered.stream_seq` is the highest stream sequence ever delivered,
//!   `delivered.consumer_seq` the number of deliveries made (first deliveries
//!   and redeliveries alike); both only grow;
//! - every pending message has exactly one entry in `pending` (by stream seq)
//!   and one in `by_consumer_seq` (its latest delivery), and the latter's
//!   order is the redelivery order: oldest delivery first;
//! - delivery times are clamped to be non-decreasing, so the oldest delivery
//!   is also the first whose AckWait runs out (a new leader's clock may be
//!   behind the old one's);
//! - the ack floor never moves backwards.
//!
//! Deliberately left out: push consumers, nak/term/in-progress acks, backoff
//! schedules, max_deliver and deliver policies other than "all".

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::subject::{validate_filter, validate_name};

/// AckWait when the user does not set one: 30 s.
pub const DEFAULT_ACK_WAIT_MS: u64 = 30_000;
/// MaxAckPending when the user does not set one.
pub const DEFAULT_MAX_ACK_PENDING: i64 = 1000;
/// MaxWaiting (pull requests waiting at once) when the user does not set one.
pub const DEFAULT_MAX_WAITING: i64 = 512;

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
        if self.filter_subject.as_deref() == Some("") {
            self.filter_subject = None;
        }
        self
    }

    /// Checks the configuration (call after [`Self::with_defaults`]).
    pub fn validate(&self) -> Result<(), CoreError> {
        validate_name("consumer", &self.name)?;
        if let Some(filter) = &self.filter_subject {
            validate_filter(filter)?;
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
        if new.filter_subject != self.filter_subject {
            return Err(CoreError::update(
                "consumer",
                &self.name,
                "filter subject cannot be changed",
            ));
        }
        new.validate()
    }
}

/// A position: consumer sequence and stream sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SeqPair {
    /// Deliveries counted by the consumer.
    pub consumer_seq: u64,
    /// Message sequence in the stream.
    pub stream_seq: u64,
}

/// A delivered message waiting for its ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Consumer sequence of its latest delivery.
    pub consumer_seq: u64,
    /// How many times it has been delivered.
    pub deliveries: u64,
    /// When it was last delivered.
    pub delivered_ms: i64,
}

/// One delivery recorded by [`ConsumerState::apply_deliver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// Which message.
    pub stream_seq: u64,
    /// The consumer sequence this delivery took.
    pub consumer_seq: u64,
    /// 1 for a first delivery, more for redeliveries.
    pub deliveries: u64,
}

/// Replicated state of one pull consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerState {
    config: ConsumerConfig,
    delivered: SeqPair,
    /// Pending messages by stream seq.
    pending: BTreeMap<u64, Pending>,
    /// consumer seq of the latest delivery -> stream seq; the redelivery queue.
    by_consumer_seq: BTreeMap<u64, u64>,
    redelivered: u64,
    /// Latest delivery time recorded; delivery times never go below it.
    last_delivered_ms: i64,
}

impl ConsumerState {
    /// A consumer that has delivered nothing. The caller has validated `config`.
    pub fn new(config: ConsumerConfig) -> Self {
        ConsumerState {
            config,
            delivered: SeqPair::default(),
            pending: BTreeMap::new(),
            by_consumer_seq: BTreeMap::new(),
            redelivered: 0,
            last_delivered_ms: i64::MIN,
        }
    }

    /// The current configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Replaces the configuration (see [`ConsumerConfig::check_update`]).
    /// A new ack_wait_ms applies to pending messages too.
    pub fn update_config(&mut self, config: ConsumerConfig) -> Result<(), CoreError> {
        self.config.check_update(&config)?;
        self.config = config;
        Ok(())
    }

    /// Records deliveries the leader chose at `now_ms`, in order. A stream
    /// seq above `delivered.stream_seq` is a first delivery; one already
    /// pending is a redelivery (new consumer seq, deliveries + 1); anything
    /// else (acked meanwhile, or not pending and not new) is skipped. `gone`
    /// lists stream seqs the stream no longer holds: they leave `pending`
    /// as if acked. Returns the deliveries actually made.
    pub fn apply_deliver(
        &mut self,
        stream_seqs: &[u64],
        gone: &[u64],
        now_ms: i64,
    ) -> Vec<Delivery> {
        for seq in gone {
            self.remove_pending(*seq);
        }
        self.last_delivered_ms = self.last_delivered_ms.max(now_ms);
        let delivered_ms = self.last_delivered_ms;
        let mut out = Vec::with_capacity(stream_seqs.len());
        for &seq in stream_seqs {
            let deliveries = if seq > self.delivered.stream_seq {
                1
            } else if let Some(p) = self.pending.get(&seq) {
                self.by_consumer_seq.remove(&p.consumer_seq);
                p.deliveries.saturating_add(1)
            } else {
                continue;
            };
            let consumer_seq = self.delivered.consumer_seq + 1;
            self.delivered.consumer_seq = consumer_seq;
            if deliveries == 1 {
                self.delivered.stream_seq = seq;
            } else if deliveries == 2 {
                self.redelivered += 1;
            }
            self.pending.insert(
                seq,
                Pending {
                    consumer_seq,
                    deliveries,
                    delivered_ms,
                },
            );
            self.by_consumer_seq.insert(consumer_seq, seq);
            out.push(Delivery {
                stream_seq: seq,
                consumer_seq,
                deliveries,
            });
        }
        out
    }

    /// Acks by stream seq; returns how many of them were pending.
    pub fn apply_ack(&mut self, stream_seqs: &[u64]) -> usize {
        stream_seqs
            .iter()
            .filter(|&&seq| self.remove_pending(seq))
            .count()
    }

    fn remove_pending(&mut self, seq: u64) -> bool {
        match self.pending.remove(&seq) {
            Some(p) => {
                self.by_consumer_seq.remove(&p.consumer_seq);
                true
            }
            None => false,
        }
    }

    /// Last delivery made: its consumer seq, and the highest stream seq
    /// delivered.
    pub fn delivered(&self) -> SeqPair {
        self.delivered
    }

    /// Highest point below which everything delivered is acked: `delivered`
    /// when nothing is pending, otherwise one below the lowest pending stream
    /// seq and one below the lowest pending consumer seq. Never moves
    /// backwards: new deliveries take seqs above every pending one.
    pub fn ack_floor(&self) -> SeqPair {
        match (
            self.pending.first_key_value(),
            self.by_consumer_seq.first_key_value(),
        ) {
            (Some((&stream_seq, _)), Some((&consumer_seq, _))) => SeqPair {
                consumer_seq: consumer_seq.saturating_sub(1),
                stream_seq: stream_seq.saturating_sub(1),
            },
            _ => self.delivered,
        }
    }

    /// Messages delivered and not yet acked.
    pub fn num_ack_pending(&self) -> u64 {
        self.pending.len() as u64
    }

    /// Distinct messages ever delivered more than once (cumulative).
    pub fn num_redelivered(&self) -> u64 {
        self.redelivered
    }

    /// The pending entry for `stream_seq`, if unacked.
    pub fn pending(&self, stream_seq: u64) -> Option<&Pending> {
        self.pending.get(&stream_seq)
    }

    /// All pending messages by ascending stream seq.
    pub fn pending_iter(&self) -> impl Iterator<Item = (u64, &Pending)> {
        self.pending.iter().map(|(&seq, p)| (seq, p))
    }

    /// Stream seqs whose AckWait has run out at `now_ms`, oldest delivery
    /// first, lazily. [`Self::due_for_redelivery`] collects it.
    pub fn due_iter(&self, now_ms: i64) -> impl Iterator<Item = u64> + '_ {
        let ack_wait_ms = self.ack_wait_ms_i64();
        self.by_consumer_seq.values().map_while(move |&seq| {
            let p = self.pending.get(&seq)?;
            (p.delivered_ms.saturating_add(ack_wait_ms) <= now_ms).then_some(seq)
        })
    }

    /// Stream seqs whose AckWait has run out at `now_ms`
    /// (`delivered_ms + ack_wait_ms <= now_ms`), oldest delivery first, at
    /// most `limit`.
    pub fn due_for_redelivery(&self, now_ms: i64, limit: usize) -> Vec<u64> {
        self.due_iter(now_ms).take(limit).collect()
    }

    /// When the next pending message's AckWait runs out (`None` if nothing
    /// is pending).
    pub fn next_redelivery_ms(&self) -> Option<i64> {
        let (_, seq) = self.by_consumer_seq.first_key_value()?;
        let p = self.pending.get(seq)?;
        Some(p.delivered_ms.saturating_add(self.ack_wait_ms_i64()))
    }

    /// Free slots under MaxAckPending given `inflight_new` first deliveries
    /// proposed but not yet applied; `usize::MAX` when unlimited.
    pub fn ack_pending_room(&self, inflight_new: usize) -> usize {
        match usize::try_from(self.config.max_ack_pending) {
            Ok(max) if max > 0 => max
                .saturating_sub(self.pending.len())
                .saturating_sub(inflight_new),
            _ => usize::MAX,
        }
    }

    fn ack_wait_ms_i64(&self) -> i64 {
        i64::try_from(self.config.ack_wait_ms).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
#[path = "consumer_tests.rs"]
mod tests;
