//! Heap bytes the stream index keeps per stored message, counted.
//!
//! A counting global allocator (this test binary only) tracks the bytes
//! live on this thread while a stream takes 100,000 messages under a few
//! subjects, as `wharf bench` publishes them. The index keeps each
//! message's subject, size and publish time (`MsgMeta`) in a B-tree by
//! sequence, and each sequence again under its subject; the payloads live
//! in the server's store, not here. The bound fails the test if a change
//! makes the index noticeably dearer per message.
//!
//! Left out: everything outside `wharf-core` (the server's sled trees and
//! page cache, the Raft log), which docs/CONFIG.md's "Memory" measures as
//! the server's RSS.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use wharf_core::{StreamConfig, StreamState};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
}

fn count(delta: i64) {
    // `try_with`: the allocator may run while this thread's locals are gone.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = LIVE_BYTES.try_with(|b| b.set(b.get() + delta));
    }
}

// SAFETY: every call is passed straight to the system allocator; counting
// touches only const-initialised thread locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as i64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MESSAGES: u64 = 100_000;

#[test]
fn the_index_keeps_a_bounded_number_of_bytes_per_message() {
    let config = StreamConfig {
        name: "BENCH".into(),
        subjects: vec!["bench.>".into()],
        ..Default::default()
    }
    .with_defaults();
    let mut stream = StreamState::new(config);
    let subjects = ["bench.a", "bench.b", "bench.c"];
    LIVE_BYTES.with(|b| b.set(0));
    COUNTING.with(|c| c.set(true));
    for i in 0..MESSAGES {
        let subject = subjects[(i % 3) as usize];
        stream
            .append(subject, 128, 1_000 + i as i64)
            .expect("stored");
    }
    COUNTING.with(|c| c.set(false));
    let per_message = LIVE_BYTES.with(Cell::get) as f64 / MESSAGES as f64;
    println!("stream index: {per_message:.1} live heap bytes per stored message");
    assert_eq!(stream.stats().messages, MESSAGES);
    assert!(per_message < 200.0, "{per_message:.1} bytes per message");
}
