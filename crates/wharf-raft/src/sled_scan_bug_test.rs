//! Regression test for bug 6 of docs/RELIABILITY.md: a sled database taken
//! from a node of a chaos run after simulated power loss, whose tree
//! `g2.log` (group 2's Raft log, entries 32,913 to 34,260) stops a forward
//! scan at 34,023 while `get` and a reverse scan see every entry. With the
//! log read by a range scan, the node's consumer group could not start
//! (openraft asked for entries up to 34,040 to replay and got 47 of 64) and
//! stayed down for the rest of the run.
//!
//! The fixture (`tests/fixtures/bug6-sled-forward-scan-stops-early.tgz`, the
//! node's fsynced image with every other group's trees dropped) is unpacked
//! into a temporary directory with `tar`; the test first checks that sled
//! still shows the defect on it, so it cannot pass vacuously.

use openraft::storage::RaftLogStorage;
use openraft::RaftLogReader;

use crate::flusher::Flusher;
use crate::log_store::LogStore;

fn unpack_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/bug6-sled-forward-scan-stops-early.tgz"
    );
    let st = std::process::Command::new("tar")
        .arg("xzf")
        .arg(fixture)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("run tar");
    assert!(st.success(), "tar xzf {fixture}: {st}");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bug6_log_reads_survive_a_sled_tree_whose_forward_scan_stops_early() {
    let dir = unpack_fixture();
    let path = dir.path().join("sled");
    let db = sled::Config::new()
        .path(&path)
        .open()
        .expect("open fixture");
    let tree = db.open_tree("g2.log").expect("tree");
    let forward = tree.iter().count();
    let reverse = tree.iter().rev().count();
    assert!(
        forward < reverse,
        "the fixture no longer shows sled's defect (forward {forward}, reverse {reverse})"
    );

    let (flusher, _task, journal) = Flusher::spawn_for_tests(db.clone(), &path).expect("flusher");
    let (mut log, _meta) = LogStore::open(&db, 1, 2, journal, flusher, None).expect("log store");
    let state = log.get_log_state().await.expect("log state");
    assert_eq!(state.last_log_id.map(|l| l.index), Some(34_260));

    // What openraft asked for at startup: the entries to replay.
    let replay = log.try_get_log_entries(33_977..34_041).await.expect("read");
    let indexes: Vec<u64> = replay.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, (33_977..34_041).collect::<Vec<_>>());

    // The whole log, as replication to a lagging follower reads it.
    let all = log.try_get_log_entries(32_913..).await.expect("read all");
    assert_eq!(all.len(), 34_260 - 32_913 + 1);

    // Truncating and purging must reach keys the forward scan does not see.
    log.truncate_after(Some(all[34_100 - 32_913].log_id))
        .await
        .expect("truncate");
    assert_eq!(tree.get(34_101u64.to_be_bytes()).expect("get"), None);
    assert!(tree.get(34_100u64.to_be_bytes()).expect("get").is_some());
    log.purge(all[34_050 - 32_913].log_id).await.expect("purge");
    assert_eq!(tree.get(34_050u64.to_be_bytes()).expect("get"), None);
    // (openraft never reads below the purged index; on this tree sled still
    // finds one purged key afterwards, 34,017, so the read starts above it.)
    let rest = log.try_get_log_entries(34_051..).await.expect("read rest");
    let rest: Vec<u64> = rest.iter().map(|e| e.log_id.index).collect();
    assert_eq!(rest, (34_051..=34_100).collect::<Vec<_>>());
}
