//! Property tests of work-queue and interest retention against a reference
//! model.
//!
//! Random sequences of publishes, deliveries, acks, naks, terms, timeouts
//! (redeliveries up to MaxDeliver), dead-letter publications and progress
//! reports of a second consumer drive one [`StreamState`] and one
//! [`ConsumerState`]; after every step the consumer's progress is reported
//! to the stream (as the stream leader does from its consumer replica). The
//! model keeps, with plain sets, what each consumer has finished:
//!
//! - work queue: a message the consumer matches is stored exactly until the
//!   consumer has acked, termed or given up on it (and its dead-letter copy,
//!   when configured, is out); a message no consumer matches stays;
//! - interest: a message is stored exactly until every consumer whose filter
//!   matches it has finished it (none: removed at publish);
//! - sequences are removed at most once and never come back; a stale
//!   (older) progress report removes nothing new.
//!
//! Left out: limits (they remove messages on their own, checked in
//! `model.rs`), dispatch (deliveries here are chosen directly).

use std::collections::BTreeSet;

use proptest::prelude::*;
use wharf_core::{
    AckPolicy, ConsumerConfig, ConsumerProgress, ConsumerState, RetentionPolicy, StreamConfig,
    StreamState,
};

const T0: i64 = 1_000_000;
const ACK_WAIT_MS: u64 = 1_000;
const SUBJECTS: [&str; 3] = ["jobs.a", "jobs.b", "jobs.c"];
/// The second consumer ("audit", interest only) matches these.
const AUDIT_FILTER: &str = "jobs.b";
const WORKERS_ID: u64 = 1;
const AUDIT_ID: u64 = 2;

#[derive(Debug, Clone)]
enum Op {
    Publish(usize),
    Deliver(usize),
    Ack(usize),
    Nak(usize),
    Term(usize),
    Timeout,
    DeadLettered,
    AuditProgress(usize),
    StaleReport,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SUBJECTS.len()).prop_map(Op::Publish),
        3 => (1usize..4).prop_map(Op::Deliver),
        3 => any::<usize>().prop_map(Op::Ack),
        1 => any::<usize>().prop_map(Op::Nak),
        1 => any::<usize>().prop_map(Op::Term),
        2 => Just(Op::Timeout),
        1 => Just(Op::DeadLettered),
        1 => (0usize..40).prop_map(Op::AuditProgress),
        1 => Just(Op::StaleReport),
    ]
}

struct World {
    retention: RetentionPolicy,
    stream: StreamState,
    consumer: ConsumerState,
    now_ms: i64,
    /// Every published seq with its subject index.
    published: Vec<(u64, usize)>,
    /// Seqs the workers consumer is finished with (model).
    workers_done: BTreeSet<u64>,
    /// Seqs waiting for a dead-letter copy (model).
    outbox: BTreeSet<u64>,
    /// The audit consumer's reported position (interest only).
    audit_position: u64,
    /// Seqs removed so far.
    removed: BTreeSet<u64>,
    /// The first progress ever reported, replayed by `StaleReport`.
    first_report: Option<ConsumerProgress>,
}

