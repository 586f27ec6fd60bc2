//! Unit tests for consumer state: config rules, first deliveries and
//! redeliveries, acks, the ack floor, AckWait and the MaxAckPending gate.

use super::*;

fn config() -> ConsumerConfig {
    ConsumerConfig {
        name: "workers".to_string(),
        ack_wait_ms: 1000,
        ..ConsumerConfig::default()
    }
    .with_defaults()
}

fn consumer(cfg: ConsumerConfig) -> ConsumerState {
    cfg.validate().expect("test config is valid");
    ConsumerState::new(cfg)
}

fn pair(consumer_seq: u64, stream_seq: u64) -> SeqPair {
    SeqPair {
        consumer_seq,
        stream_seq,
    }
}

#[test]
fn defaults() {
    let c = ConsumerConfig {
        name: "c".into(),
        filter_subject: Some(String::new()),
        ..ConsumerConfig::default()
    }
    .with_defaults();
    assert_eq!(c.ack_wait_ms, 30_000);
    assert_eq!(c.max_ack_pending, 1000);
    assert_eq!(c.max_waiting, 512);
    assert_eq!(c.filter_subject, None);
    let unlimited = ConsumerConfig {
        max_ack_pending: -7,
        ..c
    }
    .with_defaults();
    assert_eq!(unlimited.max_ack_pending, -1);
    assert_eq!(unlimited.validate(), Ok(()));
}

#[test]
fn validate_and_update_rules() {
    assert!(ConsumerConfig {
        name: "a b".into(),
        ..config()
    }
    .validate()
    .is_err());
    let bad_filter = ConsumerConfig {
        filter_subject: Some("a.>.b".into()),
        ..config()
    };
    assert!(bad_filter.validate().is_err());
    let no_wait = ConsumerConfig {
        ack_wait_ms: 0,
        ..config()
    };
    assert_eq!(
        no_wait.validate().unwrap_err().to_string(),
        "invalid consumer configuration: ack_wait_ms must be at least 1"
    );

    let old = ConsumerConfig {
        filter_subject: Some("a".into()),
        ..config()
    };
    let refilter = ConsumerConfig {
        filter_subject: Some("b".into()),
        ..old.clone()
    };
    assert_eq!(
        old.check_update(&refilter).unwrap_err().to_string(),
        "cannot update consumer \"workers\": filter subject cannot be changed"
    );
    let renamed = ConsumerConfig {
        name: "other".into(),
        ..old.clone()
    };
    assert!(old.check_update(&renamed).is_err());
    let tuned = ConsumerConfig {
        ack_wait_ms: 5,
        max_ack_pending: 3,
        max_waiting: 9,
        ..old.clone()
    };
    assert_eq!(old.check_update(&tuned), Ok(()));
}

#[test]
fn first_deliveries_and_acks() {
    let mut c = consumer(config());
    let d = c.apply_deliver(&[4, 6], &[], 100);
    assert_eq!(
        d,
        vec![
            Delivery {
                stream_seq: 4,
                consumer_seq: 1,
                deliveries: 1
            },
            Delivery {
                stream_seq: 6,
                consumer_seq: 2,
                deliveries: 1
            },
        ]
    );
    assert_eq!(c.delivered(), pair(2, 6));
    assert_eq!(c.ack_floor(), pair(0, 3));
    assert_eq!(c.num_ack_pending(), 2);
    assert_eq!(c.apply_ack(&[6, 6, 99]), 1);
    assert_eq!(c.ack_floor(), pair(0, 3));
    assert_eq!(c.apply_ack(&[4]), 1);
    assert_eq!(c.ack_floor(), pair(2, 6));
    assert_eq!(c.num_ack_pending(), 0);
    // Old or acked seqs are skipped: no consumer seq is used.
    assert_eq!(c.apply_deliver(&[4, 5, 6], &[], 200), vec![]);
    assert_eq!(c.delivered(), pair(2, 6));
}

#[test]
fn redelivery_takes_new_consumer_seq_and_counts_once() {
    let mut c = consumer(config());
    c.apply_deliver(&[1, 2], &[], 0);
    assert_eq!(c.due_for_redelivery(999, 10), Vec::<u64>::new());
    assert_eq!(c.next_redelivery_ms(), Some(1000));
    assert_eq!(c.due_for_redelivery(1000, 10), vec![1, 2]);
    assert_eq!(c.due_for_redelivery(1000, 1), vec![1]);

    let d = c.apply_deliver(&[1], &[], 1000);
    assert_eq!(
        d,
        vec![Delivery {
            stream_seq: 1,
            consumer_seq: 3,
            deliveries: 2
        }]
    );
    assert_eq!(c.num_redelivered(), 1);
    assert_eq!(
        c.pending(1),
        Some(&Pending {
            consumer_seq: 3,
            deliveries: 2,
            delivered_ms: 1000,
            redeliver_at_ms: 2000
        })
    );
    // Redelivery order follows the latest delivery: 2 is now oldest.
    assert_eq!(c.due_for_redelivery(2000, 10), vec![2, 1]);
    assert_eq!(c.ack_floor(), pair(1, 0));
    assert_eq!(c.delivered(), pair(3, 2));

    c.apply_deliver(&[1], &[], 2000);
    assert_eq!(c.pending(1).map(|p| p.deliveries), Some(3));
    assert_eq!(c.num_redelivered(), 1, "counted once per message");
    c.apply_deliver(&[2], &[], 2000);
    assert_eq!(c.num_redelivered(), 2);
    c.apply_ack(&[1, 2]);
    assert_eq!(c.num_redelivered(), 2, "survives the ack");
    assert_eq!(c.next_redelivery_ms(), None);
    assert_eq!(c.ack_floor(), pair(5, 2));
}

