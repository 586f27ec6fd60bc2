//! Replays the fuzz seeds and every saved crash input (`fuzz/seeds/<target>`,
//! `fuzz/regressions/<target>`) through the fuzz targets' bodies
//! (`wharf_server::fuzzing`), so a plain `cargo test` on stable checks them.
//! A regression input panicking again fails the test with its file name.

use std::path::{Path, PathBuf};

use prost::Message;
use wharf_proto::v1 as pb;

type Body = fn(&[u8]);

const TARGETS: &[(&str, Body)] = &[
    ("subject", wharf_server::fuzzing::subject),
    ("config", wharf_server::fuzzing::config),
    ("request", wharf_server::fuzzing::request),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(kind).join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn fuzz_seeds_and_regressions_replay_without_panics() {
    let mut total = 0;
    for (target, body) in TARGETS {
        let seeds = inputs("seeds", target);
        assert!(!seeds.is_empty(), "no seeds for fuzz target {target}");
        for path in seeds.iter().chain(inputs("regressions", target).iter()) {
            let data = std::fs::read(path).expect("read input");
            let run = std::panic::catch_unwind(|| body(&data));
            assert!(
                run.is_ok(),
                "fuzz target {target} panics on {}",
                path.display()
            );
            total += 1;
        }
    }
    eprintln!("replayed {total} fuzz inputs");
}

/// Writes the hand-made seed inputs (run once with `--ignored`; the files
/// are committed). Each request seed is a type byte and an encoded message.
#[test]
#[ignore]
fn write_seeds() {
    let write = |target: &str, name: &str, data: Vec<u8>| {
        let dir = fuzz_dir().join("seeds").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), data).unwrap();
    };
    for (i, s) in [
        "orders.>\0orders.created",
        "a.*.c\0a.b.c",
        "*.*\0a.>",
        ">\0x.y.z",
        "a..b\0a",
        "ord*\0orders",
        "a.>.b\0a.b.c",
    ]
    .iter()
    .enumerate()
    {
        write("subject", &format!("seed-{i}"), s.as_bytes().to_vec());
    }
    let stream = pb::StreamConfig {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into(), "pay.*".into()],
        max_msgs: 100,
        max_age_ms: 60_000,
        max_msg_size: 1024,
        duplicate_window_ms: 1000,
        ..Default::default()
    };
    let consumer = pb::ConsumerConfig {
        name: "shipping".into(),
        filter_subjects: vec!["orders.a".into(), "orders.b.>".into()],
        ack_wait_ms: 1000,
        max_deliver: 5,
        backoff_ms: vec![10, 100],
        deliver_policy: pb::DeliverPolicy::DeliverByStartSequence as i32,
        opt_start_seq: 3,
        metadata: [("k".to_string(), "v".to_string())].into_iter().collect(),
        ..Default::default()
    };
    let tagged = |tag: u8, msg: Vec<u8>| [vec![tag], msg].concat();
    write("config", "stream", tagged(0, stream.encode_to_vec()));
    write("config", "consumer", tagged(1, consumer.encode_to_vec()));
    let publish = pb::PublishRequest {
        subject: "orders.a".into(),
        payload: vec![1, 2, 3].into(),
        msg_id: "id-1".into(),
        headers: [("Trace-Id".to_string(), "t-1".to_string())].into(),
    };
    let add_stream = pb::AddStreamRequest {
        config: Some(stream),
    };
    let add_consumer = pb::AddConsumerRequest {
        stream: "ORDERS".into(),
        config: Some(consumer),
    };
    let pull = pb::PullRequest {
        id: 7,
        batch: 10,
        max_bytes: 2048,
        expires_ms: 1000,
        ..Default::default()
    };
    let consume = pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Pull(pull.clone())),
    };
    let ack = pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Ack(pb::AckRequest {
            stream_seq: 4,
            kind: pb::AckKind::Nak as i32,
            delay_ms: 100,
            ..Default::default()
        })),
    };
    write("request", "publish", tagged(0, publish.encode_to_vec()));
    write(
        "request",
        "add_stream",
        tagged(1, add_stream.encode_to_vec()),
    );
    write(
        "request",
        "add_consumer",
        tagged(2, add_consumer.encode_to_vec()),
    );
    write(
        "request",
        "consume_pull",
        tagged(3, consume.encode_to_vec()),
    );
    write("request", "consume_ack", tagged(3, ack.encode_to_vec()));
    write("request", "pull", tagged(4, pull.encode_to_vec()));
}
