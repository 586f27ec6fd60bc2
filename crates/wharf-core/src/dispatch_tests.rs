//! Unit tests for the dispatcher: pull bookkeeping, round-robin order,
//! MaxAckPending with proposals in flight, redeliveries, gone messages,
//! expiry and session removal.

use super::*;
use crate::consumer::{ConsumerConfig, SeqPair};
use crate::stream::StreamConfig;

fn stream(subjects: &[&str]) -> StreamState {
    let cfg = StreamConfig {
        name: "S".into(),
        subjects: subjects.iter().map(|s| s.to_string()).collect(),
        ..StreamConfig::default()
    }
    .with_defaults();
    cfg.validate().expect("valid");
    StreamState::new(cfg)
}

fn consumer(filter: Option<&str>, max_ack_pending: i64) -> ConsumerState {
    let cfg = ConsumerConfig {
        name: "C".into(),
        filter_subject: filter.map(str::to_string),
        ack_wait_ms: 1000,
        max_ack_pending,
        ..ConsumerConfig::default()
    }
    .with_defaults();
    cfg.validate().expect("valid");
    ConsumerState::new(cfg)
}

fn publish(s: &mut StreamState, subject: &str, n: usize) {
    for _ in 0..n {
        s.append(subject, 1, 0).expect("append");
    }
}

/// (session, stream_seq) of each assignment.
fn who(plan: &Plan) -> Vec<(u64, u64)> {
    plan.assignments
        .iter()
        .map(|a| (a.session, a.stream_seq))
        .collect()
}

/// Plans, applies and settles like the server does.
fn dispatch(d: &mut Dispatcher, c: &mut ConsumerState, s: &StreamState, now_ms: i64) -> Plan {
    let plan = d.plan(c, s, now_ms, 100);
    c.apply_deliver(&plan.stream_seqs(), &plan.gone, now_ms);
    d.settle(&plan.stream_seqs());
    plan
}

#[test]
fn add_pull_errors() {
    let mut d = Dispatcher::new();
    assert_eq!(d.add_pull(1, 1, 0, None, 10), Err(CoreError::InvalidBatch));
    d.add_pull(1, 1, 1, None, 2).unwrap();
    assert_eq!(
        d.add_pull(1, 1, 1, None, 2),
        Err(CoreError::DuplicatePull {
            session: 1,
            pull_id: 1
        })
    );
    d.add_pull(2, 1, 1, None, 2).unwrap();
    let err = d.add_pull(3, 1, 1, None, 2).unwrap_err();
    assert_eq!(err, CoreError::TooManyWaiting { max_waiting: 2 });
    assert_eq!(
        err.to_string(),
        "too many waiting pull requests: the consumer allows at most 2"
    );
    assert_eq!(d.num_waiting(), 2);
}

#[test]
fn round_robin_across_pulls() {
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 5);
    let mut c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 3, None, 10).unwrap();
    d.add_pull(2, 1, 1, None, 10).unwrap();
    d.add_pull(3, 1, 2, None, 10).unwrap();
    let plan = dispatch(&mut d, &mut c, &s, 0);
    assert_eq!(who(&plan), vec![(1, 1), (2, 2), (3, 3), (1, 4), (3, 5)]);
    let done: Vec<_> = plan
        .finished
        .iter()
        .map(|f| (f.session, f.delivered, f.end))
        .collect();
    assert_eq!(done, vec![(2, 1, PullEnd::Done), (3, 2, PullEnd::Done)]);
    let left: Vec<_> = d
        .waiting()
        .map(|w| (w.session, w.remaining, w.delivered))
        .collect();
    assert_eq!(left, vec![(1, 1, 2)]);
}

#[test]
fn max_batch_limits_a_plan() {
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 5);
    let c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 10, None, 10).unwrap();
    assert_eq!(who(&d.plan(&c, &s, 0, 2)), vec![(1, 1), (1, 2)]);
    assert_eq!(who(&d.plan(&c, &s, 0, 0)), vec![]);
}

