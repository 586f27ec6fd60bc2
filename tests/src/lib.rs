//! Test harness: real `wharf server` processes on loopback.
//!
//! `Cluster::start(3)` picks free ports, starts one `wharf server` process per
//! node with its own data dir, and waits until the meta group has a leader.
//! Nodes can be killed with SIGKILL, stopped with SIGTERM and restarted from
//! their data dirs. Every wait is on a condition read from the cluster (status,
//! consumer info), never a bare sleep. When a test panics (or WHARF_TEST_KEEP
//! is set) the data dirs and node logs are kept and their path printed;
//! WHARF_TEST_LOG replaces the nodes' log filter (`info,openraft=warn`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wharf_client::{proto as pb, Client};

/// The chaos harness (`cargo run -p wharf-tests --bin chaos`): workload,
/// nemesis and history checker, also run by the `chaos_*` tests.
#[path = "../chaos/mod.rs"]
pub mod chaos;

/// Starting nodes on their own IPs, pausing and resuming them (chaos).
mod cluster_faults;
/// Scraping and reading a node's Prometheus `/metrics`.
pub mod metrics;
/// Test certificates and secured configs (the `security_*` tests).
pub mod pki;
pub mod powerloss;

/// The `wharf` binary built for this test run (target/<profile>/wharf).
pub fn wharf_bin() -> PathBuf {
    if let Ok(p) = std::env::var("WHARF_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = profile_dir.join("wharf");
    assert!(
        bin.exists(),
        "{} not found: build it first with `cargo build -p wharf` (cargo test --workspace does)",
        bin.display()
    );
    bin
}

/// Where [`free_ports`] looks: below Linux's ephemeral range (32768-60999
/// by default), from which the kernel picks the local port of every outgoing
/// connection. A port taken from that range with `bind(0)` is free only
/// until the node binds it, and in CI a node's own peer connections or a
/// parallel test's took one in between (the node exited with "Address
/// already in use" and the cluster elected no meta leader).
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// Ports this process has handed out, so it never hands one out twice.
static PORTS_HANDED_OUT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// `n` distinct free ports on 127.0.0.1 from [`TEST_PORTS`]. Each test
/// process starts at an offset of its own (from its pid) and moves on from
/// there, so parallel tests probe different ports; a port is free when it
/// can be bound, and all listeners are held until every port is picked.
fn free_ports(n: usize) -> Vec<u16> {
    use std::sync::atomic::Ordering;
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    let offset = (std::process::id() % (span / 10)) * 10;
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..span {
        if listeners.len() == n {
            break;
        }
        let k = u32::from(PORTS_HANDED_OUT.fetch_add(1, Ordering::Relaxed));
        let port = TEST_PORTS.start + ((offset + k) % span) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            listeners.push(l);
        }
    }
    assert_eq!(listeners.len(), n, "no {n} free ports in {TEST_PORTS:?}");
    listeners
        .iter()
        .map(|l| l.local_addr().expect("addr").port())
        .collect()
}

/// One free port on 127.0.0.1, for a test's own server (see [`free_ports`]).
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

pub struct NodeProc {
    pub id: u64,
    pub addr: String,
    /// Where the node serves Prometheus `/metrics` (HTTP).
    pub metrics_addr: String,
    pub data: PathBuf,
    child: Option<Child>,
}

pub struct Cluster {
    pub nodes: Vec<NodeProc>,
    peers: String,
    dir: Option<tempfile::TempDir>,
    /// Raft timing passed to every node.
    pub extra_args: Vec<String>,
    /// Nodes stopped with SIGSTOP (`pause`) and not yet resumed.
    paused: std::collections::BTreeSet<u64>,
    /// Arguments for one node only (e.g. its own `--config`).
    pub node_args: std::collections::BTreeMap<u64, Vec<String>>,
    /// Environment variables for one node only, applied at its next start
    /// (e.g. a fault hook such as `WHARF_FAULT_SLOW_APPEND_MS`).
    pub node_env: std::collections::BTreeMap<u64, Vec<(String, String)>>,
    /// TLS and credentials of every client the harness makes.
    pub client_options: wharf_client::ConnectOptions,
    /// Nodes run with the power-loss shim (see [`powerloss`]).
    simulate_power_loss: bool,
    /// Nodes started with `--join` (added later with `peer add`).
    joiners: std::collections::BTreeSet<u64>,
    /// Nodes dropped by [`Cluster::forget`] (their ids are not reused).
    forgotten: std::collections::BTreeSet<u64>,
}