#[test]
fn gone_messages_leave_pending() {
    let mut c = consumer(config());
    c.apply_deliver(&[1, 2, 3], &[], 0);
    let d = c.apply_deliver(&[2], &[1, 42], 5000);
    assert_eq!(
        d,
        vec![Delivery {
            stream_seq: 2,
            consumer_seq: 4,
            deliveries: 2
        }]
    );
    assert_eq!(c.pending(1), None);
    assert_eq!(c.num_ack_pending(), 2);
    assert_eq!(c.ack_floor(), pair(2, 1));
}

#[test]
fn ack_floor_never_moves_backwards() {
    let mut c = consumer(config());
    let mut last = c.ack_floor();
    let steps: Vec<(&[u64], &[u64])> = vec![
        (&[1, 2, 3], &[]),
        (&[], &[2]),
        (&[1], &[]),
        (&[4, 5], &[]),
        (&[], &[1]),
        (&[3, 5], &[]),
        (&[], &[3, 4, 5]),
        (&[9], &[]),
        (&[], &[9]),
    ];
    for (i, (deliver, ack)) in steps.into_iter().enumerate() {
        c.apply_deliver(deliver, &[], i as i64 * 10);
        c.apply_ack(ack);
        let floor = c.ack_floor();
        assert!(
            floor.stream_seq >= last.stream_seq,
            "step {i}: {floor:?} < {last:?}"
        );
        assert!(
            floor.consumer_seq >= last.consumer_seq,
            "step {i}: {floor:?} < {last:?}"
        );
        assert!(floor.stream_seq <= c.delivered().stream_seq);
        assert!(floor.consumer_seq <= c.delivered().consumer_seq);
        last = floor;
    }
    assert_eq!(c.ack_floor(), c.delivered());
}

#[test]
fn delivery_time_never_goes_backwards() {
    let mut c = consumer(config());
    c.apply_deliver(&[1], &[], 5000);
    c.apply_deliver(&[2], &[], 10); // new leader with a clock behind
    assert_eq!(c.pending(2).map(|p| p.delivered_ms), Some(5000));
    assert_eq!(c.due_for_redelivery(5999, 10), Vec::<u64>::new());
    assert_eq!(c.due_for_redelivery(6000, 10), vec![1, 2]);
}

#[test]
fn max_ack_pending_gate() {
    let mut c = consumer(ConsumerConfig {
        max_ack_pending: 3,
        ..config()
    });
    assert_eq!(c.ack_pending_room(0), 3);
    assert_eq!(c.ack_pending_room(2), 1);
    assert_eq!(c.ack_pending_room(5), 0);
    c.apply_deliver(&[1, 2], &[], 0);
    assert_eq!(c.ack_pending_room(0), 1);
    assert_eq!(c.ack_pending_room(1), 0);
    c.apply_ack(&[1]);
    assert_eq!(c.ack_pending_room(0), 2);

    let unlimited = consumer(ConsumerConfig {
        max_ack_pending: -1,
        ..config()
    });
    assert_eq!(unlimited.ack_pending_room(1_000_000), usize::MAX);

    // Lowering the limit below what is pending leaves no room, no underflow.
    let lower = ConsumerConfig {
        max_ack_pending: 1,
        ..c.config().clone()
    };
    c.update_config(lower).unwrap();
    c.apply_deliver(&[3, 4], &[], 0);
    assert_eq!(c.ack_pending_room(0), 0);
}

#[test]
fn updated_ack_wait_applies_to_pending() {
    let mut c = consumer(config());
    c.apply_deliver(&[1], &[], 0);
    let longer = ConsumerConfig {
        ack_wait_ms: 5000,
        ..c.config().clone()
    };
    c.update_config(longer).unwrap();
    assert_eq!(c.next_redelivery_ms(), Some(5000));
    assert!(c
        .update_config(ConsumerConfig {
            name: "x".into(),
            ..config()
        })
        .is_err());
}

