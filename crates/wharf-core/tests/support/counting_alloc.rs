//! A counting global allocator for the tests that measure heap use.
//!
//! A test binary that includes this module (`#[path]`) gets it as its
//! global allocator. While a closure runs under `allocations_in` or
//! `live_bytes_in`, every allocation made on the calling thread is counted,
//! and so is the size of what is live (allocated minus freed). Other
//! threads, and the time outside those calls, are not counted.
//!
//! Left out: allocations freed on another thread than the one that made
//! them (the tests run single-threaded code).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
}

/// `new_block`: a fresh allocation (or a move by realloc), which counts.
fn count(new_block: bool, delta_bytes: i64) {
    // `try_with`: the allocator may run while this thread's locals are gone.
    if !COUNTING.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    if new_block {
        let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
    }
    let _ = LIVE_BYTES.try_with(|b| b.set(b.get() + delta_bytes));
}

// SAFETY: every call is passed straight to the system allocator; counting
// touches only const-initialised thread locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(true, layout.size() as i64);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(false, -(layout.size() as i64));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(true, new_size as i64 - layout.size() as i64);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted<T>(f: impl FnOnce() -> T) -> T {
    ALLOCATIONS.with(|a| a.set(0));
    LIVE_BYTES.with(|b| b.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    out
}

/// Allocations (and reallocations) made by `f` on this thread.
#[allow(dead_code)] // each test binary uses one of the two counters
pub fn allocations_in(f: impl FnOnce()) -> u64 {
    counted(f);
    ALLOCATIONS.with(Cell::get)
}

/// Bytes `f` left allocated on this thread, and what `f` returned (so a
/// structure built inside can be inspected after counting stops).
#[allow(dead_code)]
pub fn live_bytes_in<T>(f: impl FnOnce() -> T) -> (i64, T) {
    let out = counted(f);
    (LIVE_BYTES.with(Cell::get), out)
}
