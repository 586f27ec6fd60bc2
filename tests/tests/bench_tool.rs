//! `wharf bench` against a real three-node cluster, through the CLI as
//! `bench/compare.sh` runs it: each workload shape of the comparison (sync
//! and pipelined publish, a work queue acking each message or with ack-all,
//! the open-loop rate) reports what it did in `--json`, loses nothing and
//! cleans up after itself; bad flags are refused with exit code 1.
//!
//! What these tests check is the tool's accounting, not speed: throughput
//! figures are only required to be present and positive.

use serde_json::Value;
use wharf_tests::metrics::grpc_ok_calls;
use wharf_tests::{json, stderr, Cluster};

/// Runs `wharf bench` with these flags and `--json --quiet`.
fn bench(cluster: &Cluster, flags: &[&str]) -> anyhow::Result<Value> {
    let mut args = vec!["bench"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--json", "--quiet"]);
    let out = cluster.wharf(&args);
    anyhow::ensure!(out.status.success(), "bench {flags:?}: {}", stderr(&out));
    json(&out)
}

/// Percentiles are present, ordered, and count `n` samples.
fn assert_percentiles(p: &Value, n: u64, what: &str) {
    assert_eq!(p["count"], n, "{what}: {p}");
    let keys = ["p50", "p90", "p99", "p999", "max"];
    let values: Vec<u64> = keys
        .iter()
        .map(|k| {
            p[k].as_u64()
                .unwrap_or_else(|| panic!("{what}: no {k} in {p}"))
        })
        .collect();
    assert!(values[0] > 0, "{what}: p50 of 0 us: {p}");
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{what}: {p}");
}

fn assert_rate(side: &Value, what: &str) {
    let rate = side["msgs_per_s"].as_f64().unwrap_or(0.0);
    assert!(rate > 0.0, "{what}: msgs_per_s {rate}");
}

/// No stream is left behind (the run deletes what it created).
fn assert_no_streams(cluster: &Cluster) -> anyhow::Result<()> {
    let streams = json(&cluster.wharf(&["stream", "ls", "--json"]))?;
    assert_eq!(streams.as_array().map(Vec::len), Some(0), "{streams}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_workloads_report_every_message_and_clean_up() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;

    // Sync publish: two publishers, one ack each before the next publish.
    let r = bench(&cluster, &["--pub", "2", "--msgs", "300"])?;
    assert_eq!(r["broker"], "wharf");
    assert_eq!(r["publish"]["msgs"], 300, "{r}");
    assert_eq!(r["publish"]["errors"], 0, "{r}");
    assert_eq!(r["publish"]["bytes"], 300 * 128, "{r}");
    assert_percentiles(&r["publish"]["ack_latency_us"], 300, "sync acks");
    assert_rate(&r["publish"], "sync publish");
    assert!(r["consume"].is_null(), "{r}");
    assert_no_streams(&cluster)?;

    // Pipelined publish with three workers acking each message.
    let r = bench(
        &cluster,
        &[
            "--pub", "1", "--window", "32", "--msgs", "1000", "--sub", "3", "--batch", "10",
            "--size", "64",
        ],
    )?;
    assert_eq!(r["workload"]["ack"], "each");
    assert_eq!(r["publish"]["msgs"], 1000, "{r}");
    assert_percentiles(&r["publish"]["ack_latency_us"], 1000, "async acks");
    assert_eq!(r["consume"]["msgs"], 1000, "{r}");
    assert_eq!(r["consume"]["errors"], 0, "{r}");
    assert_eq!(r["consume"]["redelivered"], 0, "{r}");
    assert_eq!(r["consume"]["bytes"], 1000 * 64, "{r}");
    assert_percentiles(&r["consume"]["e2e_latency_us"], 1000, "end to end");
    assert_rate(&r["consume"], "work queue");
    assert_no_streams(&cluster)?;

    // A drained work queue with ack-all: the consumer is kept to check that
    // the acks settled everything.
    let r = bench(
        &cluster,
        &[
            "--pub", "0", "--sub", "3", "--batch", "50", "--msgs", "600", "--ack", "all", "--keep",
        ],
    )?;
    assert_eq!(r["workload"]["ack"], "all");
    assert_eq!(r["consume"]["msgs"], 600, "{r}");
    assert_eq!(r["consume"]["errors"], 0, "{r}");
    let info = json(&cluster.wharf(&["consumer", "info", "BENCH", "workers", "--json"]))?;
    assert_eq!(info["config"]["ack_policy"], "all", "{info}");
    assert_eq!(info["ack_floor"]["stream_seq"], 600, "{info}");
    assert_eq!(info["num_ack_pending"], 0, "{info}");
    assert_eq!(info["num_pending"], 0, "{info}");
    let out = cluster.wharf(&["stream", "rm", "BENCH"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // A drained work queue whose workers send each batch's acks with the
    // next pull: everything is acked once, nothing redelivered.
    let r = bench(
        &cluster,
        &[
            "--pub",
            "0",
            "--sub",
            "3",
            "--batch",
            "1",
            "--msgs",
            "300",
            "--ack-next",
            "--keep",
        ],
    )?;
    assert_eq!(r["workload"]["ack_next"], true, "{r}");
    assert_eq!(r["consume"]["msgs"], 300, "{r}");
    assert_eq!(r["consume"]["errors"], 0, "{r}");
    assert_eq!(r["consume"]["redelivered"], 0, "{r}");
    let info = json(&cluster.wharf(&["consumer", "info", "BENCH", "workers", "--json"]))?;
    assert_eq!(info["ack_floor"]["stream_seq"], 300, "{info}");
    assert_eq!(info["num_ack_pending"], 0, "{info}");
    assert_eq!(info["num_pending"], 0, "{info}");
    let out = cluster.wharf(&["stream", "rm", "BENCH"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Open loop: sends follow the timeline, never faster than --rate.
    let r = bench(
        &cluster,
        &[
            "--pub",
            "1",
            "--window",
            "16",
            "--sub",
            "3",
            "--batch",
            "1",
            "--rate",
            "100",
            "--duration",
            "2s",
        ],
    )?;
    let sent = r["publish"]["msgs"].as_u64().unwrap_or(0);
    assert!(
        (1..=201).contains(&sent),
        "{sent} sent in 2 s at 100/s: {r}"
    );
    assert_eq!(r["consume"]["msgs"], sent, "{r}");
    assert_percentiles(&r["publish"]["ack_latency_us"], sent, "open-loop acks");
    assert_no_streams(&cluster)?;
    Ok(())
}

/// A pipelined publisher opens its `PublishStream` at the stream's leader.
/// The two publishers start at different servers (node 1 and node 2), so
/// without that at least one would open at a follower, which would answer
/// a `PublishStream` itself and open another one to the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_publishers_open_at_the_stream_leader() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let r = bench(
        &cluster,
        &["--pub", "2", "--window", "16", "--msgs", "200", "--keep"],
    )?;
    assert_eq!(r["publish"]["msgs"], 200, "{r}");
    assert_eq!(r["publish"]["errors"], 0, "{r}");
    let leader = cluster
        .wait_group_leader("BENCH", std::time::Duration::from_secs(20))
        .await?;
    for id in 1..=3 {
        let calls = grpc_ok_calls(&cluster.node(id).metrics_addr, "PublishStream").await?;
        if id == leader {
            assert_eq!(calls, 2.0, "leader {id} answered {calls}");
        } else {
            assert_eq!(calls, 0.0, "follower {id} answered {calls}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_refuses_bad_flags_with_exit_code_one() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    for (flags, message) in [
        (&["--pub", "0", "--sub", "0"][..], "nothing to do"),
        (&["--batch", "0", "--sub", "1"][..], "--batch"),
        (&["--size", "8"][..], "--size"),
        (&["--replicas", "2"][..], "--replicas"),
        (&["--ack", "some"][..], "--ack"),
        (&["--window", "100000"][..], "--window"),
    ] {
        let mut args = vec!["bench"];
        args.extend_from_slice(flags);
        let out = cluster.wharf(&args);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(message),
            "{flags:?}: {}",
            stderr(&out)
        );
    }
    // A refused run created nothing.
    assert_no_streams(&cluster)?;
    Ok(())
}
