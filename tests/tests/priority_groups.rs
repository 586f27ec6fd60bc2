//! Priority groups: pinned (one worker gets everything until it goes away,
//! and a new consumer leader re-pins) and overflow (a standby worker helps
//! only while the backlog is over its threshold).

use std::collections::BTreeSet;
use std::time::Duration;

use wharf_client::proto as pb;
use wharf_tests::Cluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pinned_worker_gets_everything_then_hands_over_and_repins_after_failover(
) -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            ..Default::default()
        })
        .await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        priority_policy: pb::PriorityPolicy::PriorityPinned as i32,
        ..Default::default()
    };
    client.add_consumer("JOBS", config).await?;
    for i in 0..6 {
        client.publish("jobs.a", format!("j{i}")).await?;
    }
    // A pulls first and is pinned; B pulls too but gets nothing while A is there.
    let mut a = client.consumer("JOBS", "w");
    let mut b = client.consumer("JOBS", "w");
    let got_a = a.fetch(3, Duration::from_secs(5)).await?;
    assert_eq!(got_a.len(), 3);
    let got_b = b.fetch(3, Duration::from_millis(800)).await?;
    assert!(got_b.is_empty(), "B got {got_b:?} while A is pinned");
    for m in &got_a {
        a.ack(m.stream_seq).await?;
    }
    // A goes away: B is pinned next.
    a.close();
    let got_b = b.fetch(3, Duration::from_secs(5)).await?;
    assert_eq!(got_b.len(), 3, "B takes over once A left");
    for m in &got_b {
        b.ack(m.stream_seq).await?;
    }
    // The consumer's leader changes: the new leader re-pins one worker.
    client.step_down("JOBS", Some("w")).await?;
    for i in 6..12 {
        client.publish("jobs.a", format!("j{i}")).await?;
    }
    let mut c = client.consumer("JOBS", "w");
    let first = b.fetch(3, Duration::from_secs(10)).await?;
    let second = c.fetch(3, Duration::from_millis(800)).await?;
    assert_eq!(first.len(), 3, "re-pinned worker B gets the batch");
    assert!(second.is_empty(), "C got {second:?} while B is pinned");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overflow_standby_helps_only_above_its_threshold() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            ..Default::default()
        })
        .await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        priority_policy: pb::PriorityPolicy::PriorityOverflow as i32,
        ..Default::default()
    };
    client.add_consumer("JOBS", config).await?;
    let mut standby = client.consumer("JOBS", "w").with_overflow(5, 0);
    // Below the threshold (2 unprocessed) the standby gets nothing.
    for i in 0..2 {
        client.publish("jobs.a", format!("low{i}")).await?;
    }
    assert!(standby
        .fetch(10, Duration::from_millis(800))
        .await?
        .is_empty());
    // Above it (2 + 8 = 10 unprocessed) the standby helps.
    for i in 0..8 {
        client.publish("jobs.a", format!("high{i}")).await?;
    }
    let helped = standby.fetch(10, Duration::from_secs(5)).await?;
    assert!(
        !helped.is_empty(),
        "standby should help with a backlog of 10"
    );
    let seqs: BTreeSet<u64> = helped.iter().map(|m| m.stream_seq).collect();
    assert_eq!(seqs.len(), helped.len());
    Ok(())
}
