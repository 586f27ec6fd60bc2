//! Helpers for fault injection (the chaos harness): nodes on their own
//! loopback IPs, SIGSTOP/SIGCONT, graceful stop without blocking the
//! runtime, status reads that never hang on a paused node.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use wharf_client::{proto as pb, Client};

use crate::{free_ports, Cluster, NodeProc};

impl Cluster {
    /// Start one node per IP, each listening on `ip:<free port>`, so that a
    /// link between two nodes can be cut with iptables by address (the
    /// server binds its outgoing peer connections to its listen IP).
    /// With `simulate_power_loss`, nodes run under the power-loss shim.
    pub async fn start_on_ips(
        ips: &[std::net::IpAddr],
        simulate_power_loss: bool,
    ) -> Result<Cluster> {
        let dir = tempfile::Builder::new().prefix("wharf-chaos-").tempdir()?;
        let mut nodes = Vec::new();
        let metrics_ports = free_ports(ips.len());
        for (i, ip) in ips.iter().enumerate() {
            let id = i as u64 + 1;
            let l = std::net::TcpListener::bind((*ip, 0))
                .with_context(|| format!("bind {ip}: is it a loopback address?"))?;
            let port = l.local_addr()?.port();
            nodes.push(NodeProc {
                id,
                addr: format!("{ip}:{port}"),
                metrics_addr: format!("127.0.0.1:{}", metrics_ports[i]),
                data: dir.path().join(format!("node-{id}")),
                child: None,
            });
        }
        let peers = nodes
            .iter()
            .map(|p| format!("{}={}", p.id, p.addr))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            nodes,
            peers,
            dir: Some(dir),
            extra_args: Vec::new(),
            paused: Default::default(),
            node_args: Default::default(),
            node_env: Default::default(),
            client_options: Default::default(),
            simulate_power_loss,
            joiners: Default::default(),
            forgotten: Default::default(),
        };
        for id in 1..=ips.len() as u64 {
            cluster.spawn(id)?;
        }
        cluster.wait_meta_leader(Duration::from_secs(30)).await?;
        Ok(cluster)
    }

    /// Start a node that is not running (after `kill` or `terminate`).
    pub fn start_node(&mut self, id: u64) -> Result<()> {
        if self.is_running(id) {
            return Ok(());
        }
        self.spawn(id)
    }

    /// The OS process id of a running node.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.node(id).child.as_ref().map(Child::id)
    }

    fn signal(&self, id: u64, sig: &str) -> Result<()> {
        let pid = self.pid(id).context("node not running")?;
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()?;
        if !st.success() {
            bail!("kill -{sig} {pid} failed: {st}");
        }
        Ok(())
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&mut self, id: u64) -> Result<()> {
        self.signal(id, "STOP")?;
        self.paused.insert(id);
        Ok(())
    }

    /// SIGCONT a paused node.
    pub fn resume(&mut self, id: u64) -> Result<()> {
        if self.paused.remove(&id) {
            self.signal(id, "CONT")?;
        }
        Ok(())
    }

    pub fn is_paused(&self, id: u64) -> bool {
        self.paused.contains(&id)
    }

    /// SIGTERM (graceful handover), then wait up to `grace` for the exit
    /// without blocking the async runtime; SIGKILL after that. Returns
    /// whether the node exited by itself.
    pub async fn terminate(&mut self, id: u64, grace: Duration) -> bool {
        let _ = self.resume(id);
        if self.signal(id, "TERM").is_err() {
            return true;
        }
        let deadline = Instant::now() + grace;
        let node = self.node_mut(id);
        let mut child = node.child.take().expect("running");
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Cluster status as one node sees it, or None if it does not answer
    /// within `timeout` (paused, dead, partitioned).
    pub async fn status_of(&self, id: u64, timeout: Duration) -> Option<pb::ClusterStatusResponse> {
        let c = Client::connect(&self.node(id).addr, &self.client_options)
            .ok()?
            .with_retry_for(Duration::ZERO);
        tokio::time::timeout(timeout, c.cluster_status())
            .await
            .ok()?
            .ok()
    }

    /// The node's log file (stdout and stderr of the process).
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.node(id).data.with_extension("log")
    }

    /// Keep the data dirs and logs after the cluster is dropped; returns their path.
    pub fn keep_data(&mut self) -> Option<PathBuf> {
        self.dir.take().map(|d| d.keep())
    }
}
