//! The consumer leader's runtime: worker sessions, waiting pulls, dispatch, acks.
//!
//! One task per consumer replica. It idles unless its node leads the
//! consumer's group. As leader it keeps the worker sessions attached to this
//! node, asks `wharf_core::dispatch::Dispatcher` for a round-robin plan over the
//! waiting pulls, proposes the plan as one `Deliver` entry, and only after that
//! entry is applied sends each message to its worker. Acks from every session
//! are batched into `Ack` entries, or, when a delivery is planned while they
//! wait, ride in its entry ahead of it (`AcksThenDeliver`): a worker that
//! sends its acks with its next pull ("ack next") waits for one commit per
//! message instead of two. Both kinds are pipelined (a few entries in
//! flight); a `DeliverAfter` entry names the consumer position its first
//! deliveries follow, so one applied after a failed one delivers none of
//! them rather than skip the failed plan's messages.
//!
//! Invariants:
//! - A worker never receives a message whose delivery is not committed.
//! - A pull's final status (done, expired) is sent after its last message.
//! - Losing leadership closes every session with UNAVAILABLE; clients reconnect
//!   through any node and are forwarded to the new leader, which rebuilds its
//!   view from the replicated state.
//! - Everything is bounded: pull batch, planned batch, in-flight proposals,
//!   session outboxes (a full outbox drops the message; it stays pending and is
//!   redelivered after AckWait).
//!
//! Pulls and the messages sent to sessions are in `pulls`.
//!
//! Left out: anything durable about sessions and pulls: they live in the
//! leader's memory, and a new leader starts with none (clients re-attach).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tonic::Status;
use wharf_core::consumer::{start_position, ConsumerConfig};
use wharf_core::dispatch::{Assignment, Dispatcher, PullEnd, SessionId, Thresholds};
use wharf_proto::v1 as pb;
use wharf_raft::{Group, RaftError, Role};

use crate::consumer_sm::{AckKind, ConsumerCommand, ConsumerMachine, ConsumerResponse};
use crate::error::ServerError;
use crate::stream_sm::{read_messages, StreamMachine};
use crate::util::now_ms;

mod pulls;

/// Largest batch one pull may ask for.
pub const MAX_PULL_BATCH: u32 = 10_000;
/// Messages planned into one Deliver entry.
const MAX_DELIVER_BATCH: usize = 512;
/// Deliver entries in flight at once. Several let a worker's pull be
/// proposed while another worker's delivery commits; a plan names the
/// position it follows, so one that overtakes a failed plan delivers nothing
/// new instead of skipping messages.
const MAX_DELIVER_INFLIGHT: usize = 4;
/// Shortest idle heartbeat interval a pull may ask for.
const MIN_HEARTBEAT_MS: u64 = 100;
/// Unacked messages remembered per session for redeliver-on-disconnect.
const MAX_TRACKED_SENT: usize = 1_000_000;
/// Acks batched into one Ack entry.
const MAX_ACK_BATCH: usize = 4096;
/// Ack entries in flight at once. They are proposed in order; should two
/// reach the log out of order (a write retried while the lease is unsure),
/// an ack or term still settles the message, since both are final; only a
/// nak's or in-progress's due time could come out differently.
const MAX_ACK_INFLIGHT: usize = 4;
/// Events queued towards the runtime.
const EVENT_QUEUE: usize = 4096;
/// Responses queued towards one session.
pub const SESSION_OUTBOX: usize = 4096;

pub type Outbox = mpsc::Sender<Result<pb::ConsumeResponse, Status>>;

pub enum Event {
    Open {
        session: SessionId,
        out: Outbox,
    },
    /// A pull, and the acks that came with it ("ack next"), which are
    /// taken first.
    Pull {
        session: SessionId,
        pull: pb::PullRequest,
        acks: Vec<PendingAck>,
    },
    Ack(PendingAck),
    Close {
        session: SessionId,
    },
    /// The consumer was deleted: waiting pulls end with CONSUMER_DELETED.
    Deleted,
}

