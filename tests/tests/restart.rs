//! Durability across restarts: every node SIGKILLed, then restarted from its
//! data dir; streams, consumers, messages and positions are intact.

use std::time::Duration;

use wharf_client::proto as pb;
use wharf_tests::{eventually, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_restart_keeps_streams_consumers_and_positions() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    client
        .add_stream(pb::StreamConfig {
            name: "AUDIT".into(),
            subjects: vec!["audit".into()],
            replicas: 1,
            ..Default::default()
        })
        .await?;
    let config = pb::ConsumerConfig {
        name: "shipping".into(),
        ack_wait_ms: 60_000,
        ..Default::default()
    };
    client.add_consumer("ORDERS", config).await?;
    for i in 1..=10 {
        let ack = client
            .publish("orders.created", format!("order-{i}"))
            .await?;
        assert_eq!(ack.seq, i);
    }
    client.publish("audit", "audit-1").await?;

    // Four processed and acked, one delivered and left unacked.
    let mut worker = client.consumer("ORDERS", "shipping");
    let got = worker.fetch(4, Duration::from_secs(5)).await?;
    assert_eq!(got.len(), 4);
    for m in &got {
        worker.ack(m.stream_seq).await?;
    }
    let held = worker.fetch(1, Duration::from_secs(5)).await?;
    assert_eq!(held[0].stream_seq, 5);
    let before = client.consumer_info("ORDERS", "shipping").await?;
    assert_eq!(before.num_ack_pending, 1);
    drop(worker);

    // Power off every node at once, then bring them all back.
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    cluster.wait_meta_leader(Duration::from_secs(30)).await?;
    cluster
        .wait_group_leader("ORDERS/shipping", Duration::from_secs(30))
        .await?;

    let stream = client.stream_info("ORDERS").await?;
    let state = stream.state.unwrap_or_default();
    assert_eq!(
        (state.messages, state.first_seq, state.last_seq),
        (10, 1, 10)
    );
    let audit = client.stream_info("AUDIT").await?.state.unwrap_or_default();
    assert_eq!(audit.messages, 1);
    let after = eventually(
        "consumer info after restart",
        Duration::from_secs(20),
        || async { client.consumer_info("ORDERS", "shipping").await.ok() },
    )
    .await?;
    assert_eq!(after.delivered, before.delivered);
    assert_eq!(after.ack_floor, before.ack_floor);
    assert_eq!(after.num_ack_pending, 1);
    assert_eq!(after.num_pending, 5);
    assert_eq!(after.config, before.config);

    // Work continues where it stopped: the next new message is 6.
    let mut worker = client.consumer("ORDERS", "shipping");
    let next = worker.fetch(1, Duration::from_secs(10)).await?;
    assert_eq!(next[0].stream_seq, 6);
    assert_eq!(next[0].payload, "order-6".as_bytes());
    worker.ack(6).await?;
    let ack = client.publish("orders.created", "order-11").await?;
    assert_eq!(ack.seq, 11, "sequences continue after the restart");
    Ok(())
}
