//! Property tests of the pure broker logic against a small reference model.
//!
//! Random sequences of operations drive one [`StreamState`], one
//! [`ConsumerState`] and one [`Dispatcher`] the way the server's consumer
//! runtime does: `plan`, propose, then either apply the proposal
//! (`apply_deliver_after` + `apply_exhausted`) or fail it, and `settle` the
//! plan's `all_seqs()` either way; several proposals may be in flight at
//! once (first deliveries too: each plan names the position it follows) and
//! are applied in proposal order (the Raft log's order) or, sometimes,
//! newest first (a proposal retried while the leader's lease is unsure
//! reaches the log after a later one). Acks of every kind and config edits
//! are applied at once, as their own Raft entries would be.
//!
//! Next to the real types runs a reference model written independently with
//! plain maps: what is stored, what is pending (deliveries, delivery time,
//! due time, consumer seq), what was acked, termed or given up on, which
//! pulls wait in which order, what is in flight. After every step the model
//! and the crate must agree, and these invariants must hold:
//!
//! - a message is pending at most once, and never handed to a second pull
//!   while outstanding: a redelivery is planned only when it is due
//!   (delivery time + AckWait/BackOff step, or a nak's delay, or an
//!   in-progress restart), and no seq is planned twice while in flight;
//! - never more than MaxAckPending outstanding (pending + first deliveries
//!   in flight) when a plan makes first deliveries;
//! - delivery counts never exceed MaxDeliver; an acked, termed or exhausted
//!   message is never delivered again;
//! - the ack floor never moves backwards; `delivered` never decreases;
//! - first deliveries match the filter, come in stream order, and skip no
//!   stored matching message;
//! - the model's pending set equals the consumer's (`pending_iter`);
//! - pulls are served round-robin (checked exactly against a model queue,
//!   and as the per-plan fairness rule: no pull gets a second message while
//!   another waiting pull with room got none);
//! - plans make progress: when a pull still waits after a plan that used
//!   less than its batch, nothing due and nothing new was left behind.
//!
//! Left out: work-queue and interest retention (checked against their own
//! model in `retention_model.rs`), deliver policies other than `all`, priority groups and pull byte
//! limits (the round-robin checks assume plain round-robin).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use proptest::prelude::*;
use proptest::test_runner::Config as ProptestConfig;
use wharf_core::{
    AckPolicy, ConsumerConfig, ConsumerState, CoreError, Delivery, Dispatcher, FinishedPull, Plan,
    PullEnd, SeqPair, StreamConfig, StreamState,
};

/// The clock starts here (ms since epoch).
const T0: i64 = 1_000_000;
/// Publish subjects.
const SUBJECTS: [&str; 5] = [
    "orders.eu",
    "orders.us",
    "orders.eu.x",
    "audit.eu",
    "audit.us",
];
/// Consumer filters.
const FILTERS: [Option<&str>; 5] = [
    None,
    Some("orders.>"),
    Some("orders.*"),
    Some("*.eu"),
    Some("orders.eu"),
];
/// Sessions workers pull from.
const SESSIONS: u8 = 4;
/// Proposals in flight at once (the server allows 2).
const MAX_INFLIGHT: usize = 3;

// ---------------------------------------------------------------------------
// Operations and their generators

#[derive(Debug, Clone)]
struct Setup {
    ack_policy: AckPolicy,
    filter: usize,
    ack_wait_ms: u64,
    max_ack_pending: i64,
    max_deliver: i64,
    backoff_ms: Vec<u64>,
    max_waiting: i64,
    /// Stream limit (-1: none); limits remove messages that may be pending.
    stream_max_msgs: i64,
}

#[derive(Debug, Clone)]
enum Op {
    Publish {
        subject: usize,
        count: u8,
    },
    /// Delete a stored message (pick indexes the stored ones).
    Delete {
        pick: usize,
    },
    Pull {
        session: u8,
        batch: u32,
        expires_in: Option<u16>,
    },
    Close {
        session: u8,
    },
    Advance {
        ms: u16,
    },
    /// Plan, propose, and apply everything in flight in order.
    Dispatch {
        max_batch: u8,
    },
    /// Plan and propose; apply later.
    Propose {
        max_batch: u8,
    },
    ApplyOldest,
    /// The newest proposal is committed first (proposals can reach the log
    /// out of order, e.g. one retried while the leader's lease is unsure).
    ApplyNewest,
    /// The newest proposal fails (Raft: a suffix of the log is lost).
    FailNewest,
    /// Every proposal in flight fails.
    FailAll,
    /// Acks pick among every seq ever delivered (acked ones too: no-ops).
    Ack {
        pick: usize,
    },
    Nak {
        pick: usize,
        delay_ms: u16,
    },
    InProgress {
        pick: usize,
    },
    Term {
        pick: usize,
    },
    Edit(Edit),
}

#[derive(Debug, Clone)]
struct Edit {
    ack_wait_ms: u64,
    max_ack_pending: i64,
    max_deliver: i64,
    backoff_ms: Vec<u64>,
    max_waiting: i64,
}

fn ack_wait() -> impl Strategy<Value = u64> {
    prop_oneof![Just(50u64), Just(200), Just(1_000), Just(5_000)]
}

fn max_ack_pending() -> impl Strategy<Value = i64> {
    prop_oneof![Just(-1i64), Just(1), Just(2), Just(3), Just(5), Just(1_000)]
}

fn max_waiting() -> impl Strategy<Value = i64> {
    prop_oneof![Just(1i64), Just(2), Just(3), Just(512)]
}

