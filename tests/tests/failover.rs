//! Node loss under load: `wharf server` processes, SIGKILL of the node leading
//! the consumer (and, separately, the stream) while 2,000 messages are
//! published and consumed by three workers through the client library. The
//! stream case runs its nodes on one runtime thread each
//! (`--worker-threads 1`, as `bench/compare.sh THREADS_PER_NODE=1` does).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wharf_client::proto as pb;
use wharf_tests::{eventually, Cluster};

const PUBLISHERS: u64 = 2;
const PER_PUBLISHER: u64 = 1000;

async fn kill_leader_under_load(group: &str, server_args: &[&str]) -> anyhow::Result<()> {
    let mut cluster = Cluster::start_with_args(3, server_args).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    let config = pb::ConsumerConfig {
        name: "shipping".into(),
        ack_wait_ms: 2000,
        ..Default::default()
    };
    client.add_consumer("ORDERS", config).await?;
    cluster
        .wait_group_leader("ORDERS/shipping", Duration::from_secs(20))
        .await?;

    let acked: Arc<Mutex<HashSet<String>>> = Arc::default();
    let processed: Arc<Mutex<HashSet<String>>> = Arc::default();
    let published = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let (client, acked, published) = (client.clone(), acked.clone(), published.clone());
        publishers.push(tokio::spawn(async move {
            for i in 0..PER_PUBLISHER {
                let id = format!("p{p}-{i}");
                client
                    .publish("orders.created", id.clone())
                    .await
                    .expect("publish rides through failover");
                acked.lock().unwrap().insert(id);
                published.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (client, processed, stop) = (client.clone(), processed.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let mut consumer = client.consumer("ORDERS", "shipping");
            while !stop.load(Ordering::SeqCst) {
                let batch = consumer
                    .fetch(10, Duration::from_millis(500))
                    .await
                    .expect("fetch rides through failover");
                for m in batch {
                    processed
                        .lock()
                        .unwrap()
                        .insert(String::from_utf8_lossy(&m.payload).into_owned());
                    consumer
                        .ack(m.stream_seq)
                        .await
                        .expect("ack rides through failover");
                }
            }
        }));
    }

    // A quarter of the way in, kill -9 the node leading the group.
    eventually("some load", Duration::from_secs(60), || async {
        (published.load(Ordering::SeqCst) >= 500).then_some(())
    })
    .await?;
    let leader = cluster
        .wait_group_leader(group, Duration::from_secs(10))
        .await?;
    cluster.kill(leader);
    eprintln!("killed node {leader} leading {group}");
    let new_leader = cluster
        .wait_group_leader(group, Duration::from_secs(20))
        .await?;
    assert_ne!(new_leader, leader);

    for p in publishers {
        p.await?;
    }
    assert_eq!(
        acked.lock().unwrap().len() as u64,
        PUBLISHERS * PER_PUBLISHER
    );
    eventually(
        "every acknowledged publish processed",
        Duration::from_secs(90),
        || async {
            let acked = acked.lock().unwrap().clone();
            let processed = processed.lock().unwrap();
            acked.iter().all(|id| processed.contains(id)).then_some(())
        },
    )
    .await?;
    eventually("nothing outstanding", Duration::from_secs(30), || async {
        let info = client.consumer_info("ORDERS", "shipping").await.ok()?;
        (info.num_ack_pending == 0 && info.num_pending == 0).then_some(info)
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await?;
    }
    let stream = client.stream_info("ORDERS").await?;
    assert!(stream.state.unwrap_or_default().messages >= PUBLISHERS * PER_PUBLISHER);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_consumer_leader_under_load() -> anyhow::Result<()> {
    kill_leader_under_load("ORDERS/shipping", &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_stream_leader_under_load() -> anyhow::Result<()> {
    kill_leader_under_load("ORDERS", &["--worker-threads", "1"]).await
}
