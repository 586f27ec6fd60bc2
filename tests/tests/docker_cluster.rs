//! The deployment, tested for real: the `wharf:dev` image (FROM scratch, our
//! static binary) run as the Compose cluster of `deploy/compose`, driven from
//! the host through the published client ports.
//!
//! 1. The seed tutorial with the host's `wharf` CLI.
//! 2. Under a steady publish-and-consume load through the client library:
//!    `docker kill` of the container leading the consumer and `docker start`
//!    again; `docker pause` / `unpause` of another; `docker network
//!    disconnect` / `connect` of one; a rolling restart of all three
//!    (`docker stop -t 30`, `docker start`, wait until ready, next).
//! 3. Every acknowledged publish was processed, nothing is outstanding, and
//!    the rolling restart returned no error to any publish, fetch or ack.
//!
//! Skips (passes with a message) where no Docker engine answers. Builds the
//! image with deploy/docker/build.sh when `wharf:dev` is missing (or always,
//! with WHARF_DOCKER_REBUILD=1). Every container, network and volume of the
//! test's Compose project is removed at the end, pass or fail
//! (WHARF_TEST_KEEP=1 keeps them, and their logs are printed on failure).
//! Traffic from the test goes only to 127.0.0.1 (the published ports); the
//! faults are applied only to the test's own containers.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::process::Command;
use wharf_client::proto as pb;
use wharf_client::Client;
use wharf_tests::{eventually, free_port, json, stderr, stdout, wharf_bin};

const ORDERS: [&str; 3] = [
    r#"{"order_id":"ord_8w2k","customer":"acme-co","total_cents":4200,"ts":"2026-05-22T10:14:22Z"}"#,
    r#"{"order_id":"ord_2zr9","customer":"globex","total_cents":7800,"ts":"2026-05-22T10:14:25Z"}"#,
    r#"{"order_id":"ord_5k1m","customer":"initech","total_cents":1500,"ts":"2026-05-22T10:14:29Z"}"#,
];
const NODES: [u64; 3] = [1, 2, 3];
const CONSUMER: &str = "ORDERS/shipping";
/// Upper bound on the load, whatever happens: each publisher stops after this
/// many messages (and when the test says stop).
const MAX_PER_PUBLISHER: u64 = 20_000;
const PUBLISHERS: u64 = 2;
const WORKERS: usize = 3;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn image() -> String {
    std::env::var("WHARF_IMAGE").unwrap_or_else(|_| "wharf:dev".to_string())
}

/// Run a command to completion; fail with its output when it fails.
async fn run(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            stdout(&out),
            stderr(&out)
        );
    }
    Ok(out)
}

async fn docker(args: &[&str]) -> Result<String> {
    let out = run(Command::new("docker").args(args)).await?;
    Ok(stdout(&out).trim().to_string())
}

