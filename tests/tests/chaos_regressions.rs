//! Bugs the chaos harness found, one named test each (see docs/RELIABILITY.md).
//!
//! `paused_leader_*`: with the stream leader frozen (SIGSTOP), the other two
//! nodes elect a new leader within a couple of seconds, yet a publish that
//! was already on its way to the frozen node waits for it: calls have no
//! per-attempt deadline, neither the server's forwarding (forward.rs) nor the
//! client library's unary calls, so they hang until the node resumes or HTTP/2
//! keep-alive gives up (5 s + 5 s). Found by `chaos --seed 7`: every publisher
//! stalled for the whole 5.8 s pause of node 2, and the first publishes
//! after it resumed completed at the instant of SIGCONT.

use std::time::{Duration, Instant};

use wharf_client::{proto as pb, Client};
use wharf_tests::Cluster;

/// Long enough that only a re-route (not keep-alive, not the resume) can
/// finish the publish in time.
const PAUSE: Duration = Duration::from_secs(20);
/// Election (500-900 ms timeout, 900 ms lease) plus re-routing, generously.
const BOUND: Duration = Duration::from_secs(8);

async fn cluster_with_stream() -> anyhow::Result<(Cluster, u64)> {
    let cluster = Cluster::start(3).await?;
    cluster
        .client()
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    let leader = cluster
        .wait_group_leader("ORDERS", Duration::from_secs(20))
        .await?;
    // Warm the peer channels so the forward below reuses a live connection.
    for n in &cluster.nodes {
        cluster
            .client_of(n.id)
            .publish("orders.created", "warm")
            .await?;
    }
    Ok((cluster, leader))
}

/// Publish through `client`, pausing `leader` first; the publish must finish
/// within BOUND while the leader stays frozen.
async fn publish_with_leader_paused(
    cluster: &mut Cluster,
    leader: u64,
    client: Client,
) -> anyhow::Result<()> {
    cluster.pause(leader)?;
    let started = Instant::now();
    let r = tokio::time::timeout(PAUSE, client.publish("orders.created", "during-pause")).await;
    let took = started.elapsed();
    cluster.resume(leader)?;
    match r {
        Ok(Ok(ack)) => assert!(
            took < BOUND,
            "publish took {took:?} with node {leader} paused (acked at seq {})",
            ack.seq
        ),
        Ok(Err(e)) => panic!("publish failed after {took:?}: {e}"),
        Err(_) => panic!("publish still waiting after {PAUSE:?} with node {leader} paused"),
    }
    Ok(())
}

/// Through a follower: the follower forwards to the frozen leader and waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_leader_does_not_stall_a_publish_forwarded_by_a_follower() -> anyhow::Result<()> {
    let (mut cluster, leader) = cluster_with_stream().await?;
    let follower = cluster.nodes.iter().find(|n| n.id != leader).unwrap().id;
    let client = cluster
        .client_of(follower)
        .with_retry_for(Duration::from_secs(30));
    publish_with_leader_paused(&mut cluster, leader, client).await
}

/// Directly: a client whose first seed is the frozen leader waits on it
/// instead of moving to the next seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_leader_does_not_stall_a_client_that_has_other_seeds() -> anyhow::Result<()> {
    let (mut cluster, leader) = cluster_with_stream().await?;
    let mut seeds = vec![cluster.node(leader).addr.clone()];
    seeds.extend(
        cluster
            .nodes
            .iter()
            .filter(|n| n.id != leader)
            .map(|n| n.addr.clone()),
    );
    let client = Client::new(&seeds.join(","))?.with_retry_for(Duration::from_secs(30));
    publish_with_leader_paused(&mut cluster, leader, client).await
}
