//! In-process clusters over real gRPC on loopback: replication, failover and
//! restart, through the public API only. Every wait is on group status, never a
//! bare sleep.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use wharf_raft::Group;
use wharf_raft::NodeId;
use wharf_raft::RaftError;
use wharf_raft::RaftNode;
use wharf_raft::RaftSettings;
use wharf_raft::Role;
use wharf_raft::SharedStateMachine;
use wharf_raft::StateMachine;

const GROUP: u64 = 7;
const WAIT: Duration = Duration::from_secs(15);

/// Counts applied commands; answers each with the new count. Its snapshot is
/// the count followed by `pad_bytes` zeros (to make snapshots span chunks).
#[derive(Default)]
struct Counter {
    count: u64,
    pad_bytes: usize,
}

impl StateMachine for Counter {
    fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
        self.count += 1;
        self.count.to_be_bytes().to_vec()
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        let mut data = self.count.to_be_bytes().to_vec();
        data.resize(8 + self.pad_bytes, 0);
        Ok(data)
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let head = data.get(..8).ok_or("short counter snapshot")?;
        let bytes: [u8; 8] = head
            .try_into()
            .map_err(|_| "bad counter snapshot".to_string())?;
        self.count = u64::from_be_bytes(bytes);
        Ok(())
    }
}

fn counter() -> (Arc<Mutex<Counter>>, SharedStateMachine) {
    padded_counter(0)
}

fn padded_counter(pad_bytes: usize) -> (Arc<Mutex<Counter>>, SharedStateMachine) {
    let c = Arc::new(Mutex::new(Counter {
        count: 0,
        pad_bytes,
    }));
    let sm: SharedStateMachine = c.clone();
    (c, sm)
}

fn count_of(c: &Arc<Mutex<Counter>>) -> u64 {
    c.lock().unwrap().count
}

/// Logs to the test output when `RUST_LOG` is set (e.g. `RUST_LOG=openraft=warn`).
fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn settings() -> RaftSettings {
    init_tracing();
    RaftSettings {
        heartbeat_ms: 100,
        election_min_ms: 400,
        election_max_ms: 800,
        snapshot_every_entries: None,
        bind_ip: None,
        ..RaftSettings::default()
    }
}

/// A node plus the gRPC server serving its transport.
struct TestNode {
    id: NodeId,
    addr: String,
    node: Arc<RaftNode>,
    server: JoinHandle<()>,
    stop_server: tokio::sync::oneshot::Sender<()>,
}

impl TestNode {
    async fn start(
        id: NodeId,
        dir: &Path,
        listener: TcpListener,
        settings: RaftSettings,
    ) -> TestNode {
        // After a shutdown in this same process, background tasks of the old
        // node may still hold the sled Db (and its file lock) for a moment:
        // wait, bounded, until the lock is free.
        let mut tries = 0;
        let node = loop {
            match RaftNode::open(id, dir, settings.clone()) {
                Ok(node) => break node,
                Err(e) if e.to_string().contains("could not acquire lock") && tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("open node: {e}"),
            }
        };
        let addr = listener.local_addr().unwrap().to_string();
        let svc = node.transport_service();
        let (stop_server, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let incoming = TcpListenerStream::new(listener);
            let res = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = res {
                eprintln!("server error: {e}");
            }
        });
        TestNode {
            id,
            addr,
            node,
            server,
            stop_server,
        }
    }

    /// Shuts the node down and stops its server, closing every connection
    /// (aborting the accept loop alone would leave them answering).
    async fn kill(self) {
        self.node.shutdown().await;
        let _ = self.stop_server.send(());
        let _ = self.server.await;
    }
}

async fn bind() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