/// Handle to a consumer's runtime task.
#[derive(Clone)]
pub struct ConsumerRuntime {
    tx: mpsc::Sender<Event>,
    /// Pulls waiting on this node, for consumer info.
    pub num_waiting: Arc<AtomicU64>,
    /// When a worker last pulled (or this node became leader), ms since the
    /// epoch: the inactive threshold counts from here.
    pub last_active_ms: Arc<AtomicI64>,
}

impl ConsumerRuntime {
    pub fn spawn(ctx: RuntimeContext) -> Self {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let num_waiting = Arc::new(AtomicU64::new(0));
        let last_active_ms = Arc::new(AtomicI64::new(now_ms()));
        let runner = Runner::new(ctx, num_waiting.clone(), last_active_ms.clone());
        tokio::spawn(runner.run(rx));
        ConsumerRuntime {
            tx,
            num_waiting,
            last_active_ms,
        }
    }

    pub async fn send(&self, event: Event) -> Result<(), ServerError> {
        self.tx
            .send(event)
            .await
            .map_err(|_| ServerError::Unavailable("consumer is shutting down".into()))
    }
}

pub struct RuntimeContext {
    pub stream: String,
    pub name: String,
    pub group: Group,
    pub consumer: Arc<Mutex<ConsumerMachine>>,
    pub consumer_changes: watch::Receiver<u64>,
    pub stream_sm: Arc<Mutex<StreamMachine>>,
    pub stream_tree: sled::Tree,
    pub stream_last_seq: watch::Receiver<u64>,
    /// The configuration the catalog holds; the leader brings the group's copy in line.
    pub desired_config: watch::Receiver<ConsumerConfig>,
}

/// An ack of any kind from a session, waiting to be proposed.
#[derive(Debug, Clone)]
pub struct PendingAck {
    pub session: SessionId,
    pub stream_seq: u64,
    /// Non-zero: answer with an AckReply once committed.
    pub reply_id: u64,
    pub kind: AckKind,
}

enum WriteDone {
    Deliver {
        assignments: Vec<Assignment>,
        /// Every seq the proposal named, to settle in the dispatcher.
        settle: Vec<u64>,
        /// Acks that rode in the same entry (`AcksThenDeliver`).
        acks: Vec<PendingAck>,
        result: Result<Vec<u8>, RaftError>,
    },
    Ack {
        acks: Vec<PendingAck>,
        result: Result<Vec<u8>, RaftError>,
    },
    Config {
        result: Result<Vec<u8>, RaftError>,
    },
}

type PullKey = (SessionId, u64);

struct Runner {
    ctx: RuntimeContext,
    num_waiting: Arc<AtomicU64>,
    last_active_ms: Arc<AtomicI64>,
    leader: bool,
    dispatcher: Dispatcher,
    sessions: HashMap<SessionId, Outbox>,
    /// Pulls that asked not to wait: they end as NO_MESSAGES when empty.
    no_wait: HashSet<PullKey>,
    /// Messages proposed for a pull and not yet sent.
    pull_inflight: HashMap<PullKey, usize>,
    /// Final statuses held back until the pull's messages are out.
    pull_end: HashMap<PullKey, (pb::pull_status::Code, u32)>,
    acks: Vec<PendingAck>,
    /// Idle heartbeats of waiting pulls: (interval, next due time).
    heartbeats: HashMap<PullKey, (i64, i64)>,
    /// Which session each unacked message was last sent to, for
    /// redeliver-on-disconnect (bounded by MAX_TRACKED_SENT).
    sent: HashMap<u64, SessionId>,
    deliver_inflight: usize,
    ack_inflight: usize,
    config_inflight: bool,
    writes: FuturesUnordered<BoxFuture<'static, (u64, WriteDone)>>,
    /// Bumped by every reset: results of proposals made before it are
    /// ignored, so they cannot disturb the new dispatcher's bookkeeping.
    epoch: u64,
}