/// MaxDeliver and BackOff that pass validation (fewer delays than MaxDeliver).
fn redelivery() -> impl Strategy<Value = (i64, Vec<u64>)> {
    let max_deliver = prop_oneof![Just(-1i64), Just(1), Just(2), Just(3), Just(5)];
    let delay = prop_oneof![Just(20u64), Just(100), Just(700), Just(3_000)];
    (
        max_deliver,
        prop_oneof![
            2 => Just(Vec::new()),
            1 => prop::collection::vec(delay, 1..4),
        ],
    )
        .prop_map(|(max_deliver, mut backoff)| {
            if max_deliver > 0 {
                backoff.truncate(max_deliver as usize - 1);
            }
            (max_deliver, backoff)
        })
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![
            Just(AckPolicy::Explicit),
            Just(AckPolicy::All),
            Just(AckPolicy::None)
        ],
        0..FILTERS.len(),
        ack_wait(),
        max_ack_pending(),
        redelivery(),
        max_waiting(),
        prop_oneof![3 => Just(-1i64), 1 => Just(4), 1 => Just(12)],
    )
        .prop_map(
            |(ack_policy, filter, ack_wait_ms, max_ack_pending, rd, max_waiting, max_msgs)| Setup {
                ack_policy,
                filter,
                ack_wait_ms,
                max_ack_pending,
                max_deliver: rd.0,
                backoff_ms: rd.1,
                max_waiting,
                stream_max_msgs: max_msgs,
            },
        )
}

/// Which ways a proposal may fail in a run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Failures {
    /// Every proposal is applied.
    Never,
    /// The newest proposal in flight may fail (what Raft can do: the log
    /// keeps a prefix of what the leader appended).
    Newest,
    /// Every proposal in flight fails at once (the leader lost them all).
    All,
}

/// How a run mixes its operations.
#[derive(Debug, Clone, Copy)]
struct Profile {
    failures: Failures,
    /// More time passing, naks and in-progress, fewer acks: redeliveries,
    /// BackOff steps and MaxDeliver give-ups dominate.
    redeliveries: bool,
}

fn op(profile: Profile) -> impl Strategy<Value = Op> {
    let failures = profile.failures;
    let (advance, ack, nak, edit_w) = match profile.redeliveries {
        false => (4, 4, 2, 1),
        true => (8, 1, 4, 2),
    };
    let pick = 0..10_000usize;
    let edit = (ack_wait(), max_ack_pending(), redelivery(), max_waiting()).prop_map(
        |(ack_wait_ms, max_ack_pending, (max_deliver, backoff_ms), max_waiting)| {
            Op::Edit(Edit {
                ack_wait_ms,
                max_ack_pending,
                max_deliver,
                backoff_ms,
                max_waiting,
            })
        },
    );
    prop_oneof![
        4 => (0..SUBJECTS.len(), 1..4u8).prop_map(|(subject, count)| Op::Publish { subject, count }),
        1 => pick.clone().prop_map(|pick| Op::Delete { pick }),
        4 => (0..SESSIONS, 0..5u32, prop::option::weighted(0.5, 0..3_000u16))
            .prop_map(|(session, batch, expires_in)| Op::Pull { session, batch, expires_in }),
        1 => (0..SESSIONS).prop_map(|session| Op::Close { session }),
        advance => prop_oneof![0..100u16, 0..3_000u16].prop_map(|ms| Op::Advance { ms }),
        5 => (1..8u8).prop_map(|max_batch| Op::Dispatch { max_batch }),
        3 => (1..8u8).prop_map(|max_batch| Op::Propose { max_batch }),
        3 => Just(Op::ApplyOldest),
        1 => Just(Op::ApplyNewest),
        2 => Just(match failures {
            Failures::Never => Op::ApplyOldest,
            Failures::Newest => Op::FailNewest,
            Failures::All => Op::FailAll,
        }),
        ack => pick.clone().prop_map(|pick| Op::Ack { pick }),
        nak => (pick.clone(), prop_oneof![Just(0u16), 0..2_000u16])
            .prop_map(|(pick, delay_ms)| Op::Nak { pick, delay_ms }),
        nak / 2 => pick.clone().prop_map(|pick| Op::InProgress { pick }),
        1 => pick.prop_map(|pick| Op::Term { pick }),
        edit_w => edit,
    ]
}

fn ops(failures: Failures, redeliveries: bool) -> impl Strategy<Value = Vec<Op>> {
    let profile = Profile {
        failures,
        redeliveries,
    };
    prop::collection::vec(op(profile), 1..200)
}

// ---------------------------------------------------------------------------
// The reference model

/// The model's pending entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MPending {
    consumer_seq: u64,
    deliveries: u64,
    delivered_ms: i64,
    due_ms: i64,
}

/// Why a message left the pending set (or, ack none, was delivered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    Acked,
    Termed,
    Exhausted,
    Gone,
    /// Ack policy none: done once delivered.
    Delivered,
}

/// A waiting pull in the model's round-robin queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MPull {
    session: u64,
    pull_id: u64,
    remaining: u32,
    expires_at_ms: Option<i64>,
    delivered: u32,
}

/// A proposal in flight.
#[derive(Debug, Clone)]
struct InFlight {
    plan: Plan,
    now_ms: i64,
    /// MaxDeliver when it was planned.
    max_deliver: i64,
    /// Its first deliveries.
    firsts: Vec<u64>,
}

