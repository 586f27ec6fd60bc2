//! Any node serves any request, and a worker that goes away withdraws its
//! waiting pulls at once.

use std::time::Duration;

use wharf_client::proto as pb;
use wharf_tests::{eventually, json, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_accepts_every_request() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let via1 = cluster.client_of(1);
    via1.add_stream(pb::StreamConfig {
        name: "ORDERS".into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .await?;
    cluster
        .client_of(2)
        .add_consumer(
            "ORDERS",
            pb::ConsumerConfig {
                name: "shipping".into(),
                ..Default::default()
            },
        )
        .await?;
    let stream_leader = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(10))
        .await?;
    let consumer_leader = cluster
        .wait_group_leader("ORDERS/shipping", Duration::from_secs(10))
        .await?;
    eprintln!("stream leader {stream_leader}, consumer leader {consumer_leader}");
    // Every node reports itself live and ready through gRPC health (ready
    // may trail the creation by one health check period: wait for it).
    for id in 1..=3u64 {
        for service in ["ready", "live"] {
            let addr = cluster.node(id).addr.clone();
            let what = format!("node {id} {service}");
            wharf_tests::eventually(&what, Duration::from_secs(10), || async {
                let out = cluster.wharf(&["--server", &addr, "health", "--service", service]);
                out.status.success().then_some(())
            })
            .await?;
        }
    }

    // Publish, pull, ack and read state through each node in turn: two of
    // them forward to the leaders.
    for id in 1..=3u64 {
        let client = cluster.client_of(id);
        let ack = client
            .publish("orders.created", format!("via-{id}"))
            .await?;
        assert_eq!(ack.stream, "ORDERS");
        assert_eq!(ack.seq, id);
        let mut worker = client.consumer("ORDERS", "shipping");
        let got = worker.fetch(1, Duration::from_secs(5)).await?;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].payload, format!("via-{id}").into_bytes());
        worker.ack(got[0].stream_seq).await?;
        let info = client.consumer_info("ORDERS", "shipping").await?;
        assert_eq!(info.num_ack_pending, 0);
        assert_eq!(info.delivered.unwrap_or_default().stream_seq, id);
        let stream = client.stream_info("ORDERS").await?;
        assert_eq!(stream.state.unwrap_or_default().last_seq, id);
        assert_eq!(client.list_streams().await?.len(), 1);
        assert_eq!(client.list_consumers("ORDERS").await?.len(), 1);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_disconnects_loses_its_waiting_pull_at_once() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&[
        "stream",
        "add",
        "ORDERS",
        "--subjects",
        "orders.>",
        "--json",
    ]))?;
    json(&cluster.wharf(&["consumer", "add", "ORDERS", "shipping", "--json"]))?;

    // Worker A asks and waits, then dies.
    let mut a = cluster.wharf_spawn(&["consumer", "next", "ORDERS", "shipping", "--wait", "60s"]);
    let waiting = eventually("worker A's pull waits", Duration::from_secs(20), || async {
        let info =
            json(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping", "--json"])).ok()?;
        (info["num_waiting"] == 1).then_some(())
    })
    .await;
    let _ = a.kill();
    a.wait()?;
    waiting?;
    eventually(
        "worker A's pull withdrawn",
        Duration::from_secs(5),
        || async {
            let info =
                json(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping", "--json"])).ok()?;
            (info["num_waiting"] == 0).then_some(())
        },
    )
    .await?;

    // The next order is not handed to the dead worker: B gets it first time.
    assert!(cluster
        .wharf(&["pub", "orders.shipped", "ord_2zr9"])
        .status
        .success());
    let b = json(&cluster.wharf(&[
        "consumer", "next", "ORDERS", "shipping", "--json", "--wait", "10s",
    ]))?;
    assert_eq!(b["payload"], "ord_2zr9");
    assert_eq!(b["delivered"], 1);
    let info = json(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping", "--json"]))?;
    assert_eq!(info["num_redelivered"], 0);
    assert_eq!(info["num_ack_pending"], 0);
    Ok(())
}
