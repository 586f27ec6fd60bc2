//! Simulated power loss (see `wharf_tests::powerloss`): every node loses
//! what it had not fsynced, all at once, right after publishes were
//! acknowledged. An acknowledged publish was on disk on a majority, so it
//! must survive on every replica after the restart.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Result};
use wharf_tests::{eventually, powerloss, Cluster};

const WAIT: Duration = Duration::from_secs(60);

/// The model itself: with the shim, `dd conv=fsync` survives a cut, plain
/// writes do not.
#[test]
fn power_cut_keeps_only_what_was_fsynced() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let script = "printf hello | dd of=synced conv=fsync status=none && \
                  printf more | dd of=synced oflag=append conv=notrunc status=none && \
                  printf lost | dd of=never-synced status=none";
    let status = Command::new("sh")
        .args(["-c", script])
        .current_dir(&data)
        .envs(powerloss::env_for(&data))
        .status()?;
    ensure!(status.success(), "sh failed: {status}");
    assert_eq!(std::fs::read(data.join("synced"))?, b"hellomore");
    let cut = powerloss::cut(&data)?;
    assert_eq!(std::fs::read(data.join("synced"))?, b"hello");
    assert!(!data.join("never-synced").exists());
    assert_eq!(
        cut,
        powerloss::Cut {
            rolled_back: vec!["synced".into()],
            dropped: vec!["never-synced".into()],
            intact: 0
        }
    );
    Ok(())
}

/// A truncation, then a synced write past a region the file grows into
/// without writing it: after the cut that region reads as zeros, as on a
/// real file system, not as what it held before the truncation (sled
/// truncates freed segments at the end of its file and reuses the space).
/// Three processes, as a killed node and the next one are: the last one's
/// fsync also makes the truncation by the one before durable. Before the
/// shim copied the whole file at a process's first sync, the stale `a`s
/// came back (and a node killed, restarted and then cut lost writes its
/// successor's fsync had made durable: see bug 6 in docs/RELIABILITY.md).
#[test]
fn power_cut_after_a_truncation_keeps_no_stale_bytes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let script = "head -c 8192 /dev/zero | tr '\\0' a | dd of=f conv=fsync status=none && \
                  truncate -s 0 f && \
                  head -c 4096 /dev/zero | tr '\\0' b | \
                    dd of=f bs=4096 seek=1 conv=notrunc,fsync status=none";
    let status = Command::new("sh")
        .args(["-c", script])
        .current_dir(&data)
        .envs(powerloss::env_for(&data))
        .status()?;
    ensure!(status.success(), "sh failed: {status}");
    let mut want = vec![0u8; 4096];
    want.extend(std::iter::repeat_n(b'b', 4096));
    assert_eq!(std::fs::read(data.join("f"))?, want, "the real file");
    powerloss::cut(&data)?;
    assert_eq!(std::fs::read(data.join("f"))?, want, "after the cut");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_of_every_node_keeps_every_acknowledged_publish() -> Result<()> {
    let mut cluster = Cluster::start_simulating_power_loss(3, &[]).await?;
    cluster.add_stream("ORDERS", &["orders.>"]).await?;

    // Eight publishers keep publishing; the power goes off while some of
    // their publishes are still on the way.
    let acked: Arc<Mutex<BTreeSet<String>>> = Default::default();
    let mut publishers = Vec::new();
    for p in 0..8 {
        let (client, acked) = (cluster.client(), acked.clone());
        publishers.push(tokio::spawn(async move {
            for i in 0.. {
                let payload = format!("p{p}-{i}");
                if client
                    .publish("orders.created", payload.clone())
                    .await
                    .is_err()
                {
                    return;
                }
                acked.lock().unwrap().insert(payload);
            }
        }));
    }
    eventually("300 acknowledged publishes", WAIT, || async {
        (acked.lock().unwrap().len() >= 300).then_some(())
    })
    .await?;
    let mut cuts = Vec::new();
    for id in 1..=3 {
        cuts.push(cluster.power_cut(id)?);
    }
    let acked: BTreeSet<String> = acked.lock().unwrap().clone();
    for p in publishers {
        p.abort();
    }
    eprintln!("power cut after {} acks: {cuts:?}", acked.len());
    // Before bug 6's fix the cut always took back some of sled's log here
    // (bug 4 was found that way). Since then every write sled makes is
    // synced as it is made (`crates/wharf/src/sled_sync.rs`), so a cut often
    // finds nothing of `sled/db` unsynced: what was not yet written is lost
    // with the process. That the cut drops unsynced writes is shown by
    // `power_cut_keeps_only_what_was_fsynced`; this test's check is below.
    // (sled never syncs its small `conf` file, so that one always goes;
    // sled rewrites it at open.)
    assert!(
        cuts.iter().all(|c| c.intact + c.rolled_back.len() > 0),
        "a node had no file under the shim: {cuts:?}"
    );

    for id in 1..=3 {
        cluster.restart(id)?;
    }
    cluster.wait_group_leader("ORDERS", WAIT).await?;
    let seen: BTreeSet<String> = cluster
        .read_all("ORDERS", "audit")
        .await?
        .into_iter()
        .map(|(_, payload)| payload)
        .collect();
    let lost: Vec<&String> = acked.difference(&seen).collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged publishes lost ({} stored after the restart): {lost:?}",
        lost.len(),
        acked.len(),
        seen.len()
    );
    // And every replica catches up to all of them.
    for id in 1..=3u64 {
        let node = cluster.client_of(id);
        eventually(
            &format!("node {id} holds the acked messages"),
            WAIT,
            || async {
                let s = node.stream_info_local("ORDERS").await.ok()?.state?;
                (s.messages >= acked.len() as u64).then_some(())
            },
        )
        .await?;
    }
    Ok(())
}

