//! The bodies of the fuzz targets in `fuzz/`, kept in the library so that a
//! plain `cargo test` (`tests/fuzz_corpus.rs`) replays the saved corpus and
//! the crash regressions through exactly the same code, without nightly.
//!
//! Each function takes arbitrary bytes, must never panic, and asserts
//! properties that hold for every input (a panic is a finding):
//! - [`subject`]: the subject validators and matchers of `wharf-core`;
//! - [`config`]: stream and consumer configuration decoding and validation;
//! - [`request`]: prost decoding of the public request messages followed by
//!   the server's request validation (`request_check`).
//!
//! Left out: anything needing a running node (routing, the meta state
//! machine's overlap and count checks).

use prost::Message;
use wharf_core::subject::{filters_overlap, subject_matches, validate_filter, validate_subject};
use wharf_proto::v1 as pb;

use crate::limits::Limits;
use crate::request_check as check;

/// Two strings from the input, split at the first 0 byte.
fn two_strings(data: &[u8]) -> (String, String) {
    let (a, b) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[..0]),
    };
    (
        String::from_utf8_lossy(a).into_owned(),
        String::from_utf8_lossy(b).into_owned(),
    )
}

/// Subject parser and matcher.
pub fn subject(data: &[u8]) {
    let (a, b) = two_strings(data);
    let a_subject = validate_subject(&a).is_ok();
    let a_filter = validate_filter(&a).is_ok();
    let b_subject = validate_subject(&b).is_ok();
    let b_filter = validate_filter(&b).is_ok();
    assert!(
        !a_subject || a_filter,
        "a valid subject is a valid filter: {a:?}"
    );
    // Matching and overlap are total functions: call them on anything.
    let matched = subject_matches(&a, &b);
    let overlap = filters_overlap(&a, &b);
    if a_filter && b_filter {
        assert_eq!(
            overlap,
            filters_overlap(&b, &a),
            "overlap is symmetric: {a:?} {b:?}"
        );
        assert!(filters_overlap(&a, &a), "a filter overlaps itself: {a:?}");
    }
    if a_filter && b_subject {
        // A subject both filters match shows they overlap.
        assert!(!matched || overlap, "{a:?} matches {b:?} but no overlap");
    }
    if a_subject {
        assert!(subject_matches(&a, &a), "a subject matches itself: {a:?}");
    }
}

/// Stream and consumer configuration validation. The first byte picks which.
pub fn config(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let limits = Limits::default();
    if which % 2 == 0 {
        let Ok(c) = pb::StreamConfig::decode(rest) else {
            return;
        };
        let req = pb::AddStreamRequest { config: Some(c) };
        if let Ok(config) = check::check_add_stream(&limits, &req) {
            // What the server stored reads back and validates the same.
            let again = crate::convert::stream_config_to_pb(&config);
            let back = check::check_add_stream(
                &limits,
                &pb::AddStreamRequest {
                    config: Some(again),
                },
            );
            assert_eq!(back.as_ref(), Ok(&config), "stream config round trip");
            assert_eq!(config.check_update(&config), Ok(()));
        }
    } else {
        let Ok(c) = pb::ConsumerConfig::decode(rest) else {
            return;
        };
        let req = pb::AddConsumerRequest {
            stream: "S".into(),
            config: Some(c),
        };
        if let Ok(config) = check::check_add_consumer(&req) {
            let again = crate::convert::consumer_config_to_pb(&config);
            let back = check::check_add_consumer(&pb::AddConsumerRequest {
                stream: "S".into(),
                config: Some(again),
            });
            assert_eq!(back.as_ref(), Ok(&config), "consumer config round trip");
            assert_eq!(config.check_update(&config), Ok(()));
        }
    }
}

/// Decode one public request message (the first byte picks the type) and
/// run the server's validation of it, as a handler would.
pub fn request(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        max_message_bytes: 1024,
        max_request_bytes: 1024 + crate::limits::REQUEST_OVERHEAD_BYTES,
        max_pull_batch: 100,
        max_pull_bytes: 4096,
        ..Limits::default()
    };
    let _ = match which % 5 {
        0 => pb::PublishRequest::decode(rest)
            .ok()
            .map(|m| check::check_publish(&limits, &m)),
        1 => pb::AddStreamRequest::decode(rest)
            .ok()
            .map(|m| check::check_add_stream(&limits, &m).map(|_| ())),
        2 => pb::AddConsumerRequest::decode(rest)
            .ok()
            .map(|m| check::check_add_consumer(&m).map(|_| ())),
        3 => pb::ConsumeRequest::decode(rest)
            .ok()
            .map(|m| check::check_consume_request(&limits, &m)),
        _ => pb::PullRequest::decode(rest).ok().map(|m| {
            let r = check::check_pull(&limits, &m);
            assert_eq!(
                r.is_ok(),
                (1..=100).contains(&m.batch) && m.max_bytes <= 4096,
                "pull check agrees with the limits: {m:?}"
            );
            r
        }),
    };
}
