//! Crash durability and leadership moves.
//!
//! An acknowledged publish is on disk on a majority before the ack leaves the
//! leader, so killing every node with SIGKILL right after the ack loses
//! nothing: after a restart every replica holds it.

use std::time::Duration;

use wharf_client::proto as pb;
use wharf_tests::{eventually, json, stdout, Cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_all_right_after_ack_keeps_the_message_on_every_replica() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    let mut last = 0;
    for i in 1..=50 {
        last = client
            .publish("orders.created", format!("order-{i}"))
            .await?
            .seq;
    }
    // The 50th ack has just arrived: power off everything at once.
    for id in 1..=3 {
        cluster.kill(id);
    }
    assert_eq!(last, 50);
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    cluster
        .wait_group_leader("ORDERS", Duration::from_secs(30))
        .await?;
    for id in 1..=3u64 {
        let node = cluster.client_of(id);
        let state = eventually(
            &format!("node {id}'s replica has all 50"),
            Duration::from_secs(30),
            || async {
                let s = node.stream_info_local("ORDERS").await.ok()?.state?;
                (s.messages == 50).then_some(s)
            },
        )
        .await?;
        assert_eq!((state.first_seq, state.last_seq), (1, 50), "node {id}");
    }
    let mut worker = {
        client
            .add_consumer(
                "ORDERS",
                pb::ConsumerConfig {
                    name: "audit".into(),
                    ..Default::default()
                },
            )
            .await?;
        client.consumer("ORDERS", "audit")
    };
    let got = worker.fetch(50, Duration::from_secs(5)).await?;
    let payloads: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect();
    let expected: Vec<String> = (1..=50).map(|i| format!("order-{i}")).collect();
    assert_eq!(payloads, expected);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stepdown_moves_stream_and_consumer_leadership() -> anyhow::Result<()> {
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
    for (group, args) in [
        ("ORDERS", vec!["stream", "stepdown", "ORDERS"]),
        (
            "ORDERS/shipping",
            vec!["consumer", "stepdown", "ORDERS", "shipping"],
        ),
    ] {
        let before = cluster
            .wait_group_leader(group, Duration::from_secs(10))
            .await?;
        let out = cluster.wharf(&args);
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
        assert!(
            stdout(&out).contains(&format!("from node {before} to node")),
            "{}",
            stdout(&out)
        );
        let after = cluster
            .wait_group_leader(group, Duration::from_secs(10))
            .await?;
        assert_ne!(before, after, "{group}");
    }
    // The cluster keeps serving on the new leaders.
    assert!(cluster
        .wharf(&["pub", "orders.created", "after-stepdown"])
        .status
        .success());
    let m = json(&cluster.wharf(&["consumer", "next", "ORDERS", "shipping", "--json"]))?;
    assert_eq!(m["payload"], "after-stepdown");
    // A single-replica stream has nobody to step down to.
    json(&cluster.wharf(&[
        "stream",
        "add",
        "SOLO",
        "--subjects",
        "solo",
        "--replicas",
        "1",
        "--json",
    ]))?;
    let out = cluster.wharf(&["stream", "stepdown", "SOLO"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        wharf_tests::stderr(&out).contains("one replica"),
        "{}",
        wharf_tests::stderr(&out)
    );
    Ok(())
}
