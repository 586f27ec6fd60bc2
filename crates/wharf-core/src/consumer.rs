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
//! - every pending message has exactly one entry in `pending` (by stream seq),
//!   one in `by_consumer_seq` (its latest delivery; gives the ack
//!   floor) and one in `schedule` (when it may be redelivered: AckWait or the
//!   BackOff step after its delivery, pushed back by in-progress, set by a
//!   nak). All three keep a first delivery in a deque that reuses its
//!   memory, so first deliveries do not allocate per message
//!   (`sorted_deque`; `pending_set` and `redelivery_schedule` say what
//!   goes to the B-tree beside theirs); each serializes as the B-tree it
//!   replaced;
//! - delivery times are clamped to be non-decreasing (a new leader's clock
//!   may be behind the old one's);
//! - the ack floor never moves backwards;
//! - a message leaves `pending` exactly once: acked, termed, exhausted
//!   (MaxDeliver reached) or gone from the stream;
//! - a consumer whose deliver policy needs the stream's contents (new, last,
//!   last per subject, by start sequence or time) delivers nothing until its
//!   leader has resolved the start against its stream replica and
//!   [`ConsumerState::apply_start`] recorded it (once).
//!
//! Deliberately left out: push consumers.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::stream::StreamState;
use consumer_seq_index::ConsumerSeqIndex;
use pending_set::PendingSet;
use redelivery_schedule::RedeliverySchedule;

#[path = "consumer_config.rs"]
mod consumer_config;
pub use consumer_config::*;

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
    /// When it may be redelivered.
    pub redeliver_at_ms: i64,
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

/// Where a consumer with `config` starts in `stream`: the sequence it
/// continues after, and the sequences at or below it to deliver first.
/// Called by the leader; the answer is replicated with
/// [`ConsumerState::apply_start`].
pub fn start_position(config: &ConsumerConfig, stream: &StreamState) -> (u64, Vec<u64>) {
    let last_seq = stream.stats().last_seq;
    let matching = || {
        let mut after = 0;
        std::iter::from_fn(move || {
            let seq = config.next_matching(stream, after)?;
            after = seq;
            Some(seq)
        })
    };
    match config.deliver_policy {
        DeliverPolicy::All => (0, Vec::new()),
        DeliverPolicy::New => (last_seq, Vec::new()),
        DeliverPolicy::Last => match matching().last() {
            Some(seq) => (seq - 1, Vec::new()),
            None => (last_seq, Vec::new()),
        },
        DeliverPolicy::LastPerSubject => {
            let mut last: BTreeMap<&str, u64> = BTreeMap::new();
            for seq in matching() {
                if let Some(meta) = stream.get(seq) {
                    last.insert(meta.subject.as_str(), seq);
                }
            }
            let mut backlog: Vec<u64> = last.into_values().collect();
            backlog.sort_unstable();
            (last_seq, backlog)
        }
        DeliverPolicy::ByStartSeq(seq) => (seq.saturating_sub(1), Vec::new()),
        DeliverPolicy::ByStartTime(t) => {
            let first = matching().find(|s| stream.get(*s).is_some_and(|m| m.published_ms >= t));
            match first {
                Some(seq) => (seq - 1, Vec::new()),
                None => (last_seq, Vec::new()),
            }
        }
    }
}

/// Replicated state of one pull consumer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerState {
    config: ConsumerConfig,
    delivered: SeqPair,
    /// Pending messages by stream seq.
    pending: PendingSet,
    /// (consumer seq of the latest delivery, stream seq), ascending; its
    /// front gives the ack floor.
    by_consumer_seq: ConsumerSeqIndex,
    /// (redeliver_at_ms, stream seq): the redelivery schedule.
    schedule: RedeliverySchedule,
    redelivered: u64,
    /// Messages termed by a worker (cumulative).
    terminated: u64,
    /// Messages given up on after MaxDeliver deliveries (cumulative).
    exhausted: u64,
    /// Whether the start position is known (see [`DeliverPolicy`]).
    started: bool,
    /// Messages below the position still to be delivered a first time (the
    /// last-per-subject start).
    backlog: BTreeSet<u64>,
    /// Latest delivery time recorded; delivery times never go below it.
    last_delivered_ms: i64,
    /// Termed or exhausted messages whose dead-letter copy is not yet
    /// published, by stream seq.
    dead_letter_outbox: BTreeMap<u64, DeadLetter>,
    /// Dead-letter copies published (cumulative).
    dead_lettered: u64,
}

