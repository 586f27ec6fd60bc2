//! Criterion benchmarks of the log append and flush path, through
//! wharf-raft's public API only:
//! - `sled_inserts_then_flush`: N single-key inserts (128 B values) followed
//!   by `RaftNode::flush`, which is a checkpoint: sled's own flush and fsync
//!   (since 2026-12-02 a commit no longer waits for one; the journal's sync
//!   makes log writes durable);
//! - `sled_batch_then_flush`: the same N entries as one `sled::Batch` (how
//!   the log store wrote an append until 2026-12-01: sled writes out its IO
//!   buffer before and after every batch, so this shows what that cost);
//! - `group_write`: a one-node group's `Group::write` (propose, append to
//!   sled and the journal, the journal's fsync, commit, apply of a trivial
//!   state machine), one at a time and 64 concurrent writes (which the
//!   flusher covers with shared fsyncs).
//!
//! `cargo bench -p wharf-raft --bench log_append`. The figures include this
//! machine's fsync cost; the data lives in a temporary directory on the
//! target dir's filesystem.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures::future::join_all;
use wharf_raft::{RaftNode, RaftSettings, Role, StateMachine};

/// Counts applied commands.
#[derive(Default)]
struct Counter(u64);

impl StateMachine for Counter {
    fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
        self.0 += 1;
        self.0.to_le_bytes().to_vec()
    }
    fn snapshot(&self) -> Result<Vec<u8>, String> {
        Ok(self.0.to_le_bytes().to_vec())
    }
    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let raw: [u8; 8] = data.try_into().map_err(|_| "bad snapshot".to_string())?;
        self.0 = u64::from_le_bytes(raw);
        Ok(())
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn bench_dir() -> tempfile::TempDir {
    // Under target/ rather than /tmp, which may be a tmpfs with free fsyncs.
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-tmp");
    std::fs::create_dir_all(&base).expect("bench dir");
    tempfile::tempdir_in(base).expect("tempdir")
}

fn sled_append(c: &mut Criterion) {
    let rt = runtime();
    let dir = bench_dir();
    let node = rt
        .block_on(async { RaftNode::open(1, dir.path(), RaftSettings::default()) })
        .expect("open");
    let tree = node.db().open_tree("bench.log").expect("tree");
    let value = vec![7u8; 128];
    let mut g = c.benchmark_group("sled_inserts_then_flush");
    g.sample_size(30);
    let mut key = 0u64;
    for n in [1u64, 16, 256] {
        g.throughput(Throughput::Elements(n));
        g.bench_function(format!("{n}_entries"), |b| {
            b.iter(|| {
                for _ in 0..n {
                    key += 1;
                    tree.insert(key.to_be_bytes(), value.as_slice())
                        .expect("insert");
                }
                rt.block_on(node.flush()).expect("flush");
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("sled_batch_then_flush");
    g.sample_size(30);
    for n in [1u64, 16, 256] {
        g.throughput(Throughput::Elements(n));
        g.bench_function(format!("{n}_entries"), |b| {
            b.iter(|| {
                let mut batch = sled::Batch::default();
                for _ in 0..n {
                    key += 1;
                    batch.insert(&key.to_be_bytes(), value.as_slice());
                }
                tree.apply_batch(batch).expect("batch");
                rt.block_on(node.flush()).expect("flush");
            })
        });
    }
    g.finish();
    rt.block_on(node.shutdown());
}

fn group_write(c: &mut Criterion) {
    let rt = runtime();
    let dir = bench_dir();
    let settings = RaftSettings {
        heartbeat_ms: 50,
        election_min_ms: 150,
        election_max_ms: 300,
        ..RaftSettings::default()
    };
    let (node, group) = rt.block_on(async {
        let node = RaftNode::open(1, dir.path(), settings).expect("open");
        let members = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
        let sm: wharf_raft::SharedStateMachine = Arc::new(Mutex::new(Counter::default()));
        let group = node.start_group(1, members, sm).await.expect("group");
        group
            .wait_for(Duration::from_secs(10), |s| s.role == Role::Leader)
            .await
            .expect("leader");
        (node, group)
    });
    let command = vec![7u8; 128];
    let mut g = c.benchmark_group("group_write");
    g.sample_size(30);
    g.throughput(Throughput::Elements(1));
    g.bench_function("one_at_a_time", |b| {
        b.iter(|| rt.block_on(group.write(command.clone())).expect("write"))
    });
    g.throughput(Throughput::Elements(64));
    g.bench_function("64_concurrent", |b| {
        b.iter(|| {
            rt.block_on(join_all((0..64).map(|_| group.write(command.clone()))))
                .into_iter()
                .for_each(|r| {
                    r.expect("write");
                })
        })
    });
    g.finish();
    drop(group);
    rt.block_on(node.shutdown());
}

criterion_group!(benches, sled_append, group_write);
criterion_main!(benches);
