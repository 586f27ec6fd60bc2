//! Nak (with delay), in-progress, term, MaxDeliver with BackOff, and
//! redeliver-on-disconnect on a real cluster, with a consumer leader change
//! in the middle where it matters.

use std::time::{Duration, Instant};

use wharf_client::proto as pb;
use wharf_client::Client;
use wharf_tests::{eventually, json, Cluster};

async fn setup(cluster: &Cluster, config: pb::ConsumerConfig) -> anyhow::Result<Client> {
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            ..Default::default()
        })
        .await?;
    client.add_consumer("JOBS", config).await?;
    Ok(client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nak_with_delay_survives_a_leader_change() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        ack_wait_ms: 60_000,
        ..Default::default()
    };
    let client = setup(&cluster, config).await?;
    client.publish("jobs.a", "job-1").await?;
    let mut a = client.consumer("JOBS", "w");
    let m = a.fetch(1, Duration::from_secs(5)).await?.remove(0);
    let naked = Instant::now();
    a.nak(m.stream_seq, Duration::from_secs(3)).await?;
    // The consumer's leader moves while the delay runs: the schedule is replicated.
    client.step_down("JOBS", Some("w")).await?;
    let mut b = client.consumer("JOBS", "w");
    let early = b.fetch(1, Duration::from_millis(300)).await?;
    if naked.elapsed() < Duration::from_millis(2500) {
        assert!(
            early.is_empty(),
            "redelivered before its nak delay: {early:?}"
        );
    }
    let again = b.fetch(1, Duration::from_secs(15)).await?;
    assert_eq!(again.len(), 1);
    assert!(
        naked.elapsed() >= Duration::from_millis(2900),
        "after {:?}",
        naked.elapsed()
    );
    assert_eq!((again[0].stream_seq, again[0].delivered), (m.stream_seq, 2));
    b.ack(m.stream_seq).await?;
    let info = client.consumer_info("JOBS", "w").await?;
    assert_eq!((info.num_ack_pending, info.num_redelivered), (0, 1));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_progress_keeps_a_slow_message_from_being_redelivered() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        ack_wait_ms: 2000,
        ..Default::default()
    };
    let client = setup(&cluster, config).await?;
    client.publish("jobs.a", "slow").await?;
    let mut slow = client.consumer("JOBS", "w");
    let m = slow.fetch(1, Duration::from_secs(5)).await?.remove(0);
    let mut other = client.consumer("JOBS", "w");
    // Work for three AckWaits, reporting progress every half AckWait.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        slow.in_progress(m.stream_seq).await?;
        let stolen = other.fetch(1, Duration::from_millis(1000)).await?;
        assert!(
            stolen.is_empty(),
            "redelivered while in progress: {stolen:?}"
        );
    }
    slow.ack(m.stream_seq).await?;
    let info = client.consumer_info("JOBS", "w").await?;
    assert_eq!((info.num_ack_pending, info.num_redelivered), (0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn term_is_never_redelivered_and_is_counted() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&["stream", "add", "JOBS", "--subjects", "jobs.>", "--json"]))?;
    json(&cluster.wharf(&["consumer", "add", "JOBS", "w", "--ack-wait", "1s", "--json"]))?;
    assert!(cluster
        .wharf(&["pub", "jobs.bad", "poison"])
        .status
        .success());
    let out = cluster.wharf(&["consumer", "next", "JOBS", "w", "--term", "--json"]);
    assert_eq!(json(&out)?["payload"], "poison");
    // Well past AckWait nobody gets it.
    let out = cluster.wharf(&["consumer", "next", "JOBS", "w", "--wait", "3s"]);
    assert_eq!(out.status.code(), Some(1), "{}", wharf_tests::stdout(&out));
    let info = json(&cluster.wharf(&["consumer", "info", "JOBS", "w", "--json"]))?;
    assert_eq!(info["num_terminated"], 1);
    assert_eq!(info["num_ack_pending"], 0);
    assert_eq!(info["ack_floor"]["stream_seq"], 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_spaces_redeliveries_and_max_deliver_gives_up() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&["stream", "add", "JOBS", "--subjects", "jobs.>", "--json"]))?;
    let info = json(&cluster.wharf(&[
        "consumer",
        "add",
        "JOBS",
        "w",
        "--backoff",
        "1s,3s",
        "--max-deliver",
        "3",
        "--json",
    ]))?;
    assert_eq!(info["config"]["max_deliver"], 3);
    assert_eq!(
        info["config"]["backoff"],
        serde_json::json!([1_000_000_000u64, 3_000_000_000u64])
    );
    let client = cluster.client();
    client.publish("jobs.a", "flaky").await?;
    let mut worker = client.consumer("JOBS", "w");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        for m in worker.fetch(1, Duration::from_secs(10)).await? {
            seen.push((Instant::now(), m.delivered));
        }
    }
    assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), vec![1, 2, 3]);
    let gap1 = seen[1].0 - seen[0].0;
    let gap2 = seen[2].0 - seen[1].0;
    assert!(
        gap1 >= Duration::from_millis(900),
        "first backoff step is 1s, waited {gap1:?}"
    );
    assert!(
        gap2 >= Duration::from_millis(2900),
        "second backoff step is 3s, waited {gap2:?}"
    );
    // After its third delivery's 3s the consumer gives the message up.
    let info = eventually("max deliver reached", Duration::from_secs(20), || async {
        let i = client.consumer_info("JOBS", "w").await.ok()?;
        (i.num_exhausted == 1).then_some(i)
    })
    .await?;
    assert_eq!(info.num_ack_pending, 0);
    assert!(worker.fetch(1, Duration::from_secs(1)).await?.is_empty());
    // Bad combinations are refused.
    let out = cluster.wharf(&[
        "consumer",
        "add",
        "JOBS",
        "x",
        "--backoff",
        "1s,2s",
        "--max-deliver",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        wharf_tests::stderr(&out).contains("max_deliver"),
        "{}",
        wharf_tests::stderr(&out)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliver_on_disconnect_hands_a_dead_workers_message_on_at_once() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&["stream", "add", "JOBS", "--subjects", "jobs.>", "--json"]))?;
    json(&cluster.wharf(&[
        "consumer",
        "add",
        "JOBS",
        "w",
        "--ack-wait",
        "60s",
        "--redeliver-on-disconnect",
        "--json",
    ]))?;
    assert!(cluster
        .wharf(&["pub", "jobs.a", "ord_8w2k"])
        .status
        .success());
    // Worker A takes it without acking and its process exits.
    let first = json(&cluster.wharf(&["consumer", "next", "JOBS", "w", "--no-ack", "--json"]))?;
    assert_eq!(first["delivered"], 1);
    // Well within AckWait (60 s), worker B gets it.
    let started = Instant::now();
    let second =
        json(&cluster.wharf(&["consumer", "next", "JOBS", "w", "--json", "--wait", "20s"]))?;
    assert_eq!(second["payload"], "ord_8w2k");
    assert_eq!(second["delivered"], 2);
    assert!(started.elapsed() < Duration::from_secs(20));
    let info = json(&cluster.wharf(&["consumer", "info", "JOBS", "w", "--json"]))?;
    assert_eq!(info["num_ack_pending"], 0);
    assert_eq!(info["config"]["redeliver_on_disconnect"], true);
    Ok(())
}