impl ConsumerState {
    /// A consumer that has delivered nothing. The caller has validated `config`.
    pub fn new(config: ConsumerConfig) -> Self {
        ConsumerState {
            started: config.deliver_policy == DeliverPolicy::All,
            config,
            delivered: SeqPair::default(),
            pending: PendingSet::default(),
            by_consumer_seq: ConsumerSeqIndex::default(),
            schedule: RedeliverySchedule::default(),
            redelivered: 0,
            terminated: 0,
            exhausted: 0,
            backlog: BTreeSet::new(),
            last_delivered_ms: i64::MIN,
            dead_letter_outbox: BTreeMap::new(),
            dead_lettered: 0,
        }
    }

    /// The current configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// Replaces the configuration (see [`ConsumerConfig::check_update`]).
    /// A new AckWait or BackOff applies to pending messages too: their
    /// redelivery times are recomputed from their last delivery (a nak's
    /// delay is then forgotten).
    pub fn update_config(&mut self, config: ConsumerConfig) -> Result<(), CoreError> {
        self.config.check_update(&config)?;
        let retime = config.ack_wait_ms != self.config.ack_wait_ms
            || config.backoff_ms != self.config.backoff_ms;
        self.config = config;
        if retime {
            let seqs: Vec<u64> = self.pending.iter().map(|(seq, _)| seq).collect();
            for seq in seqs {
                if let Some(p) = self.pending.get(seq).copied() {
                    let at = p.delivered_ms.saturating_add(self.wait_ms(p.deliveries));
                    self.reschedule(seq, at);
                }
            }
        }
        Ok(())
    }

    /// How long delivery number `deliveries` may stay unacked: the BackOff
    /// step for it (the last step repeats) or AckWait.
    fn wait_ms(&self, deliveries: u64) -> i64 {
        let backoff = &self.config.backoff_ms;
        let ms = if backoff.is_empty() {
            self.config.ack_wait_ms
        } else {
            let i = usize::try_from(deliveries.saturating_sub(1)).unwrap_or(usize::MAX);
            backoff[i.min(backoff.len() - 1)]
        };
        i64::try_from(ms).unwrap_or(i64::MAX)
    }

    fn reschedule(&mut self, seq: u64, at_ms: i64) {
        if let Some(p) = self.pending.get_mut(seq) {
            self.schedule.remove(p.redeliver_at_ms, seq);
            p.redeliver_at_ms = at_ms;
            self.schedule.insert(at_ms, seq);
        }
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
        self.apply_deliver_after(stream_seqs, gone, now_ms, None)
    }

    /// [`Self::apply_deliver`] for a plan made while earlier plans were in
    /// flight: `first_after` is the position (`delivered.stream_seq`) its
    /// first deliveries were planned to follow. If the consumer is not there
    /// when the entry applies (an earlier plan failed, or applied out of
    /// order), its first deliveries are skipped, so the position never jumps
    /// over a message nobody was given; they are planned again. Redeliveries
    /// and `gone` apply either way.
    pub fn apply_deliver_after(
        &mut self,
        stream_seqs: &[u64],
        gone: &[u64],
        now_ms: i64,
        first_after: Option<u64>,
    ) -> Vec<Delivery> {
        let stale_firsts = first_after.is_some_and(|after| after != self.delivered.stream_seq);
        for seq in gone {
            self.remove_pending(*seq);
            self.backlog.remove(seq);
        }
        self.last_delivered_ms = self.last_delivered_ms.max(now_ms);
        let delivered_ms = self.last_delivered_ms;
        let mut out = Vec::with_capacity(stream_seqs.len());
        for &seq in stream_seqs {
            let previous = self.pending.get(seq).copied();
            let deliveries = if seq > self.delivered.stream_seq {
                if stale_firsts {
                    continue;
                }
                1
            } else if self.backlog.remove(&seq) {
                1
            } else if let Some(p) = previous {
                p.deliveries.saturating_add(1)
            } else {
                continue;
            };
            // A redelivery replaces the message's entries. (So does a first
            // delivery of a pending seq, which only a log the leader never
            // writes has: a delivery applied before the start.)
            if let Some(p) = previous {
                self.by_consumer_seq.remove(p.consumer_seq);
                self.schedule.remove(p.redeliver_at_ms, seq);
            }
            let consumer_seq = self.delivered.consumer_seq.saturating_add(1);
            self.delivered.consumer_seq = consumer_seq;
            if deliveries == 1 {
                self.delivered.stream_seq = self.delivered.stream_seq.max(seq);
            } else if deliveries == 2 {
                self.redelivered += 1;
            }
            if self.config.ack_policy != AckPolicy::None {
                let redeliver_at_ms = delivered_ms.saturating_add(self.wait_ms(deliveries));
                self.pending.insert(
                    seq,
                    Pending {
                        consumer_seq,
                        deliveries,
                        delivered_ms,
                        redeliver_at_ms,
                    },
                );
                self.by_consumer_seq.push(consumer_seq, seq);
                if deliveries == 1 {
                    self.schedule.insert_first_delivery(redeliver_at_ms, seq);
                } else {
                    self.schedule.insert(redeliver_at_ms, seq);
                }
            }
            out.push(Delivery {
                stream_seq: seq,
                consumer_seq,
                deliveries,
            });
        }
        out
    }

