//! `/metrics` scraped on every node while the seed tutorial runs: the numbers
//! move as `stream info` and `consumer info` report them.
//!
//! At each quiet point of the story the test reads the CLI's JSON info and
//! scrapes all three nodes until the leader replica's samples equal it
//! (bounded wait), and checks the expected values themselves, so equal zeros
//! cannot pass for agreement.

use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use wharf_tests::metrics::{find, parse, scrape, value, Sample};
use wharf_tests::{eventually, json, stdout, Cluster};

const WAIT: Duration = Duration::from_secs(30);

async fn scrape_all(cluster: &Cluster) -> Option<Vec<Vec<Sample>>> {
    let mut all = Vec::new();
    for n in &cluster.nodes {
        all.push(parse(&scrape(&n.metrics_addr).await.ok()?).ok()?);
    }
    Some(all)
}

/// The value of `name` as reported by the replica that leads (role="leader").
fn leader_value(all: &[Vec<Sample>], name: &str, labels: &[(&str, &str)]) -> Option<u64> {
    let mut labels = labels.to_vec();
    labels.push(("role", "leader"));
    let values: Vec<f64> = all.iter().filter_map(|s| value(s, name, &labels)).collect();
    match values.as_slice() {
        [one] => Some(*one as u64),
        _ => None,
    }
}

fn consumer_info(cluster: &Cluster, name: &str) -> Option<Value> {
    json(&cluster.wharf(&["consumer", "info", "ORDERS", name, "--json"])).ok()
}

/// Wait until the consumer leader's metrics equal `consumer info`, and the
/// info shows `expected` (pending, ack pending, redelivered, waiting).
async fn consumer_agrees(cluster: &Cluster, name: &str, expected: [u64; 4]) -> Result<()> {
    let what = format!("metrics of consumer {name} to match consumer info {expected:?}");
    eventually(&what, WAIT, || async {
        let info = consumer_info(cluster, name)?;
        let from_info = [
            info["num_pending"].as_u64()?,
            info["num_ack_pending"].as_u64()?,
            info["num_redelivered"].as_u64()?,
            info["num_waiting"].as_u64()?,
        ];
        if from_info != expected {
            return None;
        }
        let all = scrape_all(cluster).await?;
        let labels = [("stream", "ORDERS"), ("consumer", name)];
        let from_metrics = [
            leader_value(&all, "wharf_consumer_num_pending", &labels)?,
            leader_value(&all, "wharf_consumer_num_ack_pending", &labels)?,
            leader_value(&all, "wharf_consumer_num_redelivered", &labels)?,
            leader_value(&all, "wharf_consumer_num_waiting", &labels)?,
        ];
        let seqs_match = leader_value(&all, "wharf_consumer_delivered_consumer_seq", &labels)?
            == info["delivered"]["consumer_seq"].as_u64().unwrap_or(0)
            && leader_value(&all, "wharf_consumer_ack_floor_consumer_seq", &labels)?
                == info["ack_floor"]["consumer_seq"].as_u64().unwrap_or(0);
        // Waiting pulls live on the leader only: followers must not report them.
        let waiting_series = all
            .iter()
            .map(|s| find(s, "wharf_consumer_num_waiting", &labels).len())
            .sum::<usize>();
        (from_metrics == from_info && seqs_match && waiting_series == 1).then_some(())
    })
    .await
}

/// Wait until every replica of ORDERS reports `messages` and the stream info agrees.
async fn stream_agrees(cluster: &Cluster, messages: u64) -> Result<()> {
    let what = format!("ORDERS metrics on every replica to show {messages} messages");
    eventually(&what, WAIT, || async {
        let info = json(&cluster.wharf(&["stream", "info", "ORDERS", "--json"])).ok()?;
        if info["state"]["messages"].as_u64()? != messages {
            return None;
        }
        let all = scrape_all(cluster).await?;
        let per_node: Vec<(u64, u64)> = all
            .iter()
            .filter_map(|s| {
                let m = find(s, "wharf_stream_messages", &[("stream", "ORDERS")]);
                let l = find(s, "wharf_stream_last_seq", &[("stream", "ORDERS")]);
                Some((m.first()?.value as u64, l.first()?.value as u64))
            })
            .collect();
        let bytes = leader_value(&all, "wharf_stream_bytes", &[("stream", "ORDERS")])?;
        let last_seq = info["state"]["last_seq"].as_u64()?;
        (per_node.len() == 3
            && per_node.iter().all(|p| *p == (messages, last_seq))
            && bytes == info["state"]["bytes"].as_u64()?)
        .then_some(())
    })
    .await
}

