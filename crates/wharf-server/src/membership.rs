//! `peer add` and `peer remove`: changing the cluster's node set.
//!
//! Both run on the meta group's leader (other nodes forward them).
//!
//! `peer add <id> <addr>`: the node must be running with `--join` (it then
//! holds an empty meta replica). The leader adds it to the meta group as a
//! learner and waits until it has caught up, makes it a voter (joint
//! consensus), and records it in the catalog (`AddNode`), from which new
//! groups are placed on it. Each step is repeatable, so a failed call can
//! simply be issued again.
//!
//! `peer remove <id>`: one `RemoveNode` entry takes the node out of the
//! placement set and gives every group it hosts a replacement replica
//! (`meta_nodes`); the groups' leaders move them (`replica_mover`); once no
//! replica is moving, the meta leader takes the node out of the meta group.
//! The call answers within [`REMOVE_WAIT`] with `done` or the groups still
//! moving; issuing it again keeps waiting (the CLI does so until done).
//!
//! Invariants:
//! - Duplicate ids and addresses are refused before the meta group changes.
//! - A node that does not catch up as a learner is taken out again and the
//!   call fails, so the meta group never counts an unreachable voter.
//!
//! Left out: changing a member's address; removing a node below
//! `meta_nodes::MIN_NODES`.

use std::collections::BTreeSet;
use std::time::Duration;

use wharf_proto::v1 as pb;
use wharf_raft::{NodeId, RaftError};

use crate::error::{Result, ServerError};
use crate::forward::{onward_admin, retry};
use crate::meta::MetaCommand;
use crate::node::NodeInner;
use crate::routing::Route;

/// How long a joining node may take to catch up with the meta log (within
/// the forwarded admin call's 20 s deadline).
const JOIN_CATCH_UP: Duration = Duration::from_secs(12);
/// How long one `PeerRemove` call waits for the replicas to move.
pub const REMOVE_WAIT: Duration = Duration::from_secs(12);