    /// Acks by stream seq; returns how many pending messages they settled.
    /// Under [`AckPolicy::All`] an ack of N settles every pending seq <= N.
    pub fn apply_ack(&mut self, stream_seqs: &[u64]) -> usize {
        if self.config.ack_policy == AckPolicy::All {
            let Some(&top) = stream_seqs.iter().max() else {
                return 0;
            };
            let below: Vec<u64> = (self.pending.iter())
                .map(|(s, _)| s)
                .take_while(|&s| s <= top)
                .collect();
            return below
                .into_iter()
                .filter(|&seq| self.remove_pending(seq))
                .count();
        }
        stream_seqs
            .iter()
            .filter(|&&seq| self.remove_pending(seq))
            .count()
    }

    /// A negative ack: the message may be redelivered after `delay_ms`
    /// (0: at once). Returns whether it was pending.
    pub fn apply_nak(&mut self, stream_seq: u64, delay_ms: u64, now_ms: i64) -> bool {
        let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
        let at = now_ms.max(self.last_delivered_ms).saturating_add(delay);
        let pending = self.pending.contains(stream_seq);
        self.reschedule(stream_seq, at);
        pending
    }

    /// Work in progress: the message's AckWait (or BackOff step) starts
    /// again from `now_ms`. Returns whether it was pending.
    pub fn apply_in_progress(&mut self, stream_seq: u64, now_ms: i64) -> bool {
        let Some(p) = self.pending.get(stream_seq).copied() else {
            return false;
        };
        let at = now_ms
            .max(self.last_delivered_ms)
            .saturating_add(self.wait_ms(p.deliveries));
        self.reschedule(stream_seq, at);
        true
    }

    /// Terminate: the message is never redelivered; with a dead-letter
    /// subject it goes to the outbox with `reason`. Returns whether it was
    /// pending.
    pub fn apply_term(&mut self, stream_seq: u64, reason: &str) -> bool {
        let deliveries = self.pending.get(stream_seq).map(|p| p.deliveries);
        let removed = self.remove_pending(stream_seq);
        if let Some(deliveries) = deliveries.filter(|_| removed) {
            self.terminated += 1;
            self.queue_dead_letter(
                stream_seq,
                deliveries,
                DeadLetterReason::Term(reason.into()),
            );
        }
        removed
    }

    /// Give up on messages that reached MaxDeliver (see
    /// [`ConsumerState::exhausted`]); returns those that were pending.
    pub fn apply_exhausted(&mut self, stream_seqs: &[u64]) -> Vec<u64> {
        let mut out = Vec::new();
        for &seq in stream_seqs {
            let deliveries = self.pending.get(seq).map(|p| p.deliveries);
            if let Some(deliveries) = deliveries.filter(|_| self.remove_pending(seq)) {
                self.queue_dead_letter(seq, deliveries, DeadLetterReason::MaxDeliver);
                out.push(seq);
            }
        }
        self.exhausted += out.len() as u64;
        out
    }

    /// Whether a pending message has had all the deliveries MaxDeliver allows.
    pub fn exhausted(&self, stream_seq: u64) -> bool {
        match (
            self.pending.get(stream_seq),
            u64::try_from(self.config.max_deliver),
        ) {
            (Some(p), Ok(max)) => p.deliveries >= max,
            _ => false,
        }
    }

