//! Heap bytes the stream index keeps per stored message, counted.
//!
//! A counting global allocator (`support/counting_alloc.rs`) tracks the
//! bytes live on this thread while a stream takes 100,000 messages under a few
//! subjects, as `wharf bench` publishes them. The index keeps each
//! message's subject, size and publish time (`MsgMeta`) in a B-tree by
//! sequence, and each sequence again under its subject; the payloads live
//! in the server's store, not here. The bound fails the test if a change
//! makes the index noticeably dearer per message.
//!
//! Left out: everything outside `wharf-core` (the server's sled trees and
//! page cache, the Raft log), which docs/CONFIG.md's "Memory" measures as
//! the server's RSS.

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use wharf_core::{StreamConfig, StreamState};

const MESSAGES: u64 = 100_000;

#[test]
fn the_index_keeps_a_bounded_number_of_bytes_per_message() {
    let config = StreamConfig {
        name: "BENCH".into(),
        subjects: vec!["bench.>".into()],
        ..Default::default()
    }
    .with_defaults();
    let subjects = ["bench.a", "bench.b", "bench.c"];
    let (live_bytes, stream) = counting_alloc::live_bytes_in(|| {
        let mut stream = StreamState::new(config);
        for i in 0..MESSAGES {
            let subject = subjects[(i % 3) as usize];
            stream
                .append(subject, 128, 1_000 + i as i64)
                .expect("stored");
        }
        stream
    });
    let per_message = live_bytes as f64 / MESSAGES as f64;
    println!("stream index: {per_message:.1} live heap bytes per stored message");
    assert_eq!(stream.stats().messages, MESSAGES);
    assert!(per_message < 200.0, "{per_message:.1} bytes per message");
}
