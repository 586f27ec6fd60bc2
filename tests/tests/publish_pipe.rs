//! A `PublishStream` opened on a node that does not lead the stream: its
//! publishes reach the leader over one forwarded stream (not a unary call
//! each), in order, and survive the leader's loss; on the leader itself
//! they are stored in the order sent too.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use wharf_client::proto as pb;
use wharf_client::proto::wharf_client::WharfClient;
use wharf_tests::{eventually, metrics, Cluster};

const WAIT: Duration = Duration::from_secs(30);

/// A publish stream on node `id`: the sender and the acks.
async fn publish_stream_on(
    cluster: &Cluster,
    id: u64,
) -> Result<(
    mpsc::Sender<pb::PublishRequest>,
    tonic::Streaming<pb::PublishAck>,
)> {
    let url = format!("http://{}", cluster.node(id).addr);
    let mut grpc = WharfClient::connect(url).await?;
    let (tx, rx) = mpsc::channel(1024);
    let acks = grpc
        .publish_stream(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, acks))
}

fn msg(i: u64) -> pb::PublishRequest {
    pb::PublishRequest {
        subject: "orders.new".into(),
        payload: format!("o{i}").into(),
        msg_id: format!("id-{i}"),
        ..Default::default()
    }
}

/// Calls of `method` that node `id` finished with OK.
async fn handled_ok(cluster: &Cluster, id: u64, method: &str) -> Result<f64> {
    let text = metrics::scrape(&cluster.node(id).metrics_addr).await?;
    let samples = metrics::parse(&text)?;
    let labels = [("grpc_method", method), ("grpc_code", "OK")];
    Ok(metrics::value(&samples, "wharf_grpc_server_handled_total", &labels).unwrap_or(0.0))
}

async fn follower_of(cluster: &Cluster, stream: &str) -> Result<(u64, u64)> {
    let leader = cluster.wait_group_leader(stream, WAIT).await?;
    let follower = (1..=3).find(|n| *n != leader).context("no follower")?;
    Ok((leader, follower))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_on_a_follower_reach_the_leader_over_one_stream() -> Result<()> {
    let cluster = Cluster::start(3).await?;
    cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let (leader, follower) = follower_of(&cluster, "ORDERS").await?;
    let unary_before = handled_ok(&cluster, leader, "Publish").await?;

    let (tx, mut acks) = publish_stream_on(&cluster, follower).await?;
    for i in 1..=500 {
        tx.send(msg(i)).await?;
    }
    for i in 1..=500u64 {
        let ack = acks.message().await?.context("acks ended early")?;
        ensure!(ack.error.is_empty(), "publish {i}: {}", ack.error);
        assert_eq!((ack.stream.as_str(), ack.seq), ("ORDERS", i));
    }
    drop(tx);
    ensure!(acks.message().await?.is_none(), "more acks than publishes");

    // The leader served the forwarded publishes as one stream, no unary call.
    eventually("the leader counted the forwarded stream", WAIT, || async {
        (handled_ok(&cluster, leader, "PublishStream").await.ok()? >= 1.0).then_some(())
    })
    .await?;
    let unary_after = handled_ok(&cluster, leader, "Publish").await?;
    assert_eq!(
        unary_after, unary_before,
        "publishes were forwarded one call each"
    );

    let stored = cluster.read_all("ORDERS", "check").await?;
    let expected: Vec<(u64, String)> = (1..=500).map(|i| (i, format!("o{i}"))).collect();
    assert_eq!(stored, expected);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_publishes_survive_the_loss_of_the_leader() -> Result<()> {
    let mut cluster = Cluster::start(3).await?;
    cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let (leader, follower) = follower_of(&cluster, "ORDERS").await?;
    let (tx, mut acks) = publish_stream_on(&cluster, follower).await?;
    for i in 1..=100 {
        tx.send(msg(i)).await?;
    }
    for _ in 1..=100 {
        let ack = acks.message().await?.context("acks ended early")?;
        ensure!(ack.error.is_empty(), "{}", ack.error);
    }
    cluster.kill(leader);
    for i in 101..=300 {
        tx.send(msg(i)).await?;
    }
    drop(tx);
    let mut ok = 100;
    while let Some(ack) = acks.message().await? {
        ensure!(
            ack.error.is_empty(),
            "after the leader's loss: {}",
            ack.error
        );
        ok += 1;
    }
    assert_eq!(ok, 300, "every publish acknowledged");

    // Each message stored once (a retried forward is caught by its msg id).
    let mut stored: Vec<String> = cluster
        .read_all("ORDERS", "check")
        .await?
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    stored.sort_by_key(|p| p[1..].parse::<u64>().unwrap_or(0));
    let expected: Vec<String> = (1..=300).map(|i| format!("o{i}")).collect();
    assert_eq!(stored, expected);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_stream_on_the_leader_stores_in_the_order_sent() -> Result<()> {
    let cluster = Cluster::start(3).await?;
    cluster.add_stream("ORDERS", &["orders.>"]).await?;
    let leader = cluster.wait_group_leader("ORDERS", WAIT).await?;
    let (tx, mut acks) = publish_stream_on(&cluster, leader).await?;
    // Far more than one task's cooperative budget of operations in flight:
    // each message must still be queued in the order it came.
    for i in 1..=1000 {
        tx.send(msg(i)).await?;
    }
    for i in 1..=1000u64 {
        let ack = acks.message().await?.context("acks ended early")?;
        ensure!(ack.error.is_empty(), "publish {i}: {}", ack.error);
        assert_eq!(ack.seq, i, "publish {i} stored out of order");
    }
    Ok(())
}