// Bug 5 (docs/RELIABILITY.md): in a chaos run with power loss, node 1's
// sled failed a blob's CRC ("blob ... failed crc check", then "storage:
// Read corrupted data") while every snapshot of a stream's multi-MB index
// was a sled value, and so a sled blob file (sled writes values over about
// 128 KiB to files of their own). The change stores snapshot data in
// fsynced files (`<data>/snapshots/g<group>.<index>.snap`, named in the meta
// tree only once written, fsynced, renamed and the directory fsynced) and
// makes the flusher fsync blobs that grew. The two tests below cut one
// node's power again and again right after it took a snapshot of a stream
// whose index is several MB, while publishes keep coming.

/// Subjects of about 240 bytes, each used once: about 0.5 KiB of stream
/// index per message (a stored stream snapshot holds the index, not the
/// payloads), so the snapshots grow by about 1.6 MB per round.
const SNAPSHOT_PAD: usize = 220;
const SNAPSHOT_EVERY: &str = "64";
const CUT_ROUNDS: u64 = 3;
const SMALL_PER_ROUND: u64 = 2_500;
/// The node that loses power (`step_down` from either other node makes it
/// the stream leader).
const CUT: u64 = 1;

type Acked = Arc<Mutex<std::collections::BTreeMap<u64, (String, bytes::Bytes)>>>;

async fn snapshot_index(cluster: &Cluster, id: u64) -> Option<u64> {
    use wharf_tests::metrics;
    let text = metrics::scrape(&cluster.node(id).metrics_addr).await.ok()?;
    let samples = metrics::parse(&text).ok()?;
    let labels = [("kind", "stream"), ("name", "ORDERS")];
    metrics::value(&samples, "wharf_raft_snapshot_index", &labels).map(|v| v as u64)
}