fn sum(all: &[Vec<Sample>], name: &str, labels: &[(&str, &str)]) -> f64 {
    all.iter()
        .flat_map(|s| find(s, name, labels))
        .map(|s| s.value)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_with_the_seed_tutorial() -> Result<()> {
    let cluster = Cluster::start(3).await?;

    // Every node serves /metrics and reports itself ready once joined.
    eventually("every node ready in /metrics", WAIT, || async {
        let all = scrape_all(&cluster).await?;
        all.iter()
            .all(|s| find(s, "wharf_node_ready", &[]).first().map(|x| x.value) == Some(1.0))
            .then_some(())
    })
    .await?;

    let out = cluster.wharf(&["stream", "add", "ORDERS", "--subjects", "orders.>"]);
    assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    for i in 1..=3 {
        let out = cluster.wharf(&["pub", "orders.created", &format!("{{\"order\":{i}}}")]);
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    }
    stream_agrees(&cluster, 3).await?;

    let out = cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "shipping",
        "--filter",
        "orders.shipped",
    ]);
    assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    consumer_agrees(&cluster, "shipping", [0, 0, 0, 0]).await?;

    // Three workers wait: the leader's waiting pulls show 3, as info does.
    let workers: Vec<_> = (0..3)
        .map(|_| {
            cluster.wharf_spawn(&[
                "consumer", "next", "ORDERS", "shipping", "--count", "1", "--ack", "--wait", "30s",
                "--json",
            ])
        })
        .collect();
    consumer_agrees(&cluster, "shipping", [0, 0, 0, 3]).await?;
    for i in 1..=3 {
        let out = cluster.wharf(&["pub", "orders.shipped", &format!("{{\"order\":{i}}}")]);
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    }
    for w in workers {
        let out = w.wait_with_output()?;
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
        assert_eq!(stdout(&out).lines().count(), 1);
    }
    stream_agrees(&cluster, 6).await?;
    consumer_agrees(&cluster, "shipping", [0, 0, 0, 0]).await?;
    let info = consumer_info(&cluster, "shipping").expect("consumer info");
    assert_eq!(info["ack_floor"]["consumer_seq"], 3);

    // Orders arrive with nobody pulling: unprocessed goes up.
    for i in 4..=5 {
        let out = cluster.wharf(&["pub", "orders.shipped", &format!("{{\"order\":{i}}}")]);
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    }
    stream_agrees(&cluster, 8).await?;
    consumer_agrees(&cluster, "shipping", [2, 0, 0, 0]).await?;

    // A worker takes both without acking: they become outstanding.
    let out = cluster.wharf(&[
        "consumer", "next", "ORDERS", "shipping", "--count", "2", "--no-ack", "--json",
    ]);
    assert_eq!(
        stdout(&out).lines().count(),
        2,
        "{}",
        wharf_tests::stderr(&out)
    );
    consumer_agrees(&cluster, "shipping", [0, 2, 0, 0]).await?;

    // A consumer with a short AckWait: unacked messages come back redelivered.
    let out = cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "audit",
        "--filter",
        "orders.shipped",
        "--ack-wait",
        "1s",
    ]);
    assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    consumer_agrees(&cluster, "audit", [5, 0, 0, 0]).await?;
    let out = cluster.wharf(&[
        "consumer", "next", "ORDERS", "audit", "--count", "5", "--no-ack", "--json",
    ]);
    assert_eq!(
        stdout(&out).lines().count(),
        5,
        "{}",
        wharf_tests::stderr(&out)
    );
    consumer_agrees(&cluster, "audit", [0, 5, 0, 0]).await?;
    // Nothing new is left: after AckWait the next pull gets two of them again.
    let out = cluster.wharf(&[
        "consumer", "next", "ORDERS", "audit", "--count", "2", "--no-ack", "--wait", "10s",
        "--json",
    ]);
    let lines: Vec<Value> = stdout(&out)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(lines.len(), 2, "{}", wharf_tests::stderr(&out));
    assert!(lines.iter().all(|m| m["delivered"] == 2), "{lines:?}");
    consumer_agrees(&cluster, "audit", [0, 5, 2, 0]).await?;

    // A leader change shows in the Raft group metrics: a new leader, a
    // higher term, one more change counted on the replicas.
    let group = [("kind", "consumer"), ("name", "ORDERS/shipping")];
    let before = scrape_all(&cluster).await.expect("scrape");
    let changes_before = sum(&before, "wharf_raft_leader_changes_total", &group);
    let leaders_before: Vec<f64> = before
        .iter()
        .filter_map(|s| value(s, "wharf_raft_leader_id", &group))
        .collect();
    assert_eq!(leaders_before.len(), 3, "every replica reports the group");
    let out = cluster.wharf(&["consumer", "stepdown", "ORDERS", "shipping"]);
    assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    eventually("the leader change in Raft metrics", WAIT, || async {
        let all = scrape_all(&cluster).await?;
        let leaders: Vec<f64> = all
            .iter()
            .filter_map(|s| value(s, "wharf_raft_leader_id", &group))
            .collect();
        let moved = leaders.len() == 3
            && leaders
                .iter()
                .all(|l| *l == leaders[0] && *l != leaders_before[0]);
        let leading_roles = sum(
            &all,
            "wharf_raft_role",
            &[group[0], group[1], ("role", "leader")],
        );
        (moved
            && leading_roles == 1.0
            && sum(&all, "wharf_raft_leader_changes_total", &group) >= changes_before + 3.0)
            .then_some(())
    })
    .await?;
    // The new leader reports the same consumer state.
    consumer_agrees(&cluster, "shipping", [0, 2, 0, 0]).await?;

    // Raft indexes: every replica of the stream group has applied what it committed.
    let all = scrape_all(&cluster).await.expect("scrape");
    let stream_group = [("kind", "stream"), ("name", "ORDERS")];
    for s in &all {
        let commit = value(s, "wharf_raft_commit_index", &stream_group).expect("commit");
        let applied = value(s, "wharf_raft_applied_index", &stream_group).expect("applied");
        let term = value(s, "wharf_raft_term", &stream_group).expect("term");
        assert!(commit >= 8.0 && applied <= commit && term >= 1.0);
    }

    // gRPC calls are counted by method and code, with latencies.
    let missing = cluster.wharf(&["stream", "info", "NOPE"]);
    assert!(!missing.status.success());
    eventually("gRPC call metrics", WAIT, || async {
        let all = scrape_all(&cluster).await?;
        let publish_ok = [
            ("grpc_service", "wharf.v1.Wharf"),
            ("grpc_method", "Publish"),
            ("grpc_code", "OK"),
        ];
        let published = sum(&all, "wharf_grpc_server_handled_total", &publish_ok);
        let timed = sum(
            &all,
            "wharf_grpc_server_handling_seconds_count",
            &publish_ok,
        );
        let not_found = sum(
            &all,
            "wharf_grpc_server_handled_total",
            &[("grpc_method", "GetStream"), ("grpc_code", "NotFound")],
        );
        (published >= 8.0 && timed == published && not_found >= 1.0).then_some(())
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_answers_only_metrics() -> Result<()> {
    let cluster = Cluster::start(1).await?;
    let addr = &cluster.node(1).metrics_addr;
    let (status, content_type, body) = wharf_tests::metrics::get_raw(addr, "/metrics").await?;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let samples = parse(&body)?;
    assert!(
        value(&samples, "wharf_raft_term", &[("kind", "meta")]).is_some(),
        "{body}"
    );
    let (status, _, _) = wharf_tests::metrics::get_raw(addr, "/nope").await?;
    assert_eq!(status, 404);
    Ok(())
}
