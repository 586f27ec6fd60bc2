//! `Consumer::ack_each`: a batch's acks are sent together, committed
//! together (a few Raft entries, not one each), and ride through the loss of
//! the consumer's leader. `Consumer::ack_and_fetch`, which sends a batch's
//! acks with the next pull, does the same.

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

/// Wait until the consumer answers (its leader may have just died), then
/// check that nothing awaits an ack and the ack floor is `floor`.
async fn assert_all_acked(client: &Client, floor: u64) -> anyhow::Result<()> {
    let info = eventually("consumer info", Duration::from_secs(30), || async {
        client.consumer_info("JOBS", "w").await.ok()
    })
    .await?;
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(
        info.ack_floor.as_ref().map(|f| f.stream_seq),
        Some(floor),
        "{info:?}"
    );
    Ok(())
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

    assert_all_acked(&client, 50).await?;
    let mut fresh = client.consumer("JOBS", "w");
    let more = fresh.fetch(10, Duration::from_millis(500)).await?;
    assert!(more.is_empty(), "acked messages came back: {more:?}");
    Ok(())
}

/// `ack_and_fetch` over a whole queue: every batch's acks ride with the
/// next pull; at the end nothing is pending, the ack floor is the last
/// message, and each message came exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_sent_with_the_next_pull_settle_every_message_once() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let client = setup(&cluster, 40).await?;
    let mut worker = client.consumer("JOBS", "w");
    let mut seen = Vec::new();
    let mut batch = worker.fetch(3, Duration::from_secs(5)).await?;
    while !batch.is_empty() {
        let seqs: Vec<u64> = batch.iter().map(|m| m.stream_seq).collect();
        seen.extend_from_slice(&seqs);
        batch = worker
            .ack_and_fetch(&seqs, 3, Duration::from_millis(500))
            .await?;
    }
    assert_eq!(seen, (1..=40).collect::<Vec<u64>>());
    let info = client.consumer_info("JOBS", "w").await?;
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    assert_eq!(
        info.ack_floor.as_ref().map(|f| f.stream_seq),
        Some(40),
        "{info:?}"
    );
    Ok(())
}

/// A worker that acks with its next pull costs the consumer one Raft entry
/// per message: the leader commits the acks in the entry that delivers the
/// next message. Sent on their own they would take an entry each as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_sent_with_the_next_pull_share_its_delivery_entry() -> anyhow::Result<()> {
    let cluster = Cluster::start(3).await?;
    let client = setup(&cluster, 30).await?;
    let mut worker = client.consumer("JOBS", "w");
    let mut batch = worker.fetch(1, Duration::from_secs(5)).await?;
    let before = consumer_applied(&cluster).await?;
    let mut seen = Vec::new();
    while !batch.is_empty() {
        let seqs: Vec<u64> = batch.iter().map(|m| m.stream_seq).collect();
        seen.extend_from_slice(&seqs);
        batch = worker
            .ack_and_fetch(&seqs, 1, Duration::from_millis(300))
            .await?;
    }
    let after = consumer_applied(&cluster).await?;
    assert_eq!(seen, (1..=30).collect::<Vec<u64>>());
    // 29 entries that ack one message and deliver the next, one for the last
    // ack (nothing left to deliver); two apiece would be 59.
    assert!(
        after - before <= 32,
        "30 messages acked with the next pull took {} consumer entries",
        after - before
    );
    let info = client.consumer_info("JOBS", "w").await?;
    assert_eq!(info.num_ack_pending, 0, "{info:?}");
    Ok(())
}

/// The consumer's leader dies between a fetch and the acks that go with
/// the next pull: the acks are resent through the new leader and the pull
/// made again, so the worker goes on with the rest and nothing it acked
/// comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_sent_with_the_next_pull_survive_the_loss_of_the_consumer_leader() -> anyhow::Result<()>
{
    let mut cluster = Cluster::start(3).await?;
    let client = setup(&cluster, 20).await?;
    let mut worker = client.consumer("JOBS", "w");
    let first = fetch_n(&mut worker, 10).await?;
    let seqs: Vec<u64> = first.iter().map(|m| m.stream_seq).collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<u64>>());

    let leader = cluster
        .wait_group_leader(CONSUMER_GROUP, Duration::from_secs(30))
        .await?;
    cluster.kill(leader);
    let mut rest = worker
        .ack_and_fetch(&seqs, 10, Duration::from_secs(5))
        .await?;
    while rest.len() < 10 {
        let more = worker.fetch(10, Duration::from_secs(5)).await?;
        anyhow::ensure!(
            !more.is_empty(),
            "stopped at {} of 10: {rest:?}",
            rest.len()
        );
        rest.extend(more);
    }
    let rest_seqs: Vec<u64> = rest.iter().map(|m| m.stream_seq).collect();
    assert_eq!(rest_seqs, (11..=20).collect::<Vec<u64>>());
    worker.ack_each(&rest_seqs).await?;

    assert_all_acked(&client, 20).await?;
    Ok(())
}
