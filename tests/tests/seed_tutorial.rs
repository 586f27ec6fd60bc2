//! The seed story ("Scaling a consumer") on a real three-node cluster, driven
//! through the `wharf` CLI exactly as a user types it.

use std::collections::BTreeSet;
use std::time::Duration;

use wharf_tests::{eventually, json, stdout, Cluster};

const ORDERS: [&str; 3] = [
    r#"{"order_id":"ord_8w2k","customer":"acme-co","total_cents":4200,"ts":"2026-05-22T10:14:22Z"}"#,
    r#"{"order_id":"ord_2zr9","customer":"globex","total_cents":7800,"ts":"2026-05-22T10:14:25Z"}"#,
    r#"{"order_id":"ord_5k1m","customer":"initech","total_cents":1500,"ts":"2026-05-22T10:14:29Z"}"#,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_one_consumer_position() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let out = cluster.wharf(&[
        "stream",
        "add",
        "ORDERS",
        "--subjects",
        "orders.>",
        "--json",
    ]);
    let info = json(&out)?;
    assert_eq!(info["config"]["num_replicas"], 3);

    // Earlier pages of the tutorial left orders in the stream.
    for i in 1..=3 {
        let out = cluster.wharf(&["pub", "orders.created", &format!("{{\"order\":{i}}}")]);
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
        assert_eq!(
            stdout(&out).trim(),
            format!("Stored in stream ORDERS at sequence {i}")
        );
    }
    let out = cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "shipping",
        "--filter",
        "orders.shipped",
        "--json",
    ]);
    json(&out)?;

    // Three workers, each pulling one message at a time with ack.
    let workers: Vec<_> = (0..3)
        .map(|_| {
            cluster.wharf_spawn(&[
                "consumer", "next", "ORDERS", "shipping", "--count", "1", "--ack", "--wait", "30s",
                "--json",
            ])
        })
        .collect();
    // Publish once all three have a pull open, so the split is round-robin.
    eventually("three waiting pulls", Duration::from_secs(20), || async {
        let info =
            json(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping", "--json"])).ok()?;
        (info["num_waiting"] == 3).then_some(())
    })
    .await?;
    for order in ORDERS {
        let out = cluster.wharf(&["pub", "orders.shipped", order]);
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    }

    let mut received = Vec::new();
    for w in workers {
        let out = w.wait_with_output()?;
        assert!(
            out.status.success(),
            "worker failed: {}",
            wharf_tests::stderr(&out)
        );
        let lines: Vec<_> = stdout(&out).lines().map(str::to_string).collect();
        assert_eq!(
            lines.len(),
            1,
            "each worker gets exactly one order: {lines:?}"
        );
        let m: serde_json::Value = serde_json::from_str(&lines[0])?;
        assert_eq!(m["subject"], "orders.shipped");
        assert_eq!(m["delivered"], 1);
        received.push(m["payload"].as_str().unwrap_or_default().to_string());
    }
    let distinct: BTreeSet<_> = received.iter().cloned().collect();
    let expected: BTreeSet<_> = ORDERS.iter().map(|s| s.to_string()).collect();
    assert_eq!(distinct, expected, "each order reached exactly one worker");

    let info = json(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping", "--json"]))?;
    assert_eq!(info["delivered"]["consumer_seq"], 3);
    assert_eq!(info["delivered"]["stream_seq"], 6);
    assert_eq!(info["ack_floor"]["consumer_seq"], 3);
    assert_eq!(info["ack_floor"]["stream_seq"], 6);
    assert_eq!(info["num_ack_pending"], 0);
    assert_eq!(info["num_redelivered"], 0);
    assert_eq!(info["num_pending"], 0);
    assert_eq!(info["config"]["max_ack_pending"], 1000);
    assert_eq!(info["config"]["filter_subject"], "orders.shipped");
    assert!(info["cluster"]["leader"].as_u64().unwrap_or(0) >= 1);
    assert_eq!(
        info["cluster"]["replicas"].as_array().map(|a| a.len()),
        Some(3)
    );

    let text = stdout(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping"]));
    assert!(
        text.contains("Last Delivered Message: Consumer sequence: 3 Stream sequence: 6"),
        "{text}"
    );
    assert!(
        text.contains("Acknowledgment Floor: Consumer sequence: 3 Stream sequence: 6"),
        "{text}"
    );
    assert!(
        text.contains("Outstanding Acks: 0 out of maximum 1,000"),
        "{text}"
    );
    assert!(text.contains("Redelivered Messages: 0"), "{text}");
    assert!(text.contains("Unprocessed Messages: 0"), "{text}");
    assert!(text.contains("Waiting Pulls: 0 of maximum 512"), "{text}");

    // The stream keeps every order after the workers handled them.
    let stream = json(&cluster.wharf(&["stream", "info", "ORDERS", "--json"]))?;
    assert_eq!(stream["state"]["messages"], 6);
    assert_eq!(stream["state"]["first_seq"], 1);
    assert_eq!(stream["state"]["last_seq"], 6);

    // Raising MaxAckPending, as the Pitfalls section does.
    let edited = json(&cluster.wharf(&[
        "consumer",
        "edit",
        "ORDERS",
        "shipping",
        "--max-pending",
        "5000",
        "--json",
    ]))?;
    assert_eq!(edited["config"]["max_ack_pending"], 5000);
    let text = stdout(&cluster.wharf(&["consumer", "info", "ORDERS", "shipping"]));
    assert!(
        text.contains("Outstanding Acks: 0 out of maximum 5,000"),
        "{text}"
    );

    let ls = stdout(&cluster.wharf(&["consumer", "ls", "ORDERS"]));
    assert!(ls.contains("shipping"), "{ls}");
    let status = stdout(&cluster.wharf(&["cluster", "status"]));
    assert!(status.contains("ORDERS/shipping"), "{status}");
    assert_eq!(status.matches(" up").count(), 3, "{status}");
    Ok(())
}