impl NodeInner {
    pub async fn peer_add(
        &self,
        req: pb::PeerAddRequest,
        hops: u32,
    ) -> Result<pb::PeerAddResponse> {
        check_addr(req.id, &req.addr)?;
        retry(|| async {
            match self.route_meta().await? {
                Route::Local => self.peer_add_here(req.id, &req.addr).await,
                Route::Remote(n) => Ok(self
                    .peers
                    .client(n)?
                    .peer_add(onward_admin(req.clone(), hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await
    }

    async fn peer_add_here(&self, id: NodeId, addr: &str) -> Result<pb::PeerAddResponse> {
        let catalog = self.catalog();
        // The same checks as `AddNode`'s apply, before the meta group changes.
        catalog.clone().apply(MetaCommand::AddNode {
            id,
            addr: addr.to_string(),
        })?;
        let members = self.meta.member_addrs();
        if let Some((other, _)) = members.iter().find(|(n, a)| **n != id && *a == addr) {
            return Err(ServerError::AlreadyExists(format!(
                "address {addr} is already used by node {other}"
            )));
        }
        if members.get(&id).is_some_and(|a| a != addr) {
            return Err(ServerError::AlreadyExists(format!(
                "node {id} is already in the meta group at {}",
                members[&id]
            )));
        }
        tracing::info!(id, addr, "adding node to the meta group as a learner");
        match self.meta.add_learner(id, addr, JOIN_CATCH_UP).await {
            Ok(()) => {}
            Err(RaftError::Timeout) => {
                let voters = self.meta.status().voters;
                if !voters.contains(&id) {
                    let _ = self.meta.remove_learners(BTreeSet::from([id])).await;
                }
                return Err(ServerError::Conflict(format!(
                    "node {id} at {addr} did not catch up within {JOIN_CATCH_UP:?}; is it running, started with --join and reachable at that address?"
                )));
            }
            Err(e) => return Err(e.into()),
        }
        let mut voters: BTreeSet<NodeId> = self.meta.status().voters.into_iter().collect();
        voters.insert(id);
        self.meta.set_voters(voters).await?;
        self.meta_write(MetaCommand::AddNode {
            id,
            addr: addr.to_string(),
        })
        .await?;
        tracing::info!(id, addr, "node added to the cluster");
        Ok(pb::PeerAddResponse {
            nodes: self.member_list(),
        })
    }

    pub async fn peer_remove(
        &self,
        req: pb::PeerRemoveRequest,
        hops: u32,
    ) -> Result<pb::PeerRemoveResponse> {
        retry(|| async {
            match self.route_meta().await? {
                Route::Local => self.peer_remove_here(req.id).await,
                Route::Remote(n) => Ok(self
                    .peers
                    .client(n)?
                    .peer_remove(onward_admin(req, hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await
    }

    async fn peer_remove_here(&self, id: NodeId) -> Result<pb::PeerRemoveResponse> {
        let catalog = self.catalog();
        let mut moved = 0;
        if catalog.nodes.contains_key(&id) {
            catalog.check_remove_node(id)?;
            moved = catalog
                .streams
                .values()
                .filter(|s| s.replicas.contains(&id))
                .map(|s| 1 + catalog.consumers_of(&s.config.name).count() as u32)
                .sum();
            tracing::info!(id, groups = moved, "removing node: moving its replicas");
            self.meta_write(MetaCommand::RemoveNode { id }).await?;
        } else if !catalog.removed_nodes.contains_key(&id) {
            // Not a member, never was: the same answer as the catalog's.
            catalog.check_remove_node(id)?;
        }
        let deadline = tokio::time::Instant::now() + REMOVE_WAIT;
        let mut version = self.meta_version.clone();
        let mut meta = self.meta.watch();
        loop {
            let moving = self.catalog().moving_groups();
            let status = self.meta.status();
            let in_meta = status.voters.contains(&id) || status.learners.contains(&id);
            // Leadership of the meta group moved (e.g. away from the node
            // being removed): answer now, the caller's next round is
            // forwarded to the new leader, which sees the final membership.
            let not_leader = status.role != wharf_raft::Role::Leader;
            let timed_out = tokio::time::Instant::now() >= deadline;
            if (moving.is_empty() && !in_meta) || not_leader || timed_out {
                let done = moving.is_empty() && !in_meta;
                if done {
                    tracing::info!(id, "node removed from the cluster");
                }
                return Ok(pb::PeerRemoveResponse {
                    moved_groups: moved,
                    nodes: self.member_list(),
                    done,
                    moving: moving.into_iter().map(|(name, _)| name).collect(),
                });
            }
            tokio::select! {
                _ = version.changed() => {}
                _ = meta.changed() => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// What a joining node asks a seed for (see `bootstrap`).
    pub fn join_info(&self) -> pb::JoinInfoResponse {
        pb::JoinInfoResponse {
            initial_nodes: self.initial_nodes.clone().into_iter().collect(),
            nodes: self.catalog().nodes.into_iter().collect(),
        }
    }

    /// A group's leader reports its replicas moved (see `replica_mover`).
    pub async fn move_done(&self, req: pb::MoveDoneRequest, hops: u32) -> Result<()> {
        match self.route_meta().await? {
            Route::Local => {
                let cmd = MetaCommand::MoveDone {
                    group_id: req.group_id,
                };
                self.meta_write(cmd).await.map(|_| ())
            }
            Route::Remote(n) => {
                let req = onward_admin(req, hops)?;
                self.peers.client(n)?.move_done(req).await?;
                Ok(())
            }
        }
    }

    /// The catalog's nodes, as cluster status lists them (without probing).
    fn member_list(&self) -> Vec<pb::NodeStatus> {
        self.catalog()
            .nodes
            .into_iter()
            .map(|(id, addr)| pb::NodeStatus { id, addr, up: true })
            .collect()
    }
}

fn check_addr(id: NodeId, addr: &str) -> Result<()> {
    if id == 0 {
        return Err(ServerError::Invalid("node id must be 1 or more".into()));
    }
    let port = addr
        .rsplit_once(':')
        .map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(p))) if !host.is_empty() && p != 0 => Ok(()),
        _ => Err(ServerError::Invalid(format!(
            "address {addr:?} is not host:port"
        ))),
    }
}