impl Cluster {
    pub async fn start(n: u64) -> Result<Cluster> {
        Cluster::start_with(n, Vec::new(), Default::default(), Default::default(), None).await
    }

    /// `start`, with extra `wharf server` arguments for every node.
    pub async fn start_with_args(n: u64, args: &[&str]) -> Result<Cluster> {
        let args = args.iter().map(|a| a.to_string()).collect();
        Cluster::start_with(n, args, Default::default(), Default::default(), None).await
    }

    /// [`Cluster::start`] with arguments for every node, arguments per node,
    /// the clients' TLS and credentials, and which nodes must see the meta
    /// leader (`None`: any).
    pub async fn start_with(
        n: u64,
        extra_args: Vec<String>,
        node_args: std::collections::BTreeMap<u64, Vec<String>>,
        client_options: wharf_client::ConnectOptions,
        wait_on: Option<&[u64]>,
    ) -> Result<Cluster> {
        let options = (client_options, false);
        Cluster::start_inner(n, extra_args, node_args, options, wait_on).await
    }

    /// [`Cluster::start_with_args`] with every node under the power-loss
    /// shim, so that [`Cluster::power_cut`] can drop what was not fsynced.
    pub async fn start_simulating_power_loss(n: u64, args: &[&str]) -> Result<Cluster> {
        let args = args.iter().map(|a| a.to_string()).collect();
        let options = (Default::default(), true);
        Cluster::start_inner(n, args, Default::default(), options, None).await
    }

