//! The nemesis: one fault at a time, chosen by a seeded RNG, each held for a
//! few seconds, healed, then a recovery period before the next.
//!
//! Faults (a three-node cluster keeps a majority through any one of them):
//! - `kill`: SIGKILL of a random node, started again from its data dir at heal.
//! - `leader-kill`: SIGKILL of the node leading the stream or the consumer group.
//! - `pause`: SIGSTOP of a random node, SIGCONT at heal.
//! - `restart`: SIGTERM (graceful handover), wait for the exit, start again.
//! - `partition`: iptables DROP between one node's IP and the others', both
//!   ways; clients (127.0.0.1) still reach every node. Removed at heal.
//! - `power-loss`: SIGKILL of a random node, then its files lose every write
//!   it had not fsynced (`crate::powerloss`; the nodes then run under the
//!   shim); started again at heal.
//! - `member`: a node is replaced under load. A new node (a new id) starts
//!   with `--join` on the free address slot and is added with `peer add`;
//!   then `peer remove` of a random node starts moving its replicas. At heal
//!   the removal is awaited (bounded by [`MEMBER_REMOVE_BOUND`]), the removed
//!   node is stopped and forgotten, and its address becomes the free slot.
//!   The cluster is back to three nodes, so every other fault still leaves a
//!   majority. A change that does not complete in its bound is a failure of
//!   the run (`Nemesis::failures`), not an error of the harness.
//!
//! The RNG decides the kinds, the victims and the durations; which node leads
//! a group at the time is the cluster's business, so a seed replays the same
//! schedule, not the same run.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use rand::rngs::StdRng;
use rand::Rng;

use super::history::{Event, History};
use crate::Cluster;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum FaultKind {
    Kill,
    LeaderKill,
    Pause,
    Restart,
    Partition,
    PowerLoss,
    Member,
}

impl FaultKind {
    pub const ALL: [FaultKind; 7] = [
        FaultKind::Kill,
        FaultKind::LeaderKill,
        FaultKind::Pause,
        FaultKind::Restart,
        FaultKind::Partition,
        FaultKind::PowerLoss,
        FaultKind::Member,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::LeaderKill => "leader-kill",
            FaultKind::Pause => "pause",
            FaultKind::Restart => "restart",
            FaultKind::Partition => "partition",
            FaultKind::PowerLoss => "power-loss",
            FaultKind::Member => "member",
        }
    }

    pub fn parse_list(s: &str) -> Result<Vec<FaultKind>> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                out.extend(FaultKind::ALL);
                continue;
            }
            match FaultKind::ALL.iter().find(|k| k.name() == part) {
                Some(k) => out.push(*k),
                None => bail!(
                    "unknown fault {part:?} (kill, leader-kill, pause, restart, partition, power-loss, member, all)"
                ),
            }
        }
        Ok(out)
    }
}

/// The groups of the workload whose leaders the harness follows.
pub const GROUPS: [&str; 3] = ["meta", "ORDERS", "ORDERS/shipping"];

/// Each group's leader and term, taken at the highest term any reachable node
/// reports. Nodes that do not answer within a second are skipped.
pub async fn leaders(cluster: &Cluster) -> BTreeMap<String, (u64, u64)> {
    let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    let views = futures::future::join_all(
        ids.iter()
            .map(|id| cluster.status_of(*id, Duration::from_secs(1))),
    )
    .await;
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for s in views.into_iter().flatten() {
        for g in s.groups {
            if g.leader == 0 {
                continue;
            }
            let e = out.entry(g.name).or_insert((0, 0));
            if g.term > e.1 {
                *e = (g.leader, g.term);
            }
        }
    }
    out
}

/// True when every node answers and all of them name the same running,
/// unpaused leader for each workload group.
pub async fn healthy(cluster: &Cluster) -> bool {
    let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
    let views = futures::future::join_all(
        ids.iter()
            .map(|id| cluster.status_of(*id, Duration::from_secs(1))),
    )
    .await;
    if views.iter().any(Option::is_none) {
        return false;
    }
    GROUPS.iter().all(|name| {
        let mut seen = None;
        for s in views.iter().flatten() {
            let Some(g) = s.groups.iter().find(|g| g.name == *name) else {
                return false;
            };
            if g.leader == 0
                || !cluster.is_running(g.leader)
                || cluster.is_paused(g.leader)
                || seen.is_some_and(|l| l != g.leader)
            {
                return false;
            }
            seen = Some(g.leader);
        }
        seen.is_some()
    })
}