async fn docker_available() -> bool {
    Command::new("docker")
        .arg("info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `docker compose` (v2 plugin) or `docker-compose` (v1), whichever runs.
async fn compose_command() -> Option<Vec<String>> {
    for cmd in [vec!["docker", "compose"], vec!["docker-compose"]] {
        let ok = Command::new(cmd[0])
            .args(&cmd[1..])
            .arg("version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Some(cmd.into_iter().map(String::from).collect());
        }
    }
    None
}

async fn ensure_image() -> Result<()> {
    let image = image();
    let present = Command::new("docker")
        .args(["image", "inspect", &image])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await?
        .success();
    if present && std::env::var_os("WHARF_DOCKER_REBUILD").is_none() {
        return Ok(());
    }
    eprintln!("building {image} with deploy/docker/build.sh (static release build; takes minutes the first time)");
    let status = Command::new("bash")
        .arg(repo_root().join("deploy/docker/build.sh"))
        .env("WHARF_IMAGE", &image)
        .stdin(Stdio::null())
        .status()
        .await?;
    if !status.success() {
        bail!("deploy/docker/build.sh failed ({status})");
    }
    Ok(())
}

/// One Compose project of deploy/compose/docker-compose.yml under a unique
/// name, with its own host ports. Dropping it runs `down -v`.
struct Compose {
    cmd: Vec<String>,
    project: String,
    file: PathBuf,
    ports: BTreeMap<u64, u16>,
    containers: BTreeMap<u64, String>,
    network: String,
    passed: bool,
}

impl Compose {
    fn new(cmd: Vec<String>) -> Compose {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Compose {
            cmd,
            project: format!("wharftest{}x{nanos:x}", std::process::id()),
            file: repo_root().join("deploy/compose/docker-compose.yml"),
            ports: NODES.iter().map(|&id| (id, free_port())).collect(),
            containers: BTreeMap::new(),
            network: String::new(),
            passed: false,
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.cmd[0]);
        c.args(&self.cmd[1..])
            .arg("--project-name")
            .arg(&self.project)
            .arg("--file")
            .arg(&self.file)
            .args(args)
            .env("WHARF_IMAGE", image())
            .env("WHARF_BIND", "127.0.0.1")
            .env("WHARF_LOG", "info,openraft=warn,sled=warn");
        for (id, port) in &self.ports {
            c.env(format!("WHARF_PORT_{id}"), port.to_string());
        }
        c
    }

    async fn up(&mut self) -> Result<()> {
        run(&mut self.command(&["up", "-d"])).await?;
        for id in NODES {
            let out = run(&mut self.command(&["ps", "-q", &format!("wharf{id}")])).await?;
            let cid = stdout(&out).trim().to_string();
            if cid.is_empty() {
                bail!("no container for service wharf{id}");
            }
            self.containers.insert(id, cid);
        }
        let nets = docker(&[
            "inspect",
            "-f",
            "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
            &self.containers[&1],
        ])
        .await?;
        self.network = nets
            .split_whitespace()
            .find(|n| n.ends_with("_wharf"))
            .with_context(|| format!("no *_wharf network among {nets}"))?
            .to_string();
        Ok(())
    }

    fn container(&self, id: u64) -> &str {
        &self.containers[&id]
    }

    fn addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.ports[&id])
    }

    fn servers(&self) -> String {
        NODES
            .iter()
            .map(|&id| self.addr(id))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn client(&self) -> Client {
        Client::new(&self.servers()).expect("client")
    }

    /// The host's `wharf` CLI against the published ports.
    async fn wharf(&self, args: &[&str]) -> Output {
        Command::new(wharf_bin())
            .arg("--server")
            .arg(self.servers())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run wharf")
    }

    fn wharf_spawn(&self, args: &[&str]) -> tokio::process::Child {
        Command::new(wharf_bin())
            .arg("--server")
            .arg(self.servers())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn wharf")
    }

    /// One node's own view of the cluster, through its published port.
    async fn status_of(&self, id: u64) -> Option<pb::ClusterStatusResponse> {
        let c = Client::new(&self.addr(id))
            .ok()?
            .with_retry_for(Duration::from_millis(300));
        tokio::time::timeout(Duration::from_secs(3), c.cluster_status())
            .await
            .ok()?
            .ok()
    }

    /// The leader of `group` that every running replica agrees on.
    async fn agreed_leader(&self, group: &str, running: &[u64]) -> Option<u64> {
        let mut seen = None;
        for &id in running {
            let s = self.status_of(id).await?;
            let g = s.groups.iter().find(|g| g.name == group)?;
            if !g.replicas.contains(&id) {
                continue;
            }
            if g.leader == 0 || !running.contains(&g.leader) || seen.is_some_and(|l| l != g.leader)
            {
                return None;
            }
            seen = Some(g.leader);
        }
        seen
    }

    async fn wait_leader(&self, group: &str, running: &[u64], timeout: Duration) -> Result<u64> {
        eventually(&format!("a leader for {group}"), timeout, || {
            self.agreed_leader(group, running)
        })
        .await
    }

    /// Wait until every node in `others` sees node `id` down.
    async fn wait_seen_down(&self, id: u64, others: &[u64], timeout: Duration) -> Result<()> {
        eventually(
            &format!("nodes {others:?} to see node {id} down"),
            timeout,
            || async move {
                for &o in others {
                    let s = self.status_of(o).await?;
                    let n = s.nodes.iter().find(|n| n.id == id)?;
                    if n.up {
                        return None;
                    }
                }
                Some(())
            },
        )
        .await
    }

    /// Node `id` is ready: it answers on its published port, sees every
    /// running node up, every group it hosts has a leader among the running
    /// nodes, and it has applied (nearly) what that leader had applied just
    /// before; the container's health check, where the image has one, is
    /// healthy.
    async fn wait_ready(&self, id: u64, running: &[u64], timeout: Duration) -> Result<()> {
        eventually(&format!("node {id} ready"), timeout, || async move {
            let mut leader_views = BTreeMap::new();
            for &r in running {
                leader_views.insert(r, self.status_of(r).await?);
            }
            let mine = self.status_of(id).await?;
            if mine.node_id != id {
                return None;
            }
            for &r in running {
                if !mine.nodes.iter().any(|n| n.id == r && n.up) {
                    return None;
                }
            }
            for g in mine.groups.iter().filter(|g| g.replicas.contains(&id)) {
                if g.leader == 0 || !running.contains(&g.leader) {
                    return None;
                }
                let lv = &leader_views[&g.leader];
                let lg = lv.groups.iter().find(|x| x.group_id == g.group_id)?;
                if lg.leader != g.leader || g.last_applied + 64 < lg.last_applied {
                    return None;
                }
            }
            let health = docker(&[
                "inspect",
                "-f",
                "{{if .State.Health}}{{.State.Health.Status}}{{end}}",
                self.container(id),
            ])
            .await
            .ok()?;
            (health.is_empty() || health == "healthy").then_some(())
        })
        .await
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        let cmd = self.command(&[]);
        let std_cmd = cmd.as_std();
        let base = |args: &[&str]| {
            let mut c = std::process::Command::new(std_cmd.get_program());
            c.args(std_cmd.get_args()).args(args);
            for (k, v) in std_cmd.get_envs() {
                if let Some(v) = v {
                    c.env(k, v);
                }
            }
            c.stdin(Stdio::null());
            c
        };
        if !self.passed {
            if let Ok(out) = base(&["logs", "--no-color", "--tail", "200"]).output() {
                eprintln!(
                    "---- compose logs ({}) ----\n{}{}",
                    self.project,
                    stdout(&out),
                    stderr(&out)
                );
            }
        }
        // A paused container can not be stopped or removed.
        for cid in self.containers.values() {
            let _ = std::process::Command::new("docker")
                .args(["unpause", cid])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        if std::env::var_os("WHARF_TEST_KEEP").is_some() {
            eprintln!(
                "WHARF_TEST_KEEP: left compose project {} running; remove it with `{} -p {} -f {} down -v`",
                self.project,
                self.cmd.join(" "),
                self.project,
                self.file.display()
            );
            return;
        }
        match base(&["down", "-v", "--remove-orphans", "-t", "5"]).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("compose down failed: {}", stderr(&out)),
            Err(e) => eprintln!("compose down failed: {e}"),
        }
    }
}

/// The load: publishers and workers through the client library, recording
/// acknowledged publishes, processed messages, and every error returned to a
/// call, with the phase it happened in.
struct Load {
    phase: Arc<AtomicUsize>,
    stop_publishing: Arc<AtomicBool>,
    stop_working: Arc<AtomicBool>,
    acked: Arc<Mutex<HashSet<String>>>,
    processed: Arc<Mutex<HashSet<String>>>,
    published: Arc<AtomicU64>,
    processed_count: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<(usize, String)>>>,
    publishers: Vec<tokio::task::JoinHandle<()>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

const PHASES: [&str; 7] = [
    "warm-up",
    "kill consumer leader",
    "start killed node",
    "pause/unpause",
    "network disconnect/connect",
    "rolling restart",
    "drain",
];
const ROLLING: usize = 5;

impl Load {
    fn start(client: &Client) -> Load {
        let mut load = Load {
            phase: Arc::default(),
            stop_publishing: Arc::default(),
            stop_working: Arc::default(),
            acked: Arc::default(),
            processed: Arc::default(),
            published: Arc::default(),
            processed_count: Arc::default(),
            errors: Arc::default(),
            publishers: Vec::new(),
            workers: Vec::new(),
        };
        for p in 0..PUBLISHERS {
            let client = client.clone();
            let (stop, acked, published, errors, phase) = (
                load.stop_publishing.clone(),
                load.acked.clone(),
                load.published.clone(),
                load.errors.clone(),
                load.phase.clone(),
            );
            load.publishers.push(tokio::spawn(async move {
                for i in 0..MAX_PER_PUBLISHER {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let id = format!("load-p{p}-{i}");
                    match client.publish("orders.shipped", id.clone()).await {
                        Ok(_) => {
                            acked.lock().unwrap().insert(id);
                            published.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => errors
                            .lock()
                            .unwrap()
                            .push((phase.load(Ordering::SeqCst), format!("publish {id}: {e}"))),
                    }
                    // A steady trickle, not a flood: about 100 publishes/s each.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }));
        }
        for _ in 0..WORKERS {
            let client = client.clone();
            let (stop, processed, count, errors, phase) = (
                load.stop_working.clone(),
                load.processed.clone(),
                load.processed_count.clone(),
                load.errors.clone(),
                load.phase.clone(),
            );
            load.workers.push(tokio::spawn(async move {
                let mut consumer = client.consumer("ORDERS", "shipping");
                while !stop.load(Ordering::SeqCst) {
                    let batch = match consumer.fetch(10, Duration::from_millis(500)).await {
                        Ok(b) => b,
                        Err(e) => {
                            errors
                                .lock()
                                .unwrap()
                                .push((phase.load(Ordering::SeqCst), format!("fetch: {e}")));
                            continue;
                        }
                    };
                    for m in batch {
                        let id = String::from_utf8_lossy(&m.payload).into_owned();
                        if processed.lock().unwrap().insert(id) {
                            count.fetch_add(1, Ordering::SeqCst);
                        }
                        if let Err(e) = consumer.ack(m.stream_seq).await {
                            errors.lock().unwrap().push((
                                phase.load(Ordering::SeqCst),
                                format!("ack {}: {e}", m.stream_seq),
                            ));
                        }
                    }
                }
            }));
        }
        load
    }

    fn set_phase(&self, phase: usize) {
        eprintln!(
            "== phase: {} (published {}, processed {})",
            PHASES[phase],
            self.published.load(Ordering::SeqCst),
            self.processed_count.load(Ordering::SeqCst)
        );
        self.phase.store(phase, Ordering::SeqCst);
    }

    /// Wait until `n` more publishes were acknowledged and `n` more messages
    /// processed: the cluster serves the load.
    async fn wait_progress(&self, n: u64, timeout: Duration) -> Result<()> {
        let (p0, c0) = (
            self.published.load(Ordering::SeqCst),
            self.processed_count.load(Ordering::SeqCst),
        );
        eventually(
            &format!("{n} more published and processed"),
            timeout,
            || async move {
                (self.published.load(Ordering::SeqCst) >= p0 + n
                    && self.processed_count.load(Ordering::SeqCst) >= c0 + n)
                    .then_some(())
            },
        )
        .await
    }

    fn errors_in(&self, phase: usize) -> Vec<String> {
        self.errors
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| *p == phase)
            .map(|(_, e)| e.clone())
            .collect()
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop_publishing.store(true, Ordering::SeqCst);
        self.stop_working.store(true, Ordering::SeqCst);
        for h in self.publishers.iter().chain(&self.workers) {
            h.abort();
        }
    }
}

async fn seed_tutorial(compose: &Compose) -> Result<()> {
    let info = json(
        &compose
            .wharf(&[
                "stream",
                "add",
                "ORDERS",
                "--subjects",
                "orders.>",
                "--json",
            ])
            .await,
    )?;
    assert_eq!(info["config"]["num_replicas"], 3);
    for i in 1..=3 {
        let out = compose
            .wharf(&[
                "pub",
                "orders.created",
                &format!("{{\"order_id\":\"ord_{i}\"}}"),
            ])
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            stdout(&out).trim(),
            format!("Stored in stream ORDERS at sequence {i}")
        );
    }
    json(
        &compose
            .wharf(&[
                "consumer",
                "add",
                "ORDERS",
                "shipping",
                "--filter",
                "orders.shipped",
                "--json",
            ])
            .await,
    )?;
    let workers: Vec<_> = (0..3)
        .map(|_| {
            compose.wharf_spawn(&[
                "consumer", "next", "ORDERS", "shipping", "--count", "1", "--ack", "--wait", "30s",
                "--json",
            ])
        })
        .collect();
    eventually("three waiting pulls", Duration::from_secs(30), || async {
        let info = json(
            &compose
                .wharf(&["consumer", "info", "ORDERS", "shipping", "--json"])
                .await,
        )
        .ok()?;
        (info["num_waiting"] == 3).then_some(())
    })
    .await?;
    for order in ORDERS {
        let out = compose.wharf(&["pub", "orders.shipped", order]).await;
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let mut received = HashSet::new();
    for w in workers {
        let out = w.wait_with_output().await?;
        assert!(out.status.success(), "worker failed: {}", stderr(&out));
        let lines: Vec<_> = stdout(&out).lines().map(str::to_string).collect();
        assert_eq!(lines.len(), 1, "each worker gets one order: {lines:?}");
        let m: serde_json::Value = serde_json::from_str(&lines[0])?;
        received.insert(m["payload"].as_str().unwrap_or_default().to_string());
    }
    let expected: HashSet<_> = ORDERS.iter().map(|s| s.to_string()).collect();
    assert_eq!(received, expected, "each order reached exactly one worker");

    let text = stdout(
        &compose
            .wharf(&["consumer", "info", "ORDERS", "shipping"])
            .await,
    );
    eprintln!("{text}");
    assert!(
        text.contains("Last Delivered Message: Consumer sequence: 3 Stream sequence: 6"),
        "{text}"
    );
    assert!(
        text.contains("Acknowledgment Floor: Consumer sequence: 3 Stream sequence: 6"),
        "{text}"
    );
    assert!(text.contains("Outstanding Acks: 0"), "{text}");
    assert!(text.contains("Unprocessed Messages: 0"), "{text}");
    let status = stdout(&compose.wharf(&["cluster", "status"]).await);
    eprintln!("{status}");
    assert!(status.contains("ORDERS/shipping"), "{status}");
    assert_eq!(status.matches(" up").count(), 3, "{status}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compose_cluster_survives_container_faults() -> Result<()> {
    if !docker_available().await {
        eprintln!(
            "SKIPPED: no Docker engine answers `docker info`; the docker cluster test needs one"
        );
        return Ok(());
    }
    let Some(compose_cmd) = compose_command().await else {
        eprintln!("SKIPPED: neither `docker compose` nor `docker-compose` runs here");
        return Ok(());
    };
    let started = Instant::now();
    ensure_image().await?;
    let mut compose = Compose::new(compose_cmd);
    compose.up().await?;
    eprintln!(
        "compose project {} up: {} (ports {:?})",
        compose.project,
        compose.servers(),
        compose.ports
    );
    compose
        .wait_leader("meta", &NODES, Duration::from_secs(60))
        .await?;
    for id in NODES {
        compose
            .wait_ready(id, &NODES, Duration::from_secs(60))
            .await?;
    }

    // 1. The seed tutorial, from the host, with the CLI.
    seed_tutorial(&compose).await?;
    // Short AckWait, so a message handed to a session that a fault cut is
    // redelivered within the test.
    let edited = json(
        &compose
            .wharf(&[
                "consumer",
                "edit",
                "ORDERS",
                "shipping",
                "--ack-wait",
                "2s",
                "--json",
            ])
            .await,
    )?;
    assert_eq!(edited["config"]["ack_wait"], 2_000_000_000u64, "{edited}");

    // 2. Steady load, and faults.
    let client = compose.client();
    let mut load = Load::start(&client);
    load.set_phase(0);
    load.wait_progress(200, Duration::from_secs(60)).await?;

    load.set_phase(1);
    let victim = compose
        .wait_leader(CONSUMER, &NODES, Duration::from_secs(20))
        .await?;
    docker(&["kill", compose.container(victim)]).await?;
    eprintln!("docker kill wharf{victim} (leading {CONSUMER})");
    let rest: Vec<u64> = NODES.iter().copied().filter(|&n| n != victim).collect();
    let new_leader = compose
        .wait_leader(CONSUMER, &rest, Duration::from_secs(30))
        .await?;
    eprintln!("{CONSUMER} now led by wharf{new_leader}");
    load.wait_progress(200, Duration::from_secs(60)).await?;

    load.set_phase(2);
    docker(&["start", compose.container(victim)]).await?;
    compose
        .wait_ready(victim, &NODES, Duration::from_secs(60))
        .await?;
    eprintln!("wharf{victim} back and ready");
    load.wait_progress(100, Duration::from_secs(60)).await?;

    load.set_phase(3);
    let paused = NODES
        .iter()
        .copied()
        .find(|&n| n != victim)
        .expect("another node");
    docker(&["pause", compose.container(paused)]).await?;
    eprintln!("docker pause wharf{paused}");
    let rest: Vec<u64> = NODES.iter().copied().filter(|&n| n != paused).collect();
    compose
        .wait_seen_down(paused, &rest, Duration::from_secs(30))
        .await?;
    for g in ["meta", "ORDERS", CONSUMER] {
        compose
            .wait_leader(g, &rest, Duration::from_secs(30))
            .await?;
    }
    load.wait_progress(200, Duration::from_secs(60)).await?;
    docker(&["unpause", compose.container(paused)]).await?;
    eprintln!("docker unpause wharf{paused}");
    compose
        .wait_ready(paused, &NODES, Duration::from_secs(60))
        .await?;
    load.wait_progress(100, Duration::from_secs(60)).await?;

    load.set_phase(4);
    let cut = compose
        .wait_leader("ORDERS", &NODES, Duration::from_secs(20))
        .await?;
    let net = compose.network.clone();
    docker(&["network", "disconnect", &net, compose.container(cut)]).await?;
    eprintln!("docker network disconnect {net} wharf{cut} (leading ORDERS)");
    let rest: Vec<u64> = NODES.iter().copied().filter(|&n| n != cut).collect();
    compose
        .wait_seen_down(cut, &rest, Duration::from_secs(30))
        .await?;
    for g in ["meta", "ORDERS", CONSUMER] {
        compose
            .wait_leader(g, &rest, Duration::from_secs(30))
            .await?;
    }
    load.wait_progress(200, Duration::from_secs(60)).await?;
    // Reconnect under the service name, which is how the peers find it.
    docker(&[
        "network",
        "connect",
        "--alias",
        &format!("wharf{cut}"),
        &net,
        compose.container(cut),
    ])
    .await?;
    eprintln!("docker network connect {net} wharf{cut}");
    compose
        .wait_ready(cut, &NODES, Duration::from_secs(60))
        .await?;
    load.wait_progress(100, Duration::from_secs(60)).await?;

    load.set_phase(ROLLING);
    for id in NODES {
        let t = Instant::now();
        docker(&["stop", "-t", "30", compose.container(id)]).await?;
        let stopped_in = t.elapsed();
        let exit = docker(&[
            "inspect",
            "-f",
            "{{.State.ExitCode}}",
            compose.container(id),
        ])
        .await?;
        docker(&["start", compose.container(id)]).await?;
        compose
            .wait_ready(id, &NODES, Duration::from_secs(60))
            .await?;
        eprintln!(
            "rolling restart: wharf{id} stopped in {stopped_in:.1?} (exit code {exit}), ready again after {:.1?}",
            t.elapsed()
        );
        assert_eq!(exit, "0", "wharf{id} exits 0 on SIGTERM");
        load.wait_progress(100, Duration::from_secs(60)).await?;
    }

    // 3. Drain: stop publishing; everything acknowledged gets processed.
    load.set_phase(6);
    load.stop_publishing.store(true, Ordering::SeqCst);
    for p in load.publishers.drain(..) {
        p.await?;
    }
    let acked = load.acked.lock().unwrap().clone();
    eventually(
        "every acknowledged publish processed",
        Duration::from_secs(120),
        || async {
            let processed = load.processed.lock().unwrap();
            acked.iter().all(|id| processed.contains(id)).then_some(())
        },
    )
    .await?;
    let info = eventually("nothing outstanding", Duration::from_secs(60), || async {
        let info = json(
            &compose
                .wharf(&["consumer", "info", "ORDERS", "shipping", "--json"])
                .await,
        )
        .ok()?;
        (info["num_ack_pending"] == 0 && info["num_pending"] == 0).then_some(info)
    })
    .await?;
    load.stop_working.store(true, Ordering::SeqCst);

    let errors = load.errors.lock().unwrap().clone();
    for (phase, name) in PHASES.iter().enumerate() {
        let n = errors.iter().filter(|(p, _)| *p == phase).count();
        eprintln!("errors returned to the load in phase {name}: {n}");
    }
    for (phase, e) in errors.iter().take(20) {
        eprintln!("  [{}] {e}", PHASES[*phase]);
    }
    eprintln!(
        "acknowledged publishes: {}, processed: {}, consumer: delivered {} / ack floor {} / redelivered {}; took {:.0?}",
        acked.len(),
        load.processed.lock().unwrap().len(),
        info["delivered"]["stream_seq"],
        info["ack_floor"]["stream_seq"],
        info["num_redelivered"],
        started.elapsed()
    );
    let rolling = load.errors_in(ROLLING);
    assert!(
        rolling.is_empty(),
        "the rolling restart returned errors to the client: {rolling:?}"
    );
    assert!(acked.len() >= 1000, "too little load: {}", acked.len());

    let status = json(&compose.wharf(&["cluster", "status", "--json"]).await)?;
    let up = status["nodes"]
        .as_array()
        .map(|a| a.iter().filter(|n| n["up"] == true).count())
        .unwrap_or(0);
    assert_eq!(up, 3, "{status}");
    compose.passed = true;
    Ok(())
}