#[test]
fn inflight_seqs_are_not_planned_twice_and_count_against_max_ack_pending() {
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 6);
    let mut c = consumer(None, 3);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 10, None, 10).unwrap();
    let p1 = d.plan(&c, &s, 0, 2);
    assert_eq!(who(&p1), vec![(1, 1), (1, 2)]);
    assert_eq!(d.num_inflight(), 2);
    assert_eq!(p1.first_after, Some(0));
    // Not applied yet, but they count against MaxAckPending: one slot left
    // for a second plan, which follows the first.
    let p2 = d.plan(&c, &s, 0, 100);
    assert_eq!(who(&p2), vec![(1, 3)]);
    assert_eq!(p2.first_after, Some(2));
    assert!(
        d.plan(&c, &s, 0, 100).assignments.is_empty(),
        "3 outstanding"
    );
    for p in [p1, p2] {
        c.apply_deliver_after(&p.stream_seqs(), &[], 0, p.first_after);
        d.settle(&p.stream_seqs());
    }
    assert!(d.plan(&c, &s, 0, 100).assignments.is_empty(), "3 pending");
    c.apply_ack(&[2]);
    assert_eq!(who(&d.plan(&c, &s, 0, 100)), vec![(1, 4)]);
}

#[test]
fn failed_proposal_is_planned_again() {
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 2);
    let c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 10, None, 10).unwrap();
    let p = d.plan(&c, &s, 0, 100);
    assert_eq!(p.stream_seqs(), vec![1, 2]);
    d.settle(&p.stream_seqs()); // never applied
    assert_eq!(d.plan(&c, &s, 0, 100).stream_seqs(), vec![1, 2]);
    d.reset();
    assert_eq!(d.num_inflight(), 0);
    assert_eq!(d.plan(&c, &s, 0, 100).stream_seqs(), vec![1, 2]);
}

#[test]
fn redeliveries_come_first_and_skip_inflight() {
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 3);
    let mut c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 2, None, 10).unwrap();
    dispatch(&mut d, &mut c, &s, 0); // 1, 2 pending
    d.add_pull(2, 1, 3, None, 10).unwrap();
    let p = d.plan(&c, &s, 1000, 1);
    assert_eq!(p.assignments[0].stream_seq, 1);
    assert!(p.assignments[0].redelivery);
    // 1 is in flight: the next plan redelivers 2, then the new message 3.
    let p2 = d.plan(&c, &s, 1000, 100);
    let got: Vec<_> = p2
        .assignments
        .iter()
        .map(|a| (a.stream_seq, a.redelivery))
        .collect();
    assert_eq!(got, vec![(2, true), (3, false)]);
}

#[test]
fn gone_messages_are_reported_not_delivered() {
    let cfg = StreamConfig {
        name: "S".into(),
        subjects: vec!["a".into()],
        max_msgs: 2,
        ..StreamConfig::default()
    }
    .with_defaults();
    let mut s = StreamState::new(cfg);
    publish(&mut s, "a", 2);
    let mut c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 2, None, 10).unwrap();
    dispatch(&mut d, &mut c, &s, 0);
    publish(&mut s, "a", 1); // removes 1
    d.add_pull(1, 2, 5, None, 10).unwrap();
    let p = dispatch(&mut d, &mut c, &s, 1000);
    assert_eq!(p.gone, vec![1]);
    let got: Vec<_> = p
        .assignments
        .iter()
        .map(|a| (a.stream_seq, a.redelivery))
        .collect();
    assert_eq!(got, vec![(2, true), (3, false)]);
    assert_eq!(c.pending(1), None);
    assert_eq!(c.num_ack_pending(), 2);
}

#[test]
fn filter_skips_other_subjects() {
    let mut s = stream(&["orders.>"]);
    publish(&mut s, "orders.created", 2);
    publish(&mut s, "orders.shipped", 1);
    publish(&mut s, "orders.created", 1);
    publish(&mut s, "orders.shipped", 1);
    let mut c = consumer(Some("orders.shipped"), -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 10, None, 10).unwrap();
    assert_eq!(dispatch(&mut d, &mut c, &s, 0).stream_seqs(), vec![3, 5]);
    assert_eq!(
        c.delivered(),
        SeqPair {
            consumer_seq: 2,
            stream_seq: 5
        }
    );
}

