//! A group whose storage fails on one node is stopped and reported there;
//! the node and its other groups go on, and the group keeps serving from
//! its other replicas.
//!
//! The fault is injected with `WHARF_FAULT_FAIL_GROUP=<node>:<group>:<after>`
//! (wharf-raft's `fault` module): node 1's log store of group 1 (the first
//! stream created) fails from its 8th append on, as a broken disk would.

use std::time::Duration;

use wharf_client::Client;
use wharf_tests::{eventually, json, stderr, stdout, Cluster};

async fn local_role(cluster: &Cluster, node: u64, group: &str) -> Option<(String, String)> {
    let status = cluster.client_of(node).cluster_status().await.ok()?;
    let g = status.groups.into_iter().find(|g| g.name == group)?;
    Some((g.local_role, g.local_error))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_group_is_stopped_and_reported_and_the_node_goes_on() -> anyhow::Result<()> {
    // Inherited by the three server processes; only node 1 matches it.
    std::env::set_var("WHARF_FAULT_FAIL_GROUP", "1:1:8");
    let cluster = Cluster::start(3).await?;
    json(&cluster.wharf(&[
        "stream",
        "add",
        "FRAGILE",
        "--subjects",
        "fragile.>",
        "--json",
    ]))?;
    json(&cluster.wharf(&[
        "stream",
        "add",
        "STEADY",
        "--subjects",
        "steady.>",
        "--json",
    ]))?;
    let status = cluster.client().cluster_status().await?;
    let fragile = status.groups.iter().find(|g| g.name == "FRAGILE").unwrap();
    assert_eq!(fragile.group_id, 1, "the fault targets group 1");

    // Publishing drives node 1's replica of FRAGILE past its 8th append.
    let client: Client = cluster.client();
    for i in 0..30 {
        client.publish("fragile.x", format!("m{i}")).await?;
    }
    let (role, error) = eventually(
        "node 1 to report FRAGILE failed",
        Duration::from_secs(20),
        || async {
            local_role(&cluster, 1, "FRAGILE")
                .await
                .filter(|(r, _)| r == "failed")
        },
    )
    .await?;
    assert_eq!(role, "failed");
    assert!(error.contains("injected storage fault"), "{error}");
    // The CLI shows it too.
    let out = cluster.wharf(&["--server", &cluster.node(1).addr, "cluster", "status"]);
    assert!(stdout(&out).contains("failed here"), "{}", stdout(&out));

    // The group goes on on nodes 2 and 3: every publish so far is there,
    // and more succeed.
    for i in 30..40 {
        client.publish("fragile.x", format!("m{i}")).await?;
    }
    let info = cluster.client_of(2).stream_info("FRAGILE").await?;
    assert_eq!(info.state.unwrap_or_default().messages, 40);
    for node in [2, 3] {
        let (role, _) = local_role(&cluster, node, "FRAGILE")
            .await
            .unwrap_or_default();
        assert!(
            role == "leader" || role == "follower",
            "node {node}: {role}"
        );
    }

    // Node 1 and its other groups go on: it still serves STEADY and the meta
    // group, and answers as ready.
    let node1 = cluster.client_of(1);
    for i in 0..5 {
        node1.publish("steady.x", format!("s{i}")).await?;
    }
    for group in ["STEADY", "meta"] {
        let (role, error) = local_role(&cluster, 1, group).await.unwrap_or_default();
        assert!(
            role == "leader" || role == "follower",
            "{group} on node 1: {role} {error}"
        );
    }
    let health = cluster.wharf(&["--server", &cluster.node(1).addr, "health"]);
    assert!(
        health.status.success(),
        "{}{}",
        stdout(&health),
        stderr(&health)
    );
    Ok(())
}
