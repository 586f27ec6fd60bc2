//! Server-wide limits against a live three-node cluster started with small
//! limits: each limit answers with its gRPC status and a message naming the
//! setting and its value, the refused call changes nothing, and the cluster
//! still publishes and delivers afterwards.
//!
//! The per-client tests connect from 127.0.0.2 and 127.0.0.3: the nodes
//! listen on 127.0.0.1, which is a cluster member's address and therefore
//! never limited (peer traffic).

use std::net::IpAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};
use wharf_proto::v1 as pb;
use wharf_proto::v1::wharf_client::WharfClient;
use wharf_tests::{eventually, Cluster};

const LIMIT_ARGS: &[&str] = &[
    "--max-message-bytes",
    "1024",
    "--max-request-bytes",
    "70000",
    "--max-pull-batch",
    "5",
    "--max-pull-bytes",
    "4096",
    "--max-streams",
    "2",
    "--max-consumers",
    "2",
    "--max-connections-per-ip",
    "2",
    "--max-pulls-per-client",
    "2",
];

/// A client on its own TCP connection to `addr`, from local address `from`.
async fn connect(addr: &str, from: &str) -> anyhow::Result<WharfClient<Channel>> {
    let from: IpAddr = from.parse()?;
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .local_address(Some(from))
        .timeout(Duration::from_secs(20))
        .connect()
        .await?;
    Ok(WharfClient::new(channel))
}

fn assert_status<T: std::fmt::Debug>(r: Result<T, Status>, code: Code, needle: &str) {
    match r {
        Ok(v) => panic!("expected {code:?} {needle:?}, got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert!(s.message().contains(needle), "{needle:?} not in {s:?}");
        }
    }
}

fn publish(subject: &str, n: usize) -> pb::PublishRequest {
    pb::PublishRequest {
        subject: subject.into(),
        payload: vec![b'x'; n].into(),
        msg_id: String::new(),
        headers: Default::default(),
    }
}

fn stream(name: &str, subject: &str, max_msg_size: i32) -> pb::AddStreamRequest {
    pb::AddStreamRequest {
        config: Some(pb::StreamConfig {
            name: name.into(),
            subjects: vec![subject.into()],
            max_msg_size,
            ..Default::default()
        }),
    }
}

fn consumer(stream: &str, name: &str) -> pb::AddConsumerRequest {
    pb::AddConsumerRequest {
        stream: stream.into(),
        config: Some(pb::ConsumerConfig {
            name: name.into(),
            ..Default::default()
        }),
    }
}

struct Session {
    up: mpsc::Sender<pb::ConsumeRequest>,
    down: Streaming<pb::ConsumeResponse>,
}

/// Open a pull session on `stream`/`name`.
async fn open_session(
    client: &mut WharfClient<Channel>,
    stream: &str,
    name: &str,
) -> Result<Session, Status> {
    let (up, rx) = mpsc::channel(16);
    let open = pb::ConsumeRequest {
        kind: Some(pb::consume_request::Kind::Open(pb::ConsumeOpen {
            stream: stream.into(),
            consumer: name.into(),
        })),
    };
    up.send(open).await.expect("channel open");
    let down = client.consume(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Session { up, down })
}

impl Session {
    async fn pull(&self, batch: u32, max_bytes: u64) {
        let pull = pb::PullRequest {
            id: 1,
            batch,
            max_bytes,
            expires_ms: 5_000,
            ..Default::default()
        };
        let req = pb::ConsumeRequest {
            kind: Some(pb::consume_request::Kind::Pull(pull)),
        };
        self.up.send(req).await.expect("session open");
    }

