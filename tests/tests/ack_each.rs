//! `Consumer::ack_each`: a batch's acks are sent together, committed
//! together (a few Raft entries, not one each), and ride through the loss of
//! the consumer's leader.

use std::time::Duration;

use wharf_client::proto as pb;
use wharf_client::Client;
use wharf_tests::{eventually, Cluster};

const CONSUMER_GROUP: &str = "JOBS/w";

async fn setup(cluster: &Cluster, messages: u64) -> anyhow::Result<Client> {
    let client = cluster.client();
    cluster.add_stream("JOBS", &["jobs.>"]).await?;
    let config = pb::ConsumerConfig {
        name: "w".into(),
        // Long enough that nothing is redelivered while the test runs.
        ack_wait_ms: 120_000,
        ..Default::default()
    };
    client.add_consumer("JOBS", config).await?;
    for i in 0..messages {
        client.publish("jobs.a", format!("job-{i}")).await?;
    }
    Ok(client)
}

/// The consumer group's applied index on its leader.
async fn consumer_applied(cluster: &Cluster) -> anyhow::Result<u64> {
    let leader = cluster
        .wait_group_leader(CONSUMER_GROUP, Duration::from_secs(30))
        .await?;
    let status = cluster.client_of(leader).cluster_status().await?;
    let group = status
        .groups
        .iter()
        .find(|g| g.name == CONSUMER_GROUP)
        .ok_or_else(|| anyhow::anyhow!("no group {CONSUMER_GROUP} in {status:?}"))?;
    Ok(group.last_applied)
}

/// Fetch until `n` messages are in hand.
async fn fetch_n(
    worker: &mut wharf_client::Consumer,
    n: usize,
) -> anyhow::Result<Vec<wharf_client::Message>> {
    let mut got = Vec::new();
    while got.len() < n {
        let batch = worker
            .fetch((n - got.len()) as u32, Duration::from_secs(5))
            .await?;
        anyhow::ensure!(!batch.is_empty(), "stopped at {} of {n}", got.len());
        got.extend(batch);
    }
    Ok(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_acks_is_committed_in_a_few_entries() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let client = setup(&cluster, 300).await?;
    let mut worker = client.consumer("JOBS", "w");
    let msgs = fetch_n(&mut worker, 300).await?;
    let seqs: Vec<u64> = msgs.iter().map(|m| m.stream_seq).collect();
    assert_eq!(seqs, (1..=300).collect::<Vec<u64>>());

    let before = consumer_applied(&cluster).await?;
    worker.ack_each(&seqs).await?;
    let after = consumer_applied(&cluster).await?;

    let info = client.consumer_info("JOBS", "w").await?;
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(
        info.ack_floor.as_ref().map(|f| f.stream_seq),
        Some(300),
        "{info:?}"
    );
    // One at a time, 300 acks would be 300 entries; sent together they share
    // entries (the leader proposes whatever queued while one was in flight).
    assert!(
        after - before <= 30,
        "300 acks took {} consumer entries",
        after - before
    );
    let more = worker.fetch(10, Duration::from_millis(500)).await?;
    assert!(more.is_empty(), "acked messages came back: {more:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_sent_together_survive_the_loss_of_the_consumer_leader() -> anyhow::Result<()> {
    let mut cluster = Cluster::start(3).await?;
    let client = setup(&cluster, 50).await?;
    let mut worker = client.consumer("JOBS", "w");
    let msgs = fetch_n(&mut worker, 50).await?;
    let seqs: Vec<u64> = msgs.iter().map(|m| m.stream_seq).collect();

    let leader = cluster
        .wait_group_leader(CONSUMER_GROUP, Duration::from_secs(30))
        .await?;
    cluster.kill(leader);
    worker.ack_each(&seqs).await?;

    let info = eventually(
        "consumer info after failover",
        Duration::from_secs(30),
        || async { client.consumer_info("JOBS", "w").await.ok() },
    )
    .await?;
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(
        info.ack_floor.as_ref().map(|f| f.stream_seq),
        Some(50),
        "{info:?}"
    );
    let mut fresh = client.consumer("JOBS", "w");
    let more = fresh.fetch(10, Duration::from_millis(500)).await?;
    assert!(more.is_empty(), "acked messages came back: {more:?}");
    Ok(())
}