impl World {
    fn new(retention: RetentionPolicy, filter: Option<&str>, dead_letter: bool) -> World {
        let stream_config = StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            retention,
            ..StreamConfig::default()
        }
        .with_defaults();
        let consumer_config = ConsumerConfig {
            name: "workers".into(),
            filter_subject: filter.map(str::to_string),
            ack_wait_ms: ACK_WAIT_MS,
            max_deliver: 3,
            ack_policy: AckPolicy::Explicit,
            dead_letter_subject: dead_letter.then(|| "dlq.jobs".to_string()),
            ..ConsumerConfig::default()
        }
        .with_defaults();
        let mut stream = StreamState::new(stream_config);
        let mut consumers = vec![(
            "workers".to_string(),
            WORKERS_ID,
            consumer_config
                .filters()
                .iter()
                .map(|f| f.to_string())
                .collect(),
        )];
        if retention == RetentionPolicy::Interest {
            consumers.push(("audit".into(), AUDIT_ID, vec![AUDIT_FILTER.into()]));
        }
        assert!(stream.set_consumers(consumers).is_empty());
        World {
            retention,
            stream,
            consumer: ConsumerState::new(consumer_config),
            now_ms: T0,
            published: Vec::new(),
            workers_done: BTreeSet::new(),
            outbox: BTreeSet::new(),
            audit_position: 0,
            removed: BTreeSet::new(),
            first_report: None,
        }
    }

    fn workers_match(&self, subject: usize) -> bool {
        self.consumer.config().matches(SUBJECTS[subject])
    }

    fn pending(&self) -> Vec<u64> {
        self.consumer.pending_iter().map(|(s, _)| s).collect()
    }

    fn pick(&self, i: usize) -> Option<u64> {
        let p = self.pending();
        (!p.is_empty()).then(|| p[i % p.len()])
    }

    fn finish(&mut self, seq: u64, dead_letter: bool) {
        if dead_letter && self.consumer.config().dead_letter_subject.is_some() {
            self.outbox.insert(seq);
        } else {
            self.workers_done.insert(seq);
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        self.now_ms += 100;
        let now = self.now_ms;
        let mut removed = Vec::new();
        match op {
            Op::Publish(s) => {
                let a = (self.stream.append(SUBJECTS[*s], 10, now)).map_err(|e| e.to_string())?;
                self.published.push((a.seq, *s));
                removed.extend(a.removed);
            }
            Op::Deliver(n) => {
                let mut after = self.consumer.delivered().stream_seq;
                let mut seqs = Vec::new();
                while seqs.len() < *n {
                    let Some(seq) = self.consumer.config().next_matching(&self.stream, after)
                    else {
                        break;
                    };
                    seqs.push(seq);
                    after = seq;
                }
                self.consumer.apply_deliver(&seqs, &[], now);
            }
            Op::Ack(i) => {
                if let Some(seq) = self.pick(*i) {
                    self.consumer.apply_ack(&[seq]);
                    self.finish(seq, false);
                }
            }
            Op::Nak(i) => {
                if let Some(seq) = self.pick(*i) {
                    self.consumer.apply_nak(seq, 0, now);
                }
            }
            Op::Term(i) => {
                if let Some(seq) = self.pick(*i) {
                    self.consumer.apply_term(seq, "model");
                    self.finish(seq, true);
                }
            }
            Op::Timeout => {
                self.now_ms += ACK_WAIT_MS as i64;
                let due = self.consumer.due_for_redelivery(self.now_ms, 100);
                let (exhausted, again): (Vec<u64>, Vec<u64>) =
                    due.into_iter().partition(|s| self.consumer.exhausted(*s));
                for seq in self.consumer.apply_exhausted(&exhausted) {
                    self.finish(seq, true);
                }
                self.consumer.apply_deliver(&again, &[], self.now_ms);
            }
            Op::DeadLettered => {
                let out: Vec<u64> = self.outbox.iter().copied().collect();
                self.consumer.apply_dead_lettered(&out, &[]);
                self.workers_done.extend(std::mem::take(&mut self.outbox));
            }
            Op::AuditProgress(p) => {
                let last = self.stream.stats().last_seq;
                self.audit_position = self.audit_position.max((*p as u64).min(last));
                let progress = ConsumerProgress {
                    started: true,
                    position: self.audit_position,
                    ..ConsumerProgress::default()
                };
                removed.extend(self.stream.record_progress("audit", AUDIT_ID, progress));
            }
            Op::StaleReport => {
                if let Some(old) = self.first_report.clone() {
                    let r = self.stream.record_progress("workers", WORKERS_ID, old);
                    if !r.is_empty() {
                        return Err(format!("a stale report removed {r:?}"));
                    }
                }
            }
        }
        let progress = self.consumer.progress();
        self.first_report.get_or_insert_with(|| progress.clone());
        removed.extend(self.stream.record_progress("workers", WORKERS_ID, progress));
        for seq in removed {
            if !self.removed.insert(seq) {
                return Err(format!("seq {seq} removed twice"));
            }
        }
        self.check()
    }

    /// Should `seq` (subject index `s`) still be stored, by the model?
    fn should_be_stored(&self, seq: u64, s: usize) -> bool {
        let workers = self.workers_match(s);
        let workers_done = self.workers_done.contains(&seq);
        match self.retention {
            RetentionPolicy::WorkQueue => !workers || !workers_done,
            RetentionPolicy::Interest => {
                let audit = SUBJECTS[s] == AUDIT_FILTER;
                let audit_done = seq <= self.audit_position;
                (workers && !workers_done) || (audit && !audit_done)
            }
            RetentionPolicy::Limits => true,
        }
    }

    fn check(&self) -> Result<(), String> {
        for &(seq, s) in &self.published {
            let stored = self.stream.get(seq).is_some();
            let want = self.should_be_stored(seq, s);
            if stored != want {
                return Err(format!(
                    "seq {seq} ({}) stored={stored}, model says {want}; done={:?} outbox={:?} pending={:?}",
                    SUBJECTS[s],
                    self.workers_done,
                    self.outbox,
                    self.pending()
                ));
            }
            if self.removed.contains(&seq) == stored {
                return Err(format!("seq {seq}: removed list and index disagree"));
            }
        }
        Ok(())
    }
}

fn run(
    retention: RetentionPolicy,
    filter: Option<&str>,
    dlq: bool,
    ops: &[Op],
) -> Result<(), String> {
    let mut world = World::new(retention, filter, dlq);
    for (i, op) in ops.iter().enumerate() {
        world
            .step(op)
            .map_err(|e| format!("step {i} {op:?}: {e}"))?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Work queue, consumer on every subject: messages go exactly when done.
    #[test]
    fn workqueue_messages_disappear_exactly_when_done(
        dlq in any::<bool>(), ops in prop::collection::vec(op(), 1..120)
    ) {
        run(RetentionPolicy::WorkQueue, None, dlq, &ops).map_err(TestCaseError::fail)?;
    }

    /// Work queue, filtered consumer: unmatched messages stay.
    #[test]
    fn workqueue_keeps_messages_no_consumer_matches(
        dlq in any::<bool>(), ops in prop::collection::vec(op(), 1..120)
    ) {
        run(RetentionPolicy::WorkQueue, Some("jobs.a"), dlq, &ops).map_err(TestCaseError::fail)?;
    }

    /// Interest: two consumers, removed when every matching one is done.
    #[test]
    fn interest_waits_for_every_matching_consumer(
        filtered in any::<bool>(), dlq in any::<bool>(), ops in prop::collection::vec(op(), 1..120)
    ) {
        let filter = filtered.then_some("jobs.a");
        run(RetentionPolicy::Interest, filter, dlq, &ops).map_err(TestCaseError::fail)?;
    }
}
