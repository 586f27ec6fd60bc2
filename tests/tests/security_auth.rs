//! Client authentication and per-user permissions on a TLS cluster.
//!
//! Three nodes share one config: TLS with the cluster CA (nodes forward calls
//! to each other over mutual TLS) and three users: `admin` (everything),
//! `alice` (publishes `orders.>` but not `orders.secret.>`, consumes only
//! ORDERS/shipping, administers nothing) and `bob` (user and password, may
//! consume ORDERS/audit only). Every refused call must come back with the
//! right status and leave the stream and the consumers exactly as they were.

use std::time::Duration;

use wharf_client::{proto as pb, Client, Code, ConnectOptions};
use wharf_tests::pki::{passwd, Pki};
use wharf_tests::{json, stderr, Cluster};

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const ALICE_TOKEN: &str = "alice-token-0123456789";

async fn secured_cluster(pki: &Pki) -> anyhow::Result<Cluster> {
    let auth = format!(
        r#"[auth]
[[auth.users]]
name = "admin"
token_hash = "{admin}"
publish_allow = [">"]
consume_allow = [">"]
admin_allow = [">"]

[[auth.users]]
name = "alice"
token_hash = "{alice}"
publish_allow = ["orders.>"]
publish_deny = ["orders.secret.>"]
consume_allow = ["ORDERS.shipping"]

[[auth.users]]
name = "bob"
password_hash = "{bob}"
consume_allow = ["ORDERS.audit"]
"#,
        admin = passwd(ADMIN_TOKEN)?,
        alice = passwd(ALICE_TOKEN)?,
        bob = passwd("bob-password")?,
    );
    let config = pki.write_config("wharf.toml", Some(&pki.cluster()), &auth)?;
    let options = ConnectOptions {
        tls_ca_pem: Some(pki.ca_pem()?),
        token: Some(ADMIN_TOKEN.into()),
        ..Default::default()
    };
    let args = vec!["--config".to_string(), config.display().to_string()];
    Cluster::start_with(3, args, Default::default(), options, None).await
}

/// The status code of a failed call (None when it succeeded).
fn code<T>(r: Result<T, wharf_client::ClientError>) -> Option<Code> {
    r.err().and_then(|e| e.code())
}

fn as_user(cluster: &Cluster, pki: &Pki, token: Option<&str>) -> Client {
    let options = ConnectOptions {
        tls_ca_pem: Some(pki.ca_pem().expect("ca")),
        token: token.map(str::to_string),
        ..Default::default()
    };
    Client::connect(&cluster.servers(), &options)
        .expect("client")
        .with_retry_for(Duration::from_secs(5))
}

async fn setup(cluster: &Cluster) -> anyhow::Result<()> {
    let admin = cluster.client();
    admin
        .add_stream(pb::StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        })
        .await?;
    for name in ["shipping", "audit"] {
        admin
            .add_consumer(
                "ORDERS",
                pb::ConsumerConfig {
                    name: name.into(),
                    ..Default::default()
                },
            )
            .await?;
    }
    Ok(())
}