/// Waits until every group agrees on one leader among them and returns its id.
async fn agreed_leader(groups: &[&Group]) -> NodeId {
    let first = groups[0]
        .wait_for(WAIT, |s| s.leader.is_some())
        .await
        .expect("a leader is elected");
    let mut leader = first.leader.unwrap();
    // The first node may have seen an older leader; settle on one everyone
    // shares. Elections can still be going on (a candidate's pre-vote round),
    // so poll until the deadline rather than a fixed number of times.
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        let mut agreed = true;
        for g in groups {
            let s = g
                .wait_for(WAIT, |s| s.leader.is_some())
                .await
                .expect("leader known");
            if s.leader != Some(leader) {
                leader = s.leader.unwrap();
                agreed = false;
            }
        }
        if agreed {
            return leader;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("nodes never agreed on a leader within {WAIT:?}");
}

async fn write_n(g: &Group, n: u64) -> u64 {
    let mut last = 0;
    for i in 0..n {
        let resp = g
            .write(format!("cmd-{i}").into_bytes())
            .await
            .expect("write");
        last = u64::from_be_bytes(resp.try_into().expect("8-byte answer"));
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_and_fail_over() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut listeners = Vec::new();
    let mut members = BTreeMap::new();
    for id in 1..=3u64 {
        let (l, addr) = bind().await;
        listeners.push(l);
        members.insert(id, addr);
    }
    let mut nodes = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        nodes.push(TestNode::start(i as u64 + 1, dirs[i].path(), l, settings()).await);
    }
    assert!(
        nodes[0]
            .node
            .ping(&members[&2], Duration::from_secs(2))
            .await
    );

    let mut counters = Vec::new();
    let mut groups = Vec::new();
    for n in &nodes {
        let (c, sm) = counter();
        let g = n
            .node
            .start_group(GROUP, members.clone(), sm.clone())
            .await
            .unwrap();
        // Starting again returns the running group.
        let again = n
            .node
            .start_group(GROUP, members.clone(), sm)
            .await
            .unwrap();
        assert_eq!(again.id(), GROUP);
        counters.push(c);
        groups.push(g);
    }

    let leader = agreed_leader(&groups.iter().collect::<Vec<_>>()).await;
    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    assert_eq!(groups[li].status().role, Role::Leader);
    assert_eq!(groups[li].status().voters, vec![1, 2, 3]);

    // A follower refuses writes and names the leader.
    let fi = (li + 1) % 3;
    match groups[fi].write(b"nope".to_vec()).await {
        Err(RaftError::NotLeader { leader: l }) => assert_eq!(l, Some(leader)),
        other => panic!("expected NotLeader, got {other:?}"),
    }

    assert_eq!(write_n(&groups[li], 100).await, 100);
    // The status watch changes after each apply, so a predicate on the state
    // machine is re-checked whenever it can have changed.
    groups[li]
        .ensure_linearizable()
        .await
        .expect("read barrier on the leader");
    for (g, c) in groups.iter().zip(&counters) {
        g.wait_for(WAIT, |_| count_of(c) == 100)
            .await
            .expect("replica catches up");
    }

    // Kill the leader's node; the other two elect a new leader and go on.
    let dead = nodes.remove(li);
    groups.remove(li);
    counters.remove(li);
    dead.kill().await;

    let survivors: Vec<&Group> = groups.iter().collect();
    for g in &survivors {
        g.wait_for(WAIT, |s| s.leader.is_some() && s.leader != Some(leader))
            .await
            .expect("new leader elected");
    }
    let new_leader = agreed_leader(&survivors).await;
    assert_ne!(new_leader, leader);
    let ni = nodes.iter().position(|n| n.id == new_leader).unwrap();
    assert_eq!(write_n(&groups[ni], 10).await, 110);
    for (g, c) in groups.iter().zip(&counters) {
        g.wait_for(WAIT, |_| count_of(c) == 110)
            .await
            .expect("replica catches up");
    }

    for n in nodes {
        n.kill().await;
    }
}

/// Writes to a single-voter group, shuts the node down, reopens the same
/// directory in the same process and checks the state is replayed.
async fn restart_replays(settings: RaftSettings, writes: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (l, addr) = bind().await;
    let members = BTreeMap::from([(1u64, addr.clone())]);

    let n = TestNode::start(1, dir.path(), l, settings.clone()).await;
    let (c, sm) = counter();
    let g = n
        .node
        .start_group(GROUP, members.clone(), sm)
        .await
        .unwrap();
    g.wait_for(WAIT, |s| s.role == Role::Leader).await.unwrap();
    assert_eq!(write_n(&g, writes).await, writes);
    drop(g);
    n.kill().await;

    let l = TcpListener::bind(&addr).await.unwrap();
    let n = TestNode::start(1, dir.path(), l, settings).await;
    let (c2, sm) = counter();
    let g = n.node.start_group(GROUP, members, sm).await.unwrap();
    g.wait_for(WAIT, |_| count_of(&c2) == writes)
        .await
        .expect("replayed");
    assert_eq!(count_of(&c), writes);
    // Still writable after the restart.
    g.wait_for(WAIT, |s| s.role == Role::Leader).await.unwrap();
    assert_eq!(write_n(&g, 1).await, writes + 1);

    // Stopping with destroy drops the trees; a restart then starts empty.
    n.node.stop_group(GROUP, true).await.unwrap();
    assert!(n.node.group(GROUP).is_none());
    g.wait_for(WAIT, |s| s.role == Role::Shutdown)
        .await
        .expect("a stopped group reports Shutdown");
    assert!(matches!(
        g.write(b"late".to_vec()).await,
        Err(RaftError::Stopped(_))
    ));
    assert!(matches!(
        n.node.stop_group(GROUP, false).await,
        Err(RaftError::GroupNotFound(GROUP))
    ));
    n.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replays_the_log() {
    restart_replays(settings(), 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_restores_the_snapshot_then_the_log() {
    let s = RaftSettings {
        snapshot_every_entries: Some(10),
        ..settings()
    };
    restart_replays(s, 25).await;
}

/// A follower that was down while the others snapshotted and purged their
/// logs past its end catches up through InstallSnapshot (a multi-chunk
/// snapshot: 2.5 MiB of padding). openraft's leader does not purge what a
/// lagging follower's replication still wants, so leadership first moves to
/// the other follower, which has purged its own log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_follower_catches_up_by_snapshot() {
    const PAD: usize = 5 * 512 * 1024;
    let s = RaftSettings {
        snapshot_every_entries: Some(100),
        ..settings()
    };
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut listeners = Vec::new();
    let mut members = BTreeMap::new();
    for id in 1..=3u64 {
        let (l, addr) = bind().await;
        listeners.push(l);
        members.insert(id, addr);
    }
    let mut nodes = Vec::new();
    let mut groups = Vec::new();
    let mut counters = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let n = TestNode::start(i as u64 + 1, dirs[i].path(), l, s.clone()).await;
        let (c, sm) = padded_counter(PAD);
        groups.push(
            n.node
                .start_group(GROUP, members.clone(), sm)
                .await
                .unwrap(),
        );
        counters.push(c);
        nodes.push(n);
    }
    let leader = agreed_leader(&groups.iter().collect::<Vec<_>>()).await;
    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    assert_eq!(write_n(&groups[li], 5).await, 5);

    // Take a follower down, then write well past the log the nodes keep.
    let fi = (li + 1) % 3;
    let lagging_id = nodes[fi].id;
    let lagging = nodes.remove(fi);
    groups.remove(fi);
    counters.remove(fi);
    lagging.kill().await;
    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    let lg = groups[li].clone();
    for batch in 0..13 {
        let writes = (0..100).map(|i| lg.write(format!("b{batch}-{i}").into_bytes()));
        for r in futures::future::join_all(writes).await {
            r.expect("write");
        }
    }
    let total = 5 + 1300;

    // Hand leadership to the other follower once it has applied everything.
    let oi = 1 - li;
    let other_id = nodes[oi].id;
    groups[oi]
        .wait_for(WAIT, |_| count_of(&counters[oi]) == total)
        .await
        .unwrap();
    lg.transfer_leader(other_id).await.expect("transfer");
    groups[oi]
        .wait_for(WAIT, |s| s.role == Role::Leader)
        .await
        .expect("leadership moved");

    // Restart the lagging follower on its old directory and address.
    let dir = dirs[(lagging_id - 1) as usize].path();
    let l = TcpListener::bind(&members[&lagging_id]).await.unwrap();
    let n = TestNode::start(lagging_id, dir, l, s).await;
    let (c, sm) = padded_counter(PAD);
    let g = n
        .node
        .start_group(GROUP, members.clone(), sm)
        .await
        .unwrap();
    g.wait_for(WAIT, |_| count_of(&c) == total)
        .await
        .expect("follower catches up");
    assert_eq!(write_n(&groups[oi], 1).await, total + 1);
    nodes.push(n);
    for n in nodes {
        n.kill().await;
    }
}

/// Starts three nodes with group `GROUP` on each; `env` is set while the
/// node with that id opens (faults are read once, when a node opens).
async fn three_node_group(
    dirs: &[tempfile::TempDir],
    env: Option<(NodeId, &str, &str)>,
) -> (Vec<TestNode>, Vec<Group>, Vec<Arc<Mutex<Counter>>>) {
    let mut listeners = Vec::new();
    let mut members = BTreeMap::new();
    for id in 1..=3u64 {
        let (l, addr) = bind().await;
        listeners.push(l);
        members.insert(id, addr);
    }
    let (mut nodes, mut groups, mut counters) = (Vec::new(), Vec::new(), Vec::new());
    for (i, l) in listeners.into_iter().enumerate() {
        let id = i as u64 + 1;
        let faulty = env.filter(|(n, _, _)| *n == id);
        if let Some((_, k, v)) = faulty {
            std::env::set_var(k, v);
        }
        let n = TestNode::start(id, dirs[i].path(), l, settings()).await;
        if let Some((_, k, _)) = faulty {
            std::env::remove_var(k);
        }
        let (c, sm) = counter();
        groups.push(
            n.node
                .start_group(GROUP, members.clone(), sm)
                .await
                .unwrap(),
        );
        counters.push(c);
        nodes.push(n);
    }
    (nodes, groups, counters)
}

/// A follower that does not know the streaming AppendEntries call (a node
/// of an earlier version, simulated with `WHARF_FAULT_NO_APPEND_STREAM`) is
/// replicated to with unary calls: it applies everything the leader wrote.
/// Without the fallback its leader would retry the stream forever and it
/// would apply nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_without_append_streams_is_replicated_by_unary_calls() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (nodes, groups, counters) =
        three_node_group(&dirs, Some((3, "WHARF_FAULT_NO_APPEND_STREAM", "1"))).await;
    let mut leader = agreed_leader(&groups.iter().collect::<Vec<_>>()).await;
    if leader == 3 {
        // Node 3 must be a follower: hand leadership to node 1.
        groups[2].transfer_leader(1).await.expect("transfer");
        groups[0]
            .wait_for(WAIT, |s| s.role == Role::Leader)
            .await
            .expect("node 1 leads");
        leader = 1;
    }
    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    let written = write_n(&groups[li], 50).await;
    for (g, c) in groups.iter().zip(&counters) {
        g.wait_for(WAIT, |_| count_of(c) == written)
            .await
            .expect("every replica, node 3 too, applies every write");
    }
    for n in nodes {
        n.kill().await;
    }
}

/// `AppendStream` refuses what it cannot serve with a clear status and
/// changes nothing: no group header, an unknown group, a frame that does not
/// decode. The group keeps working afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_stream_refuses_bad_input_clearly() {
    use wharf_proto::v1::raft::raft_transport_client::RaftTransportClient;
    use wharf_proto::v1::raft::RaftFrame;

    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (nodes, groups, counters) = three_node_group(&dirs, None).await;
    let leader = agreed_leader(&groups.iter().collect::<Vec<_>>()).await;
    let follower = nodes.iter().find(|n| n.id != leader).unwrap();
    let addr = format!("http://{}", follower.addr);
    let mut client = RaftTransportClient::connect(addr).await.expect("connect");
    let frame = |group_id| RaftFrame {
        group_id,
        payload: bytes::Bytes::from_static(b"not an AppendEntries request"),
        from_node: 99,
    };
    let call = |group: Option<&str>, frame: RaftFrame| {
        let mut request = tonic::Request::new(tokio_stream::iter(vec![frame]));
        if let Some(g) = group {
            request
                .metadata_mut()
                .insert("wharf-raft-group", g.parse().unwrap());
        }
        request
    };

    let status = client
        .append_stream(call(None, frame(GROUP)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(status.message().contains("wharf-raft-group"), "{status}");

    let status = client
        .append_stream(call(Some("99"), frame(99)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound, "{status}");

    let mut answers = client
        .append_stream(call(Some(&GROUP.to_string()), frame(GROUP)))
        .await
        .expect("the call is accepted; its frame is not")
        .into_inner();
    let status = answers.message().await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    assert!(status.message().contains("decode"), "{status}");

    let li = nodes.iter().position(|n| n.id == leader).unwrap();
    let written = write_n(&groups[li], 5).await;
    for (g, c) in groups.iter().zip(&counters) {
        g.wait_for(WAIT, |_| count_of(c) == written)
            .await
            .expect("the group still replicates");
    }
    for n in nodes {
        n.kill().await;
    }
}
