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
use wharf_tests::{eventually, Cluster};

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
    let (_, client) = follower_first_client(&cluster, leader)?;
    // Where a caller would open a `PublishStream`: the leader's seed.
    assert_eq!(
        client.stream_leader_seed("ORDERS").await?,
        Some(cluster.node(leader).addr.clone())
    );
    assert!(client.stream_leader_seed("NO_SUCH").await.is_err());

    // The first publish does not know the route: a unary call through the
    // follower, whose ack names the leader.
    let first = client.publish("orders.created", "0").await?;
    assert_eq!(first.stored_by, cluster.node(leader).addr, "{first:?}");
    let before = calls(&cluster).await?;
    for i in 1..=20 {
        let ack = client.publish("orders.created", format!("{i}")).await?;
        assert_eq!(ack.seq, i + 1);
        assert_eq!(ack.stored_by, cluster.node(leader).addr);
    }
    // The next 20 went down one lane (a `PublishStream`, counted when it
    // ends: with the client) to the leader, and nothing else went anywhere.
    drop(client);
    let mut expected = before.clone();
    expected[index(leader)].1 += 1.0;
    let settled = eventually(
        "the lane to the leader ended",
        Duration::from_secs(10),
        || async { (calls(&cluster).await.ok()? == expected).then_some(()) },
    )
    .await;
    if settled.is_err() {
        let now = calls(&cluster).await?;
        anyhow::bail!("(Publish, PublishStream) calls per node {now:?}, expected {expected:?}");
    }

    // A new client learns the route again, then the leader goes away: the
    // next publish finds its lane broken, falls back to the other seeds,
    // and its ack names the new leader, which later publishes go to.
    let (_, client) = follower_first_client(&cluster, leader)?;
    assert_eq!(client.publish("orders.created", "21").await?.seq, 22);
    assert_eq!(client.publish("orders.created", "22").await?.seq, 23);
    cluster.kill(leader);
    let ack = client.publish("orders.created", "after").await?;
    assert_eq!(ack.seq, 24, "{ack:?}");
    let new_leader = (1..=3)
        .find(|&n| n != leader && ack.stored_by == cluster.node(n).addr)
        .unwrap_or_else(|| panic!("stored_by {:?} names no live node", ack.stored_by));
    let before = node_calls(&cluster, new_leader).await?;
    for i in 25..=32 {
        let ack = client.publish("orders.created", format!("{i}")).await?;
        assert_eq!(ack.seq, i);
        assert_eq!(ack.stored_by, cluster.node(new_leader).addr);
    }
    // Nothing acknowledged was lost or stored twice.
    let info = client.stream_info("ORDERS").await?;
    assert_eq!(info.state.map(|s| s.messages), Some(32));
    drop(client);
    let expected = (before.0, before.1 + 1.0);
    let settled = eventually(
        "the lane to the new leader ended",
        Duration::from_secs(10),
        || async { (node_calls(&cluster, new_leader).await.ok()? == expected).then_some(()) },
    )
    .await;
    if settled.is_err() {
        let now = node_calls(&cluster, new_leader).await?;
        anyhow::bail!("new leader's (Publish, PublishStream) calls {now:?}, expected {expected:?}");
    }
    Ok(())
}

/// Index of node `id` in what [`calls`] returns.
fn index(id: u64) -> usize {
    usize::try_from(id - 1).expect("small node id")
}

/// (`Publish`, `PublishStream`) calls node `id` answered OK.
async fn node_calls(cluster: &Cluster, id: u64) -> anyhow::Result<(f64, f64)> {
    let addr = &cluster.node(id).metrics_addr;
    Ok((
        grpc_ok_calls(addr, "Publish").await?,
        grpc_ok_calls(addr, "PublishStream").await?,
    ))
}

/// [`node_calls`] of nodes 1 to 3.
async fn calls(cluster: &Cluster) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut all = Vec::new();
    for id in 1..=3 {
        all.push(node_calls(cluster, id).await?);
    }
    Ok(all)
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
