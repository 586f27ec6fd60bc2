//! Fuzz target `request`: the body is `wharf_server::fuzzing::request`, which
//! `crates/wharf-server/tests/fuzz_corpus.rs` also replays under `cargo test`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    wharf_server::fuzzing::request(data);
});