#[test]
fn expiry_and_session_removal() {
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 1, Some(500), 10).unwrap();
    d.add_pull(2, 1, 1, Some(100), 10).unwrap();
    d.add_pull(1, 2, 1, None, 10).unwrap();
    d.add_pull(3, 1, 1, None, 10).unwrap();
    assert_eq!(d.next_expiry_ms(), Some(100));
    assert_eq!(d.expire(99), vec![]);
    assert_eq!(
        d.expire(100),
        vec![FinishedPull {
            session: 2,
            pull_id: 1,
            delivered: 0,
            end: PullEnd::Expired
        }]
    );
    assert_eq!(d.remove_session(1), 2);
    assert_eq!(d.remove_session(1), 0);
    assert_eq!(d.num_waiting(), 1);
    assert_eq!(d.next_expiry_ms(), None);

    // plan() expires first, so an expired pull gets nothing.
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 1);
    let c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 1, Some(10), 10).unwrap();
    d.add_pull(2, 1, 1, None, 10).unwrap();
    let p = d.plan(&c, &s, 10, 100);
    assert_eq!(who(&p), vec![(2, 1)]);
    let ends: Vec<_> = p.finished.iter().map(|f| (f.session, f.end)).collect();
    assert_eq!(ends, vec![(1, PullEnd::Expired), (2, PullEnd::Done)]);
}

#[test]
fn nothing_waiting_plans_nothing() {
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 3);
    let c = consumer(None, -1);
    let mut d = Dispatcher::new();
    assert!(d.plan(&c, &s, 0, 100).is_empty());
    assert_eq!(d.num_inflight(), 0);
}

/// Chaos run seed 2030 (docs/RELIABILITY.md, bug 8): a new consumer leader
/// planned from its node's stream replica, which trailed the stream's
/// leader, and declared the pending messages it could not find gone.
#[test]
fn a_trailing_stream_replica_does_not_make_pending_messages_gone() {
    let mut full = stream(&["a"]);
    publish(&mut full, "a", 3);
    let mut c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 3, None, 10).unwrap();
    let p = dispatch(&mut d, &mut c, &full, 0);
    assert_eq!(who(&p), vec![(1, 1), (1, 2), (1, 3)]);

    // A new leader whose stream replica has stored only seqs 1 and 2 yet.
    let mut trailing = stream(&["a"]);
    publish(&mut trailing, "a", 2);
    let mut d = Dispatcher::new();
    d.add_pull(2, 1, 10, None, 100_000).unwrap();
    let p = dispatch(&mut d, &mut c, &trailing, 5000);
    assert!(p.gone.is_empty(), "gone: {:?}", p.gone);
    assert_eq!(who(&p), vec![(2, 1), (2, 2)]);
    assert!(c.pending(3).is_some(), "seq 3 must stay pending");

    // Once the replica has caught up, seq 3 is redelivered.
    let p = dispatch(&mut d, &mut c, &full, 5000);
    assert!(p.gone.is_empty(), "gone: {:?}", p.gone);
    assert_eq!(who(&p), vec![(2, 3)]);
}

#[test]
fn a_plan_overtaking_a_failed_one_delivers_none_of_its_new_messages() {
    let mut s = stream(&["a"]);
    publish(&mut s, "a", 3);
    let mut c = consumer(None, -1);
    let mut d = Dispatcher::new();
    d.add_pull(1, 1, 10, None, 10).unwrap();
    let p1 = d.plan(&c, &s, 0, 1);
    let p2 = d.plan(&c, &s, 0, 1);
    let p3 = d.plan(&c, &s, 0, 1);
    assert_eq!(
        [p1.stream_seqs(), p2.stream_seqs(), p3.stream_seqs()],
        [[1], [2], [3]]
    );
    // p2 fails; p1 and p3 commit. p3 followed p2, so applying it must not
    // move the position past 2, which nobody was given.
    d.settle(&p2.stream_seqs());
    let got1 = c.apply_deliver_after(&p1.stream_seqs(), &[], 0, p1.first_after);
    d.settle(&p1.stream_seqs());
    let got3 = c.apply_deliver_after(&p3.stream_seqs(), &[], 0, p3.first_after);
    d.settle(&p3.stream_seqs());
    assert_eq!(got1.len(), 1);
    assert!(got3.is_empty(), "{got3:?}");
    assert_eq!(c.delivered().stream_seq, 1);
    // Nothing in flight: planning starts again from the position.
    let again = d.plan(&c, &s, 0, 10);
    assert_eq!(again.stream_seqs(), [2, 3]);
    assert_eq!(again.first_after, Some(1));
    let got = c.apply_deliver_after(&again.stream_seqs(), &[], 0, again.first_after);
    assert_eq!(got.iter().map(|g| g.stream_seq).collect::<Vec<_>>(), [2, 3]);
}
