//! Leader-only dispatch: waiting pull requests and round-robin planning.
//!
//! Workers open sessions and send pull requests ("give me up to N
//! messages"). The consumer's Raft leader keeps those requests here, in
//! memory, and [`Dispatcher::plan`]s which message goes to which request.
//! The caller proposes the plan through Raft
//! ([`crate::ConsumerState::apply_deliver_after`] with the assignments'
//! stream seqs, [`Plan::gone`] and [`Plan::first_after`]), sends messages
//! only after the commit (matching
//! the returned deliveries to assignments by stream seq), then calls
//! [`Dispatcher::settle`].
//!
//! Invariants:
//! - a stream seq is planned at most once while it is in flight (proposed
//!   but not applied), so two workers never get the same delivery;
//! - first deliveries in flight count against MaxAckPending; several plans
//!   with first deliveries may be in flight, each naming the position it
//!   follows ([`Plan::first_after`]), so one applied after an earlier plan
//!   failed delivers none of its new messages instead of skipping the failed
//!   plan's (they are planned again once nothing is in flight);
//! - pulls are served round-robin: one message to the pull at the front,
//!   which then goes to the back if it wants more;
//! - a pull is reported exactly once as finished (done or expired); pulls
//!   dropped with [`Dispatcher::remove_session`] are not reported.
//!
//! Deliberately left out (the caller's job): sending messages, heartbeats,
//! no-wait pulls and max_bytes pulls. Nothing here is replicated; after a
//! leadership change the new leader starts from [`Dispatcher::reset`] and
//! the workers pull again.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, DefaultHasher};

use serde::{Deserialize, Serialize};

use crate::consumer::{ConsumerState, PriorityPolicy};
use crate::error::CoreError;
use crate::stream::StreamState;

/// Identifies a worker's session (one gRPC stream).
pub type SessionId = u64;

/// The in-flight set's map. A hash map keeps its table between plans, so
/// planning a message does not allocate (a B-tree makes a node about every
/// sixth key inserted in order). Dispatch never reads it in order; only the
/// derived `Debug` and `Serialize` do, in hash order (a dispatcher is never
/// persisted or replicated). `DefaultHasher` with its fixed keys, not
/// `RandomState`: this crate takes no randomness.
type InflightMap = HashMap<u64, bool, BuildHasherDefault<DefaultHasher>>;

/// A pull request waiting for messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitingPull {
    /// Session that sent it.
    pub session: SessionId,
    /// Id the worker gave it, unique within the session while waiting.
    pub pull_id: u64,
    /// Messages it still wants.
    pub remaining: u32,
    /// When it gives up, if ever.
    pub expires_at_ms: Option<i64>,
    /// Messages planned for it so far.
    pub delivered: u32,
    /// Payload bytes it may still receive, if the pull set a limit.
    pub remaining_bytes: Option<u64>,
    /// Overflow policy: serve this pull only while the consumer has at least
    /// this many unprocessed messages (0: no threshold).
    pub min_pending: u64,
    /// Overflow policy: ... or at least this many outstanding (0: no threshold).
    pub min_ack_pending: u64,
}

/// Overflow thresholds of a pull (see [`crate::consumer::PriorityPolicy`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Thresholds {
    /// Unprocessed messages needed before the pull is served (0: none).
    pub min_pending: u64,
    /// Outstanding messages needed before the pull is served (0: none).
    pub min_ack_pending: u64,
}

/// What a plan knows about the consumer when choosing pulls.
struct Eligibility {
    policy: PriorityPolicy,
    num_pending: u64,
    num_ack_pending: u64,
}

/// One message planned for one pull.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Which message.
    pub stream_seq: u64,
    /// Which session gets it.
    pub session: SessionId,
    /// Which of the session's pulls.
    pub pull_id: u64,
    /// Whether it is a redelivery (AckWait ran out).
    pub redelivery: bool,
}

/// Why a pull stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullEnd {
    /// It got all the messages it asked for.
    Done,
    /// Its expiry passed first.
    Expired,
}

/// A pull request that stopped waiting; the caller tells the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedPull {
    /// Session that sent it.
    pub session: SessionId,
    /// Its id.
    pub pull_id: u64,
    /// Messages planned for it in total.
    pub delivered: u32,
    /// Why it ended.
    pub end: PullEnd,
}