/// What a refused call must not change: the stream's messages and both
/// consumers' positions.
async fn state(admin: &Client) -> anyhow::Result<String> {
    let s = admin.stream_info("ORDERS").await?;
    let mut out = format!("stream {:?}", s.state);
    for name in ["shipping", "audit"] {
        let c = admin.consumer_info("ORDERS", name).await?;
        out.push_str(&format!(
            " | {name}: delivered {:?} ack_floor {:?} pending {} ack_pending {} waiting {}",
            c.delivered, c.ack_floor, c.num_pending, c.num_ack_pending, c.num_waiting
        ));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_allowed_user_publishes_and_consumes() -> anyhow::Result<()> {
    let pki = Pki::new()?;
    let cluster = secured_cluster(&pki).await?;
    setup(&cluster).await?;

    // Through every node in turn: two of them forward to the leaders over
    // mutual TLS, carrying alice's already-authorized call.
    for id in 1..=3u64 {
        let options = ConnectOptions {
            tls_ca_pem: Some(pki.ca_pem()?),
            token: Some(ALICE_TOKEN.into()),
            ..Default::default()
        };
        let alice = Client::connect(&cluster.node(id).addr, &options)?;
        let ack = alice.publish("orders.new", format!("via-{id}")).await?;
        assert_eq!((ack.stream.as_str(), ack.seq), ("ORDERS", id));
        let mut worker = alice.consumer("ORDERS", "shipping");
        let got = worker.fetch(1, Duration::from_secs(5)).await?;
        assert_eq!(got.len(), 1, "node {id}");
        assert_eq!(got[0].payload.as_ref(), format!("via-{id}").as_bytes());
        worker.ack(got[0].stream_seq).await?;
        worker.close();
    }
    let info = cluster.client().consumer_info("ORDERS", "shipping").await?;
    assert_eq!(info.num_ack_pending, 0);
    assert_eq!(info.ack_floor.map(|f| f.stream_seq), Some(3));

    // The CLI with a user and password (bob may consume ORDERS/audit).
    let ca = pki.dir().join("ca.pem");
    let ca = ca.to_str().expect("utf-8 path");
    let out = cluster.wharf(&[
        "--tls-ca",
        ca,
        "--user",
        "bob",
        "--password",
        "bob-password",
        "consumer",
        "next",
        "ORDERS",
        "audit",
        "--count",
        "3",
        "--wait",
        "2s",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = cluster.wharf(&[
        "--tls-ca",
        ca,
        "--token",
        ALICE_TOKEN,
        "pub",
        "orders.cli",
        "hello",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = cluster.wharf(&[
        "--tls-ca",
        ca,
        "--token",
        ALICE_TOKEN,
        "stream",
        "info",
        "ORDERS",
        "--json",
    ]);
    let info = json(&out)?;
    assert_eq!(info["state"]["messages"], 4, "{info}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_refused_calls_get_their_status_and_change_nothing() -> anyhow::Result<()> {
    let pki = Pki::new()?;
    let cluster = secured_cluster(&pki).await?;
    setup(&cluster).await?;
    let admin = cluster.client();
    admin.publish("orders.first", "1").await?;
    let before = state(&admin).await?;

    // A wrong token and a missing token: UNAUTHENTICATED.
    let wrong = as_user(&cluster, &pki, Some("not-a-token"));
    assert_eq!(
        code(wrong.publish("orders.x", "x").await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(wrong.delete_stream("ORDERS").await),
        Some(Code::Unauthenticated)
    );
    let nobody = as_user(&cluster, &pki, None);
    assert_eq!(
        code(nobody.publish("orders.x", "x").await),
        Some(Code::Unauthenticated)
    );
    let mut w = nobody.consumer("ORDERS", "shipping");
    assert_eq!(
        code(w.fetch(1, Duration::from_secs(1)).await),
        Some(Code::Unauthenticated)
    );
    assert_eq!(
        code(nobody.cluster_status().await),
        Some(Code::Unauthenticated)
    );
    // A wrong password.
    let options = ConnectOptions {
        tls_ca_pem: Some(pki.ca_pem()?),
        user: Some(("bob".into(), "wrong".into())),
        ..Default::default()
    };
    let bad_bob = Client::connect(&cluster.servers(), &options)?;
    let mut w = bad_bob.consumer("ORDERS", "audit");
    assert_eq!(
        code(w.fetch(1, Duration::from_secs(1)).await),
        Some(Code::Unauthenticated)
    );

    // alice: a forbidden subject, a forbidden consumer, and admin calls.
    let alice = as_user(&cluster, &pki, Some(ALICE_TOKEN));
    assert_eq!(
        code(alice.publish("orders.secret.x", "x").await),
        Some(Code::PermissionDenied)
    );
    let mut w = alice.consumer("ORDERS", "audit");
    assert_eq!(
        code(w.fetch(1, Duration::from_secs(1)).await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(alice.delete_stream("ORDERS").await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(alice.delete_consumer("ORDERS", "shipping").await),
        Some(Code::PermissionDenied)
    );
    assert_eq!(
        code(alice.purge_stream("ORDERS", None, 0, 0).await),
        Some(Code::PermissionDenied)
    );
    // The CLI exits 1 with the server's reason.
    let ca = pki.dir().join("ca.pem");
    let out = cluster.wharf(&[
        "--tls-ca",
        ca.to_str().expect("utf-8"),
        "--token",
        ALICE_TOKEN,
        "stream",
        "rm",
        "ORDERS",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("may not administer"),
        "{}",
        stderr(&out)
    );

    // Nothing changed: same messages, same consumer positions, both
    // consumers and the stream still there.
    assert_eq!(state(&admin).await?, before);
    assert_eq!(admin.list_consumers("ORDERS").await?.len(), 2);
    // And the allowed path still works afterwards.
    let ack = alice.publish("orders.ok", "ok").await?;
    assert_eq!(ack.seq, 2);
    Ok(())
}
