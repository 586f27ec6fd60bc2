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

/// Counts applied commands; answers each with the new count.
#[derive(Default)]
struct Counter {
    count: u64,
}

impl StateMachine for Counter {
    fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
        self.count += 1;
        self.count.to_be_bytes().to_vec()
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        Ok(self.count.to_be_bytes().to_vec())
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        let bytes: [u8; 8] = data.try_into().map_err(|_| "bad counter snapshot".to_string())?;
        self.count = u64::from_be_bytes(bytes);
        Ok(())
    }
}

fn counter() -> (Arc<Mutex<Counter>>, SharedStateMachine) {
    let c = Arc::new(Mutex::new(Counter::default()));
    let sm: SharedStateMachine = c.clone();
    (c, sm)
}

fn count_of(c: &Arc<Mutex<Counter>>) -> u64 {
    c.lock().unwrap().count
}

fn settings() -> RaftSettings {
    RaftSettings {
        heartbeat_ms: 100,
        election_min_ms: 400,
        election_max_ms: 800,
        snapshot_every_entries: None,
    }
}

/// A node plus the gRPC server serving its transport.
struct TestNode {
    id: NodeId,
    node: Arc<RaftNode>,
    server: JoinHandle<()>,
}

impl TestNode {
    async fn start(id: NodeId, dir: &Path, listener: TcpListener, settings: RaftSettings) -> TestNode {
        let node = RaftNode::open(id, dir, settings).expect("open node");
        let svc = node.transport_service();
        let server = tokio::spawn(async move {
            let incoming = TcpListenerStream::new(listener);
            let res = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = res {
                eprintln!("server error: {e}");
            }
        });
        TestNode { id, node, server }
    }

    /// Shuts the node down and kills its server (the peers see it vanish).
    async fn kill(self) {
        self.node.shutdown().await;
        self.server.abort();
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
    // The first node may have seen an older leader; settle on one everyone shares.
    for _ in 0..10 {
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
    }
    panic!("nodes never agreed on a leader");
}

async fn write_n(g: &Group, n: u64) -> u64 {
    let mut last = 0;
    for i in 0..n {
        let resp = g.write(format!("cmd-{i}").into_bytes()).await.expect("write");
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
    assert!(nodes[0].node.ping(&members[&2], Duration::from_secs(2)).await);

    let mut counters = Vec::new();
    let mut groups = Vec::new();
    for n in &nodes {
        let (c, sm) = counter();
        let g = n.node.start_group(GROUP, members.clone(), sm.clone()).await.unwrap();
        // Starting again returns the running group.
        let again = n.node.start_group(GROUP, members.clone(), sm).await.unwrap();
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
    groups[li].ensure_linearizable().await.expect("read barrier on the leader");
    for (g, c) in groups.iter().zip(&counters) {
        g.wait_for(WAIT, |_| count_of(c) == 100).await.expect("replica catches up");
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
        g.wait_for(WAIT, |_| count_of(c) == 110).await.expect("replica catches up");
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
    let g = n.node.start_group(GROUP, members.clone(), sm).await.unwrap();
    g.wait_for(WAIT, |s| s.role == Role::Leader).await.unwrap();
    assert_eq!(write_n(&g, writes).await, writes);
    drop(g);
    n.kill().await;

    let l = TcpListener::bind(&addr).await.unwrap();
    let n = TestNode::start(1, dir.path(), l, settings).await;
    let (c2, sm) = counter();
    let g = n.node.start_group(GROUP, members, sm).await.unwrap();
    g.wait_for(WAIT, |_| count_of(&c2) == writes).await.expect("replayed");
    assert_eq!(count_of(&c), writes);
    // Still writable after the restart.
    g.wait_for(WAIT, |s| s.role == Role::Leader).await.unwrap();
    assert_eq!(write_n(&g, 1).await, writes + 1);

    // Stopping with destroy drops the trees; a restart then starts empty.
    n.node.stop_group(GROUP, true).await.unwrap();
    assert!(n.node.group(GROUP).is_none());
    assert!(matches!(n.node.stop_group(GROUP, false).await, Err(RaftError::GroupNotFound(GROUP))));
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