    fn remove_pending(&mut self, seq: u64) -> bool {
        match self.pending.remove(seq) {
            Some(p) => {
                self.by_consumer_seq.remove(p.consumer_seq);
                self.schedule.remove(p.redeliver_at_ms, seq);
                true
            }
            None => false,
        }
    }

    /// Whether the leader still has to resolve where the consumer starts.
    pub fn needs_start(&self) -> bool {
        !self.started
    }

    /// Record the resolved start (once; later calls are ignored): deliveries
    /// continue after `after_seq`, and `backlog` (sequences at or below it)
    /// is delivered first. Returns whether it took effect.
    pub fn apply_start(&mut self, after_seq: u64, backlog: Vec<u64>) -> bool {
        if self.started {
            return false;
        }
        self.started = true;
        self.delivered.stream_seq = after_seq;
        self.backlog = backlog.into_iter().filter(|s| *s <= after_seq).collect();
        true
    }

    /// Messages below the position waiting for their first delivery, ascending.
    pub fn backlog_iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.backlog.iter().copied()
    }

    /// How many messages wait in the backlog.
    pub fn backlog_len(&self) -> u64 {
        self.backlog.len() as u64
    }

    /// Messages of `stream` not yet delivered a first time (NATS'
    /// `num_pending`): those after the position that match the filters, plus
    /// the start backlog.
    pub fn num_pending(&self, stream: &StreamState) -> u64 {
        self.config
            .count_matching_after(stream, self.delivered.stream_seq)
            + self.backlog_len()
    }

    /// Whether deliveries are paused at `now_ms`.
    pub fn is_paused(&self, now_ms: i64) -> bool {
        self.config.pause_until_ms > now_ms
    }

    /// Messages termed by workers (cumulative).
    pub fn num_terminated(&self) -> u64 {
        self.terminated
    }

    /// Messages given up on after MaxDeliver deliveries (cumulative).
    pub fn num_exhausted(&self) -> u64 {
        self.exhausted
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
        let floor = match (self.pending.first_seq(), self.by_consumer_seq.first()) {
            (Some(stream_seq), Some(consumer_seq)) => SeqPair {
                consumer_seq: consumer_seq.saturating_sub(1),
                stream_seq: stream_seq.saturating_sub(1),
            },
            _ => self.delivered,
        };
        match self.backlog.first() {
            Some(&first) if first <= floor.stream_seq => SeqPair {
                consumer_seq: floor.consumer_seq,
                stream_seq: first - 1,
            },
            _ => floor,
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
        self.pending.get(stream_seq)
    }

    /// All pending messages by ascending stream seq.
    pub fn pending_iter(&self) -> impl Iterator<Item = (u64, &Pending)> {
        self.pending.iter()
    }

    /// Stream seqs due for redelivery at `now_ms` (their AckWait or BackOff
    /// step ran out, or a nak's delay passed), earliest first, lazily.
    /// [`Self::due_for_redelivery`] collects it.
    pub fn due_iter(&self, now_ms: i64) -> impl Iterator<Item = u64> + '_ {
        self.schedule
            .iter()
            .map_while(move |(at, seq)| (at <= now_ms).then_some(seq))
    }

    /// Stream seqs due for redelivery at `now_ms`, earliest first, at most `limit`.
    pub fn due_for_redelivery(&self, now_ms: i64, limit: usize) -> Vec<u64> {
        self.due_iter(now_ms).take(limit).collect()
    }

    /// When the next pending message becomes due (`None` if nothing is pending).
    pub fn next_redelivery_ms(&self) -> Option<i64> {
        self.schedule.first().map(|(at, _)| at)
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
}

#[path = "consumer_seq_index.rs"]
mod consumer_seq_index;

#[path = "redelivery_schedule.rs"]
mod redelivery_schedule;

#[path = "pending_set.rs"]
mod pending_set;

#[path = "merged.rs"]
mod merged;

#[path = "sorted_deque.rs"]
mod sorted_deque;

#[path = "dead_letter.rs"]
pub mod dead_letter;
pub use dead_letter::{DeadLetter, DeadLetterReason};

#[cfg(test)]
#[path = "consumer_tests.rs"]
mod tests;