    async fn start_inner(
        n: u64,
        extra_args: Vec<String>,
        node_args: std::collections::BTreeMap<u64, Vec<String>>,
        (client_options, simulate_power_loss): (wharf_client::ConnectOptions, bool),
        wait_on: Option<&[u64]>,
    ) -> Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("wharf-test-").tempdir()?;
        let ports = free_ports(2 * n as usize);
        let nodes: Vec<NodeProc> = (1..=n)
            .map(|id| NodeProc {
                id,
                addr: format!("127.0.0.1:{}", ports[2 * (id as usize - 1)]),
                metrics_addr: format!("127.0.0.1:{}", ports[2 * (id as usize - 1) + 1]),
                data: dir.path().join(format!("node-{id}")),
                child: None,
            })
            .collect();
        let peers = nodes
            .iter()
            .map(|p| format!("{}={}", p.id, p.addr))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            nodes,
            peers,
            dir: Some(dir),
            extra_args,
            paused: Default::default(),
            node_args,
            node_env: Default::default(),
            client_options,
            simulate_power_loss,
            joiners: Default::default(),
            forgotten: Default::default(),
        };
        for id in 1..=n {
            cluster.spawn(id)?;
        }
        match wait_on {
            None => {
                if let Err(e) = cluster.wait_meta_leader(Duration::from_secs(30)).await {
                    // Keep the node logs: a cluster that cannot elect is a bug
                    // to read about, not just a failed test.
                    if let Some(dir) = cluster.dir.take() {
                        eprintln!(
                            "cluster data and node logs kept in {}",
                            dir.keep().display()
                        );
                    }
                    return Err(e);
                }
            }
            Some(ids) => {
                for id in ids {
                    let what = format!("node {id} sees a meta leader");
                    eventually(&what, Duration::from_secs(30), || async {
                        let s = cluster.status_of(*id, Duration::from_secs(2)).await?;
                        let meta = s.groups.iter().find(|g| g.name == "meta")?;
                        Some(meta.leader).filter(|l| *l != 0)
                    })
                    .await?;
                }
            }
        }
        Ok(cluster)
    }

    fn node_mut(&mut self, id: u64) -> &mut NodeProc {
        self.nodes.iter_mut().find(|n| n.id == id).expect("node id")
    }

    pub fn node(&self, id: u64) -> &NodeProc {
        self.nodes.iter().find(|n| n.id == id).expect("node id")
    }

    fn spawn(&mut self, id: u64) -> Result<()> {
        // A joining node asks the other nodes (never itself) for the cluster.
        let founding = ["--peers".to_string(), self.peers.clone()];
        let seeds: Vec<String> = (self.nodes.iter())
            .filter(|n| n.id != id)
            .map(|n| n.addr.clone())
            .collect();
        let joining = ["--join".to_string(), seeds.join(",")];
        let membership = if self.joiners.contains(&id) {
            joining
        } else {
            founding
        };
        let mut extra = self.extra_args.clone();
        extra.extend(self.node_args.get(&id).cloned().unwrap_or_default());
        let power_loss = self.simulate_power_loss;
        let mut env: Vec<(String, std::ffi::OsString)> = self
            .node_env
            .get(&id)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into()))
            .collect();
        let node = self.node_mut(id);
        if power_loss {
            env.extend(
                powerloss::env_for(&node.data)
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v)),
            );
        }
        if node.data.exists() {
            // A restart: the metrics port was free while the node was down,
            // and a parallel test may have taken it since (seen in CI: the
            // node exited with "Address already in use"). Peers know only
            // the gRPC address, so the metrics one can move.
            node.metrics_addr = format!("127.0.0.1:{}", free_ports(1)[0]);
        }
        std::fs::create_dir_all(&node.data)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.data.with_extension("log"))?;
        let child = Command::new(wharf_bin())
            .args([
                "server",
                "--node-id",
                &id.to_string(),
                "--listen",
                &node.addr,
            ])
            .arg("--data")
            .arg(&node.data)
            .args(&membership)
            .args(["--metrics-listen", &node.metrics_addr])
            .args(&extra)
            .env(
                "WHARF_LOG",
                std::env::var("WHARF_TEST_LOG").unwrap_or_else(|_| "info,openraft=warn".into()),
            )
            .envs(env)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawn wharf server")?;
        node.child = Some(child);
        Ok(())
    }

    /// Start a new node with `--join` (the other nodes as seeds); it holds no
    /// data until `wharf cluster peer add <id> <addr>` adds it. Returns its id.
    pub fn spawn_joining(&mut self) -> Result<u64> {
        let port = free_ports(1)[0];
        self.spawn_joining_at(format!("127.0.0.1:{port}"))
    }

    /// [`Cluster::spawn_joining`] listening on `addr` (the chaos harness
    /// gives a new node the address of one it removed earlier). Ids are
    /// never reused: the new id is one above every id this cluster had.
    pub fn spawn_joining_at(&mut self, addr: String) -> Result<u64> {
        let id = (self.nodes.iter().map(|n| n.id))
            .chain(self.forgotten.iter().copied())
            .max()
            .unwrap_or(0)
            + 1;
        let dir = self
            .dir
            .as_ref()
            .context("cluster dir")?
            .path()
            .to_path_buf();
        let metrics_port = free_ports(1)[0];
        self.nodes.push(NodeProc {
            id,
            addr,
            metrics_addr: format!("127.0.0.1:{metrics_port}"),
            data: dir.join(format!("node-{id}")),
            child: None,
        });
        self.joiners.insert(id);
        self.spawn(id)?;
        Ok(id)
    }

    /// A node removed from the cluster (`peer remove`): SIGKILL it if it
    /// still runs and drop it from [`Cluster::nodes`]. Its data dir and log
    /// stay with the cluster's (kept or deleted with them).
    pub fn forget(&mut self, id: u64) {
        self.kill(id);
        self.paused.remove(&id);
        self.nodes.retain(|n| n.id != id);
        self.forgotten.insert(id);
    }

    /// SIGKILL: no chance to flush or hand anything over.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.node_mut(id).child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the process to exit.
    pub fn stop(&mut self, id: u64) {
        if let Some(mut c) = self.node_mut(id).child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Power cut: SIGKILL, then the node's files lose everything that was
    /// not fsynced (only with [`Cluster::start_simulating_power_loss`]).
    pub fn power_cut(&mut self, id: u64) -> Result<powerloss::Cut> {
        anyhow::ensure!(
            self.simulate_power_loss,
            "the cluster runs without the power-loss shim"
        );
        self.kill(id);
        powerloss::cut(&self.node(id).data)
    }

    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.kill(id);
        self.spawn(id)
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.node(id).child.is_some()
    }

    /// Client addresses of every node, comma-separated.
    pub fn servers(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.addr.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.servers(), &self.client_options).expect("client")
    }

    /// A client that talks to one node only.
    pub fn client_of(&self, id: u64) -> Client {
        Client::connect(&self.node(id).addr, &self.client_options).expect("client")
    }

    /// Run the CLI against this cluster. Client commands keep retrying for
    /// up to 30 s while groups elect leaders (a loaded 2-core CI machine can
    /// be slow to elect a new group's first leader).
    pub fn wharf(&self, args: &[&str]) -> Output {
        Command::new(wharf_bin())
            .args(args)
            .env("WHARF_RETRY_FOR", "30s")
            .env("WHARF_SERVER", self.servers())
            .output()
            .expect("run wharf")
    }

    /// Start the CLI without waiting for it.
    pub fn wharf_spawn(&self, args: &[&str]) -> Child {
        Command::new(wharf_bin())
            .args(args)
            .env("WHARF_RETRY_FOR", "30s")
            .env("WHARF_SERVER", self.servers())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn wharf")
    }

    /// Cluster status from the first running node that answers.
    pub async fn status(&self) -> Result<pb::ClusterStatusResponse> {
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            let c = Client::connect(&n.addr, &self.client_options)?
                .with_retry_for(Duration::from_millis(500));
            if let Ok(s) = c.cluster_status().await {
                return Ok(s);
            }
        }
        bail!("no node answered cluster status")
    }

    /// Create an R3 stream with default limits.
    pub async fn add_stream(&self, name: &str, subjects: &[&str]) -> Result<pb::StreamInfo> {
        let config = pb::StreamConfig {
            name: name.into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            replicas: 3,
            ..Default::default()
        };
        Ok(self.client().add_stream(config).await?)
    }

    /// Create a consumer (explicit ack, deliver all) and read every stored
    /// message through it, acking each: (stream seq, payload) in order.
    pub async fn read_all(&self, stream: &str, consumer: &str) -> Result<Vec<(u64, String)>> {
        let client = self.client();
        let config = pb::ConsumerConfig {
            name: consumer.into(),
            ..Default::default()
        };
        client.add_consumer(stream, config).await?;
        let stored = client.stream_info(stream).await?.state.unwrap_or_default();
        let mut worker = client.consumer(stream, consumer);
        let mut got = Vec::new();
        while (got.len() as u64) < stored.messages {
            let batch = worker.fetch(100, Duration::from_secs(5)).await?;
            anyhow::ensure!(
                !batch.is_empty(),
                "consumer {consumer} stopped at {} of {}",
                got.len(),
                stored.messages
            );
            for m in batch {
                worker.ack(m.stream_seq).await?;
                got.push((
                    m.stream_seq,
                    String::from_utf8_lossy(&m.payload).into_owned(),
                ));
            }
        }
        Ok(got)
    }

    pub async fn wait_meta_leader(&self, timeout: Duration) -> Result<u64> {
        self.wait_group_leader("meta", timeout).await
    }

    /// Wait until a running node reports a leader for the named group that is
    /// itself running, and every running replica agrees.
    pub async fn wait_group_leader(&self, name: &str, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.agreed_leader(name).await {
                return Ok(leader);
            }
            if Instant::now() > deadline {
                bail!("no leader for group {name} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn agreed_leader(&self, name: &str) -> Option<u64> {
        let mut seen = None;
        for n in self.nodes.iter().filter(|n| n.child.is_some()) {
            let c = Client::connect(&n.addr, &self.client_options)
                .ok()?
                .with_retry_for(Duration::from_millis(300));
            let s = c.cluster_status().await.ok()?;
            let g = s.groups.iter().find(|g| g.name == name)?;
            if !g.replicas.contains(&n.id) {
                continue;
            }
            if g.leader == 0 || !self.is_running(g.leader) || seen.is_some_and(|l| l != g.leader) {
                return None;
            }
            seen = Some(g.leader);
        }
        seen
    }

    pub fn logs_dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(|d| d.path())
    }

    /// Wait up to `timeout` for node `id` to exit by itself (no signal from
    /// the harness): its exit status, or None if it still runs then (or was
    /// not running). A node that exited counts as not running afterwards.
    pub async fn wait_exit(
        &mut self,
        id: u64,
        timeout: Duration,
    ) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let node = self.node_mut(id);
            if let Some(status) = node.child.as_mut()?.try_wait().ok()? {
                node.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if std::thread::panicking() || std::env::var_os("WHARF_TEST_KEEP").is_some() {
            if let Some(dir) = self.dir.take() {
                let path = dir.keep();
                eprintln!("cluster data and node logs kept in {}", path.display());
            }
        }
    }
}

/// Poll `f` until it returns Some, or fail after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Parse a CLI output as JSON, with the output in the error.
pub fn json(out: &Output) -> Result<serde_json::Value> {
    if !out.status.success() {
        bail!(
            "wharf failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("not JSON: {}", String::from_utf8_lossy(&out.stdout)))
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