/// The outcome of [`Dispatcher::plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Messages to propose, redeliveries first, in the order to deliver.
    pub assignments: Vec<Assignment>,
    /// Pending stream seqs the stream no longer holds; propose them too so
    /// they leave the consumer's pending set.
    pub gone: Vec<u64>,
    /// Pending stream seqs that reached MaxDeliver and are due again: propose
    /// them so the consumer gives up on them
    /// ([`ConsumerState::apply_exhausted`]) instead of redelivering.
    pub exhausted: Vec<u64>,
    /// Pulls that ended (expired before planning, or filled by this plan).
    pub finished: Vec<FinishedPull>,
    /// With first deliveries of new messages: the consumer position they
    /// follow (the last first delivery of the plans still in flight, or the
    /// consumer's own). Propose it with the plan for
    /// [`ConsumerState::apply_deliver_after`].
    pub first_after: Option<u64>,
}

impl Plan {
    /// Nothing to propose and nothing to report.
    pub fn is_empty(&self) -> bool {
        self.assignments.is_empty()
            && self.gone.is_empty()
            && self.exhausted.is_empty()
            && self.finished.is_empty()
    }

    /// Whether there is anything to propose.
    pub fn has_proposal(&self) -> bool {
        !(self.assignments.is_empty() && self.gone.is_empty() && self.exhausted.is_empty())
    }

    /// Every stream seq the proposal names (assignments, gone, exhausted):
    /// what to pass to [`Dispatcher::settle`] once it is applied or failed.
    pub fn all_seqs(&self) -> Vec<u64> {
        let planned = self.assignments.iter().map(|a| a.stream_seq);
        planned
            .chain(self.gone.iter().copied())
            .chain(self.exhausted.iter().copied())
            .collect()
    }

    /// The stream seqs of the assignments, in order: the `stream_seqs`
    /// argument of [`ConsumerState::apply_deliver`].
    pub fn stream_seqs(&self) -> Vec<u64> {
        self.assignments.iter().map(|a| a.stream_seq).collect()
    }
}

/// Leader-side state of one consumer's dispatch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dispatcher {
    /// Waiting pulls in round-robin order.
    waiting: VecDeque<WaitingPull>,
    /// Stream seqs proposed and not yet settled -> is it a first delivery?
    inflight: InflightMap,
    /// First deliveries in `inflight`.
    inflight_new: usize,
    /// Highest stream seq planned as a first delivery (0 when none in flight).
    cursor: u64,
    /// The session pinned under the pinned priority policy.
    pinned: Option<SessionId>,
}

impl Dispatcher {
    /// No waiting pulls, nothing in flight.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues a pull request for `batch` messages at the back. Refused when
    /// `batch` is 0, when `max_waiting` (if positive) pulls already wait, or
    /// when the session already has a waiting pull with this id.
    pub fn add_pull(
        &mut self,
        session: SessionId,
        pull_id: u64,
        batch: u32,
        expires_at_ms: Option<i64>,
        max_waiting: i64,
    ) -> Result<(), CoreError> {
        if batch == 0 {
            return Err(CoreError::InvalidBatch);
        }
        if max_waiting > 0 && self.waiting.len() as u64 >= max_waiting as u64 {
            return Err(CoreError::TooManyWaiting { max_waiting });
        }
        if self
            .waiting
            .iter()
            .any(|w| w.session == session && w.pull_id == pull_id)
        {
            return Err(CoreError::DuplicatePull { session, pull_id });
        }
        self.waiting.push_back(WaitingPull {
            session,
            pull_id,
            remaining: batch,
            expires_at_ms,
            delivered: 0,
            remaining_bytes: None,
            min_pending: 0,
            min_ack_pending: 0,
        });
        Ok(())
    }

    /// Sets the overflow thresholds of the pull just added.
    pub fn set_thresholds(&mut self, session: SessionId, pull_id: u64, t: Thresholds) {
        if let Some(w) = self
            .waiting
            .iter_mut()
            .rev()
            .find(|w| w.session == session && w.pull_id == pull_id)
        {
            w.min_pending = t.min_pending;
            w.min_ack_pending = t.min_ack_pending;
        }
    }

    /// The session pinned under the pinned priority policy, if any.
    pub fn pinned(&self) -> Option<SessionId> {
        self.pinned
    }

    /// [`Self::add_pull`] with a payload byte limit: the pull ends (done)
    /// when the next message would not fit.
    pub fn add_pull_with_max_bytes(
        &mut self,
        session: SessionId,
        pull_id: u64,
        batch: u32,
        expires_at_ms: Option<i64>,
        max_waiting: i64,
        max_bytes: u64,
    ) -> Result<(), CoreError> {
        self.add_pull(session, pull_id, batch, expires_at_ms, max_waiting)?;
        if max_bytes > 0 {
            if let Some(w) = self.waiting.back_mut() {
                w.remaining_bytes = Some(max_bytes);
            }
        }
        Ok(())
    }

