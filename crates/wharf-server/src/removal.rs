//! A removed node stops itself.
//!
//! `peer remove <id>` (`membership`) moves every replica off the node and
//! then takes it out of the meta group. After that nobody sends the node
//! anything, but its process would go on running. Here the node notices and
//! stops:
//!
//! - Evidence: a committed `RemoveNode` of this node. A running node sees it
//!   in its own catalog (it applies the meta log until it leaves the meta
//!   group). A node that was down during the removal has a stored catalog
//!   from before it, so it asks the cluster: once when it starts, and again
//!   whenever its meta replica has had no leader for [`ASK_WHEN_LEADERLESS`]
//!   (a node outside the meta group hears from no leader).
//! - When: only once the removal is *done* as the meta group's leader sees
//!   it, the same test `peer remove` answers `done` with: no stream or
//!   consumer group has a replica on the node or is still moving away from
//!   it (every `MoveDone` is committed), and the node is out of the meta
//!   group. Until then the node keeps serving: a group's move needs a
//!   majority of its old voters, and the meta group its voters. The node's
//!   own catalog cannot tell the last step (the leader stops replicating to
//!   a removed voter as soon as it appends the new membership, so the node
//!   never sees it), hence the question goes to the leader
//!   (`RemovalStatus`, forwarded by whichever member is asked).
//! - Then: the node gives its own reconciler up to [`LET_GO_WAIT`] to stop
//!   the replicas that moved (it applies the meta log a little behind the
//!   leader), `Node::removed` resolves; `wharf server` logs one line ("node N
//!   was removed from the cluster; shutting down"), shuts down as on SIGTERM
//!   and exits with code 0. The reconciler starts no group any more.
//! - At start: when the stored catalog already says the node was removed,
//!   the reconciler asks before it starts any group (for at most
//!   [`START_ASK_TIMEOUT`]), and starts none if the removal is done, so a
//!   removed node restarted with its old data dir exits without touching the
//!   cluster. When the stored catalog predates the removal, the node starts
//!   its stale groups while it asks; their replicas only ever send pre-votes,
//!   which the members refuse while their leaders are alive (pre-vote is on:
//!   `wharf_raft`), so terms and leaders stay as they are.
//!
//! Exit code 0, not an error: the node did what the operator asked for. A
//! supervisor that restarts on failure (systemd `Restart=on-failure`, Docker
//! `on-failure`) leaves it stopped; one that always restarts (a Kubernetes
//! pod) gets a process that exits again at once with the same log line,
//! without joining the cluster.
//!
//! Invariants:
//! - Only a committed catalog counts as evidence (this node's, or the meta
//!   leader's); no answer means "keep running".
//! - A node that leads the meta group never stops itself here (it is still a
//!   member); `replica_mover` first hands its leadership over.
//!
//! Left out: deleting the data dir (kept for the operator); `wharf dev`
//! (three nodes in one process) does not stop a removed node.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use wharf_proto::v1 as pb;
use wharf_raft::NodeId;

use crate::error::Result;
use crate::forward::{onward_admin, retry};
use crate::node::NodeInner;
use crate::routing::Route;

/// How often the watcher looks at the catalog and the meta group, and how
/// often a node that knows it was removed asks whether the removal is done.
const TICK: Duration = Duration::from_secs(1);
/// A node whose meta replica has had no leader this long asks the other
/// members whether it was removed.
const ASK_WHEN_LEADERLESS: Duration = Duration::from_secs(10);
/// Bound on one question to one member (it may forward it to the leader).
const ASK_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on the question a node asks at start before starting any group.
const START_ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a node whose removal is done waits for its own reconciler to
/// stop the replicas that moved away before it shuts down anyway.
const LET_GO_WAIT: Duration = Duration::from_secs(5);
/// How often it looks while it waits.
const LET_GO_POLL: Duration = Duration::from_millis(50);

