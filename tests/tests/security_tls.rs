//! TLS on the one port, and mutual TLS between nodes.
//!
//! A plaintext client (and a client that does not trust the cluster CA) gets
//! nothing from a TLS node; a node whose certificate comes from another CA
//! never joins: the cluster's nodes refuse its handshakes and it refuses
//! theirs, and the Raft transport answers only callers holding a certificate
//! of the cluster CA.

use std::time::{Duration, Instant};

use bytes::Bytes;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use wharf_client::{proto as pb, Client, Code, ConnectOptions};
use wharf_proto::v1::raft::raft_transport_client::RaftTransportClient;
use wharf_proto::v1::raft::RaftFrame;
use wharf_tests::pki::{Pki, TlsFiles};
use wharf_tests::{eventually, Cluster};

fn tls_options(pki: &Pki) -> ConnectOptions {
    ConnectOptions {
        tls_ca_pem: Some(pki.ca_pem().expect("ca")),
        ..Default::default()
    }
}

/// One Ping on the Raft transport of `addr`, over TLS trusting `ca`,
/// presenting `identity` if given.
async fn raft_ping(
    addr: &str,
    ca: &std::path::Path,
    identity: Option<&TlsFiles>,
) -> Result<(), String> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(
        std::fs::read(ca).map_err(|e| e.to_string())?,
    ));
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(&id.cert).map_err(|e| e.to_string())?,
            std::fs::read(&id.key).map_err(|e| e.to_string())?,
        ));
    }
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(3))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    RaftTransportClient::new(channel)
        .ping(RaftFrame {
            group_id: 0,
            payload: Bytes::new(),
            from_node: 99,
        })
        .await
        .map(|_| ())
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_plaintext_client_is_refused_on_a_tls_port() -> anyhow::Result<()> {
    let pki = Pki::new()?;
    let config = pki.write_config("wharf.toml", Some(&pki.cluster()), "")?;
    let args = vec!["--config".to_string(), config.display().to_string()];
    let cluster = Cluster::start_with(3, args, Default::default(), tls_options(&pki), None).await?;
    let client = cluster.client();
    client
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    // Over TLS, through every node (two forward over mutual TLS).
    for id in 1..=3u64 {
        let c = Client::connect(&cluster.node(id).addr, &tls_options(&pki))?;
        assert_eq!(c.publish("orders.tls", "ok").await?.seq, id);
    }

    for id in 1..=3u64 {
        let addr = cluster.node(id).addr.clone();
        // Plain HTTP/2 to the TLS port: no call gets through.
        let plain = Client::new(&addr)?.with_retry_for(Duration::from_millis(500));
        let err = plain
            .publish("orders.plain", "x")
            .await
            .expect_err("a plaintext publish must be refused");
        assert_ne!(err.code(), Some(Code::Ok), "{err}");
        assert!(plain.cluster_status().await.is_err());
        // TLS trusting another CA: the client refuses the node's certificate.
        let wrong_ca = ConnectOptions {
            tls_ca_pem: Some(std::fs::read(pki.foreign().ca)?),
            ..Default::default()
        };
        let c = Client::connect(&addr, &wrong_ca)?.with_retry_for(Duration::from_millis(500));
        assert!(c.publish("orders.wrong-ca", "x").await.is_err());
        // The health check needs TLS too.
        let out = cluster.wharf(&["--server", &addr, "health"]);
        assert!(!out.status.success(), "plaintext health check must fail");
        let ca = pki.cluster().ca;
        let out = cluster.wharf(&[
            "--server",
            &addr,
            "--tls-ca",
            ca.to_str().expect("utf-8"),
            "health",
        ]);
        assert!(out.status.success(), "{}", wharf_tests::stderr(&out));
    }
    // Only the three TLS publishes were stored.
    let info = client.stream_info("ORDERS").await?;
    assert_eq!(info.state.map(|s| s.messages), Some(3));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_node_with_foreign_certificate_cannot_join() -> anyhow::Result<()> {
    let pki = Pki::new()?;
    let good = pki.write_config("good.toml", Some(&pki.cluster()), "")?;
    // Node 3 trusts the cluster CA but presents a certificate of another CA.
    let foreign = TlsFiles {
        ca: pki.cluster().ca,
        ..pki.foreign()
    };
    let bad = pki.write_config("foreign.toml", Some(&foreign), "")?;
    let node_args = [(1, &good), (2, &good), (3, &bad)]
        .into_iter()
        .map(|(id, path)| (id, vec!["--config".to_string(), path.display().to_string()]))
        .collect();
    let cluster =
        Cluster::start_with(3, Vec::new(), node_args, tls_options(&pki), Some(&[1, 2])).await?;
    let ca = pki.cluster().ca;

    // The Raft transport answers a caller with the cluster's certificate
    // (so the probes below can succeed), refuses one with no certificate,
    // and the TLS handshake fails for one with the foreign certificate.
    let addr1 = cluster.node(1).addr.clone();
    raft_ping(&addr1, &ca, Some(&pki.cluster()))
        .await
        .map_err(anyhow::Error::msg)?;
    let no_cert = raft_ping(&addr1, &ca, None)
        .await
        .expect_err("no client certificate");
    assert!(no_cert.contains("Unauthenticated"), "{no_cert}");
    raft_ping(&addr1, &ca, Some(&pki.foreign()))
        .await
        .expect_err("foreign client certificate");

    // Nodes 1 and 2 formed the meta group without node 3 and report it down.
    let down = eventually("node 3 reported down", Duration::from_secs(15), || async {
        let s = cluster.status_of(1, Duration::from_secs(2)).await?;
        let n3 = s.nodes.iter().find(|n| n.id == 3)?;
        (!n3.up).then_some(())
    })
    .await;
    down?;
    // Node 3 (read over TLS trusting its foreign CA) never learns the
    // leader: watched for 4 s, more than two election timeouts of the
    // default 800-1600 ms, during which the leader sends it heartbeats that
    // would reach it if it had joined.
    let foreign_view = ConnectOptions {
        tls_ca_pem: Some(std::fs::read(pki.foreign().ca)?),
        ..Default::default()
    };
    let node3 = Client::connect(&cluster.node(3).addr, &foreign_view)?
        .with_retry_for(Duration::from_secs(2));
    let until = Instant::now() + Duration::from_secs(4);
    let mut seen = 0;
    while Instant::now() < until {
        let s = node3.cluster_status().await?;
        let meta = s
            .groups
            .iter()
            .find(|g| g.name == "meta")
            .expect("meta group");
        assert_eq!(meta.leader, 0, "node 3 joined: {s:?}");
        seen += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(seen > 5, "node 3 answered its status only {seen} times");
    // Meanwhile nodes 1 and 2 still agree on a leader among themselves.
    let s = cluster
        .status_of(2, Duration::from_secs(2))
        .await
        .expect("node 2 answers");
    let meta = s
        .groups
        .iter()
        .find(|g| g.name == "meta")
        .expect("meta group");
    assert!(meta.leader == 1 || meta.leader == 2, "{s:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_certificates_are_reread_on_restart() -> anyhow::Result<()> {
    let pki = Pki::new()?;
    // Node 1 reads its own copies of the files (as from a mounted secret).
    let own = TlsFiles {
        cert: pki.dir().join("node1.pem"),
        key: pki.dir().join("node1.key"),
        ca: pki.cluster().ca,
    };
    let install = |from: &TlsFiles| -> anyhow::Result<()> {
        std::fs::copy(&from.cert, &own.cert)?;
        std::fs::copy(&from.key, &own.key)?;
        Ok(())
    };
    install(&pki.cluster())?;
    let shared = pki.write_config("shared.toml", Some(&pki.cluster()), "")?;
    let node1 = pki.write_config("node1.toml", Some(&own), "")?;
    let node_args = [(1, &node1), (2, &shared), (3, &shared)]
        .into_iter()
        .map(|(id, path)| (id, vec!["--config".to_string(), path.display().to_string()]))
        .collect();
    let mut cluster =
        Cluster::start_with(3, Vec::new(), node_args, tls_options(&pki), None).await?;
    let node_up =
        |s: &pb::ClusterStatusResponse, id: u64| s.nodes.iter().find(|n| n.id == id).map(|n| n.up);

    // The secret now holds a certificate of another CA. After a restart
    // node 1 serves it (a client trusting only that CA gets its status; one
    // trusting the cluster CA no longer gets through), and the others, which
    // ping it on every status call, see it as down while it runs.
    install(&pki.foreign())?;
    cluster.restart(1)?;
    let foreign_view = ConnectOptions {
        tls_ca_pem: Some(std::fs::read(pki.foreign().ca)?),
        ..Default::default()
    };
    let addr1 = cluster.node(1).addr.clone();
    eventually(
        "node 1 serving the new certificate",
        Duration::from_secs(20),
        || async {
            let c = Client::connect(&addr1, &foreign_view).ok()?;
            let c = c.with_retry_for(Duration::from_millis(500));
            c.cluster_status().await.ok()
        },
    )
    .await?;
    let cluster_view =
        Client::connect(&addr1, &tls_options(&pki))?.with_retry_for(Duration::from_millis(500));
    assert!(cluster_view.cluster_status().await.is_err());
    let s2 = cluster
        .status_of(2, Duration::from_secs(2))
        .await
        .expect("node 2 answers");
    assert_eq!(node_up(&s2, 1), Some(false), "{s2:?}");
    // The right certificate again: after the next restart node 1 rejoins.
    install(&pki.cluster())?;
    cluster.restart(1)?;
    eventually(
        "node 1 back with a leader",
        Duration::from_secs(30),
        || async {
            let s1 = cluster.status_of(1, Duration::from_secs(2)).await?;
            let meta = s1.groups.iter().find(|g| g.name == "meta")?;
            let s2 = cluster.status_of(2, Duration::from_secs(2)).await?;
            (meta.leader != 0 && node_up(&s2, 1) == Some(true)).then_some(())
        },
    )
    .await?;
    Ok(())
}
