//! Leader-aware clients. Publishing: the ack of a publish names the node
//! that stored it, and a client seeded with every node sends the subject's
//! next publishes straight to that node instead of through a follower. When
//! the leader is killed the client falls back to its other seeds, loses no
//! acknowledged publish, and learns the new leader from the next ack.
//! Consuming: a worker's session moves to the node leading the consumer,
//! stays proxied when the client does not know that node, and after the
//! leader is killed lands on the new one.

use std::time::Duration;

use wharf_client::proto as pb;
use wharf_client::{Client, Consumer};
use wharf_tests::metrics::grpc_ok_calls;
use wharf_tests::Cluster;

/// `Publish` calls node `id` answered OK, as its `/metrics` counts them.
async fn publish_calls(cluster: &Cluster, id: u64) -> anyhow::Result<f64> {
    grpc_ok_calls(&cluster.node(id).metrics_addr, "Publish").await
}

/// A node other than `leader`, and a client seeded with every node, that
/// one first: without routing, every call would enter there and be
/// forwarded or relayed.
fn follower_first_client(cluster: &Cluster, leader: u64) -> anyhow::Result<(u64, Client)> {
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");
    let mut seeds = vec![cluster.node(follower).addr.clone()];
    seeds.extend(
        (1..=3)
            .filter(|&n| n != follower)
            .map(|n| cluster.node(n).addr.clone()),
    );
    let client = Client::new(&seeds.join(","))?.with_retry_for(Duration::from_secs(30));
    Ok((follower, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_go_straight_to_the_stream_leader() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let leader = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(20))
        .await?;
    let (follower, client) = follower_first_client(&cluster, leader)?;
    // Where a caller would open a `PublishStream`: the leader's seed.
    assert_eq!(
        client.stream_leader_seed("ORDERS").await?,
        Some(cluster.node(leader).addr.clone())
    );
    assert!(client.stream_leader_seed("NO_SUCH").await.is_err());

    let first = client.publish("orders.created", "0").await?;
    assert_eq!(first.stored_by, cluster.node(leader).addr, "{first:?}");
    let follower_before = publish_calls(&cluster, follower).await?;
    let leader_before = publish_calls(&cluster, leader).await?;
    for i in 1..=20 {
        let ack = client.publish("orders.created", format!("{i}")).await?;
        assert_eq!(ack.seq, i + 1);
        assert_eq!(ack.stored_by, cluster.node(leader).addr);
    }
    assert_eq!(
        publish_calls(&cluster, follower).await?,
        follower_before,
        "the follower was not in the path of routed publishes"
    );
    assert_eq!(publish_calls(&cluster, leader).await?, leader_before + 20.0);

    // The leader goes away: the next publish falls back to the other seeds
    // and its ack names the new leader, which later publishes go to.
    cluster.kill(leader);
    let ack = client.publish("orders.created", "after").await?;
    assert_eq!(ack.seq, 22, "{ack:?}");
    let new_leader = (1..=3)
        .find(|&n| n != leader && ack.stored_by == cluster.node(n).addr)
        .unwrap_or_else(|| panic!("stored_by {:?} names no live node", ack.stored_by));
    let before = publish_calls(&cluster, new_leader).await?;
    for i in 23..=30 {
        let ack = client.publish("orders.created", format!("{i}")).await?;
        assert_eq!(ack.seq, i);
        assert_eq!(ack.stored_by, cluster.node(new_leader).addr);
    }
    assert_eq!(publish_calls(&cluster, new_leader).await?, before + 8.0);

    // Nothing acknowledged was lost or stored twice.
    let info = client.stream_info("ORDERS").await?;
    assert_eq!(info.state.map(|s| s.messages), Some(30));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_know_the_leader_address_still_publishes() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let leader = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(20))
        .await?;
    let follower = (1..=3).find(|&n| n != leader).expect("a follower");
    // Seeded with the follower only: the ack names an address the client
    // was not given, so it keeps publishing through the follower.
    let client = cluster.client_of(follower);
    assert_eq!(client.stream_leader_seed("ORDERS").await?, None);
    for i in 1..=5 {
        let ack = client.publish("orders.created", format!("{i}")).await?;
        assert_eq!(ack.seq, i);
        assert_eq!(ack.stored_by, cluster.node(leader).addr);
    }
    assert!(publish_calls(&cluster, follower).await? >= 5.0);
    Ok(())
}

/// Fetch until `n` messages arrived (or 30 s passed), acking each batch.
async fn take(consumer: &mut Consumer, n: usize) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < n {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} messages arrived",
            got.len()
        );
        let want = u32::try_from(n - got.len())?;
        let msgs = consumer.fetch(want, Duration::from_secs(1)).await?;
        let seqs: Vec<u64> = msgs.iter().map(|m| m.stream_seq).collect();
        consumer.ack_each(&seqs).await?;
        got.extend(
            msgs.iter()
                .map(|m| String::from_utf8_lossy(&m.payload).into_owned()),
        );
    }
    Ok(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_session_moves_to_the_consumer_leader() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let admin = cluster.client();
    let config = pb::ConsumerConfig {
        name: "shipping".into(),
        ..Default::default()
    };
    admin.add_consumer("ORDERS", config).await?;
    let group = "ORDERS/shipping";
    let leader = cluster
        .wait_group_leader(group, Duration::from_secs(20))
        .await?;
    let (follower, client) = follower_first_client(&cluster, leader)?;
    for i in 0..10 {
        client.publish("orders.created", format!("m{i}")).await?;
    }

    // Seeded follower first, the session ends up at the consumer's leader.
    let mut worker = client.consumer("ORDERS", "shipping");
    assert_eq!(take(&mut worker, 5).await?.len(), 5);
    assert_eq!(
        worker.session_addr(),
        Some(cluster.node(leader).addr.as_str())
    );

    // Seeded with the follower only: proxied there, and still served.
    let mut proxied = cluster.client_of(follower).consumer("ORDERS", "shipping");
    assert_eq!(take(&mut proxied, 5).await?.len(), 5);
    assert_eq!(
        proxied.session_addr(),
        Some(cluster.node(follower).addr.as_str())
    );
    proxied.close();

    // The leader goes: the session is reopened and moves to the new leader.
    cluster.kill(leader);
    for i in 10..15 {
        client.publish("orders.created", format!("m{i}")).await?;
    }
    let got = take(&mut worker, 5).await?;
    assert_eq!(got, ["m10", "m11", "m12", "m13", "m14"]);
    let new_leader = cluster
        .wait_group_leader(group, Duration::from_secs(20))
        .await?;
    assert_eq!(
        worker.session_addr(),
        Some(cluster.node(new_leader).addr.as_str())
    );

    let info = client.consumer_info("ORDERS", "shipping").await?;
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(info.ack_floor.map(|f| f.stream_seq), Some(15), "{info:?}");
    Ok(())
}