impl Runner {
    fn new(
        ctx: RuntimeContext,
        num_waiting: Arc<AtomicU64>,
        last_active_ms: Arc<AtomicI64>,
    ) -> Self {
        Runner {
            ctx,
            num_waiting,
            last_active_ms,
            leader: false,
            dispatcher: Dispatcher::new(),
            sessions: HashMap::new(),
            no_wait: HashSet::new(),
            pull_inflight: HashMap::new(),
            pull_end: HashMap::new(),
            acks: Vec::new(),
            sent: HashMap::new(),
            heartbeats: HashMap::new(),
            deliver_inflight: 0,
            ack_inflight: 0,
            config_inflight: false,
            writes: FuturesUnordered::new(),
            epoch: 0,
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Event>) {
        let mut status = self.ctx.group.watch_role();
        let mut stream_seq = self.ctx.stream_last_seq.clone();
        let mut changes = self.ctx.consumer_changes.clone();
        let mut desired = self.ctx.desired_config.clone();
        loop {
            let is_leader = *status.borrow_and_update() == Role::Leader;
            if is_leader != self.leader {
                self.leader = is_leader;
                self.last_active_ms.store(now_ms(), Ordering::Relaxed);
                self.reset("leadership changed", pb::pull_status::Code::LeaderChanged);
            }
            if self.leader {
                self.sync_config();
                self.dispatch();
                self.flush_acks();
            }
            self.send_heartbeats();
            self.num_waiting
                .store(self.dispatcher.num_waiting() as u64, Ordering::Relaxed);
            let wake = self.next_wake();
            tokio::select! {
                ev = rx.recv() => match ev {
                    Some(Event::Deleted) => {
                        self.reset("consumer deleted", pb::pull_status::Code::ConsumerDeleted);
                        return;
                    }
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
                Some((epoch, done)) = self.writes.next(), if !self.writes.is_empty() => {
                    if epoch == self.epoch {
                        self.on_write_done(done);
                    }
                }
                r = status.changed() => if r.is_err() { break },
                _ = stream_seq.changed() => {}
                _ = changes.changed() => {}
                _ = desired.changed() => {}
                _ = tokio::time::sleep(wake) => self.expire_pulls(),
            }
        }
        self.reset("consumer stopped", pb::pull_status::Code::LeaderChanged);
    }

    /// Drop all sessions and leader memory; clients reconnect and re-pull.
    fn reset(&mut self, why: &str, code: pb::pull_status::Code) {
        // Tell every waiting pull why it ends, then close its session: on a
        // leader change the worker reconnects through any node; a deleted
        // consumer is gone for good.
        let waiting: Vec<(SessionId, u64, u32)> = self
            .dispatcher
            .waiting()
            .map(|w| (w.session, w.pull_id, w.delivered))
            .collect();
        for (session, pull_id, delivered) in waiting {
            self.send_status(session, pull_id, code, delivered, why.to_string());
        }
        let text = format!("consumer {}/{}: {why}", self.ctx.stream, self.ctx.name);
        for (_, out) in self.sessions.drain() {
            let status = if code == pb::pull_status::Code::ConsumerDeleted {
                Status::not_found(text.clone())
            } else {
                Status::unavailable(format!("{text}; reconnect"))
            };
            let _ = out.try_send(Err(status));
        }
        self.heartbeats.clear();
        self.epoch += 1;
        self.deliver_inflight = 0;
        self.ack_inflight = 0;
        self.config_inflight = false;
        // Waiting pulls belong to the sessions just closed.
        self.dispatcher = Dispatcher::new();
        self.no_wait.clear();
        self.pull_inflight.clear();
        self.pull_end.clear();
        self.acks.clear();
        self.sent.clear();
    }

    fn next_wake(&self) -> Duration {
        let now = now_ms();
        let mut at = self.dispatcher.next_expiry_ms();
        if let Some(hb) = self.heartbeats.values().map(|(_, next)| *next).min() {
            at = Some(at.map_or(hb, |a| a.min(hb)));
        }
        if self.leader && self.dispatcher.num_waiting() > 0 {
            let redeliver = self
                .ctx
                .consumer
                .lock()
                .map(|c| c.state().next_redelivery_ms());
            if let Ok(Some(r)) = redeliver {
                at = Some(at.map_or(r, |a| a.min(r)));
            }
        } else if self.leader {
            // Nobody is pulling: only MaxDeliver give-ups need the clock, and
            // a check a second suffices for them.
            let next = self.ctx.consumer.lock().ok().and_then(|c| {
                let state = c.state();
                (state.config().max_deliver > 0)
                    .then(|| state.next_redelivery_ms())
                    .flatten()
            });
            if let Some(r) = next {
                let r = r.max(now + 1000);
                at = Some(at.map_or(r, |a| a.min(r)));
            }
        }
        match at {
            // Never spin: a deadline already passed is retried shortly.
            Some(at) => Duration::from_millis((at - now).clamp(5, 60_000) as u64),
            None => Duration::from_secs(60),
        }
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Open { session, out } => {
                if !self.leader {
                    let _ = out.try_send(Err(Status::unavailable("not the consumer leader")));
                    return;
                }
                self.sessions.insert(session, out);
            }
            Event::Pull {
                session,
                pull,
                acks,
            } => {
                for ack in acks {
                    self.on_ack(ack);
                }
                self.last_active_ms.store(now_ms(), Ordering::Relaxed);
                self.on_pull(session, pull)
            }
            Event::Ack(ack) => self.on_ack(ack),
            // Handled in the run loop, which ends the runtime.
            Event::Deleted => {}
            Event::Close { session } => {
                self.redeliver_sent_to(session);
                self.sessions.remove(&session);
                self.dispatcher.remove_session(session);
                self.no_wait.retain(|(s, _)| *s != session);
                self.pull_end.retain(|(s, _), _| *s != session);
            }
        }
    }

    /// Queue an ack for the next entry that carries acks (`flush_acks`, or a
    /// delivery planned before then: `dispatch`).
    fn on_ack(&mut self, ack: PendingAck) {
        if self.leader && self.acks.len() < MAX_ACK_BATCH * 16 {
            if ack.kind != AckKind::InProgress {
                self.sent.remove(&ack.stream_seq);
            }
            self.acks.push(ack);
        } else if ack.reply_id != 0 {
            self.reply_ack(ack.session, ack.reply_id, "ack not accepted: retry".into());
        }
    }

    /// With redeliver-on-disconnect, what a closed session held unacked is
    /// nak'ed at once so the next waiting worker gets it.
    fn redeliver_sent_to(&mut self, session: SessionId) {
        let enabled = self
            .ctx
            .consumer
            .lock()
            .map(|c| c.state().config().redeliver_on_disconnect);
        if !self.leader || !enabled.unwrap_or(false) {
            return;
        }
        let held: Vec<u64> = self
            .sent
            .iter()
            .filter(|(_, s)| **s == session)
            .map(|(seq, _)| *seq)
            .collect();
        for stream_seq in held {
            self.sent.remove(&stream_seq);
            let kind = AckKind::Nak { delay_ms: 0 };
            self.acks.push(PendingAck {
                session,
                stream_seq,
                reply_id: 0,
                kind,
            });
        }
    }

    fn sync_config(&mut self) {
        if self.config_inflight {
            return;
        }
        let cmd = match self.start_command() {
            Some(start) => start,
            None => {
                let desired = self.ctx.desired_config.borrow().clone();
                let current = self.ctx.consumer.lock().map(|c| c.state().config().clone());
                if current.ok().as_ref() == Some(&desired) {
                    return;
                }
                ConsumerCommand::UpdateConfig { config: desired }
            }
        };
        let Ok(cmd) = bincode::serialize(&cmd) else {
            return;
        };
        self.config_inflight = true;
        let group = self.ctx.group.clone();
        self.push_write(
            async move {
                WriteDone::Config {
                    result: group.write(cmd).await,
                }
            }
            .boxed(),
        );
    }

    /// A consumer whose deliver policy depends on the stream's contents
    /// starts where the leader's stream replica says, once.
    fn start_command(&self) -> Option<ConsumerCommand> {
        let consumer = self.ctx.consumer.lock().ok()?;
        if !consumer.state().needs_start() {
            return None;
        }
        let stream = self.ctx.stream_sm.lock().ok()?;
        let (after_seq, backlog) = start_position(consumer.state().config(), stream.state());
        Some(ConsumerCommand::Start { after_seq, backlog })
    }

    /// A message that reached MaxDeliver is due: it must be given up on even
    /// when no pull waits, so it stops holding a MaxAckPending slot.
    fn give_up_due(&self) -> bool {
        let now = now_ms();
        self.ctx.consumer.lock().is_ok_and(|c| {
            let state = c.state();
            state.config().max_deliver > 0
                && state.due_iter(now).take(64).any(|seq| state.exhausted(seq))
        })
    }

    fn dispatch(&mut self) {
        while self.deliver_inflight < MAX_DELIVER_INFLIGHT
            && (self.dispatcher.num_waiting() > 0 || self.give_up_due())
        {
            let now = now_ms();
            let mut plan = {
                let (Ok(consumer), Ok(stream)) =
                    (self.ctx.consumer.lock(), self.ctx.stream_sm.lock())
                else {
                    return;
                };
                self.dispatcher
                    .plan(consumer.state(), stream.state(), now, MAX_DELIVER_BATCH)
            };
            for a in &plan.assignments {
                *self
                    .pull_inflight
                    .entry((a.session, a.pull_id))
                    .or_default() += 1;
            }
            // Pulls the plan finished (filled, or expired while planning) end
            // now, or after their in-flight messages if they have any.
            for f in std::mem::take(&mut plan.finished) {
                let key = (f.session, f.pull_id);
                let code = match f.end {
                    PullEnd::Done => pb::pull_status::Code::Done,
                    PullEnd::Expired if self.no_wait.contains(&key) && f.delivered == 0 => {
                        pb::pull_status::Code::NoMessages
                    }
                    PullEnd::Expired => pb::pull_status::Code::Expired,
                };
                self.end_pull(key, code, f.delivered);
            }
            if !plan.has_proposal() {
                return;
            }
            let settle = plan.all_seqs();
            let stream_seqs = plan.assignments.iter().map(|a| a.stream_seq).collect();
            // Acks waiting now ride in this entry, before the deliveries
            // (a worker that acked and pulled again gets both in one commit).
            let acks: Vec<PendingAck> = {
                let take = self.acks.len().min(MAX_ACK_BATCH);
                self.acks.drain(..take).collect()
            };
            let cmd = if acks.is_empty() {
                ConsumerCommand::DeliverAfter {
                    now_ms: now,
                    stream_seqs,
                    gone: plan.gone,
                    exhausted: plan.exhausted,
                    first_after: plan.first_after,
                }
            } else {
                ConsumerCommand::AcksThenDeliver {
                    now_ms: now,
                    acks: ack_items(&acks),
                    stream_seqs,
                    gone: plan.gone,
                    exhausted: plan.exhausted,
                    first_after: plan.first_after,
                }
            };
            let Ok(cmd) = bincode::serialize(&cmd) else {
                return;
            };
            let group = self.ctx.group.clone();
            let assignments = plan.assignments;
            self.deliver_inflight += 1;
            self.push_write(
                async move {
                    let result = group.write(cmd).await;
                    WriteDone::Deliver {
                        assignments,
                        settle,
                        acks,
                        result,
                    }
                }
                .boxed(),
            );
        }
    }

    fn flush_acks(&mut self) {
        if self.ack_inflight >= MAX_ACK_INFLIGHT || self.acks.is_empty() {
            return;
        }
        let take = self.acks.len().min(MAX_ACK_BATCH);
        let acks: Vec<_> = self.acks.drain(..take).collect();
        let cmd = ConsumerCommand::Acks {
            now_ms: now_ms(),
            items: ack_items(&acks),
        };
        let Ok(cmd) = bincode::serialize(&cmd) else {
            return;
        };
        let group = self.ctx.group.clone();
        self.ack_inflight += 1;
        self.push_write(
            async move {
                let result = group.write(cmd).await;
                WriteDone::Ack { acks, result }
            }
            .boxed(),
        );
    }

    fn push_write(&mut self, write: BoxFuture<'static, WriteDone>) {
        let epoch = self.epoch;
        self.writes
            .push(write.map(move |done| (epoch, done)).boxed());
    }

    fn on_write_done(&mut self, done: WriteDone) {
        match done {
            WriteDone::Deliver {
                assignments,
                settle,
                acks,
                result,
            } => {
                self.deliver_inflight -= 1;
                self.dispatcher.settle(&settle);
                self.reply_acks(acks, &result);
                match result.map(|b| bincode::deserialize::<ConsumerResponse>(&b)) {
                    Ok(Ok(resp)) => self.deliver(assignments, resp),
                    Ok(Err(e)) => tracing::error!("undecodable deliver response: {e}"),
                    Err(e) => {
                        tracing::warn!(consumer = %self.ctx.name, "deliver not committed: {e}");
                        self.reset(
                            "delivery could not be committed",
                            pb::pull_status::Code::LeaderChanged,
                        );
                    }
                }
            }
            WriteDone::Ack { acks, result } => {
                self.ack_inflight -= 1;
                self.reply_acks(acks, &result);
            }
            WriteDone::Config { result } => {
                self.config_inflight = false;
                if let Err(e) = result {
                    tracing::warn!(consumer = %self.ctx.name, "config update not committed: {e}");
                }
            }
        }
    }

    /// Answer the synchronous acks of a committed (or failed) entry.
    fn reply_acks(&mut self, acks: Vec<PendingAck>, result: &Result<Vec<u8>, RaftError>) {
        let error = match result {
            Ok(_) => String::new(),
            Err(e) => format!("ack not committed: {e}; retry"),
        };
        for ack in acks {
            if ack.reply_id != 0 {
                self.reply_ack(ack.session, ack.reply_id, error.clone());
            }
        }
    }

    /// Send committed deliveries to their workers, then any final statuses.
    fn deliver(&mut self, assignments: Vec<Assignment>, resp: ConsumerResponse) {
        let by_seq: HashMap<u64, &Assignment> =
            assignments.iter().map(|a| (a.stream_seq, a)).collect();
        let deliveries = resp.deliveries();
        let seqs: Vec<u64> = deliveries.iter().map(|d| d.stream_seq).collect();
        // Each payload block once for the whole batch.
        let mut stored = match read_messages(&self.ctx.stream_tree, &seqs) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!("read messages {seqs:?}: {e}");
                Default::default()
            }
        };
        for d in deliveries {
            let Some(a) = by_seq.get(&d.stream_seq) else {
                continue;
            };
            // Not found: removed by limits since planning. It stays pending
            // and is dropped on its next redelivery attempt.
            let Some(msg) = stored.remove(&d.stream_seq) else {
                continue;
            };
            let message = pb::Message {
                subject: msg.subject,
                payload: msg.payload,
                stream_seq: d.stream_seq,
                consumer_seq: d.consumer_seq,
                delivered: d.deliveries,
                pull_id: a.pull_id,
                published_ms: msg.published_ms,
                headers: msg.headers.into_iter().collect(),
            };
            if self.sent.len() < MAX_TRACKED_SENT {
                self.sent.insert(d.stream_seq, a.session);
            }
            self.send(a.session, pb::consume_response::Kind::Message(message));
        }
        for a in &assignments {
            let key = (a.session, a.pull_id);
            let left = self.pull_inflight.get_mut(&key).map(|n| {
                *n -= 1;
                *n
            });
            if left == Some(0) {
                self.pull_inflight.remove(&key);
                if let Some((code, delivered)) = self.pull_end.remove(&key) {
                    self.end_pull(key, code, delivered);
                }
            }
        }
    }
}

/// The replicated form of queued acks.
fn ack_items(acks: &[PendingAck]) -> Vec<(u64, AckKind)> {
    acks.iter()
        .map(|a| (a.stream_seq, a.kind.clone()))
        .collect()
}
