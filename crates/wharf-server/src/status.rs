//! `ClusterStatus`: the nodes, which answer, and every group with its leader.
//!
//! Answered from this node's view: groups it hosts report their live Raft
//! status; groups placed elsewhere report only their placement. Nodes are
//! the catalog's members; the meta group's replicas are its Raft voters.

use std::time::Duration;

use wharf_proto::v1 as pb;
use wharf_raft::{Group, Role};

use crate::meta::META_GROUP;
use crate::node::NodeInner;

const PING_TIMEOUT: Duration = Duration::from_millis(500);

fn group_status(
    group: Option<Group>,
    id: u64,
    kind: &str,
    name: String,
    replicas: Vec<u64>,
) -> pb::GroupStatus {
    let status = group.map(|g| g.status());
    let local_role = status.as_ref().map(|s| role_name(&s.role)).unwrap_or("");
    pb::GroupStatus {
        group_id: id,
        kind: kind.to_string(),
        name,
        leader: status.as_ref().and_then(|s| s.leader).unwrap_or(0),
        term: status.as_ref().map(|s| s.term).unwrap_or(0),
        replicas,
        last_applied: status.as_ref().map(|s| s.last_applied).unwrap_or(0),
        local_role: local_role.to_string(),
        voters: status
            .as_ref()
            .map(|s| s.voters.clone())
            .unwrap_or_default(),
        local_error: status.and_then(|s| s.error).unwrap_or_default(),
    }
}

/// How a role is named in status, metrics and logs.
pub fn role_name(role: &Role) -> &'static str {
    match role {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::Learner => "learner",
        Role::Shutdown => "shutdown",
        Role::Failed => "failed",
    }
}

pub async fn cluster_status(node: &NodeInner) -> pb::ClusterStatusResponse {
    let catalog = node.catalog();
    let mut nodes = Vec::new();
    for (id, addr) in &catalog.nodes {
        let up = *id == node.id() || node.raft.ping(addr, PING_TIMEOUT).await;
        nodes.push(pb::NodeStatus {
            id: *id,
            addr: addr.clone(),
            up,
        });
    }
    let mut groups = vec![group_status(
        Some(node.meta.clone()),
        META_GROUP,
        "meta",
        "meta".into(),
        node.meta.status().voters,
    )];
    for (name, s) in &catalog.streams {
        let g = node.raft.group(s.group_id);
        groups.push(group_status(
            g,
            s.group_id,
            "stream",
            name.clone(),
            s.replicas.clone(),
        ));
    }
    for ((stream, name), c) in &catalog.consumers {
        let g = node.raft.group(c.group_id);
        let label = format!("{stream}/{name}");
        groups.push(group_status(
            g,
            c.group_id,
            "consumer",
            label,
            c.replicas.clone(),
        ));
    }
    pb::ClusterStatusResponse {
        node_id: node.id(),
        nodes,
        groups,
    }
}
