//! Snapshots and log compaction on a real three-node cluster.
//!
//! With `--snapshot-every-entries 50` every group snapshots often: the
//! stream leader's Raft log must stay bounded while a follower is down, the
//! follower must come back by an InstallSnapshot (its log end was purged on
//! the others) with every payload, and a cluster restarted from snapshots
//! plus the log after them must still hold and deliver every message.

use std::time::Duration;

use anyhow::{Context, Result};
use wharf_tests::{eventually, metrics, Cluster};

const SNAPSHOT_EVERY: u64 = 50;
const MESSAGES: u64 = 400;
const WAIT: Duration = Duration::from_secs(60);

/// (snapshot index, entries in the log) of the stream group on one node.
async fn raft_log(cluster: &Cluster, id: u64) -> Result<(u64, u64)> {
    let text = metrics::scrape(&cluster.node(id).metrics_addr).await?;
    let samples = metrics::parse(&text)?;
    let labels = [("kind", "stream"), ("name", "ORDERS")];
    let snapshot = metrics::value(&samples, "wharf_raft_snapshot_index", &labels)
        .context("no wharf_raft_snapshot_index for ORDERS")?;
    let entries = metrics::value(&samples, "wharf_raft_log_entries", &labels)
        .context("no wharf_raft_log_entries for ORDERS")?;
    Ok((snapshot as u64, entries as u64))
}

fn expected() -> Vec<(u64, String)> {
    (1..=MESSAGES).map(|i| (i, format!("order-{i}"))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_stays_bounded_and_a_follower_down_long_catches_up_by_snapshot() -> Result<()> {
    let every = SNAPSHOT_EVERY.to_string();
    let mut cluster = Cluster::start_with_args(3, &["--snapshot-every-entries", &every]).await?;
    let client = cluster.client();
    cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let leader = cluster.wait_group_leader("ORDERS", WAIT).await?;
    let down = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster.kill(down);

    // Each publish is at least one entry: eight snapshot intervals' worth.
    for i in 1..=MESSAGES {
        client
            .publish("orders.created", format!("order-{i}"))
            .await?;
    }
    // On both running replicas the log was compacted: a recent snapshot, and
    // no more than three intervals of entries (the interval since the last
    // snapshot, as many kept for followers that lag a little, and a purge
    // batch of at most one interval).
    for id in (1..=3).filter(|id| *id != down) {
        let last = std::cell::Cell::new((0, 0));
        let compacted = eventually(
            &format!("node {id} snapshotted the stream and purged its log"),
            WAIT,
            || async {
                last.set(raft_log(&cluster, id).await.ok()?);
                let (snapshot, entries) = last.get();
                (snapshot >= MESSAGES - 2 * SNAPSHOT_EVERY && entries <= 3 * SNAPSHOT_EVERY)
                    .then_some(())
            },
        )
        .await;
        assert!(
            compacted.is_ok(),
            "node {id} (stream leader: node {leader}): (snapshot index, log entries) = {:?}",
            last.get()
        );
    }

    // The follower comes back behind the others' purged logs.
    cluster.restart(down)?;
    let node = cluster.client_of(down);
    eventually(&format!("node {down} caught up"), WAIT, || async {
        let s = node.stream_info_local("ORDERS").await.ok()?.state?;
        (s.messages == MESSAGES && s.last_seq == MESSAGES).then_some(())
    })
    .await?;
    let log = std::fs::read_to_string(cluster.log_path(down))?;
    assert!(
        log.contains("installed a snapshot sent by the leader"),
        "node {down} caught up without a snapshot transfer"
    );

    // Its replica has every payload: make it the stream's leader and read.
    eventually(&format!("node {down} leads ORDERS"), WAIT, || async {
        let now = cluster.wait_group_leader("ORDERS", WAIT).await.ok()?;
        if now == down {
            return Some(());
        }
        let _ = client.step_down("ORDERS", None).await;
        None
    })
    .await?;
    for seq in [1, MESSAGES / 2, MESSAGES] {
        let m = node.get_message("ORDERS", seq).await?;
        assert_eq!(String::from_utf8_lossy(&m.payload), format!("order-{seq}"));
    }
    assert_eq!(
        cluster.read_all("ORDERS", "after-catch-up").await?,
        expected()
    );

    // SIGKILL everything: each node restores its own snapshot (index only,
    // payloads from its tree) and replays the log after it.
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    cluster.wait_group_leader("ORDERS", WAIT).await?;
    for id in 1..=3u64 {
        let node = cluster.client_of(id);
        eventually(&format!("node {id} has every message"), WAIT, || async {
            let s = node.stream_info_local("ORDERS").await.ok()?.state?;
            (s.messages == MESSAGES && s.first_seq == 1 && s.last_seq == MESSAGES).then_some(())
        })
        .await?;
    }
    assert_eq!(
        cluster.read_all("ORDERS", "after-restart").await?,
        expected()
    );
    Ok(())
}