/// Wait (bounded) until the cluster is healthy; false on timeout.
pub async fn wait_healthy(cluster: &Cluster, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    while tokio::time::Instant::now() < deadline {
        if healthy(cluster).await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// iptables rules in a dedicated chain jumped to from INPUT. Only packets
/// between two of our nodes' loopback IPs are ever dropped.
pub struct Net {
    chain: String,
    installed: bool,
}

fn iptables(args: &[&str]) -> Result<()> {
    let out = Command::new("iptables").arg("-w").args(args).output()?;
    if !out.status.success() {
        bail!(
            "iptables {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Net {
    pub const CHAIN: &'static str = "WHARF_CHAOS";

    /// Remove what an earlier run may have left, then create the chain.
    /// Err says why partitions cannot be injected here.
    pub fn setup() -> Result<Net> {
        iptables(&["-L", "INPUT", "-n"])?;
        let mut net = Net {
            chain: Net::CHAIN.to_string(),
            installed: true,
        };
        net.teardown();
        iptables(&["-N", &net.chain])?;
        net.installed = true;
        iptables(&["-I", "INPUT", "1", "-j", &net.chain])?;
        Ok(net)
    }

    /// Drop every packet between `ip` and each of `others`, both ways.
    pub fn isolate(&self, ip: IpAddr, others: &[IpAddr]) -> Result<()> {
        for o in others {
            let (a, b) = (ip.to_string(), o.to_string());
            iptables(&["-A", &self.chain, "-s", &a, "-d", &b, "-j", "DROP"])?;
            iptables(&["-A", &self.chain, "-s", &b, "-d", &a, "-j", "DROP"])?;
        }
        Ok(())
    }

    pub fn heal(&self) -> Result<()> {
        iptables(&["-F", &self.chain])
    }

    pub fn teardown(&mut self) {
        if !self.installed {
            return;
        }
        while iptables(&["-D", "INPUT", "-j", &self.chain]).is_ok() {}
        let _ = iptables(&["-F", &self.chain]);
        let _ = iptables(&["-X", &self.chain]);
        self.installed = false;
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// How long `peer add` of a new node may take, retries included.
pub const MEMBER_ADD_BOUND: Duration = Duration::from_secs(60);
/// How long a `peer remove` may take to move every replica off the node.
pub const MEMBER_REMOVE_BOUND: Duration = Duration::from_secs(120);

/// One fault in progress, remembered so that it can be healed.
#[derive(Debug, Clone, Copy)]
pub struct Active {
    pub kind: FaultKind,
    pub node: u64,
    /// `member`: the node that joined in place of `node`.
    pub added: Option<u64>,
}

pub struct Nemesis {
    pub rng: StdRng,
    pub kinds: Vec<FaultKind>,
    pub net: Option<Net>,
    pub fault_ms: (u64, u64),
    pub recovery_ms: (u64, u64),
    pub history: Arc<History>,
    /// Every address a node may listen on: the founding nodes' and one
    /// spare (`member` faults move nodes between them). Clients know all.
    pub slots: Vec<String>,
    /// What the cluster failed to do that no client operation shows (a
    /// membership change that did not complete); the run is then invalid.
    pub failures: Vec<String>,
}

impl Nemesis {
    fn fault_event(&self, phase: &str, kind: FaultKind, node: u64, detail: String) {
        eprintln!(
            "[chaos {:>7.1}s] {phase} {} node {node} {detail}",
            self.history.now_ms() as f64 / 1000.0,
            kind.name()
        );
        self.history.push(Event::Fault {
            t_ms: self.history.now_ms(),
            phase: phase.to_string(),
            kind: kind.name().to_string(),
            node,
            detail,
        });
    }

    /// Inject faults until `until` (a harness clock time in ms).
    pub async fn run(&mut self, cluster: &mut Cluster, until_ms: u64) -> Result<()> {
        while self.history.now_ms() + self.fault_ms.1 < until_ms {
            let recovery = self.rng.gen_range(self.recovery_ms.0..=self.recovery_ms.1);
            tokio::time::sleep(Duration::from_millis(recovery)).await;
            if !wait_healthy(cluster, Duration::from_secs(30)).await {
                self.history
                    .note("cluster not healthy 30 s after the last heal; injecting anyway");
            }
            if self.history.now_ms() + self.fault_ms.1 >= until_ms {
                break;
            }
            let kind = self.kinds[self.rng.gen_range(0..self.kinds.len())];
            // Member faults change the node set: read it every round.
            let node_ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
            let random_node = node_ids[self.rng.gen_range(0..node_ids.len())];
            let hold = self.rng.gen_range(self.fault_ms.0..=self.fault_ms.1);
            let group = if self.rng.gen_bool(0.5) {
                "ORDERS"
            } else {
                "ORDERS/shipping"
            };
            let active = self.inject(cluster, kind, random_node, group).await?;
            tokio::time::sleep(Duration::from_millis(hold)).await;
            self.heal(cluster, active).await?;
        }
        Ok(())
    }

    async fn inject(
        &mut self,
        cluster: &mut Cluster,
        kind: FaultKind,
        random_node: u64,
        group: &str,
    ) -> Result<Active> {
        let node = match kind {
            FaultKind::LeaderKill => match leaders(cluster).await.get(group) {
                Some((l, _)) if cluster.is_running(*l) => *l,
                _ => random_node,
            },
            _ => random_node,
        };
        let mut added = None;
        let detail = match kind {
            FaultKind::Member => {
                let (id, detail) = self.replace_node(cluster, node).await?;
                added = id;
                detail
            }
            FaultKind::Kill => {
                cluster.kill(node);
                "SIGKILL".to_string()
            }
            FaultKind::LeaderKill => {
                cluster.kill(node);
                format!("SIGKILL (leader of {group})")
            }
            FaultKind::Pause => {
                cluster.pause(node)?;
                "SIGSTOP".to_string()
            }
            FaultKind::PowerLoss => {
                let cut = cluster.power_cut(node)?;
                format!(
                    "SIGKILL, unsynced writes dropped ({} files rolled back, {} dropped)",
                    cut.rolled_back.len(),
                    cut.dropped.len()
                )
            }
            FaultKind::Restart => {
                let started = tokio::time::Instant::now();
                let clean = cluster.terminate(node, Duration::from_secs(20)).await;
                format!(
                    "SIGTERM, exited {} after {:.1} s",
                    if clean {
                        "by itself"
                    } else {
                        "only on SIGKILL"
                    },
                    started.elapsed().as_secs_f64()
                )
            }
            FaultKind::Partition => {
                let net = self.net.as_ref().expect("partition needs iptables");
                let ip = node_ip(cluster, node);
                let others: Vec<IpAddr> = cluster
                    .nodes
                    .iter()
                    .filter(|n| n.id != node)
                    .map(|n| node_ip(cluster, n.id))
                    .collect();
                net.isolate(ip, &others)?;
                format!("isolated {ip} from the other nodes")
            }
        };
        self.fault_event("start", kind, node, detail);
        Ok(Active { kind, node, added })
    }

    /// A client over every slot address (whichever nodes hold them now).
    fn admin(&self) -> wharf_client::Client {
        super::workload::client_starting_at(&self.slots, 0).with_retry_for(Duration::from_secs(5))
    }

    /// `member` inject: start a node on the free slot, `peer add` it, then
    /// ask for `peer remove` of `victim` (the first call waits up to the
    /// server's own bound; the rest is awaited at heal). The new id (None
    /// when it could not be added: it is then stopped and nothing is
    /// removed) and a description.
    async fn replace_node(
        &mut self,
        cluster: &mut Cluster,
        victim: u64,
    ) -> Result<(Option<u64>, String)> {
        let Some(addr) = (self.slots.iter())
            .find(|a| cluster.nodes.iter().all(|n| &n.addr != *a))
            .cloned()
        else {
            // Only after a removal that did not finish (already a failure).
            return Ok((None, "no free address slot; nothing changed".into()));
        };
        let started = tokio::time::Instant::now();
        let id = cluster.spawn_joining_at(addr.clone())?;
        let admin = self.admin();
        let deadline = started + MEMBER_ADD_BOUND;
        let mut last_err = String::new();
        let mut added = false;
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(30), admin.peer_add(id, &addr)).await {
                Ok(Ok(_)) => {
                    added = true;
                    break;
                }
                Ok(Err(e)) => last_err = e.to_string(),
                Err(_) => last_err = "peer add timed out after 30 s".into(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if !added {
            self.failures.push(format!(
                "member: peer add of node {id} at {addr} did not complete within {MEMBER_ADD_BOUND:?}: {last_err}"
            ));
            cluster.forget(id);
            let detail = format!("node {id} started at {addr} but peer add failed: {last_err}");
            return Ok((None, detail));
        }
        let add_s = started.elapsed().as_secs_f64();
        let removing = tokio::time::Instant::now();
        let first = tokio::time::timeout(Duration::from_secs(30), admin.peer_remove(victim)).await;
        let first_s = removing.elapsed().as_secs_f64();
        let first = match first {
            Ok(Ok(r)) if r.done => {
                format!("done in {first_s:.1} s, {} groups moved", r.moved_groups)
            }
            Ok(Ok(r)) => format!("after {first_s:.1} s still moving {:?}", r.moving),
            Ok(Err(e)) => format!("first call: {e}"),
            Err(_) => "first call timed out".to_string(),
        };
        Ok((
            Some(id),
            format!(
                "node {id} added at {addr} in {add_s:.1} s; peer remove {victim} started ({first})"
            ),
        ))
    }

    /// `member` heal: wait until the removal of `victim` is done, then stop
    /// and forget it (its address is the free slot again).
    async fn finish_removal(&mut self, cluster: &mut Cluster, victim: u64) -> String {
        let started = tokio::time::Instant::now();
        let deadline = started + MEMBER_REMOVE_BOUND;
        let admin = self.admin();
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(30), admin.peer_remove(victim)).await {
                Ok(Ok(r)) if r.done => {
                    cluster.forget(victim);
                    return format!(
                        "removal done after {:.1} s more; node stopped",
                        started.elapsed().as_secs_f64()
                    );
                }
                Ok(Ok(r)) => last = format!("still moving {:?}", r.moving),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "peer remove timed out after 30 s".into(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.failures.push(format!(
            "member: peer remove of node {victim} not done within {MEMBER_REMOVE_BOUND:?}: {last}"
        ));
        format!("removal NOT done within {MEMBER_REMOVE_BOUND:?}: {last}")
    }

    /// Undo one fault.
    pub async fn heal(&mut self, cluster: &mut Cluster, a: Active) -> Result<()> {
        let detail = match a.kind {
            FaultKind::Member if a.added.is_some() => self.finish_removal(cluster, a.node).await,
            FaultKind::Member => "no node was added, none removed".to_string(),
            FaultKind::Kill | FaultKind::LeaderKill | FaultKind::Restart | FaultKind::PowerLoss => {
                cluster.start_node(a.node)?;
                "started again".to_string()
            }
            FaultKind::Pause => {
                cluster.resume(a.node)?;
                "SIGCONT".to_string()
            }
            FaultKind::Partition => {
                if let Some(net) = &self.net {
                    net.heal()?;
                }
                "rules removed".to_string()
            }
        };
        self.fault_event("end", a.kind, a.node, detail);
        Ok(())
    }

    /// Heal everything whatever state the run is in: every node running and
    /// unpaused, no iptables rule.
    pub fn heal_all(&mut self, cluster: &mut Cluster) -> Result<()> {
        if let Some(net) = &self.net {
            net.heal()?;
        }
        let ids: Vec<u64> = cluster.nodes.iter().map(|n| n.id).collect();
        for id in ids {
            cluster.resume(id)?;
            cluster.start_node(id)?;
        }
        Ok(())
    }
}

pub fn node_ip(cluster: &Cluster, id: u64) -> IpAddr {
    let addr: std::net::SocketAddr = cluster.node(id).addr.parse().expect("ip:port");
    addr.ip()
}
