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
    // Writes were under way: the cut must have taken back some of sled's
    // log, or this test shows nothing (sled never syncs its small `conf`
    // file, so that one always goes; sled rewrites it at open).
    let db = std::path::Path::new("sled/db");
    assert!(
        cuts.iter().any(|c| c.rolled_back.iter().any(|p| p == db)),
        "nothing of sled/db was unsynced at the cut: {cuts:?}"
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
