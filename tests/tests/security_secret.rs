//! Peer authentication without TLS: the shared cluster secret.
//!
//! Nodes 1 and 2 share a secret; node 3 has another. The Raft transport
//! answers only calls carrying the right secret, so node 3 never joins, while
//! users (tokens, over plain HTTP/2 here) work through nodes 1 and 2,
//! including calls node 1 forwards to node 2 with the secret.

use std::time::Duration;

use bytes::Bytes;
use tonic::transport::Endpoint;
use wharf_client::{proto as pb, Client, Code, ConnectOptions};
use wharf_proto::v1::raft::raft_transport_client::RaftTransportClient;
use wharf_proto::v1::raft::RaftFrame;
use wharf_tests::pki::{passwd, Pki};
use wharf_tests::{eventually, Cluster};

const TOKEN: &str = "admin-token-0123456789";

/// A Raft transport Ping to `addr` with `secret` in the peer header.
async fn ping_with(addr: &str, secret: Option<&str>) -> Result<(), Code> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|_| Code::Unavailable)?;
    let mut req = tonic::Request::new(RaftFrame {
        group_id: 0,
        payload: Bytes::new(),
        from_node: 99,
    });
    if let Some(s) = secret {
        req.metadata_mut()
            .insert("x-wharf-cluster-secret", s.parse().expect("ascii"));
    }
    RaftTransportClient::new(channel)
        .ping(req)
        .await
        .map(|_| ())
        .map_err(|s| s.code())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_cluster_secret_keeps_other_nodes_out_without_tls() -> anyhow::Result<()> {
    let pki = Pki::new()?;
    let users = format!(
        "[[auth.users]]\nname = \"admin\"\ntoken_hash = \"{}\"\npublish_allow = [\">\"]\nconsume_allow = [\">\"]\nadmin_allow = [\">\"]\n",
        passwd(TOKEN)?
    );
    let good = pki.write_config(
        "good.toml",
        None,
        &format!("[auth]\ncluster_secret = \"right-secret\"\n{users}"),
    )?;
    let bad = pki.write_config(
        "bad.toml",
        None,
        &format!("[auth]\ncluster_secret = \"wrong-secret\"\n{users}"),
    )?;
    let node_args = [(1, &good), (2, &good), (3, &bad)]
        .into_iter()
        .map(|(id, path)| (id, vec!["--config".to_string(), path.display().to_string()]))
        .collect();
    let options = ConnectOptions {
        token: Some(TOKEN.into()),
        ..Default::default()
    };
    let cluster = Cluster::start_with(3, Vec::new(), node_args, options, Some(&[1, 2])).await?;

    let addr1 = cluster.node(1).addr.clone();
    assert_eq!(ping_with(&addr1, Some("right-secret")).await, Ok(()));
    assert_eq!(ping_with(&addr1, None).await, Err(Code::Unauthenticated));
    assert_eq!(
        ping_with(&addr1, Some("wrong-secret")).await,
        Err(Code::Unauthenticated)
    );

    // Node 3 (wrong secret) is reported down, and never learns the leader.
    eventually("node 3 reported down", Duration::from_secs(15), || async {
        let s = cluster.status_of(1, Duration::from_secs(2)).await?;
        let n3 = s.nodes.iter().find(|n| n.id == 3)?;
        (!n3.up).then_some(())
    })
    .await?;
    let s3 = cluster
        .status_of(3, Duration::from_secs(2))
        .await
        .expect("node 3 answers its own status");
    let meta = s3.groups.iter().find(|g| g.name == "meta").expect("meta");
    assert_eq!(meta.leader, 0, "node 3 joined: {s3:?}");

    // Users work through nodes 1 and 2 (one of them forwards to the other).
    // Placement puts the first one-replica stream on the least loaded,
    // lowest-numbered node: node 1, never the outsider.
    let admin12 = Client::connect(
        &format!("{},{}", cluster.node(1).addr, cluster.node(2).addr),
        &cluster.client_options,
    )?;
    admin12
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            replicas: 1,
            ..Default::default()
        })
        .await?;
    for id in [1u64, 2] {
        let c = Client::connect(&cluster.node(id).addr, &cluster.client_options)?;
        c.publish("orders.x", "x").await?;
    }
    let nobody = Client::new(&cluster.node(1).addr)?.with_retry_for(Duration::from_millis(500));
    let err = nobody.publish("orders.x", "x").await.expect_err("no token");
    assert_eq!(err.code(), Some(Code::Unauthenticated));
    assert_eq!(
        admin12
            .stream_info("ORDERS")
            .await?
            .state
            .map(|s| s.messages),
        Some(2)
    );
    Ok(())
}
