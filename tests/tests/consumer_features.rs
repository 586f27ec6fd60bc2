//! Deliver policies, pause and resume, pull byte limits, idle heartbeats and
//! the typed status a worker gets when its consumer is deleted.

use std::time::{Duration, Instant};

use wharf_client::proto as pb;
use wharf_tests::{json, stderr, stdout, Cluster};

fn payloads(out: &std::process::Output) -> Vec<String> {
    stdout(out)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v["payload"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_policies_start_where_asked() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&[
        "stream",
        "add",
        "ORDERS",
        "--subjects",
        "orders.>",
        "--json",
    ]))?;
    for (subject, payload) in [
        ("orders.a", "a1"),
        ("orders.b", "b1"),
        ("orders.a", "a2"),
        ("orders.b", "b2"),
    ] {
        assert!(cluster.wharf(&["pub", subject, payload]).status.success());
    }
    let cases: [(&[&str], &[&str]); 5] = [
        (&["--deliver", "all"], &["a1", "b1", "a2", "b2"]),
        (&["--deliver", "last"], &["b2"]),
        (&["--deliver", "last-per-subject"], &["a2", "b2"]),
        (&["--start-seq", "3"], &["a2", "b2"]),
        (&["--deliver", "new"], &[]),
    ];
    for (i, (flags, expected)) in cases.iter().enumerate() {
        let name = format!("c{i}");
        let mut args = vec!["consumer", "add", "ORDERS", name.as_str(), "--json"];
        args.extend_from_slice(flags);
        json(&cluster.wharf(&args))?;
        let out = cluster.wharf(&[
            "consumer", "next", "ORDERS", &name, "--count", "10", "--wait", "1s", "--json",
        ]);
        if expected.is_empty() {
            assert_eq!(out.status.code(), Some(1), "{flags:?}: {}", stdout(&out));
        } else {
            assert_eq!(payloads(&out), *expected, "{flags:?}: {}", stderr(&out));
        }
    }
    // `new` delivers what is published after it was created.
    assert!(cluster.wharf(&["pub", "orders.c", "c1"]).status.success());
    let out = cluster.wharf(&["consumer", "next", "ORDERS", "c4", "--json"]);
    assert_eq!(payloads(&out), vec!["c1"]);
    let info = json(&cluster.wharf(&["consumer", "info", "ORDERS", "c4", "--json"]))?;
    assert_eq!(info["config"]["deliver_policy"], "new");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_deliveries_until_resumed() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&["stream", "add", "JOBS", "--subjects", "jobs.>", "--json"]))?;
    json(&cluster.wharf(&[
        "consumer",
        "add",
        "JOBS",
        "w",
        "--metadata",
        "team=billing",
        "--json",
    ]))?;
    assert!(cluster.wharf(&["pub", "jobs.a", "j1"]).status.success());
    let out = cluster.wharf(&["consumer", "pause", "JOBS", "w", "--for", "1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let info = json(&cluster.wharf(&["consumer", "info", "JOBS", "w", "--json"]))?;
    assert_eq!(info["paused"], true);
    assert_eq!(info["config"]["metadata"]["team"], "billing");
    let out = cluster.wharf(&["consumer", "next", "JOBS", "w", "--wait", "1s"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "paused consumer delivered: {}",
        stdout(&out)
    );
    assert!(cluster
        .wharf(&["consumer", "resume", "JOBS", "w"])
        .status
        .success());
    let m = json(&cluster.wharf(&["consumer", "next", "JOBS", "w", "--json", "--wait", "10s"]))?;
    assert_eq!(m["payload"], "j1");
    let info = json(&cluster.wharf(&["consumer", "info", "JOBS", "w", "--json"]))?;
    assert_eq!(info["paused"], false);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_byte_limit_heartbeats_and_deleted_consumer_status() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            ..Default::default()
        })
        .await?;
    client
        .add_consumer(
            "JOBS",
            pb::ConsumerConfig {
                name: "w".into(),
                ..Default::default()
            },
        )
        .await?;
    for i in 0..3 {
        client.publish("jobs.a", vec![b'x'; 40]).await?;
        let _ = i;
    }
    // 100 bytes fit two 40-byte messages.
    let mut worker = client.consumer("JOBS", "w").with_max_bytes(100);
    let got = worker.fetch(10, Duration::from_secs(5)).await?;
    assert_eq!(got.len(), 2);
    // A pull with idle heartbeats waits quietly for 2 s and the session stays healthy.
    let mut waiting = client
        .consumer("JOBS", "idle")
        .with_idle_heartbeat(Duration::from_millis(200));
    client
        .add_consumer(
            "JOBS",
            pb::ConsumerConfig {
                name: "idle".into(),
                deliver_policy: pb::DeliverPolicy::DeliverNew as i32,
                ..Default::default()
            },
        )
        .await?;
    let started = Instant::now();
    assert!(waiting.fetch(1, Duration::from_secs(2)).await?.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(1900));
    // A worker waiting on a consumer that is deleted is told so.
    let pending = tokio::spawn(async move { waiting.fetch(1, Duration::from_secs(30)).await });
    wharf_tests::eventually("pull waiting", Duration::from_secs(10), || async {
        let info = client.consumer_info("JOBS", "idle").await.ok()?;
        (info.num_waiting == 1).then_some(())
    })
    .await?;
    client.delete_consumer("JOBS", "idle").await?;
    let err = pending.await?.expect_err("the pull must fail");
    assert_eq!(err.code(), Some(tonic_code_not_found()), "{err}");
    Ok(())
}

fn tonic_code_not_found() -> wharf_client::Code {
    wharf_client::Code::NotFound
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_filters_and_inactive_threshold() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&[
        "stream",
        "add",
        "ORDERS",
        "--subjects",
        "orders.>",
        "--json",
    ]))?;
    for (subject, payload) in [
        ("orders.created", "c"),
        ("orders.shipped", "s"),
        ("orders.cancelled", "x"),
    ] {
        assert!(cluster.wharf(&["pub", subject, payload]).status.success());
    }
    let info = json(&cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "ops",
        "--filter",
        "orders.shipped",
        "--filter",
        "orders.cancelled",
        "--json",
    ]))?;
    assert_eq!(info["num_pending"], 2);
    let out = cluster.wharf(&[
        "consumer", "next", "ORDERS", "ops", "--count", "5", "--wait", "1s", "--json",
    ]);
    assert_eq!(payloads(&out), vec!["s", "x"]);
    let out = cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "bad",
        "--filter",
        "orders.*",
        "--filter",
        "orders.shipped",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("overlap"), "{}", stderr(&out));

    // A consumer nobody pulls from goes away after its inactive threshold;
    // one that is being pulled from stays.
    json(&cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "idle",
        "--inactive-threshold",
        "2s",
        "--json",
    ]))?;
    json(&cluster.wharf(&[
        "consumer",
        "add",
        "ORDERS",
        "busy",
        "--inactive-threshold",
        "2s",
        "--json",
    ]))?;
    let busy = cluster.wharf_spawn(&[
        "consumer", "next", "ORDERS", "busy", "--count", "100", "--wait", "8s",
    ]);
    let gone =
        wharf_tests::eventually("idle consumer deleted", Duration::from_secs(20), || async {
            let out = cluster.wharf(&["consumer", "info", "ORDERS", "idle"]);
            (out.status.code() == Some(1) && stderr(&out).contains("not found")).then_some(())
        })
        .await;
    let still = cluster.wharf(&["consumer", "info", "ORDERS", "busy", "--json"]);
    let _ = busy.wait_with_output();
    gone?;
    json(&still)?;
    Ok(())
}
