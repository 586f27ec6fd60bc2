//! Heap allocations on the consumer leader's dispatch path, counted.
//!
//! One cycle is what the consumer runtime does for each plan: three workers
//! each have a pull waiting, the dispatcher plans them, the plan is applied
//! as a delivery, settled, and every message is acked. A counting global
//! allocator (`support/counting_alloc.rs`) counts the allocations the cycles make
//! on this thread, after a warm-up, with 10,000 messages already pending so
//! the consumer's maps have their working depth.
//!
//! What it shows: the path allocates per plan, not per message. With
//! pulls of 100 a plan of 300 messages makes 13 allocations, 0.043 per
//! message, when this was written: the plan's vectors, its delivery's and
//! its settle's, and the acks'. Every per-message structure keeps its
//! memory from plan to plan: the dispatcher's in-flight set is a hash
//! table, and the consumer keeps first deliveries in deques sorted by
//! construction (`sorted_deque`); what does not arrive in order (a
//! redelivery's or a nak's due time, a restored snapshot) goes to B-trees
//! beside two of them. Before 2026-12-07 those were
//! four B-trees, each making a node about every sixth key inserted in
//! order: 0.71 allocations per message. One allocation per message would
//! take pulls of 100 past 0.1 per message and 16 per plan. A third test
//! naks one message per plan for twice AckWait, so an entry due after
//! every first delivery is always in the schedule: first deliveries must
//! still not allocate. With pulls of 1 each plan carries three messages,
//! so the per-plan vectors are per message (6.0 per plan); the bound there
//! is per plan, so one more allocation per message would break it too.
//!
//! Left out: the server's side of the path (Raft entries, gRPC messages),
//! which is not in this crate.

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use counting_alloc::allocations_in;
use wharf_core::{ConsumerConfig, ConsumerState, Dispatcher, StreamConfig, StreamState};

const WORKERS: u64 = 3;
const ALREADY_PENDING: u64 = 10_000;
const NOW_MS: i64 = 1_000;
const ACK_WAIT_MS: u64 = 3_600_000;

struct Queue {
    stream: StreamState,
    consumer: ConsumerState,
    dispatcher: Dispatcher,
    next_pull_id: u64,
    acked_through: u64,
    /// Nak each plan's last message for twice AckWait, so an entry due
    /// after every first delivery's is always in the schedule.
    nak_last: bool,
}

impl Queue {
    /// A stream of `messages` and a consumer with `ALREADY_PENDING` of them
    /// delivered and unacked.
    fn new(messages: u64) -> Self {
        let config = StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        }
        .with_defaults();
        let mut stream = StreamState::new(config);
        for _ in 0..messages {
            stream.append("orders.eu.shipped", 128, 0).expect("append");
        }
        let mut consumer = ConsumerState::new(
            ConsumerConfig {
                name: "workers".into(),
                ack_wait_ms: ACK_WAIT_MS,
                max_ack_pending: -1,
                ..Default::default()
            }
            .with_defaults(),
        );
        let first: Vec<u64> = (1..=ALREADY_PENDING).collect();
        consumer.apply_deliver(&first, &[], 0);
        Self {
            stream,
            consumer,
            dispatcher: Dispatcher::new(),
            next_pull_id: 1,
            acked_through: 0,
            nak_last: false,
        }
    }

    /// One pull of `batch` per worker, planned, delivered, settled; then the
    /// oldest messages are acked, as many as were delivered, so the pending
    /// count stays where it was. Returns the messages delivered.
    fn cycle(&mut self, batch: u32) -> u64 {
        for worker in 1..=WORKERS {
            self.dispatcher
                .add_pull(worker, self.next_pull_id, batch, None, 512)
                .expect("pull");
        }
        self.next_pull_id += 1;
        let max = (u64::from(batch) * WORKERS) as usize;
        let plan = self
            .dispatcher
            .plan(&self.consumer, &self.stream, NOW_MS, max);
        let seqs = plan.stream_seqs();
        let delivered =
            self.consumer
                .apply_deliver_after(&seqs, &plan.gone, NOW_MS, plan.first_after);
        self.dispatcher.settle(&plan.all_seqs());
        if let Some(last) = delivered.last().filter(|_| self.nak_last) {
            let delay_ms = 2 * ACK_WAIT_MS;
            assert!(self.consumer.apply_nak(last.stream_seq, delay_ms, NOW_MS));
        }
        let n = delivered.len() as u64;
        let acks: Vec<u64> = (self.acked_through + 1..=self.acked_through + n).collect();
        self.acked_through += n;
        assert_eq!(self.consumer.apply_ack(&acks), n as usize);
        n
    }
}

/// (allocations, messages, plans) over `cycles` cycles after a warm-up.
fn measure(batch: u32, cycles: u64) -> (u64, u64, u64) {
    measure_with(batch, cycles, false)
}

fn measure_with(batch: u32, cycles: u64, nak_last: bool) -> (u64, u64, u64) {
    let messages = ALREADY_PENDING + (cycles + 10) * u64::from(batch) * WORKERS;
    let mut queue = Queue::new(messages);
    queue.nak_last = nak_last;
    for _ in 0..10 {
        queue.cycle(batch);
    }
    let mut delivered = 0;
    let allocations = allocations_in(|| {
        for _ in 0..cycles {
            delivered += queue.cycle(batch);
        }
    });
    assert_eq!(delivered, cycles * u64::from(batch) * WORKERS);
    assert_eq!(queue.consumer.num_ack_pending(), ALREADY_PENDING);
    (allocations, delivered, cycles)
}

#[test]
fn batches_of_100_allocate_per_plan_not_per_message() {
    let (allocations, messages, plans) = measure(100, 200);
    let per_message = allocations as f64 / messages as f64;
    let per_plan = allocations as f64 / plans as f64;
    println!(
        "pulls of 100: {allocations} allocations for {messages} messages in {plans} plans: \
         {per_message:.3} per message, {per_plan:.1} per plan"
    );
    // The acks' vector is counted too (the caller's, but on the path).
    assert!(
        per_message < 0.1 && per_plan <= 16.0,
        "{per_message:.3} allocations per message, {per_plan:.1} per plan: \
         something allocates per message"
    );
}

#[test]
fn batches_of_1_allocate_a_bounded_number_per_plan() {
    let (allocations, messages, plans) = measure(1, 2_000);
    let per_plan = allocations as f64 / plans as f64;
    println!(
        "pulls of 1: {allocations} allocations for {messages} messages in {plans} plans: \
         {per_plan:.2} per plan of {WORKERS}"
    );
    // The vectors of a plan, its delivery, its settle and its acks. One more
    // allocation per message would add three per plan.
    assert!(
        per_plan <= 8.0,
        "{per_plan:.2} allocations per plan of {WORKERS} messages"
    );
}

#[test]
fn a_long_nak_in_every_plan_leaves_first_deliveries_allocation_free() {
    let (allocations, messages, plans) = measure_with(100, 200, true);
    let per_message = allocations as f64 / messages as f64;
    let per_plan = allocations as f64 / plans as f64;
    println!(
        "pulls of 100, one nak of 2x AckWait per plan: {allocations} allocations for \
         {messages} messages in {plans} plans: {per_message:.3} per message, {per_plan:.1} per plan"
    );
    // The naks' entries go to the schedule's B-tree: a node every few plans.
    assert!(
        per_message < 0.1 && per_plan <= 16.0,
        "{per_message:.3} allocations per message, {per_plan:.1} per plan: \
         first deliveries allocate once a nak is due after them"
    );
}