fn sled_blobs(cluster: &Cluster, id: u64) -> usize {
    let dir = cluster.node(id).data.join("sled/blobs");
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Read every acknowledged message back through `id` while it leads ORDERS
/// (so from its own replica), comparing subject and payload.
async fn read_back(cluster: &Cluster, id: u64, acked: &Acked) -> Result<()> {
    eventually(&format!("node {id} leads ORDERS"), WAIT, || async {
        let now = cluster.wait_group_leader("ORDERS", WAIT).await.ok()?;
        if now == id {
            return Some(());
        }
        let _ = cluster.client().step_down("ORDERS", None).await;
        None
    })
    .await?;
    let all: Vec<_> = acked.lock().unwrap().clone().into_iter().collect();
    let mut readers = Vec::new();
    for part in all.chunks(all.len().div_ceil(8).max(1)) {
        let (node, part) = (cluster.client_of(id), part.to_vec());
        readers.push(tokio::spawn(async move {
            let mut bad = Vec::new();
            for (seq, (subject, payload)) in part {
                match node.get_message("ORDERS", seq).await {
                    Ok(m) if m.subject == subject && m.payload == payload => {}
                    Ok(m) => bad.push(format!(
                        "seq {seq}: {} ({} bytes)",
                        m.subject,
                        m.payload.len()
                    )),
                    Err(e) => bad.push(format!("seq {seq}: {e}")),
                }
            }
            bad
        }));
    }
    let mut bad = Vec::new();
    for r in readers {
        bad.extend(r.await?);
    }
    ensure!(
        bad.is_empty(),
        "{} of {} acknowledged messages not read back from node {id}: {:?}",
        bad.len(),
        all.len(),
        &bad[..bad.len().min(10)]
    );
    let leader = cluster.wait_group_leader("ORDERS", WAIT).await?;
    ensure!(
        leader == id,
        "leadership moved to {leader} while reading from {id}"
    );
    Ok(())
}

/// The bug 5 scenario. Each round: 2,500 small messages with long unique
/// subjects from eight publishers, while two more publishers go on until
/// after the cut (with `big`, every sixteenth of their messages has a
/// payload of that many bytes); then the power of node 1 goes off right
/// after it reported a new snapshot (`wharf_raft_snapshot_index`), and it
/// restarts. Checked each round: every replica holds every acknowledged
/// message and they agree; node 1 keeps running, logs no CRC, corruption or
/// storage error and has no failed replica; the snapshot it reported before
/// the cut survived it and the data file of the one it holds is on disk
/// (multi-MB from the second round on); every acknowledged message reads
/// back from node 1 with its subject and payload. At the end also from
/// node 2. Returns the number of sled blob files node 1 held in each round.
async fn power_cuts_after_snapshots(big: Option<usize>) -> Result<Vec<usize>> {
    use std::sync::atomic::{AtomicBool, Ordering};

    use anyhow::Context;
    use bytes::Bytes;

    let mut cluster =
        Cluster::start_simulating_power_loss(3, &["--snapshot-every-entries", SNAPSHOT_EVERY])
            .await?;
    let info = cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let group = info
        .cluster
        .context("stream info without cluster")?
        .group_id;
    let acked: Acked = Default::default();
    let pad = "x".repeat(SNAPSHOT_PAD);
    let started = std::time::Instant::now();
    let mut blobs = Vec::new();

    for round in 1..=CUT_ROUNDS {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tail = Vec::new();
        for t in 0..2 {
            let (client, acked, stop) = (cluster.client(), acked.clone(), stop.clone());
            let pad = pad.clone();
            tail.push(tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let (subject, payload) = match big {
                        Some(size) if i % 16 == 0 => {
                            let subject = format!("orders.big.r{round}.t{t}.n{i}");
                            let unit = format!("{subject};");
                            let mut payload = unit.repeat(size / unit.len() + 1).into_bytes();
                            payload.truncate(size);
                            (subject, Bytes::from(payload))
                        }
                        _ => {
                            let subject = format!("orders.{pad}.r{round}.t{t}.n{i}");
                            (subject, Bytes::from(format!("r{round}-t{t}-n{i}")))
                        }
                    };
                    if let Ok(ack) = client.publish(&subject, payload.clone()).await {
                        acked.lock().unwrap().insert(ack.seq, (subject, payload));
                    }
                    i += 1;
                }
            }));
        }
        let mut small = Vec::new();
        for p in 0..8 {
            let (client, acked, pad) = (cluster.client(), acked.clone(), pad.clone());
            small.push(tokio::spawn(async move {
                for i in (p..SMALL_PER_ROUND).step_by(8) {
                    let subject = format!("orders.{pad}.r{round}.n{i}");
                    let payload = Bytes::from(format!("r{round}-n{i}"));
                    let ack = client.publish(&subject, payload.clone()).await?;
                    acked.lock().unwrap().insert(ack.seq, (subject, payload));
                }
                anyhow::Ok(())
            }));
        }
        for s in small {
            s.await??;
        }
        // Power goes off right after node 1 took its next snapshot.
        let before = snapshot_index(&cluster, CUT).await.unwrap_or(0);
        let at_cut = eventually(
            &format!("round {round}: node {CUT} takes a new snapshot"),
            WAIT,
            || async { snapshot_index(&cluster, CUT).await.filter(|s| *s > before) },
        )
        .await?;
        let cut = cluster.power_cut(CUT)?;
        stop.store(true, Ordering::SeqCst);
        for t in tail {
            t.await?;
        }
        let acks = acked.lock().unwrap().len() as u64;
        eprintln!(
            "round {round} at {:.1?}: power cut after snapshot {at_cut}, {acks} acks: {cut:?}",
            started.elapsed()
        );

        let log_path = cluster.log_path(CUT);
        let logged_before = std::fs::metadata(&log_path)?.len() as usize;
        cluster.restart(CUT)?;
        let this_run = || -> Result<String> {
            let log = std::fs::read_to_string(&log_path)?;
            Ok(log.get(logged_before..).unwrap_or_default().to_string())
        };
        // Every replica holds every acknowledged message, and they agree.
        let last = std::cell::RefCell::new(Vec::new());
        let agreed = eventually(
            &format!("round {round}: every replica holds the {acks} acked messages"),
            WAIT,
            || async {
                let mut states = Vec::new();
                for id in 1..=3u64 {
                    let client = cluster.client_of(id).with_retry_for(Duration::ZERO);
                    states.push(match client.stream_info_local("ORDERS").await {
                        Ok(info) => {
                            let s = info.state.unwrap_or_default();
                            Ok((s.messages, s.bytes, s.last_seq))
                        }
                        Err(e) => Err(e.to_string()),
                    });
                }
                *last.borrow_mut() = states.clone();
                let first = states[0].clone().ok()?;
                let same = states.iter().all(|s| *s == Ok(first));
                (same && first.0 >= acks).then_some(())
            },
        )
        .await;
        ensure!(
            agreed.is_ok(),
            "round {round}: replicas (messages, bytes, last seq) {:?}, {acks} acked; node {CUT}'s log since the restart:\n{}",
            last.borrow(),
            this_run()?
        );
        // Running, no storage error, no failed replica.
        ensure!(
            cluster.wait_exit(CUT, Duration::ZERO).await.is_none(),
            "round {round}: node {CUT} exited after its restart:\n{}",
            this_run()?
        );
        let run = this_run()?.to_lowercase();
        for bad in ["crc", "corrupt", "storage:"] {
            ensure!(
                !run.contains(bad),
                "round {round}: node {CUT}'s log mentions {bad:?}:\n{run}"
            );
        }
        let status = cluster
            .status_of(CUT, Duration::from_secs(5))
            .await
            .context("status of the restarted node")?;
        let failed: Vec<&str> = (status.groups.iter())
            .filter(|g| g.local_role == "failed")
            .map(|g| g.name.as_str())
            .collect();
        ensure!(
            failed.is_empty(),
            "round {round}: failed replicas {failed:?}"
        );
        // The snapshot reported before the cut survived it, and the file of
        // the one the node holds is on disk.
        let dir = cluster.node(CUT).data.join("snapshots");
        let (index, size) = eventually(
            &format!("round {round}: node {CUT}'s snapshot file"),
            WAIT,
            || async {
                let index = snapshot_index(&cluster, CUT).await?;
                let file = dir.join(format!("g{group}.{index}.snap"));
                Some((index, std::fs::metadata(file).ok()?.len()))
            },
        )
        .await?;
        eprintln!("round {round}: node {CUT} restored snapshot {index} ({size} bytes)");
        ensure!(
            index >= at_cut,
            "round {round}: snapshot {at_cut} was reported before the cut, {index} after it"
        );
        ensure!(
            round == 1 || size >= 2 << 20,
            "round {round}: the snapshot is {size} bytes, not multi-MB: the test shows less than it claims"
        );
        // Every acknowledged message reads back from the node's replica.
        read_back(&cluster, CUT, &acked).await?;
        blobs.push(sled_blobs(&cluster, CUT));
    }
    // And from another replica.
    read_back(&cluster, 2, &acked).await?;
    eprintln!(
        "done at {:.1?}; sled blob files on node {CUT}: {blobs:?}",
        started.elapsed()
    );
    Ok(blobs)
}