#[test]
fn huge_ack_wait_does_not_overflow() {
    let mut c = consumer(ConsumerConfig {
        ack_wait_ms: u64::MAX,
        ..config()
    });
    c.apply_deliver(&[1], &[], i64::MAX - 1);
    assert_eq!(c.next_redelivery_ms(), Some(i64::MAX));
    assert_eq!(c.due_for_redelivery(i64::MAX - 1, 10), Vec::<u64>::new());
}

#[test]
fn state_round_trips_through_serde() {
    let mut c = consumer(config());
    c.apply_deliver(&[1, 2, 3], &[], 0);
    c.apply_deliver(&[2], &[], 1000);
    c.apply_ack(&[1]);
    let json = serde_json::to_string(&c).unwrap();
    let back: ConsumerState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, c);
    assert_eq!(
        back.pending_iter().map(|(s, _)| s).collect::<Vec<_>>(),
        vec![2, 3]
    );
}

/// `ConsumerState` as it was laid out before 2026-12-07, when its
/// per-message structures were B-trees: snapshots of either build must
/// read in the other.
#[derive(Serialize, Deserialize)]
struct BTreeLayout {
    config: ConsumerConfig,
    delivered: SeqPair,
    pending: BTreeMap<u64, Pending>,
    by_consumer_seq: BTreeMap<u64, u64>,
    schedule: BTreeSet<(i64, u64)>,
    redelivered: u64,
    terminated: u64,
    exhausted: u64,
    started: bool,
    backlog: BTreeSet<u64>,
    last_delivered_ms: i64,
    dead_letter_outbox: BTreeMap<u64, DeadLetter>,
    dead_lettered: u64,
}

impl BTreeLayout {
    fn of(c: &ConsumerState) -> Self {
        let pending: BTreeMap<u64, Pending> = c.pending_iter().map(|(s, p)| (s, *p)).collect();
        BTreeLayout {
            config: c.config.clone(),
            delivered: c.delivered,
            by_consumer_seq: pending.iter().map(|(s, p)| (p.consumer_seq, *s)).collect(),
            schedule: pending
                .iter()
                .map(|(s, p)| (p.redeliver_at_ms, *s))
                .collect(),
            pending,
            redelivered: c.redelivered,
            terminated: c.terminated,
            exhausted: c.exhausted,
            started: c.started,
            backlog: c.backlog.clone(),
            last_delivered_ms: c.last_delivered_ms,
            dead_letter_outbox: c.dead_letter_outbox.clone(),
            dead_lettered: c.dead_lettered,
        }
    }
}

#[test]
fn snapshots_are_the_bytes_the_btree_layout_wrote() {
    let mut c = consumer(config());
    let first: Vec<u64> = (1..=50).collect();
    c.apply_deliver(&first, &[], 0);
    c.apply_deliver(&[2, 7], &[], 2_000); // redeliveries
    c.apply_nak(3, 3_600_000, 2_000);
    c.apply_in_progress(4, 2_500);
    c.apply_ack(&[1, 10, 11, 12, 49]);
    c.apply_term(5, "bad");
    let old = bincode::serialize(&BTreeLayout::of(&c)).unwrap();
    assert_eq!(bincode::serialize(&c).unwrap(), old);
    // An old snapshot restores to the same state, which then behaves alike.
    let mut back: ConsumerState = bincode::deserialize(&old).unwrap();
    assert_eq!(back, c);
    for state in [&mut c, &mut back] {
        state.apply_deliver(&[51, 52, 6], &[], 3_000);
        state.apply_ack(&[2, 51]);
    }
    assert_eq!(back, c);
    assert_eq!(back.ack_floor(), c.ack_floor());
    assert_eq!(
        back.due_for_redelivery(i64::MAX, 100),
        c.due_for_redelivery(i64::MAX, 100)
    );
    assert_eq!(
        bincode::serialize(&back).unwrap(),
        bincode::serialize(&c).unwrap()
    );
}

#[test]
fn a_first_delivery_of_a_pending_seq_replaces_its_entries() {
    // Only a log the leader never writes has this: a delivery applied before
    // the start, then the start's backlog naming the same seq.
    let mut c = consumer(ConsumerConfig {
        deliver_policy: DeliverPolicy::LastPerSubject,
        ..config()
    });
    c.apply_deliver(&[3], &[], 0);
    assert!(c.apply_start(5, vec![3]));
    c.apply_deliver(&[3], &[], 10);
    assert_eq!(c.num_ack_pending(), 1);
    assert_eq!(c.due_for_redelivery(i64::MAX, 10), vec![3]);
    assert_eq!(c.apply_ack(&[3]), 1);
    assert_eq!(c.due_for_redelivery(i64::MAX, 10), Vec::<u64>::new());
    assert_eq!(c.next_redelivery_ms(), None);
    assert_eq!(c.ack_floor(), c.delivered());
}