    /// Drops the session's waiting pulls; returns how many there were.
    pub fn remove_session(&mut self, session: SessionId) -> usize {
        if self.pinned == Some(session) {
            self.pinned = None;
        }
        let before = self.waiting.len();
        self.waiting.retain(|w| w.session != session);
        before - self.waiting.len()
    }

    /// Removes pulls whose expiry is at or before `now_ms`, in queue order.
    pub fn expire(&mut self, now_ms: i64) -> Vec<FinishedPull> {
        let mut finished = Vec::new();
        self.waiting.retain(|w| {
            let expired = w.expires_at_ms.is_some_and(|t| t <= now_ms);
            if expired {
                finished.push(finished_pull(w, PullEnd::Expired));
            }
            !expired
        });
        finished
    }

    /// The earliest expiry among waiting pulls.
    pub fn next_expiry_ms(&self) -> Option<i64> {
        self.waiting.iter().filter_map(|w| w.expires_at_ms).min()
    }

    /// How many pulls are waiting.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The waiting pulls, front of the queue first.
    pub fn waiting(&self) -> impl Iterator<Item = &WaitingPull> {
        self.waiting.iter()
    }

    /// Stream seqs proposed and not yet settled.
    pub fn num_inflight(&self) -> usize {
        self.inflight.len()
    }

    /// Plans up to `max_batch` deliveries at `now_ms`. Pulls expired at
    /// `now_ms` are removed first (reported as [`PullEnd::Expired`]). Then
    /// redeliveries whose AckWait ran out (skipping those in flight; those
    /// the stream lost go to [`Plan::gone`]; those above `stream`'s last
    /// sequence wait, since `stream` may be a replica that has not stored
    /// them yet), then new messages matching the
    /// consumer's filter, as MaxAckPending allows. Each message goes to the
    /// pull at the front of the queue, which moves to the back if it wants
    /// more, or is reported [`PullEnd::Done`]. Planned seqs are in flight
    /// until [`Self::settle`]d.
    pub fn plan(
        &mut self,
        consumer: &ConsumerState,
        stream: &StreamState,
        now_ms: i64,
        max_batch: usize,
    ) -> Plan {
        let mut plan = Plan {
            finished: self.expire(now_ms),
            ..Plan::default()
        };
        // Nothing goes out before the start is known or while paused.
        if consumer.needs_start() || consumer.is_paused(now_ms) {
            return plan;
        }
        let policy = consumer.config().priority_policy;
        let thresholds = self
            .waiting
            .iter()
            .any(|w| w.min_pending > 0 || w.min_ack_pending > 0);
        let elig = Eligibility {
            policy,
            num_pending: if policy == PriorityPolicy::Overflow && thresholds {
                consumer
                    .config()
                    .count_matching_after(stream, consumer.delivered().stream_seq)
                    + consumer.backlog_len()
            } else {
                0
            },
            num_ack_pending: consumer.num_ack_pending() + self.inflight_new as u64,
        };
        if policy == PriorityPolicy::Pinned && self.pinned.is_none() {
            self.pinned = self.waiting.front().map(|w| w.session);
        }
        // Due messages: gone and exhausted ones are settled even when no pull
        // waits; the scan is bounded so a large backlog costs little.
        for seq in consumer.due_iter(now_ms).take(max_batch.saturating_mul(4)) {
            if plan.assignments.len() + plan.gone.len() + plan.exhausted.len() >= max_batch {
                break;
            }
            if self.inflight.contains_key(&seq) {
                continue;
            }
            // The stream copy planned from trails the one that stored it (a
            // consumer leader whose stream replica is catching up): the
            // message is not here yet, which does not make it gone.
            if seq > stream.last_seq() {
                continue;
            }
            if stream.get(seq).is_none() {
                plan.gone.push(seq);
                self.inflight.insert(seq, false);
                continue;
            }
            if consumer.exhausted(seq) {
                plan.exhausted.push(seq);
                self.inflight.insert(seq, false);
                continue;
            }
            if self.waiting.is_empty() {
                continue;
            }
            let size = stream.get(seq).map_or(0, |m| m.size);
            self.assign(&mut plan, &elig, seq, size, true);
        }
        // First deliveries may be planned while earlier ones are in flight:
        // each plan names the position it follows (`first_after`), and its
        // apply skips them unless the consumer is there, so a failed plan
        // overtaken by a later one cannot make the position pass over its
        // messages.
        let mut room = consumer.ack_pending_room(self.inflight_new);
        // First deliveries of the backlog (a last-per-subject start), in order.
        for seq in consumer.backlog_iter() {
            if room == 0 || self.waiting.is_empty() || plan.assignments.len() >= max_batch {
                break;
            }
            if self.inflight.contains_key(&seq) {
                continue;
            }
            // Not in this (trailing) copy of the stream yet: wait, in order.
            if seq > stream.last_seq() {
                break;
            }
            match stream.get(seq) {
                None => {
                    plan.gone.push(seq);
                    self.inflight.insert(seq, false);
                }
                Some(meta) => {
                    if !self.assign(&mut plan, &elig, seq, meta.size, false) {
                        break;
                    }
                    room -= 1;
                }
            }
        }
        let mut after = self.cursor.max(consumer.delivered().stream_seq);
        while room > 0 && !self.waiting.is_empty() && plan.assignments.len() < max_batch {
            let Some(seq) = consumer.config().next_matching(stream, after) else {
                break;
            };
            let size = stream.get(seq).map_or(0, |m| m.size);
            if !self.assign(&mut plan, &elig, seq, size, false) {
                break;
            }
            plan.first_after.get_or_insert(after);
            self.cursor = seq;
            after = seq;
            room -= 1;
        }
        plan
    }

