//! With authentication on, per-client limits follow the logged-in user, not
//! the address: two users on one host each get their own pull sessions.
//! The clients connect from 127.0.0.2: the nodes (on 127.0.0.1) do not count
//! their peers' addresses.

use std::time::Duration;

use wharf_client::{proto as pb, Client, Code, ConnectOptions};
use wharf_tests::pki::{passwd, Pki};
use wharf_tests::Cluster;

const ADMIN_TOKEN: &str = "admin-token-0123456789";
const ALICE_TOKEN: &str = "alice-token-0123456789";

fn on_node_1(cluster: &Cluster, pki: &Pki, token: &str) -> anyhow::Result<Client> {
    let options = ConnectOptions {
        tls_ca_pem: Some(pki.ca_pem()?),
        token: Some(token.into()),
        local_address: Some("127.0.0.2".parse()?),
        ..Default::default()
    };
    let client = Client::connect(&cluster.node(1).addr, &options)?;
    Ok(client.with_retry_for(Duration::from_secs(5)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_pull_sessions_are_counted_per_user() -> anyhow::Result<()> {
    let pki = Pki::new()?;
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
consume_allow = ["JOBS.w"]
"#,
        admin = passwd(ADMIN_TOKEN)?,
        alice = passwd(ALICE_TOKEN)?,
    );
    let config = pki.write_config("wharf.toml", Some(&pki.cluster()), &auth)?;
    let options = ConnectOptions {
        tls_ca_pem: Some(pki.ca_pem()?),
        token: Some(ADMIN_TOKEN.into()),
        ..Default::default()
    };
    let args = vec![
        "--config".to_string(),
        config.display().to_string(),
        "--max-pulls-per-client".to_string(),
        "1".to_string(),
    ];
    let cluster = Cluster::start_with(3, args, Default::default(), options, None).await?;
    let admin = cluster.client();
    admin
        .add_stream(pb::StreamConfig {
            name: "JOBS".into(),
            subjects: vec!["jobs.>".into()],
            ..Default::default()
        })
        .await?;
    admin
        .add_consumer(
            "JOBS",
            pb::ConsumerConfig {
                name: "w".into(),
                ..Default::default()
            },
        )
        .await?;

    // admin's one session on node 1 stays open (an empty fetch keeps it).
    let admin1 = on_node_1(&cluster, &pki, ADMIN_TOKEN)?;
    let mut first = admin1.consumer("JOBS", "w");
    assert!(first.fetch(1, Duration::from_millis(200)).await?.is_empty());
    // A second session of admin on node 1 is over the limit...
    let mut second = on_node_1(&cluster, &pki, ADMIN_TOKEN)?.consumer("JOBS", "w");
    let err = second
        .fetch(1, Duration::from_millis(200))
        .await
        .expect_err("admin's second session is refused");
    assert_eq!(err.code(), Some(Code::ResourceExhausted), "{err}");
    assert!(err.to_string().contains("user \"admin\""), "{err}");
    // ...but alice, from the same address, has a session of her own.
    let mut alice = on_node_1(&cluster, &pki, ALICE_TOKEN)?.consumer("JOBS", "w");
    admin.publish("jobs.a", "for alice").await?;
    let got = alice.fetch(1, Duration::from_secs(5)).await?;
    assert_eq!(got.len(), 1);
    alice.ack(got[0].stream_seq).await?;
    Ok(())
}