impl NodeInner {
    /// `RemovalStatus`: answered by the meta leader from its catalog and its
    /// meta membership; other nodes forward it there.
    pub async fn removal_status(
        &self,
        req: pb::RemovalStatusRequest,
        hops: u32,
    ) -> Result<pb::RemovalStatusResponse> {
        retry(|| async {
            match self.route_meta().await? {
                Route::Local => Ok(self.removal_here(req.id)),
                Route::Remote(n) => Ok(self
                    .peers
                    .client(n)?
                    .removal_status(onward_admin(req, hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await
    }

    fn removal_here(&self, id: NodeId) -> pb::RemovalStatusResponse {
        let catalog = self.catalog();
        let removed = catalog.removed_nodes.contains_key(&id);
        let meta = self.meta.status();
        let in_meta = meta.voters.contains(&id) || meta.learners.contains(&id);
        pb::RemovalStatusResponse {
            removed,
            done: removed && !catalog.has_replicas_on(id) && !in_meta,
        }
    }

    /// Whether this node learned that it was removed and is not needed.
    pub fn is_removed(&self) -> bool {
        *self.removed.borrow()
    }
}

/// Runs until the node learns its removal is done (then resolves
/// `Node::removed`) or the node shuts down.
pub(crate) async fn watch(node: Arc<NodeInner>, mut shutdown: watch::Receiver<bool>) {
    let me = node.id();
    let mut version = node.meta_version.clone();
    let mut removed = false;
    // Once at start: the stored catalog may predate a removal.
    let mut ask_now = true;
    let mut leaderless_since: Option<Instant> = None;
    loop {
        removed |= node.catalog().removed_nodes.contains_key(&me);
        match node.meta.status().leader {
            Some(_) => leaderless_since = None,
            None => {
                let since = *leaderless_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= ASK_WHEN_LEADERLESS {
                    ask_now = true;
                    leaderless_since = Some(Instant::now());
                }
            }
        }
        if removed || ask_now {
            ask_now = false;
            if let Some(answer) = ask(&node).await {
                removed |= answer.removed;
                if answer.done {
                    let_go(&node).await;
                    announce(&node);
                    return;
                }
            }
        }
        tokio::select! {
            Ok(()) = version.changed() => {}
            _ = tokio::time::sleep(TICK) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// At start, before any group starts: true (and `Node::removed` resolved)
/// when the stored catalog says this node was removed and the cluster
/// confirms the removal is done.
pub(crate) async fn done_at_start(node: &NodeInner) -> bool {
    if !node.catalog().removed_nodes.contains_key(&node.id()) {
        return false;
    }
    tracing::info!(
        "the stored catalog says this node was removed from the cluster; asking the cluster whether the removal is done before starting any group"
    );
    let answer = tokio::time::timeout(START_ASK_TIMEOUT, ask(node)).await;
    let done = answer.ok().flatten().is_some_and(|a| a.done);
    if done {
        announce(node);
    }
    done
}

/// The meta leader's catalog says every move away from this node is done,
/// but this node applies the meta log a little behind it: give the
/// reconciler a bounded time to stop (and drop) the replicas that moved, so
/// the node lets go of them before it says it stops. When the time is up
/// (the node never got the last `MoveDone`s), shutdown stops the groups and
/// keeps their data.
async fn let_go(node: &NodeInner) {
    let hosts_nothing = || {
        node.local
            .lock()
            .map(|l| l.streams.is_empty() && l.consumers.is_empty() && l.stopping == 0)
            .unwrap_or(true)
    };
    let deadline = Instant::now() + LET_GO_WAIT;
    while !hosts_nothing() {
        if Instant::now() >= deadline {
            tracing::warn!(
                "the removal is done but this node's catalog still places groups here after {LET_GO_WAIT:?}: stopping them without dropping their data"
            );
            return;
        }
        tokio::time::sleep(LET_GO_POLL).await;
    }
}

fn announce(node: &NodeInner) {
    node.removed.send_replace(true);
}

/// Ask the members (the known meta leader first) until one answers; None
/// when none does. A node that leads the meta group is still a member: it
/// does not ask.
async fn ask(node: &NodeInner) -> Option<pb::RemovalStatusResponse> {
    let me = node.id();
    let catalog = node.catalog();
    // At start the reconciler may not have taught the transport these yet.
    node.peers.learn(&catalog.nodes);
    let leader = node.meta.status().leader;
    if leader == Some(me) {
        return None;
    }
    let mut members: Vec<NodeId> = leader.into_iter().collect();
    let known = catalog.nodes.keys().chain(node.initial_nodes.keys());
    for n in known {
        let gone = *n == me || catalog.removed_nodes.contains_key(n);
        if !gone && !members.contains(n) {
            members.push(*n);
        }
    }
    for n in members {
        let Ok(mut client) = node.peers.client(n) else {
            continue;
        };
        let mut req = tonic::Request::new(pb::RemovalStatusRequest { id: me });
        req.set_timeout(ASK_TIMEOUT);
        match tokio::time::timeout(ASK_TIMEOUT, client.removal_status(req)).await {
            Ok(Ok(answer)) => return Some(answer.into_inner()),
            Ok(Err(e)) => tracing::debug!(node = n, "removal status: {e}"),
            Err(_) => tracing::debug!(node = n, "removal status: no answer"),
        }
    }
    None
}