    /// Gives `seq` (of `size` bytes) to the pull at the front and rotates
    /// the queue. Pulls whose byte limit it would exceed end first (done).
    /// Returns false when no waiting pull can take it.
    fn assign(
        &mut self,
        plan: &mut Plan,
        elig: &Eligibility,
        seq: u64,
        size: u64,
        redelivery: bool,
    ) -> bool {
        // Pulls the priority policy passes over keep their place in line.
        let mut passed_over = Vec::new();
        let found = loop {
            let Some(pull) = self.waiting.pop_front() else {
                break None;
            };
            if pull.remaining_bytes.is_some_and(|b| b < size) {
                plan.finished.push(finished_pull(&pull, PullEnd::Done));
                continue;
            }
            if !self.eligible(&pull, elig) {
                passed_over.push(pull);
                continue;
            }
            break Some(pull);
        };
        for p in passed_over.into_iter().rev() {
            self.waiting.push_front(p);
        }
        let Some(mut pull) = found else {
            return false;
        };
        if let Some(b) = pull.remaining_bytes.as_mut() {
            *b -= size;
        }
        plan.assignments.push(Assignment {
            stream_seq: seq,
            session: pull.session,
            pull_id: pull.pull_id,
            redelivery,
        });
        self.inflight.insert(seq, !redelivery);
        if !redelivery {
            self.inflight_new += 1;
        }
        pull.remaining = pull.remaining.saturating_sub(1);
        pull.delivered = pull.delivered.saturating_add(1);
        if pull.remaining > 0 && pull.remaining_bytes != Some(0) {
            self.waiting.push_back(pull);
        } else {
            plan.finished.push(finished_pull(&pull, PullEnd::Done));
        }
        true
    }

    fn eligible(&self, pull: &WaitingPull, elig: &Eligibility) -> bool {
        match elig.policy {
            PriorityPolicy::None => true,
            PriorityPolicy::Pinned => self.pinned == Some(pull.session),
            PriorityPolicy::Overflow => {
                if pull.min_pending == 0 && pull.min_ack_pending == 0 {
                    return true;
                }
                (pull.min_pending > 0 && elig.num_pending >= pull.min_pending)
                    || (pull.min_ack_pending > 0 && elig.num_ack_pending >= pull.min_ack_pending)
            }
        }
    }

    /// The Deliver command for these seqs was applied (or failed): they are
    /// no longer in flight. Once no first delivery is in flight the cursor
    /// falls back to the consumer's own position, so first deliveries whose
    /// proposal failed are planned again.
    pub fn settle(&mut self, stream_seqs: &[u64]) {
        for seq in stream_seqs {
            if self.inflight.remove(seq) == Some(true) {
                self.inflight_new = self.inflight_new.saturating_sub(1);
            }
        }
        if self.inflight_new == 0 {
            self.cursor = 0;
        }
    }

    /// Leadership lost or regained: forget what is in flight and the cursor.
    /// Waiting pulls are kept; the caller drops them if it wants to.
    pub fn reset(&mut self) {
        self.inflight.clear();
        self.inflight_new = 0;
        self.cursor = 0;
    }
}

fn finished_pull(w: &WaitingPull, end: PullEnd) -> FinishedPull {
    FinishedPull {
        session: w.session,
        pull_id: w.pull_id,
        delivered: w.delivered,
        end,
    }
}

#[cfg(test)]
#[path = "dispatch_tests.rs"]
mod tests;
