//! Stream features on a real three-node cluster, through the CLI and the
//! client: deduplication by message id (also across a stream leader
//! stepdown), discard-new, max messages per subject, stream edit through a
//! node that leads nothing involved, purge variants, get and delete of one
//! message, and subjects in stream info. Bad input answers a clear error.

use std::process::Output;
use std::time::Duration;

use wharf_client::proto as pb;
use wharf_tests::{eventually, json, stderr, stdout, Cluster};

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "wharf failed: {}{}",
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

fn fails_with(out: &Output, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected failure, got: {}{}",
        stdout(out),
        stderr(out)
    );
    let err = stderr(out);
    assert!(err.starts_with("error: "), "{err}");
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "expected {needle:?} in {err:?}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

async fn messages(cluster: &Cluster, stream: &str) -> anyhow::Result<u64> {
    let info = cluster.client().stream_info(stream).await?;
    Ok(info.state.unwrap_or_default().messages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedup_stores_once_through_cli_and_client_and_survives_stepdown() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    ok(&cluster.wharf(&["stream", "add", "ORDERS", "--subjects", "orders.>"]));

    // The CLI: the second publish with the same id is a duplicate.
    let first = ok(&cluster.wharf(&["pub", "orders.created", "one", "--id", "ord-1"]));
    assert_eq!(first.trim(), "Stored in stream ORDERS at sequence 1");
    let again = ok(&cluster.wharf(&["pub", "orders.created", "two", "--id", "ord-1"]));
    assert_eq!(
        again.trim(),
        "Duplicate message: already stored in stream ORDERS at sequence 1"
    );
    let v = json(&cluster.wharf(&["pub", "orders.created", "x", "--id", "ord-1", "--json"]))?;
    assert_eq!(
        (v["seq"].as_u64(), v["duplicate"].as_bool()),
        (Some(1), Some(true))
    );
    // The stored copy is the first one.
    let m = json(&cluster.wharf(&["stream", "get", "ORDERS", "1", "--json"]))?;
    assert_eq!(m["data"], "one");

    // The client, through every node.
    let client = cluster.client();
    let ack = client
        .publish_with_id("orders.created", "b", "ord-2")
        .await?;
    assert_eq!((ack.seq, ack.duplicate), (2, false));
    for id in 1..=3 {
        let ack = (cluster.client_of(id))
            .publish_with_id("orders.created", "b again", "ord-2")
            .await?;
        assert_eq!(
            (ack.stream.as_str(), ack.seq, ack.duplicate),
            ("ORDERS", 2, true)
        );
    }
    assert_eq!(messages(&cluster, "ORDERS").await?, 2);

    // The window is replicated state: a new stream leader remembers it.
    let before = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(10))
        .await?;
    let moved = client.step_down("ORDERS", None).await?;
    assert_eq!(moved.previous_leader, before);
    assert_ne!(moved.leader, before);
    let after = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(10))
        .await?;
    assert_ne!(after, before);
    let ack = client
        .publish_with_id("orders.created", "c", "ord-2")
        .await?;
    assert_eq!((ack.seq, ack.duplicate), (2, true));
    let ack = client
        .publish_with_id("orders.created", "c", "ord-1")
        .await?;
    assert_eq!((ack.seq, ack.duplicate), (1, true));
    let ack = client
        .publish_with_id("orders.created", "c", "ord-3")
        .await?;
    assert_eq!((ack.seq, ack.duplicate), (3, false));
    // Every replica holds exactly one copy of each.
    for id in 1..=3 {
        let n = eventually("replica caught up", Duration::from_secs(10), || async {
            let info = cluster
                .client_of(id)
                .stream_info_local("ORDERS")
                .await
                .ok()?;
            let s = info.state?;
            (s.last_seq == 3).then_some(s.messages)
        })
        .await?;
        assert_eq!(n, 3, "node {id}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_new_refuses_and_per_subject_limit_keeps_newest() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let info = json(&cluster.wharf(&[
        "stream",
        "add",
        "LOGS",
        "--subjects",
        "logs.>",
        "--max-msgs",
        "2",
        "--discard",
        "new",
        "--json",
    ]))?;
    assert_eq!(info["config"]["discard"], "new");
    ok(&cluster.wharf(&["pub", "logs.a", "1"]));
    ok(&cluster.wharf(&["pub", "logs.b", "2"]));
    fails_with(
        &cluster.wharf(&["pub", "logs.a", "3"]),
        "maximum messages exceeded",
    );
    let info = json(&cluster.wharf(&["stream", "info", "LOGS", "--json"]))?;
    assert_eq!(info["state"]["messages"], 2);
    assert_eq!(info["state"]["last_seq"], 2);
    // Through the client: a clear, non-retried error.
    let err = (cluster.client())
        .publish("logs.c", "x")
        .await
        .expect_err("the stream is full");
    assert!(
        err.to_string().contains("maximum messages exceeded"),
        "{err}"
    );

    let info = json(&cluster.wharf(&[
        "stream",
        "add",
        "KV",
        "--subjects",
        "kv.>",
        "--max-msgs-per-subject",
        "2",
        "--json",
    ]))?;
    assert_eq!(info["config"]["max_msgs_per_subject"], 2);
    for (subject, value) in [
        ("kv.a", "a1"),
        ("kv.a", "a2"),
        ("kv.b", "b1"),
        ("kv.a", "a3"),
    ] {
        ok(&cluster.wharf(&["pub", subject, value]));
    }
    let info = json(&cluster.wharf(&["stream", "info", "KV", "--subjects", "--json"]))?;
    assert_eq!(info["state"]["messages"], 3);
    assert_eq!(info["state"]["num_subjects"], 2);
    assert_eq!(info["state"]["subjects"]["kv.a"], 2);
    assert_eq!(info["state"]["subjects"]["kv.b"], 1);
    fails_with(&cluster.wharf(&["stream", "get", "KV", "1"]), "no message");
    let m = json(&cluster.wharf(&["stream", "get", "KV", "4", "--json"]))?;
    assert_eq!(
        (m["subject"].as_str(), m["data"].as_str()),
        (Some("kv.a"), Some("a3"))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_edit_through_a_non_leader_applies_at_once() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    ok(&cluster.wharf(&["stream", "add", "ORDERS", "--subjects", "orders.>"]));
    ok(&cluster.wharf(&["stream", "add", "OTHER", "--subjects", "other.>"]));
    for i in 0..5 {
        ok(&cluster.wharf(&["pub", "orders.created", &i.to_string()]));
    }
    let stream_leader = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(10))
        .await?;
    let meta_leader = cluster.wait_meta_leader(Duration::from_secs(10)).await?;
    let via = (1..=3)
        .find(|n| *n != stream_leader && *n != meta_leader)
        .unwrap_or_else(|| (1..=3).find(|n| *n != stream_leader).expect("three nodes"));
    let addr = cluster.node(via).addr.clone();

    let info = json(&cluster.wharf(&[
        "--server",
        &addr,
        "stream",
        "edit",
        "ORDERS",
        "--max-msgs",
        "3",
        "--discard",
        "new",
        "--dupe-window",
        "10s",
        "--max-msgs-per-subject",
        "100",
        "--subjects",
        "orders.>,returns.>",
        "--json",
    ]))?;
    let c = &info["config"];
    assert_eq!(c["max_msgs"], 3);
    assert_eq!(c["discard"], "new");
    assert_eq!(c["duplicate_window"], 10_000_000_000u64);
    assert_eq!(c["max_msgs_per_subject"], 100);
    assert_eq!(c["subjects"], serde_json::json!(["orders.>", "returns.>"]));
    // Applied at once: the lowered limit removed the two oldest, and the
    // stream is full under discard new.
    assert_eq!(info["state"]["messages"], 3);
    assert_eq!(info["state"]["first_seq"], 3);
    fails_with(
        &cluster.wharf(&["pub", "returns.x", "r"]),
        "maximum messages exceeded",
    );
    ok(&cluster.wharf(&["stream", "edit", "ORDERS", "--max-msgs", "-1"]));
    let out = ok(&cluster.wharf(&["pub", "returns.x", "r"]));
    assert!(out.contains("ORDERS at sequence 6"), "{out}");
    // Every node's replica applies the new config.
    for id in 1..=3 {
        eventually(
            "replica follows the edit",
            Duration::from_secs(10),
            || async {
                let info = cluster
                    .client_of(id)
                    .stream_info_local("ORDERS")
                    .await
                    .ok()?;
                let c = info.config?;
                (c.max_msgs == -1 && c.discard == pb::DiscardPolicy::DiscardNew as i32)
                    .then_some(())
            },
        )
        .await?;
    }

    // Conflicting or impossible edits change nothing.
    fails_with(
        &cluster.wharf(&["stream", "edit", "ORDERS", "--subjects", "other.x"]),
        "overlap",
    );
    fails_with(
        &cluster.wharf(&["stream", "edit", "NOPE", "--max-msgs", "1"]),
        "not found",
    );
    fails_with(
        &cluster.wharf(&["stream", "edit", "ORDERS", "--subjects", "bad..subject"]),
        "invalid",
    );
    fails_with(
        &cluster.wharf(&[
            "stream",
            "edit",
            "ORDERS",
            "--max-age",
            "5s",
            "--dupe-window",
            "1m",
        ]),
        "duplicate window",
    );
    let client = cluster.client();
    let mut renamed = client
        .stream_info("ORDERS")
        .await?
        .config
        .unwrap_or_default();
    renamed.replicas = 1;
    let err = client
        .update_stream(renamed)
        .await
        .expect_err("replicas are fixed");
    assert!(
        err.to_string().contains("replicas cannot be changed"),
        "{err}"
    );
    let info = client.stream_info("ORDERS").await?;
    let c = info.config.unwrap_or_default();
    assert_eq!((c.subjects.len(), c.replicas, c.max_age_ms), (2, 3, 0));

    // A whole-cluster restart replays each stream log from the created
    // config and ends on the edited one, with the same messages.
    let before = info.state.unwrap_or_default();
    let mut cluster = cluster;
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    cluster
        .wait_group_leader("ORDERS", Duration::from_secs(20))
        .await?;
    let info = cluster.client().stream_info("ORDERS").await?;
    let (c, s) = (
        info.config.unwrap_or_default(),
        info.state.unwrap_or_default(),
    );
    assert_eq!(
        (c.max_msgs, c.discard),
        (-1, pb::DiscardPolicy::DiscardNew as i32)
    );
    assert_eq!(
        (s.messages, s.first_seq, s.last_seq),
        (before.messages, 3, 6)
    );
    let ack = cluster
        .client()
        .publish("orders.x", "after restart")
        .await?;
    assert_eq!(ack.seq, 7);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_get_rmm_and_info_subjects() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    ok(&cluster.wharf(&["stream", "add", "ORDERS", "--subjects", "orders.>"]));
    let client = cluster.client();
    for i in 1..=10u64 {
        let subject = if i % 2 == 0 { "orders.eu" } else { "orders.us" };
        client.publish(subject, format!("m{i}")).await?;
    }
    let out = ok(&cluster.wharf(&["stream", "info", "ORDERS", "--subjects"]));
    assert!(out.contains("Number of Subjects: 2"), "{out}");
    assert!(out.contains("orders.eu"), "{out}");

    // get and rmm.
    let out = ok(&cluster.wharf(&["stream", "get", "ORDERS", "3"]));
    assert!(
        out.contains("ORDERS#3") && out.contains("orders.us") && out.contains("m3"),
        "{out}"
    );
    let out = ok(&cluster.wharf(&["stream", "rmm", "ORDERS", "3"]));
    assert_eq!(out.trim(), "Deleted message 3 from stream ORDERS");
    fails_with(
        &cluster.wharf(&["stream", "get", "ORDERS", "3"]),
        "no message with sequence 3",
    );
    fails_with(
        &cluster.wharf(&["stream", "rmm", "ORDERS", "3"]),
        "no message with sequence 3",
    );
    fails_with(
        &cluster.wharf(&["stream", "get", "ORDERS", "0"]),
        "1 or more",
    );
    fails_with(&cluster.wharf(&["stream", "get", "NOPE", "1"]), "not found");
    fails_with(&cluster.wharf(&["stream", "rmm", "NOPE", "1"]), "not found");
    fails_with(&cluster.wharf(&["stream", "get", "ORDERS", "x"]), "invalid");
    assert_eq!(messages(&cluster, "ORDERS").await?, 9);

    // Purge: by subject keeping the newest, below a sequence, then the rest.
    let v = json(&cluster.wharf(&[
        "stream",
        "purge",
        "ORDERS",
        "--subject",
        "orders.us",
        "--keep",
        "1",
        "--json",
    ]))?;
    assert_eq!(v["purged"], 3); // 1, 5, 7 (3 was deleted); 9 kept
    let out = ok(&cluster.wharf(&["stream", "purge", "ORDERS", "--seq", "6"]));
    assert_eq!(out.trim(), "Purged 2 messages from stream ORDERS"); // 2, 4
    let info = json(&cluster.wharf(&["stream", "info", "ORDERS", "--subjects", "--json"]))?;
    assert_eq!(info["state"]["messages"], 4); // 6, 8, 9, 10
    assert_eq!(info["state"]["first_seq"], 6);
    assert_eq!(info["state"]["subjects"]["orders.eu"], 3);
    assert_eq!(info["state"]["subjects"]["orders.us"], 1);
    fails_with(
        &cluster.wharf(&["stream", "purge", "ORDERS", "--subject", "orders..x"]),
        "invalid",
    );
    fails_with(&cluster.wharf(&["stream", "purge", "NOPE"]), "not found");
    assert_eq!(client.purge_stream("ORDERS", None, 0, 0).await?, 4);
    let info = client
        .stream_info("ORDERS")
        .await?
        .state
        .unwrap_or_default();
    assert_eq!(
        (
            info.messages,
            info.first_seq,
            info.last_seq,
            info.num_subjects
        ),
        (0, 11, 10, 0)
    );
    // Sequences go on after a purge.
    assert_eq!(client.publish("orders.eu", "after").await?.seq, 11);
    Ok(())
}
