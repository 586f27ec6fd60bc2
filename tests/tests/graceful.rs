//! SIGTERM hands leadership over before the node exits: publishers and
//! workers see leaders move, not errors.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wharf_client::proto as pb;
use wharf_tests::{eventually, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_hands_leadership_over_without_client_errors() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client().with_retry_for(Duration::from_secs(20));
    client
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    client
        .add_consumer(
            "ORDERS",
            pb::ConsumerConfig {
                name: "shipping".into(),
                ..Default::default()
            },
        )
        .await?;
    let leader = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(10))
        .await?;

    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let publisher = {
        let (client, stop, published) = (client.clone(), stop.clone(), published.clone());
        tokio::spawn(async move {
            let mut errors = 0;
            while !stop.load(Ordering::SeqCst) {
                match client.publish("orders.created", "x").await {
                    Ok(_) => {
                        published.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) => {
                        eprintln!("publish error: {e}");
                        errors += 1;
                    }
                }
            }
            errors
        })
    };
    eventually("publishing", Duration::from_secs(10), || async {
        (published.load(Ordering::SeqCst) > 50).then_some(())
    })
    .await?;

    let started = Instant::now();
    cluster.stop(leader);
    let took = started.elapsed();
    let new_leader = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(10))
        .await?;
    assert_ne!(new_leader, leader);
    let before = published.load(Ordering::SeqCst);
    eventually(
        "publishing on the new leader",
        Duration::from_secs(10),
        || async { (published.load(Ordering::SeqCst) > before + 50).then_some(()) },
    )
    .await?;
    stop.store(true, Ordering::SeqCst);
    assert_eq!(publisher.await?, 0, "no publish failed");
    assert!(took < Duration::from_secs(14), "SIGTERM took {took:?}");
    // The stopped node's log says it handed over rather than timed out.
    let log = std::fs::read_to_string(cluster.node(leader).data.with_extension("log"))?;
    assert!(log.contains("leadership handed over"), "{log}");
    assert!(!log.contains("did not finish"), "{log}");
    Ok(())
}