    /// The payload sizes of the messages of one pull, until its end status.
    async fn messages(&mut self) -> Result<Vec<usize>, Status> {
        let mut got = Vec::new();
        while let Some(r) = self.down.message().await? {
            match r.kind {
                Some(pb::consume_response::Kind::Message(m)) => got.push(m.payload.len()),
                Some(pb::consume_response::Kind::Status(s))
                    if s.code != pb::pull_status::Code::Heartbeat as i32 =>
                {
                    return Ok(got)
                }
                _ => {}
            }
        }
        Ok(got)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_on_sizes_and_counts_answer_with_their_error() -> anyhow::Result<()> {
    let cluster = Cluster::start_with_args(3, LIMIT_ARGS).await?;
    let addr = cluster.node(1).addr.clone();
    // From 127.0.0.1, a member's address: no connection limit applies here.
    let mut c = connect(&addr, "127.0.0.1").await?;
    c.add_stream(stream("ORDERS", "orders.>", 0)).await?;
    c.add_consumer(consumer("ORDERS", "shipping")).await?;
    c.publish(publish("orders.a", 1024)).await?;

    // Message size (max_message_bytes), request size (max_request_bytes).
    assert_status(
        c.publish(publish("orders.a", 1025)).await,
        Code::InvalidArgument,
        "max_message_bytes is 1024",
    );
    assert_status(
        c.publish(publish("orders.a", 80_000)).await,
        Code::OutOfRange,
        "decoded message length too large",
    );
    assert_status(
        c.publish(publish("orders.a", 80_000)).await,
        Code::OutOfRange,
        "the limit is: 70000 bytes",
    );
    // A stream may not accept more than the server does.
    assert_status(
        c.add_stream(stream("BIG", "big.>", 2048)).await,
        Code::InvalidArgument,
        "max_message_bytes is 1024",
    );
    // Names and subjects.
    assert_status(
        c.publish(publish("orders..a", 1)).await,
        Code::InvalidArgument,
        "tokens between dots may not be empty",
    );
    assert_status(
        c.add_stream(stream("bad.name", "x", 0)).await,
        Code::InvalidArgument,
        "names may only contain",
    );
    let bad_open = open_session(&mut c, "ORDERS", "no*such").await;
    assert_status(bad_open.map(|_| ()), Code::InvalidArgument, "consumer name");

    // Stream and consumer counts (max_streams, max_consumers).
    c.add_stream(stream("OTHER", "other.>", 0)).await?;
    assert_status(
        c.add_stream(stream("THIRD", "third.>", 0)).await,
        Code::ResourceExhausted,
        "max_streams is 2",
    );
    c.add_consumer(consumer("OTHER", "audit")).await?;
    assert_status(
        c.add_consumer(consumer("ORDERS", "billing")).await,
        Code::ResourceExhausted,
        "max_consumers is 2",
    );
    // Re-adding an existing one with the same config is not a new one.
    c.add_consumer(consumer("ORDERS", "shipping")).await?;

    // Pull batch and bytes (max_pull_batch, max_pull_bytes): the session
    // ends with the error.
    let mut s = open_session(&mut c, "ORDERS", "shipping").await?;
    s.pull(6, 0).await;
    assert_status(
        s.messages().await,
        Code::InvalidArgument,
        "max_pull_batch is 5",
    );
    let mut s = open_session(&mut c, "ORDERS", "shipping").await?;
    s.pull(1, 4097).await;
    assert_status(
        s.messages().await,
        Code::InvalidArgument,
        "max_pull_bytes is 4096",
    );

    // Nothing changed: two streams, two consumers, one stored message.
    let client = cluster.client();
    let names: Vec<String> = client
        .list_streams()
        .await?
        .into_iter()
        .filter_map(|s| s.config.map(|c| c.name))
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(!names.contains(&"THIRD".to_string()));
    let consumers = client.list_consumers("ORDERS").await?;
    assert_eq!(consumers.len(), 1);
    let info = client.stream_info("ORDERS").await?;
    assert_eq!(info.state.map(|s| s.messages), Some(1));

    // Still serving: publish through another node, pull everything.
    let mut c2 = connect(&cluster.node(2).addr, "127.0.0.1").await?;
    c2.publish(publish("orders.b", 10)).await?;
    let mut s = open_session(&mut c2, "ORDERS", "shipping").await?;
    s.pull(5, 4096).await;
    let got = s.messages().await?;
    assert_eq!(got, vec![1024, 10]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_client_connections_and_pull_sessions() -> anyhow::Result<()> {
    let cluster = Cluster::start_with_args(3, LIMIT_ARGS).await?;
    let addr = cluster.node(1).addr.clone();
    let client = cluster.client();
    client
        .add_stream(stream("JOBS", "jobs.>", 0).config.unwrap())
        .await?;
    client
        .add_consumer("JOBS", consumer("JOBS", "work").config.unwrap())
        .await?;
    client.publish("jobs.1", b"one".to_vec()).await?;

    // max_connections_per_ip = 2: a third connection from 127.0.0.2 is
    // answered with RESOURCE_EXHAUSTED on every call.
    let mut a = connect(&addr, "127.0.0.2").await?;
    let mut b = connect(&addr, "127.0.0.2").await?;
    a.cluster_status(pb::ClusterStatusRequest {}).await?;
    b.cluster_status(pb::ClusterStatusRequest {}).await?;
    let mut over = connect(&addr, "127.0.0.2").await?;
    assert_status(
        over.cluster_status(pb::ClusterStatusRequest {}).await,
        Code::ResourceExhausted,
        "too many connections from 127.0.0.2: max_connections_per_ip is 2",
    );
    assert_status(
        over.publish(publish("jobs.2", 3)).await,
        Code::ResourceExhausted,
        "max_connections_per_ip is 2",
    );
    drop(over);
    // Another address is not affected.
    let mut other = connect(&addr, "127.0.0.3").await?;
    other.cluster_status(pb::ClusterStatusRequest {}).await?;
    // Closing a connection frees its place (the server notices the close).
    drop(a);
    let a = eventually("a freed connection place", Duration::from_secs(10), || {
        let addr = addr.clone();
        async move {
            let mut c = connect(&addr, "127.0.0.2").await.ok()?;
            c.cluster_status(pb::ClusterStatusRequest {}).await.ok()?;
            Some(c)
        }
    })
    .await?;

    // max_pulls_per_client = 2, counted per node at the node the client
    // is connected to: two sessions on each node all reach the one consumer
    // leader (sessions forwarded by peers are not counted there).
    for n in 2..=6 {
        client
            .publish(&format!("jobs.{n}"), b"more".to_vec())
            .await?;
    }
    let mut conns = vec![a];
    for id in 2..=3 {
        conns.push(connect(&cluster.node(id).addr, "127.0.0.2").await?);
    }
    let mut sessions = Vec::new();
    for c in conns.iter_mut() {
        for _ in 0..2 {
            sessions.push(open_session(c, "JOBS", "work").await?);
        }
        assert_status(
            open_session(c, "JOBS", "work").await.map(|_| ()),
            Code::ResourceExhausted,
            "too many concurrent pull sessions from 127.0.0.2: max_pulls_per_client is 2",
        );
    }
    // All six sessions are live: each gets one of the six messages.
    for s in &sessions {
        s.pull(1, 0).await;
    }
    let mut delivered = 0;
    for s in sessions.iter_mut() {
        delivered += s.messages().await?.len();
    }
    assert_eq!(delivered, 6);

    // Ending a session frees its place on that node.
    drop(sessions.remove(0));
    let c1 = &mut conns[0];
    let reopened = eventually(
        "a freed pull session place",
        Duration::from_secs(10),
        || {
            let mut c = c1.clone();
            async move { open_session(&mut c, "JOBS", "work").await.ok() }
        },
    )
    .await?;
    drop(reopened);

    // Still serving, and the refusals changed nothing: one stream, one
    // consumer, seven messages after one more publish, which is delivered.
    drop(b);
    let info = client.stream_info("JOBS").await?;
    assert_eq!(info.state.map(|s| s.messages), Some(6));
    assert_eq!(client.list_consumers("JOBS").await?.len(), 1);
    client.publish("jobs.7", b"late".to_vec()).await?;
    let mut c = connect(&cluster.node(2).addr, "127.0.0.1").await?;
    let mut s = open_session(&mut c, "JOBS", "work").await?;
    s.pull(1, 0).await;
    assert_eq!(s.messages().await?, vec![4]);
    Ok(())
}