/// Bug 5 as it was: snapshots of several MB (1.6, 3.3, 5.0 MB after the
/// three rounds), all other values small. Guards the change: a power cut
/// right after a snapshot keeps that snapshot (its file on disk) and the
/// node readable, and sled holds no blob file at all. Against a build with
/// the change reverted (snapshots as sled values, blobs fsynced only when
/// new), with the file and blob checks skipped, it failed three runs out of
/// three: "blob ... failed crc check!" in node 1's log (the original
/// symptom), a snapshot reported before the cut that was gone after it, and
/// node 1 losing log entries it had acknowledged, which made the leader's
/// Raft core panic ("follower log reversion is not allowed").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bug5_power_cut_after_multi_megabyte_snapshots_keeps_the_node_readable() -> Result<()> {
    let blobs = power_cuts_after_snapshots(None).await?;
    ensure!(
        blobs.iter().all(|b| *b == 0),
        "sled blob files on node {CUT} without any large value: {blobs:?}"
    );
    Ok(())
}

/// The same with messages of 160 KiB among the others: a Raft entry or a
/// stored payload that big is a sled blob file, which the change left in
/// sled. Ignored: it failed in 2 of 6 runs here (both while the machine was
/// loaded). In the one analysed, the cut dropped a blob file that had never
/// been fsynced while sled's main file already held, durably, the write
/// pointing to it and a later one (an fsync of sled's main file, sled's own
/// every 500 ms or the flusher's, which syncs it before it lists the blob
/// files); sled skips a dangling blob at recovery, so the stream group's
/// Raft log had a hole (entry 5252 missing, 5251 and 5253 present, the
/// stored committed index 5252) and the group could not start on node 1
/// again ("Failed to get log entries", node 1 "holds no replica of stream
/// ORDERS"). See docs/RELIABILITY.md, bug 5. Fixed since: blob files are
/// synced before sled's main file, both by the flusher and in place of
/// sled's `sync_file_range`, and sled's own periodic fsync is off
/// (`wharf_raft::sync_sled_write`); then it passed 3 runs of 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bug5_power_cut_while_sled_writes_blobs_keeps_the_node_readable() -> Result<()> {
    let blobs = power_cuts_after_snapshots(Some(160 * 1024)).await?;
    ensure!(
        blobs.iter().all(|b| *b > 0),
        "no sled blob files on node {CUT}: the test shows less than it claims ({blobs:?})"
    );
    Ok(())
}
