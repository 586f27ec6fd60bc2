//! AckWait redelivery across workers, and MaxAckPending shared by all workers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use wharf_client::proto as pb;
use wharf_tests::{json, stdout, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_message_of_a_vanished_worker_goes_to_another_with_count_2() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&[
        "stream",
        "add",
        "ORDERS",
        "--subjects",
        "orders.>",
        "--json",
    ]))?;
    json(&cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "shipping",
        "--filter",
        "orders.shipped",
        "--ack-wait",
        "2s",
        "--json",
    ]))?;
    let out = cluster.wharf(&["pub", "orders.shipped", "ord_8w2k"]);
    assert!(out.status.success());

    // Worker A pulls without acking, prints, and its process exits: its stream closes.
    let out = cluster.wharf(&[
        "consumer", "next", "ORDERS", "shipping", "--count", "1", "--no-ack", "--json",
    ]);
    let first = json(&out)?;
    assert_eq!(first["delivered"], 1);
    assert_eq!(first["payload"], "ord_8w2k");
    let info = json(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping", "--json"]))?;
    assert_eq!(info["num_ack_pending"], 1);

    // Worker B is waiting; after AckWait the message reaches it, delivered twice.
    let out = cluster.wharf(&[
        "consumer", "next", "ORDERS", "shipping", "--count", "1", "--ack", "--wait", "20s",
        "--json",
    ]);
    let second = json(&out)?;
    assert_eq!(second["payload"], "ord_8w2k");
    assert_eq!(second["delivered"], 2);
    assert_eq!(second["stream_seq"], first["stream_seq"]);
    assert_eq!(
        second["consumer_seq"], 2,
        "a redelivery takes a new consumer sequence"
    );

    let info = json(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping", "--json"]))?;
    assert_eq!(info["num_ack_pending"], 0);
    assert_eq!(info["num_redelivered"], 1);
    let text = stdout(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping"]));
    assert!(text.contains("Redelivered Messages: 1"), "{text}");
    assert!(
        text.contains("Outstanding Acks: 0 out of maximum 1,000"),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ack_pending_caps_outstanding_across_ten_workers() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            ..Default::default()
        })
        .await?;
    let config = pb::ConsumerConfig {
        name: "workers".into(),
        ack_wait_ms: 60_000,
        max_ack_pending: 3,
        ..Default::default()
    };
    client.add_consumer("JOBS", config).await?;
    for i in 0..20 {
        client.publish("jobs.run", format!("job-{i}")).await?;
    }

    // Ten workers hold what they get without acking.
    let received = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..10 {
        let mut consumer = client.consumer("JOBS", "workers");
        let received = received.clone();
        workers.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for _ in 0..3 {
                let got = consumer
                    .fetch(1, Duration::from_secs(2))
                    .await
                    .expect("fetch");
                received.fetch_add(got.len() as u64, Ordering::SeqCst);
                held.extend(got);
            }
            (consumer, held)
        }));
    }
    // While they pull, the consumer never has more than 3 outstanding.
    let mut max_seen = 0;
    while workers.iter().any(|w| !w.is_finished()) {
        let info = client.consumer_info("JOBS", "workers").await?;
        max_seen = max_seen.max(info.num_ack_pending);
        assert!(
            info.num_ack_pending <= 3,
            "outstanding {} > 3",
            info.num_ack_pending
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut holders = Vec::new();
    for w in workers {
        holders.push(w.await?);
    }
    assert_eq!(
        received.load(Ordering::SeqCst),
        3,
        "only three messages may be in progress"
    );
    assert_eq!(
        max_seen.max(
            client
                .consumer_info("JOBS", "workers")
                .await?
                .num_ack_pending
        ),
        3
    );

    // Acking one frees exactly one slot for a waiting worker.
    let (holder, held) = holders
        .iter_mut()
        .find(|(_, h)| !h.is_empty())
        .expect("someone holds one");
    holder.ack(held[0].stream_seq).await?;
    let mut other = client.consumer("JOBS", "workers");
    let got = other.fetch(5, Duration::from_secs(3)).await?;
    assert_eq!(got.len(), 1, "one slot freed, one message delivered");
    let info = client.consumer_info("JOBS", "workers").await?;
    assert_eq!(info.num_ack_pending, 3);
    assert_eq!(info.num_pending, 16);
    Ok(())
}