/// Subject filter matching, written for the model (tokens, `*`, `>`).
fn matches(filter: Option<&str>, subject: &str) -> bool {
    let Some(filter) = filter else {
        return true;
    };
    let f: Vec<&str> = filter.split('.').collect();
    let s: Vec<&str> = subject.split('.').collect();
    for (i, tok) in f.iter().enumerate() {
        match *tok {
            ">" => return s.len() > i,
            "*" if i < s.len() => {}
            t if i < s.len() && s[i] == t => {}
            _ => return false,
        }
    }
    f.len() == s.len()
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

type Check = Result<(), String>;

/// The crate's types and the model, side by side.
struct Sim {
    // The system under test.
    stream: StreamState,
    consumer: ConsumerState,
    dispatcher: Dispatcher,

    // The model.
    now: i64,
    ack_policy: AckPolicy,
    filter: Option<&'static str>,
    ack_wait_ms: u64,
    max_ack_pending: i64,
    max_deliver: i64,
    backoff_ms: Vec<u64>,
    max_waiting: i64,
    stream_max_msgs: i64,
    stored: BTreeMap<u64, &'static str>,
    last_seq: u64,
    pending: BTreeMap<u64, MPending>,
    settled: HashMap<u64, Settled>,
    /// Every seq delivered at least once, in first-delivery order.
    first_delivered: Vec<u64>,
    delivered: SeqPair,
    last_delivered_ms: i64,
    waiting: VecDeque<MPull>,
    next_pull_id: u64,
    inflight: VecDeque<InFlight>,
    /// The last first delivery planned while first deliveries are in flight
    /// (0 once none is): the next plan's first deliveries follow it.
    chain: u64,

    // What was seen before, for the monotonic checks.
    prev_floor: SeqPair,
    prev_delivered: SeqPair,

    /// What the run exercised (for the coverage check).
    stats: Stats,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    firsts: u64,
    redeliveries: u64,
    exhausted: u64,
    gone: u64,
    failed: u64,
    termed: u64,
    acked: u64,
}

impl Sim {
    fn new(setup: &Setup) -> Sim {
        let stream_config = StreamConfig {
            name: "S".into(),
            subjects: vec!["orders.>".into(), "audit.>".into()],
            replicas: 1,
            max_msgs: setup.stream_max_msgs,
            ..StreamConfig::default()
        }
        .with_defaults();
        stream_config.validate().expect("stream config");
        let config = ConsumerConfig {
            name: "C".into(),
            filter_subject: FILTERS[setup.filter].map(str::to_string),
            ack_wait_ms: setup.ack_wait_ms,
            max_ack_pending: setup.max_ack_pending,
            max_waiting: setup.max_waiting,
            ack_policy: setup.ack_policy,
            max_deliver: setup.max_deliver,
            backoff_ms: setup.backoff_ms.clone(),
            ..ConsumerConfig::default()
        }
        .with_defaults();
        config.validate().expect("consumer config");
        Sim {
            stream: StreamState::new(stream_config),
            consumer: ConsumerState::new(config),
            dispatcher: Dispatcher::new(),
            now: T0,
            ack_policy: setup.ack_policy,
            filter: FILTERS[setup.filter],
            ack_wait_ms: setup.ack_wait_ms,
            max_ack_pending: setup.max_ack_pending,
            max_deliver: setup.max_deliver,
            backoff_ms: setup.backoff_ms.clone(),
            max_waiting: setup.max_waiting,
            stream_max_msgs: setup.stream_max_msgs,
            stored: BTreeMap::new(),
            last_seq: 0,
            pending: BTreeMap::new(),
            settled: HashMap::new(),
            first_delivered: Vec::new(),
            delivered: SeqPair::default(),
            last_delivered_ms: i64::MIN,
            waiting: VecDeque::new(),
            next_pull_id: 1,
            inflight: VecDeque::new(),
            chain: 0,
            prev_floor: SeqPair::default(),
            prev_delivered: SeqPair::default(),
            stats: Stats::default(),
        }
    }

    /// How long delivery number `deliveries` may stay unacked.
    fn wait_ms(&self, deliveries: u64) -> i64 {
        let ms = match self.backoff_ms.len() {
            0 => self.ack_wait_ms,
            n => self.backoff_ms[(deliveries as usize - 1).min(n - 1)],
        };
        ms as i64
    }

    fn pick_delivered(&self, pick: usize) -> Option<u64> {
        (!self.first_delivered.is_empty())
            .then(|| self.first_delivered[pick % self.first_delivered.len()])
    }

    fn inflight_seqs(&self) -> BTreeSet<u64> {
        self.inflight
            .iter()
            .flat_map(|f| f.plan.all_seqs())
            .collect()
    }

    fn inflight_firsts(&self) -> usize {
        self.inflight.iter().map(|f| f.firsts.len()).sum()
    }

    /// Highest stream seq delivered or in flight as a first delivery.
    fn frontier(&self) -> u64 {
        let inflight = self.inflight.iter().flat_map(|f| f.firsts.iter().copied());
        inflight.fold(self.delivered.stream_seq, u64::max)
    }

    /// A proposal left the flight (applied or failed).
    fn settled_one(&mut self) {
        if self.inflight_firsts() == 0 {
            self.chain = 0;
        }
    }

    fn run(&mut self, ops: &[Op]) -> Check {
        for (i, op) in ops.iter().enumerate() {
            self.step(op).map_err(|e| format!("step {i} {op:?}: {e}"))?;
            self.check()
                .map_err(|e| format!("after step {i} {op:?}: {e}"))?;
        }
        // Drain: apply what is in flight, then check once more.
        while !self.inflight.is_empty() {
            self.apply_oldest()?;
            self.check()
                .map_err(|e| format!("after the final apply: {e}"))?;
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Check {
        match op {
            Op::Publish { subject, count } => {
                for _ in 0..*count {
                    self.publish(SUBJECTS[*subject])?;
                }
            }
            Op::Delete { pick } => {
                if !self.stored.is_empty() {
                    let seq = *self.stored.keys().nth(pick % self.stored.len()).unwrap();
                    self.stream.delete(seq).map_err(|e| e.to_string())?;
                    self.stored.remove(&seq);
                }
            }
            Op::Pull {
                session,
                batch,
                expires_in,
            } => {
                let session = u64::from(*session);
                let pull_id = self.next_pull_id;
                self.next_pull_id += 1;
                let expires_at_ms = expires_in.map(|e| self.now + i64::from(e));
                let got = self.dispatcher.add_pull(
                    session,
                    pull_id,
                    *batch,
                    expires_at_ms,
                    self.max_waiting,
                );
                if *batch == 0 {
                    ensure!(
                        got == Err(CoreError::InvalidBatch),
                        "batch 0 accepted: {got:?}"
                    );
                } else if self.waiting.len() as i64 >= self.max_waiting {
                    ensure!(
                        matches!(got, Err(CoreError::TooManyWaiting { .. })),
                        "pull beyond max_waiting {}: {got:?}",
                        self.max_waiting
                    );
                } else {
                    ensure!(got.is_ok(), "pull refused: {got:?}");
                    self.waiting.push_back(MPull {
                        session,
                        pull_id,
                        remaining: *batch,
                        expires_at_ms,
                        delivered: 0,
                    });
                }
            }
            Op::Close { session } => {
                let session = u64::from(*session);
                let n = self.dispatcher.remove_session(session);
                let before = self.waiting.len();
                self.waiting.retain(|w| w.session != session);
                ensure!(
                    n == before - self.waiting.len(),
                    "remove_session dropped {n} pulls, model {}",
                    before - self.waiting.len()
                );
            }
            Op::Advance { ms } => self.now += i64::from(*ms),
            Op::Dispatch { max_batch } => {
                self.propose(usize::from(*max_batch))?;
                while !self.inflight.is_empty() {
                    self.apply_oldest()?;
                }
            }
            Op::Propose { max_batch } => {
                if self.inflight.len() < MAX_INFLIGHT {
                    self.propose(usize::from(*max_batch))?;
                }
            }
            Op::ApplyOldest => {
                if !self.inflight.is_empty() {
                    self.apply_oldest()?;
                }
            }
            Op::ApplyNewest => {
                if !self.inflight.is_empty() {
                    self.apply(self.inflight.len() - 1)?;
                }
            }
            Op::FailNewest => {
                if let Some(f) = self.inflight.pop_back() {
                    self.fail(f);
                }
            }
            Op::FailAll => {
                while let Some(f) = self.inflight.pop_back() {
                    self.fail(f);
                }
            }
            Op::Ack { pick } => {
                if let Some(seq) = self.pick_delivered(*pick) {
                    self.ack(seq)?;
                }
            }
            Op::Nak { pick, delay_ms } => {
                if let Some(seq) = self.pick_delivered(*pick) {
                    let hit = self.consumer.apply_nak(seq, u64::from(*delay_ms), self.now);
                    let base = self.now.max(self.last_delivered_ms);
                    let model = self.pending.get_mut(&seq).map(|p| {
                        p.due_ms = base + i64::from(*delay_ms);
                    });
                    ensure!(hit == model.is_some(), "nak of {seq}: {hit}");
                }
            }
            Op::InProgress { pick } => {
                if let Some(seq) = self.pick_delivered(*pick) {
                    let hit = self.consumer.apply_in_progress(seq, self.now);
                    let base = self.now.max(self.last_delivered_ms);
                    let wait = self.pending.get(&seq).map(|p| self.wait_ms(p.deliveries));
                    if let (Some(p), Some(wait)) = (self.pending.get_mut(&seq), wait) {
                        p.due_ms = base + wait;
                    }
                    ensure!(hit == wait.is_some(), "in-progress of {seq}: {hit}");
                }
            }
            Op::Term { pick } => {
                if let Some(seq) = self.pick_delivered(*pick) {
                    let hit = self.consumer.apply_term(seq, "");
                    let model = self.pending.remove(&seq).is_some();
                    if model {
                        self.settled.insert(seq, Settled::Termed);
                        self.stats.termed += 1;
                    }
                    ensure!(hit == model, "term of {seq}: {hit}");
                }
            }
            Op::Edit(edit) => self.edit(edit)?,
        }
        Ok(())
    }

    fn publish(&mut self, subject: &'static str) -> Check {
        let appended = (self.stream)
            .append(subject, 10, self.now)
            .map_err(|e| format!("publish: {e}"))?;
        self.last_seq += 1;
        ensure!(
            appended.seq == self.last_seq,
            "publish got seq {}, model {}",
            appended.seq,
            self.last_seq
        );
        self.stored.insert(self.last_seq, subject);
        let mut removed = Vec::new();
        if self.stream_max_msgs > 0 {
            while self.stored.len() as i64 > self.stream_max_msgs {
                let (seq, _) = self.stored.pop_first().unwrap();
                removed.push(seq);
            }
        }
        ensure!(
            appended.removed == removed,
            "limits removed {:?}, model {removed:?}",
            appended.removed
        );
        Ok(())
    }

    fn ack(&mut self, seq: u64) -> Check {
        let n = self.consumer.apply_ack(&[seq]);
        let acked: Vec<u64> = match self.ack_policy {
            AckPolicy::All => self.pending.range(..=seq).map(|(s, _)| *s).collect(),
            _ => self
                .pending
                .contains_key(&seq)
                .then_some(seq)
                .into_iter()
                .collect(),
        };
        for s in &acked {
            self.pending.remove(s);
            self.settled.insert(*s, Settled::Acked);
        }
        self.stats.acked += acked.len() as u64;
        ensure!(
            n == acked.len(),
            "ack of {seq} settled {n}, model {acked:?}"
        );
        Ok(())
    }

    fn edit(&mut self, edit: &Edit) -> Check {
        let mut config = self.consumer.config().clone();
        config.ack_wait_ms = edit.ack_wait_ms;
        config.max_ack_pending = edit.max_ack_pending;
        config.max_deliver = edit.max_deliver;
        config.backoff_ms = edit.backoff_ms.clone();
        config.max_waiting = edit.max_waiting;
        let config = config.with_defaults();
        config
            .validate()
            .map_err(|e| format!("edit invalid: {e}"))?;
        (self.consumer)
            .update_config(config)
            .map_err(|e| format!("edit refused: {e}"))?;
        let retime = edit.ack_wait_ms != self.ack_wait_ms || edit.backoff_ms != self.backoff_ms;
        self.ack_wait_ms = edit.ack_wait_ms;
        self.max_ack_pending = edit.max_ack_pending;
        self.max_deliver = edit.max_deliver;
        self.backoff_ms = edit.backoff_ms.clone();
        self.max_waiting = edit.max_waiting;
        if retime {
            let waits: Vec<(u64, i64)> = (self.pending.iter())
                .map(|(s, p)| (*s, self.wait_ms(p.deliveries)))
                .collect();
            for (seq, wait) in waits {
                let p = self.pending.get_mut(&seq).unwrap();
                p.due_ms = p.delivered_ms + wait;
            }
        }
        Ok(())
    }

    /// Plans at `now`, checks the plan against the model, and puts it in
    /// flight if it proposes anything.
    fn propose(&mut self, max_batch: usize) -> Check {
        let now = self.now;
        let inflight_before = self.inflight_seqs();
        let pending_len = self.consumer.num_ack_pending() as usize;
        let plan = (self.dispatcher).plan(&self.consumer, &self.stream, now, max_batch);
        let ctx = || format!("plan at {now} (max {max_batch}) {plan:?}");

        // Pulls: expired ones leave first, in queue order; then each message
        // goes to the front pull, which moves to the back if it wants more.
        let mut finished = Vec::new();
        self.waiting.retain(|w| {
            let expired = w.expires_at_ms.is_some_and(|t| t <= now);
            if expired {
                finished.push(FinishedPull {
                    session: w.session,
                    pull_id: w.pull_id,
                    delivered: w.delivered,
                    end: PullEnd::Expired,
                });
            }
            !expired
        });
        let eligible: Vec<MPull> = self.waiting.iter().copied().collect();
        let mut got: HashMap<(u64, u64), u32> = HashMap::new();
        for a in &plan.assignments {
            let Some(mut w) = self.waiting.pop_front() else {
                return Err(format!("assignment with no pull waiting: {}", ctx()));
            };
            ensure!(
                (w.session, w.pull_id) == (a.session, a.pull_id),
                "seq {} went to pull {}/{}, the front of the queue is {}/{}: {}",
                a.stream_seq,
                a.session,
                a.pull_id,
                w.session,
                w.pull_id,
                ctx()
            );
            *got.entry((w.session, w.pull_id)).or_default() += 1;
            w.remaining -= 1;
            w.delivered += 1;
            if w.remaining > 0 {
                self.waiting.push_back(w);
            } else {
                finished.push(FinishedPull {
                    session: w.session,
                    pull_id: w.pull_id,
                    delivered: w.delivered,
                    end: PullEnd::Done,
                });
            }
        }
        ensure!(
            plan.finished == finished,
            "finished pulls {:?}, model {finished:?}",
            plan.finished
        );
        // Fairness, per plan: a pull gets a second message only when every
        // other waiting pull with room got one.
        for a in &eligible {
            for b in &eligible {
                let ga = got.get(&(a.session, a.pull_id)).copied().unwrap_or(0);
                let gb = got.get(&(b.session, b.pull_id)).copied().unwrap_or(0);
                ensure!(
                    ga <= gb + 1 || gb == b.remaining,
                    "pull {}/{} got {ga} while {}/{} (wants {}) got {gb}: {}",
                    a.session,
                    a.pull_id,
                    b.session,
                    b.pull_id,
                    b.remaining,
                    ctx()
                );
            }
        }

        // Each planned seq: not in flight, planned once, and allowed.
        let mut planned = BTreeSet::new();
        let chain_pos = self.chain.max(self.delivered.stream_seq);
        ensure!(
            chain_pos >= self.frontier(),
            "chain {chain_pos} behind the first deliveries in flight: {}",
            ctx()
        );
        let mut frontier = chain_pos;
        let mut firsts = Vec::new();
        let mut seen_first = false;
        for a in &plan.assignments {
            let seq = a.stream_seq;
            ensure!(
                !inflight_before.contains(&seq),
                "seq {seq} planned while in flight: {}",
                ctx()
            );
            ensure!(planned.insert(seq), "seq {seq} planned twice: {}", ctx());
            ensure!(
                self.stored.contains_key(&seq),
                "seq {seq} planned but not stored: {}",
                ctx()
            );
            if a.redelivery {
                ensure!(!seen_first, "redelivery after a first delivery: {}", ctx());
                let Some(p) = self.pending.get(&seq) else {
                    return Err(format!("redelivery of {seq}, not pending: {}", ctx()));
                };
                ensure!(
                    p.due_ms <= now,
                    "redelivery of {seq} at {now} before it is due at {}: {}",
                    p.due_ms,
                    ctx()
                );
                ensure!(
                    self.max_deliver <= 0 || (p.deliveries as i64) < self.max_deliver,
                    "redelivery of {seq} after {} deliveries, max_deliver {}: {}",
                    p.deliveries,
                    self.max_deliver,
                    ctx()
                );
            } else {
                seen_first = true;
                ensure!(
                    seq > frontier,
                    "first delivery of {seq} at or below {frontier}: {}",
                    ctx()
                );
                ensure!(
                    matches(self.filter, self.stored[&seq]),
                    "first delivery of {seq} ({}) outside filter {:?}",
                    self.stored[&seq],
                    self.filter
                );
                let skipped = (self.stored.range(frontier + 1..seq))
                    .find(|(_, subject)| matches(self.filter, subject));
                ensure!(
                    skipped.is_none(),
                    "first delivery of {seq} skips stored {skipped:?} (frontier {frontier}): {}",
                    ctx()
                );
                ensure!(
                    !self.settled.contains_key(&seq) && !self.pending.contains_key(&seq),
                    "first delivery of {seq}, already delivered: {}",
                    ctx()
                );
                frontier = seq;
                firsts.push(seq);
            }
        }
        for &seq in &plan.gone {
            ensure!(
                !inflight_before.contains(&seq) && planned.insert(seq),
                "gone {seq} planned twice: {}",
                ctx()
            );
            let due = self.pending.get(&seq).map(|p| p.due_ms);
            ensure!(
                due.is_some_and(|d| d <= now) && !self.stored.contains_key(&seq),
                "gone {seq} (due {due:?}) is not a due pending lost seq: {}",
                ctx()
            );
        }
        for &seq in &plan.exhausted {
            ensure!(
                !inflight_before.contains(&seq) && planned.insert(seq),
                "exhausted {seq} planned twice: {}",
                ctx()
            );
            let p = self.pending.get(&seq);
            ensure!(
                p.is_some_and(|p| p.due_ms <= now
                    && self.max_deliver > 0
                    && p.deliveries as i64 >= self.max_deliver),
                "exhausted {seq} ({p:?}, max_deliver {}) is not due and spent: {}",
                self.max_deliver,
                ctx()
            );
        }
        let inflight_firsts = self.inflight_firsts() + firsts.len();
        // MaxAckPending: pending plus first deliveries in flight.
        if self.max_ack_pending > 0 && !firsts.is_empty() {
            ensure!(
                pending_len + inflight_firsts <= self.max_ack_pending as usize,
                "{pending_len} pending + {inflight_firsts} in flight > max_ack_pending {}: {}",
                self.max_ack_pending,
                ctx()
            );
        }

        // Progress: a pull still waits and the plan had room, so nothing
        // that could go out was left behind.
        let used = plan.assignments.len() + plan.gone.len() + plan.exhausted.len();
        let due: Vec<(u64, MPending)> = (self.pending.iter())
            .filter(|(_, p)| p.due_ms <= now)
            .map(|(s, p)| (*s, *p))
            .collect();
        if used < max_batch && due.len() <= max_batch * 4 {
            for (seq, p) in &due {
                if inflight_before.contains(seq) || planned.contains(seq) {
                    continue;
                }
                let lost = !self.stored.contains_key(seq);
                let spent = self.max_deliver > 0 && p.deliveries as i64 >= self.max_deliver;
                ensure!(
                    !(lost || spent || !self.waiting.is_empty()),
                    "due seq {seq} ({p:?}, lost {lost}, spent {spent}) left out: {}",
                    ctx()
                );
            }
        }
        let room = match self.max_ack_pending {
            m if m > 0 => (m as usize).saturating_sub(pending_len + inflight_firsts),
            _ => usize::MAX,
        };
        // First deliveries follow the chain of plans in flight, each naming
        // the position it follows.
        match firsts.last() {
            Some(&last) => {
                ensure!(
                    plan.first_after == Some(chain_pos),
                    "first_after {:?}, model {chain_pos}: {}",
                    plan.first_after,
                    ctx()
                );
                self.chain = last;
            }
            None => ensure!(
                plan.first_after.is_none(),
                "first_after without first deliveries: {}",
                ctx()
            ),
        }
        if !self.waiting.is_empty() && plan.assignments.len() < max_batch && room > 0 {
            let next = (self.stored.range(frontier + 1..))
                .find(|(_, subject)| matches(self.filter, subject));
            ensure!(
                next.is_none(),
                "new message {next:?} left out with room {room}: {}",
                ctx()
            );
        }

        self.stats.firsts += firsts.len() as u64;
        if plan.has_proposal() {
            self.inflight.push_back(InFlight {
                plan,
                now_ms: now,
                max_deliver: self.max_deliver,
                firsts,
            });
        } else {
            ensure!(plan.all_seqs().is_empty(), "no proposal but seqs: {plan:?}");
        }
        Ok(())
    }

    /// The oldest proposal is committed: apply it to both, then settle.
    fn apply_oldest(&mut self) -> Check {
        self.apply(0)
    }

    /// Proposal `index` in flight is committed: apply it to both, then settle.
    fn apply(&mut self, index: usize) -> Check {
        let f = self.inflight.remove(index).expect("a proposal in flight");
        let plan = &f.plan;
        // Its first deliveries count only where the consumer is at the
        // position they were planned to follow.
        let stale = plan
            .first_after
            .is_some_and(|after| after != self.delivered.stream_seq);
        let got = (self.consumer).apply_deliver_after(
            &plan.stream_seqs(),
            &plan.gone,
            f.now_ms,
            plan.first_after,
        );
        let got_exhausted = self.consumer.apply_exhausted(&plan.exhausted);
        self.dispatcher.settle(&plan.all_seqs());
        self.settled_one();

        // The model's apply.
        for seq in &plan.gone {
            if self.pending.remove(seq).is_some() {
                self.settled.insert(*seq, Settled::Gone);
                self.stats.gone += 1;
            }
        }
        self.last_delivered_ms = self.last_delivered_ms.max(f.now_ms);
        let at = self.last_delivered_ms;
        let mut want = Vec::new();
        for a in &plan.assignments {
            let seq = a.stream_seq;
            let deliveries = if seq > self.delivered.stream_seq {
                if stale {
                    continue;
                }
                1
            } else if let Some(p) = self.pending.get(&seq) {
                p.deliveries + 1
            } else {
                // Acked, termed or lost since it was planned.
                continue;
            };
            ensure!(
                !self.settled.contains_key(&seq),
                "seq {seq} delivered again after {:?}",
                self.settled[&seq]
            );
            ensure!(
                f.max_deliver <= 0 || deliveries as i64 <= f.max_deliver,
                "seq {seq} delivered {deliveries} times, max_deliver {}",
                f.max_deliver
            );
            if deliveries == 1 {
                ensure!(
                    self.first_delivered.last().is_none_or(|l| *l < seq),
                    "first delivery of {seq} after {:?}",
                    self.first_delivered.last()
                );
                ensure!(
                    !a.redelivery,
                    "seq {seq} planned as a redelivery, delivered first"
                );
                self.first_delivered.push(seq);
                self.delivered.stream_seq = seq;
            } else {
                self.stats.redeliveries += 1;
            }
            self.delivered.consumer_seq += 1;
            let consumer_seq = self.delivered.consumer_seq;
            if self.ack_policy == AckPolicy::None {
                self.settled.insert(seq, Settled::Delivered);
            } else {
                let due_ms = at + self.wait_ms(deliveries);
                self.pending.insert(
                    seq,
                    MPending {
                        consumer_seq,
                        deliveries,
                        delivered_ms: at,
                        due_ms,
                    },
                );
            }
            want.push(Delivery {
                stream_seq: seq,
                consumer_seq,
                deliveries,
            });
        }
        ensure!(
            got == want,
            "apply_deliver of {plan:?} at {} gave {got:?}, model {want:?}",
            f.now_ms
        );
        let mut want_exhausted = Vec::new();
        for seq in &plan.exhausted {
            if self.pending.remove(seq).is_some() {
                self.settled.insert(*seq, Settled::Exhausted);
                want_exhausted.push(*seq);
            }
        }
        self.stats.exhausted += want_exhausted.len() as u64;
        ensure!(
            got_exhausted == want_exhausted,
            "apply_exhausted gave {got_exhausted:?}, model {want_exhausted:?}"
        );
        Ok(())
    }

    /// A proposal failed: nothing is applied, its seqs are settled.
    fn fail(&mut self, f: InFlight) {
        self.dispatcher.settle(&f.plan.all_seqs());
        self.settled_one();
        self.stats.failed += 1;
    }

    /// The invariants that hold after every step.
    fn check(&mut self) -> Check {
        // Pending sets agree, entry by entry.
        let core: Vec<(u64, MPending)> = (self.consumer.pending_iter())
            .map(|(s, p)| {
                let m = MPending {
                    consumer_seq: p.consumer_seq,
                    deliveries: p.deliveries,
                    delivered_ms: p.delivered_ms,
                    due_ms: p.redeliver_at_ms,
                };
                (s, m)
            })
            .collect();
        let model: Vec<(u64, MPending)> = self.pending.iter().map(|(s, p)| (*s, *p)).collect();
        ensure!(core == model, "pending {core:?}, model {model:?}");
        ensure!(
            self.consumer.num_ack_pending() as usize == self.pending.len(),
            "num_ack_pending"
        );
        for seq in self.pending.keys() {
            ensure!(
                !self.settled.contains_key(seq),
                "seq {seq} pending and {:?}",
                self.settled[seq]
            );
        }
        // Positions.
        let delivered = self.consumer.delivered();
        ensure!(
            delivered == self.delivered,
            "delivered {delivered:?}, model {:?}",
            self.delivered
        );
        ensure!(
            delivered.consumer_seq >= self.prev_delivered.consumer_seq
                && delivered.stream_seq >= self.prev_delivered.stream_seq,
            "delivered went back from {:?} to {delivered:?}",
            self.prev_delivered
        );
        self.prev_delivered = delivered;
        let floor = self.consumer.ack_floor();
        let want = match (
            self.pending.keys().next(),
            self.pending.values().map(|p| p.consumer_seq).min(),
        ) {
            (Some(s), Some(c)) => SeqPair {
                consumer_seq: c - 1,
                stream_seq: s - 1,
            },
            _ => self.delivered,
        };
        ensure!(floor == want, "ack floor {floor:?}, model {want:?}");
        ensure!(
            floor.consumer_seq >= self.prev_floor.consumer_seq
                && floor.stream_seq >= self.prev_floor.stream_seq,
            "ack floor went back from {:?} to {floor:?}",
            self.prev_floor
        );
        self.prev_floor = floor;
        // Dispatcher bookkeeping.
        ensure!(
            self.dispatcher.num_inflight() == self.inflight_seqs().len(),
            "{} seqs in flight, model {:?}",
            self.dispatcher.num_inflight(),
            self.inflight_seqs()
        );
        let waiting: Vec<(u64, u64, u32, u32)> = (self.dispatcher.waiting())
            .map(|w| (w.session, w.pull_id, w.remaining, w.delivered))
            .collect();
        let model: Vec<(u64, u64, u32, u32)> = (self.waiting.iter())
            .map(|w| (w.session, w.pull_id, w.remaining, w.delivered))
            .collect();
        ensure!(waiting == model, "waiting {waiting:?}, model {model:?}");
        // Nothing skipped: with nothing in flight, every stored matching
        // message at or below the position was delivered.
        if self.inflight.is_empty() {
            let delivered: BTreeSet<u64> = self.first_delivered.iter().copied().collect();
            let skipped = (self.stored.range(..=self.delivered.stream_seq))
                .find(|(s, subject)| matches(self.filter, subject) && !delivered.contains(s));
            ensure!(
                skipped.is_none(),
                "stored {skipped:?} is below the position {} and was never delivered",
                self.delivered.stream_seq
            );
        }
        // A pending message's due time never precedes its delivery.
        for (seq, p) in &self.pending {
            ensure!(p.due_ms >= p.delivered_ms, "seq {seq} due before delivered");
        }
        Ok(())
    }
}

fn run(setup: &Setup, ops: &[Op]) -> Result<Stats, String> {
    let mut sim = Sim::new(setup);
    sim.run(ops)?;
    Ok(sim.stats)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Every proposal is applied (possibly later, several in flight).
    #[test]
    fn matches_model_when_proposals_commit(setup in setup(), ops in ops(Failures::Never, false)) {
        run(&setup, &ops).map_err(TestCaseError::fail)?;
    }

    /// The newest proposal in flight may fail (Raft keeps a prefix).
    #[test]
    fn matches_model_when_newest_proposal_fails(setup in setup(), ops in ops(Failures::Newest, false)) {
        run(&setup, &ops).map_err(TestCaseError::fail)?;
    }

    /// Redeliveries dominate: time passes, naks, in-progress, config edits.
    #[test]
    fn matches_model_under_redeliveries(setup in setup(), ops in ops(Failures::Never, true)) {
        run(&setup, &ops).map_err(TestCaseError::fail)?;
    }

    /// Every proposal in flight may fail at once.
    #[test]
    fn matches_model_when_all_proposals_fail(setup in setup(), ops in ops(Failures::All, false)) {
        run(&setup, &ops).map_err(TestCaseError::fail)?;
    }
}

/// The generators reach the interesting paths at all: redeliveries,
/// MaxDeliver give-ups, lost messages, failed proposals, terms.
#[test]
fn generators_cover_the_interesting_paths() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut total = Stats::default();
    for _ in 0..64 {
        let setup = setup().new_tree(&mut runner).unwrap().current();
        let ops = ops(Failures::All, true)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let s = run(&setup, &ops).unwrap_or_default();
        total.firsts += s.firsts;
        total.redeliveries += s.redeliveries;
        total.exhausted += s.exhausted;
        total.gone += s.gone;
        total.failed += s.failed;
        total.termed += s.termed;
        total.acked += s.acked;
    }
    assert!(
        total.firsts > 0
            && total.redeliveries > 0
            && total.exhausted > 0
            && total.gone > 0
            && total.failed > 0
            && total.termed > 0
            && total.acked > 0,
        "{total:?}"
    );
}

// ---------------------------------------------------------------------------
// Minimal cases of wharf-core bugs the model found. They fail until the bug
// is fixed in src/ (not here).

/// WHARF-CORE BUG, found by `matches_model_when_newest_proposal_fails`: the
/// newest proposal fails while an older one with first deliveries is still
/// in flight. `Dispatcher::settle` leaves the cursor past the failed first
/// delivery (it falls back only once no first delivery is in flight), so the
/// next plan continues after it; once the older proposal and the next one
/// are applied, `delivered.stream_seq` is past the failed seq, and
/// `apply_deliver` would skip it (not new, not pending): it is never
/// delivered. Raft allows exactly this order (the log keeps A, loses B).
#[test]
fn failed_newest_proposal_loses_no_message() {
    let mut stream = StreamState::new(
        StreamConfig {
            name: "S".into(),
            subjects: vec!["orders.>".into()],
            ..StreamConfig::default()
        }
        .with_defaults(),
    );
    for _ in 0..3 {
        stream.append("orders.eu", 10, T0).unwrap();
    }
    let mut consumer = ConsumerState::new(
        ConsumerConfig {
            name: "C".into(),
            ..ConsumerConfig::default()
        }
        .with_defaults(),
    );
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 10, None, 512).unwrap();
    let a = d.plan(&consumer, &stream, T0, 1);
    assert_eq!(a.stream_seqs(), [1]);
    // B is planned while A is in flight and fails; C follows B. Applying C
    // after A must not move the position past 2 (this once lost seq 2):
    // C names the position it follows, so its first delivery is skipped.
    let b = d.plan(&consumer, &stream, T0, 1);
    assert_eq!(b.stream_seqs(), [2]);
    d.settle(&b.all_seqs()); // B failed.
    let c = d.plan(&consumer, &stream, T0, 1);
    for p in [a, c] {
        consumer.apply_deliver_after(&p.stream_seqs(), &p.gone, T0, p.first_after);
        d.settle(&p.all_seqs());
    }
    // Whatever is left goes out now.
    for _ in 0..3 {
        let p = d.plan(&consumer, &stream, T0, 10);
        consumer.apply_deliver_after(&p.stream_seqs(), &p.gone, T0, p.first_after);
        d.settle(&p.all_seqs());
    }
    let pending: Vec<u64> = consumer.pending_iter().map(|(s, _)| s).collect();
    assert_eq!(pending, [1, 2, 3], "a message was never delivered");
}
