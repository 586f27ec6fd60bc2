//! Criterion benchmarks of wharf-core's hot paths: subject matching, dispatch
//! planning and ack bookkeeping with a million outstanding messages.
//!
//! `cargo bench -p wharf-core --bench hot_paths`
//!
//! The consumer states are built once (a million deliveries) and then kept at
//! a million pending by each iteration's deliver-and-ack cycle, so every
//! iteration sees the same size of state.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use wharf_core::{
    subject_matches, ConsumerConfig, ConsumerState, Dispatcher, StreamConfig, StreamState,
};

const OUTSTANDING: u64 = 1_000_000;
const BATCH: u64 = 100;
/// Far from any AckWait deadline: nothing is due for redelivery.
const NOW_MS: i64 = 1_000;

fn subjects(c: &mut Criterion) {
    let cases = [
        ("exact", "orders.eu.shipped", "orders.eu.shipped"),
        ("star", "orders.*.shipped", "orders.eu.shipped"),
        ("gt", "orders.>", "orders.eu.shipped.express"),
        ("miss", "orders.*.created", "orders.eu.shipped"),
        ("long", "a.b.c.d.e.f.g.h.*.>", "a.b.c.d.e.f.g.h.i.j.k"),
    ];
    let mut g = c.benchmark_group("subject_matches");
    for (name, filter, subject) in cases {
        g.bench_function(name, |b| {
            b.iter(|| subject_matches(black_box(filter), black_box(subject)))
        });
    }
    g.finish();
}

fn consumer_config() -> ConsumerConfig {
    ConsumerConfig {
        name: "workers".into(),
        ack_wait_ms: 3_600_000,
        max_ack_pending: -1,
        ..Default::default()
    }
    .with_defaults()
}

/// A consumer with `OUTSTANDING` delivered and unacked messages (seqs 1..=N).
fn loaded_consumer() -> ConsumerState {
    let mut consumer = ConsumerState::new(consumer_config());
    let mut seq = 1;
    while seq <= OUTSTANDING {
        let chunk: Vec<u64> = (seq..(seq + 10_000).min(OUTSTANDING + 1)).collect();
        consumer.apply_deliver(&chunk, &[], 0);
        seq += chunk.len() as u64;
    }
    assert_eq!(consumer.num_ack_pending(), OUTSTANDING);
    consumer
}

/// A stream holding `n` messages on one subject.
fn stream_with(n: u64) -> StreamState {
    let config = StreamConfig {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    }
    .with_defaults();
    let mut stream = StreamState::new(config);
    for _ in 0..n {
        stream.append("orders.eu.shipped", 128, 0).expect("append");
    }
    stream
}

fn ack_bookkeeping(c: &mut Criterion) {
    let mut g = c.benchmark_group("consumer_1M_pending");
    g.throughput(Throughput::Elements(BATCH));
    g.sample_size(30);

    // Steady state: deliver the next 100 messages, ack the 100 oldest.
    let mut consumer = loaded_consumer();
    let (mut next, mut oldest) = (OUTSTANDING + 1, 1u64);
    g.bench_function("deliver_100_then_ack_100_in_order", |b| {
        b.iter(|| {
            let deliver: Vec<u64> = (next..next + BATCH).collect();
            consumer.apply_deliver(&deliver, &[], NOW_MS);
            let ack: Vec<u64> = (oldest..oldest + BATCH).collect();
            black_box(consumer.apply_ack(&ack));
            next += BATCH;
            oldest += BATCH;
        })
    });

    // Out-of-order acks spread over the whole pending set (workers finishing
    // at different speeds), plus 100 new deliveries, so about a million stay
    // pending.
    let mut consumer = loaded_consumer();
    let (mut k, mut next) = (0u64, OUTSTANDING + 1);
    g.bench_function("deliver_100_then_ack_100_scattered", |b| {
        b.iter(|| {
            let deliver: Vec<u64> = (next..next + BATCH).collect();
            consumer.apply_deliver(&deliver, &[], NOW_MS);
            next += BATCH;
            let seqs: Vec<u64> = (0..BATCH)
                .map(|i| 1 + (k * 7_919 + i * (OUTSTANDING / BATCH)) % OUTSTANDING)
                .collect();
            k += 1;
            black_box(consumer.apply_ack(&seqs));
        })
    });

    let consumer = loaded_consumer();
    g.bench_function("ack_floor_and_counts", |b| {
        b.iter(|| {
            black_box(consumer.ack_floor());
            black_box(consumer.num_ack_pending());
            black_box(consumer.next_redelivery_ms());
        })
    });
    g.finish();
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch_1M_pending");
    g.throughput(Throughput::Elements(BATCH));
    g.sample_size(30);
    let consumer = loaded_consumer();
    let stream = stream_with(OUTSTANDING + 10_000);
    // Three workers, each with a pull of 100 waiting; plan 100 deliveries.
    g.bench_function("plan_100_over_3_pulls", |b| {
        b.iter_batched(
            || {
                let mut d = Dispatcher::new();
                for session in 1..=3 {
                    d.add_pull(session, 1, BATCH as u32, None, 512)
                        .expect("pull");
                }
                d
            },
            |mut d| {
                let plan = d.plan(&consumer, &stream, NOW_MS, BATCH as usize);
                assert_eq!(plan.assignments.len(), BATCH as usize);
                d.settle(&plan.stream_seqs());
                plan
            },
            BatchSize::SmallInput,
        )
    });
    // The stream index on the dispatch path: next message after a position.
    g.bench_function("next_matching_100", |b| {
        b.iter(|| {
            let mut after = OUTSTANDING;
            for _ in 0..BATCH {
                after = stream
                    .next_matching(after, Some("orders.*.shipped"))
                    .expect("next");
            }
            black_box(after)
        })
    });
    g.finish();
}

criterion_group!(benches, subjects, ack_bookkeeping, dispatch);
criterion_main!(benches);
