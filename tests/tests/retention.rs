//! Work-queue and interest retention on a real three-node cluster, with a
//! kill -9 of a consumer group's leader in the middle of each.

use std::time::Duration;

use wharf_client::proto as pb;
use wharf_client::Client;
use wharf_tests::{eventually, json, Cluster};

async fn messages(client: &Client, stream: &str) -> Option<u64> {
    let info = client.stream_info(stream).await.ok()?;
    Some(info.state.unwrap_or_default().messages)
}

/// Waits until the stream holds exactly `want` messages.
async fn wait_messages(client: &Client, stream: &str, want: u64) -> anyhow::Result<()> {
    eventually(
        &format!("{stream} to hold {want} messages"),
        Duration::from_secs(20),
        || async { (messages(client, stream).await == Some(want)).then_some(()) },
    )
    .await
}

/// Fetches and acks until `count` messages were acked.
async fn ack_n(client: &Client, stream: &str, consumer: &str, count: usize) -> anyhow::Result<()> {
    let mut worker = client.consumer(stream, consumer);
    let mut acked = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while acked < count {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "acked only {acked} of {count}"
        );
        let batch = (count - acked).min(10) as u32;
        for m in worker.fetch(batch, Duration::from_secs(2)).await? {
            worker.ack(m.stream_seq).await?;
            acked += 1;
        }
    }
    Ok(())
}

async fn kill_leader(cluster: &mut Cluster, group: &str) -> anyhow::Result<u64> {
    let leader = cluster
        .wait_group_leader(group, Duration::from_secs(20))
        .await?;
    cluster.kill(leader);
    cluster
        .wait_group_leader(group, Duration::from_secs(20))
        .await?;
    Ok(leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workqueue_removes_what_its_consumer_acked_and_survives_a_leader_kill() -> anyhow::Result<()>
{
    let mut cluster = Cluster::start(3).await?;
    // The CLI flag creates the work-queue stream.
    let out = cluster.wharf(&[
        "stream",
        "add",
        "JOBS",
        "--subjects",
        "jobs.>",
        "--retention",
        "workqueue",
        "--json",
    ]);
    assert_eq!(json(&out)?["config"]["retention"], "workqueue");
    let client = cluster.client();
    let consumer = |name: &str, filter: &str| pb::ConsumerConfig {
        name: name.into(),
        filter_subject: filter.into(),
        ack_wait_ms: 2_000,
        ..Default::default()
    };
    client.add_consumer("JOBS", consumer("a", "jobs.a")).await?;
    // Overlapping consumers are refused, and change nothing.
    for (name, filter) in [("all", ""), ("wild", "jobs.*"), ("same", "jobs.a")] {
        let err = client
            .add_consumer("JOBS", consumer(name, filter))
            .await
            .expect_err("an overlapping work-queue consumer is refused");
        assert!(err.to_string().contains("overlap"), "{err}");
    }
    let none = pb::ConsumerConfig {
        ack_policy: pb::AckPolicy::AckNone as i32,
        ..consumer("none", "jobs.c")
    };
    let err = client
        .add_consumer("JOBS", none)
        .await
        .expect_err("ack none refused");
    assert!(err.to_string().contains("must ack"), "{err}");
    assert_eq!(client.list_consumers("JOBS").await?.len(), 1);
    client.add_consumer("JOBS", consumer("b", "jobs.b")).await?;

    for i in 0..10 {
        client.publish("jobs.a", format!("a-{i}")).await?;
    }
    client.publish("jobs.b", "b-0").await?;
    client.publish("jobs.z", "nobody's").await?;
    wait_messages(&client, "JOBS", 12).await?;
    ack_n(&client, "JOBS", "a", 4).await?;
    wait_messages(&client, "JOBS", 8).await?;

    // Deliver three more without acking, then kill consumer a's leader.
    let mut slow = client.consumer("JOBS", "a");
    let taken = slow.fetch(3, Duration::from_secs(5)).await?;
    assert_eq!(taken.len(), 3);
    kill_leader(&mut cluster, "JOBS/a").await?;
    let client = cluster.client();
    // Unacked messages stay stored across the failover...
    assert_eq!(messages(&client, "JOBS").await, Some(8));
    // ...and go once acked on the new leader (the three come back after AckWait).
    ack_n(&client, "JOBS", "a", 6).await?;
    ack_n(&client, "JOBS", "b", 1).await?;
    wait_messages(&client, "JOBS", 1).await?;
    let left = client.get_message("JOBS", 12).await?;
    assert_eq!(left.subject, "jobs.z");
    let info = client.consumer_info("JOBS", "a").await?;
    assert_eq!((info.num_ack_pending, info.num_pending), (0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interest_keeps_a_message_until_every_matching_consumer_acked() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            retention: pb::RetentionPolicy::RetentionInterest as i32,
            ..Default::default()
        })
        .await?;
    // Nobody is interested yet: stored and removed at once.
    let ack = client.publish("orders.new", "early").await?;
    assert_eq!(ack.seq, 1);
    wait_messages(&client, "ORDERS", 0).await?;

    let consumer = |name: &str, filter: &str| pb::ConsumerConfig {
        name: name.into(),
        filter_subject: filter.into(),
        ack_wait_ms: 2_000,
        ..Default::default()
    };
    client
        .add_consumer("ORDERS", consumer("billing", ""))
        .await?;
    client
        .add_consumer("ORDERS", consumer("shipping", "orders.new"))
        .await?;
    let info = client.stream_info("ORDERS").await?;
    let mut registered = info.state.unwrap_or_default().retention_consumers;
    registered.sort();
    assert_eq!(registered, ["billing", "shipping"]);

    for i in 0..3 {
        client.publish("orders.new", format!("new-{i}")).await?;
    }
    client.publish("orders.paid", "paid-0").await?;
    wait_messages(&client, "ORDERS", 4).await?;
    // billing acks everything: orders.paid (only billing's) goes, the three
    // orders.new wait for shipping.
    ack_n(&client, "ORDERS", "billing", 4).await?;
    wait_messages(&client, "ORDERS", 3).await?;

    ack_n(&client, "ORDERS", "shipping", 1).await?;
    wait_messages(&client, "ORDERS", 2).await?;
    kill_leader(&mut cluster, "ORDERS/shipping").await?;
    let client = cluster.client();
    assert_eq!(messages(&client, "ORDERS").await, Some(2));
    ack_n(&client, "ORDERS", "shipping", 2).await?;
    wait_messages(&client, "ORDERS", 0).await?;

    // A deleted consumer stops holding messages back.
    client.publish("orders.new", "late").await?;
    ack_n(&client, "ORDERS", "billing", 1).await?;
    wait_messages(&client, "ORDERS", 1).await?;
    client.delete_consumer("ORDERS", "shipping").await?;
    wait_messages(&client, "ORDERS", 0).await?;
    Ok(())
}
