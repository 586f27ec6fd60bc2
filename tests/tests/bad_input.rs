//! Bad input through the CLI against a live cluster: a clear error, exit code
//! 1, and nothing changed or lost.

use wharf_tests::{json, stderr, Cluster};

fn fails_with(out: &std::process::Output, needle: &str) {
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected failure, got: {}{}",
        wharf_tests::stdout(out),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_clearly_and_changes_nothing() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&[
        "stream",
        "add",
        "ORDERS",
        "--subjects",
        "orders.>",
        "--max-msg-size",
        "64",
        "--json",
    ]))?;
    json(&cluster.wharf(&["consumer", "add", "ORDERS", "shipping", "--json"]))?;
    let ok = cluster.wharf(&["pub", "orders.created", "fits"]);
    assert!(ok.status.success(), "{}", stderr(&ok));

    // Unknown things.
    fails_with(&cluster.wharf(&["stream", "info", "NOPE"]), "not found");
    fails_with(
        &cluster.wharf(&["consumer", "info", "ORDERS", "nope"]),
        "not found",
    );
    fails_with(
        &cluster.wharf(&["consumer", "add", "NOPE", "c1"]),
        "not found",
    );
    fails_with(
        &cluster.wharf(&["consumer", "next", "ORDERS", "nope", "--wait", "1s"]),
        "not found",
    );
    fails_with(
        &cluster.wharf(&["pub", "nowhere.bound", "x"]),
        "no stream matches",
    );
    // Bad names and subjects.
    fails_with(
        &cluster.wharf(&["stream", "add", "bad.name", "--subjects", "x"]),
        "invalid",
    );
    fails_with(
        &cluster.wharf(&["stream", "add", "S2", "--subjects", "a..b"]),
        "invalid",
    );
    fails_with(
        &cluster.wharf(&["stream", "add", "S3", "--subjects", "a.>.b"]),
        "invalid",
    );
    fails_with(&cluster.wharf(&["pub", "orders.*", "x"]), "invalid");
    fails_with(
        &cluster.wharf(&["consumer", "add", "ORDERS", "c2", "--filter", "orders..x"]),
        "invalid",
    );
    fails_with(
        &cluster.wharf(&["stream", "add", "S4", "--subjects", "x", "--replicas", "2"]),
        "replicas",
    );
    // Conflicting configuration.
    fails_with(
        &cluster.wharf(&["stream", "add", "ORDERS", "--subjects", "other.>"]),
        "already in use",
    );
    fails_with(
        &cluster.wharf(&["stream", "add", "OVERLAP", "--subjects", "orders.created"]),
        "overlap",
    );
    fails_with(
        &cluster.wharf(&[
            "consumer",
            "add",
            "ORDERS",
            "shipping",
            "--max-pending",
            "7",
        ]),
        "already exists",
    );
    // Oversize message.
    let big = "x".repeat(65);
    fails_with(&cluster.wharf(&["pub", "orders.created", &big]), "exceeds");
    // Bad headers, a dead-letter subject with a wildcard.
    fails_with(
        &cluster.wharf(&["pub", "orders.created", "x", "-H", "bad name:v"]),
        "header name",
    );
    fails_with(
        &cluster.wharf(&["pub", "orders.created", "x", "-H", "novalue"]),
        "expected Name:value",
    );
    fails_with(
        &cluster.wharf(&[
            "consumer",
            "add",
            "ORDERS",
            "dlq",
            "--dead-letter-subject",
            "dlq.*",
        ]),
        "wildcard",
    );

    // Nothing changed: one stream, one message, one consumer with its config.
    let streams = json(&cluster.wharf(&["stream", "ls", "--json"]))?;
    assert_eq!(streams.as_array().map(|a| a.len()), Some(1));
    let info = json(&cluster.wharf(&["stream", "info", "ORDERS", "--json"]))?;
    assert_eq!(info["state"]["messages"], 1);
    assert_eq!(info["config"]["subjects"], serde_json::json!(["orders.>"]));
    let consumers = json(&cluster.wharf(&["consumer", "ls", "ORDERS", "--json"]))?;
    assert_eq!(consumers.as_array().map(|a| a.len()), Some(1));
    assert_eq!(consumers[0]["config"]["max_ack_pending"], 1000);

    // Delete works and the stream is gone for every node.
    assert!(cluster
        .wharf(&["consumer", "rm", "ORDERS", "shipping"])
        .status
        .success());
    assert!(cluster.wharf(&["stream", "rm", "ORDERS"]).status.success());
    fails_with(&cluster.wharf(&["stream", "info", "ORDERS"]), "not found");
    fails_with(&cluster.wharf(&["stream", "rm", "ORDERS"]), "not found");
    Ok(())
}
