//! The node set a cluster was founded with, and joining an existing cluster.
//!
//! The meta catalog starts from the founding node set and changes only
//! through replicated `AddNode` / `RemoveNode` entries, so every member must
//! replay the meta log from the *same* starting set (placement depends on
//! it). A founding node takes it from `--peers` on its first start; a node
//! that joins later (`--join seed,...`) reads it from a seed (`JoinInfo`).
//! Either way it is stored in the node's database on first start
//! (`cluster` tree) and read from there on every later start, so editing
//! `--peers` afterwards (e.g. to list nodes added since) changes nothing.
//!
//! Invariants:
//! - A node that joins never initializes the meta group: its id is not in
//!   the founding set (refused otherwise), so it starts as an empty replica
//!   that waits until `peer add` makes it a learner of the existing group.
//! - The founding set is written and flushed before the meta group starts.
//!
//! Left out: discovering seeds (DNS, gossip); the operator names them.

use std::collections::BTreeMap;
use std::time::Duration;

use wharf_proto::v1 as pb;
use wharf_raft::{NodeId, RaftNode};

use crate::error::{Result, ServerError};
use crate::forward::Peers;
use crate::node::NodeConfig;

const TREE: &str = "cluster";
const KEY_INITIAL_NODES: &[u8] = b"initial_nodes";
/// How long a joining node keeps asking its seeds before it gives up
/// (a supervisor restarts it; the next start asks again).
const JOIN_DEADLINE: Duration = Duration::from_secs(120);
const JOIN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);
const JOIN_RETRY: Duration = Duration::from_millis(500);

/// The founding node set of this node's cluster (see the module docs).
pub async fn initial_nodes(
    raft: &RaftNode,
    config: &NodeConfig,
    peers: &Peers,
) -> Result<BTreeMap<NodeId, String>> {
    let tree = raft.db().open_tree(TREE)?;
    if let Some(bytes) = tree.get(KEY_INITIAL_NODES)? {
        let stored: BTreeMap<NodeId, String> = bincode::deserialize(&bytes)?;
        if config.join.is_empty() && !config.peers.is_empty() && config.peers != stored {
            tracing::info!(
                "--peers differs from the founding node set stored at first start; the stored one is used (membership changes go through `wharf cluster peer add/remove`)"
            );
        }
        return Ok(stored);
    }
    let nodes = if config.join.is_empty() {
        config.peers.clone()
    } else {
        let nodes = ask_seeds(config, peers).await?;
        if nodes.contains_key(&config.node_id) {
            return Err(ServerError::Invalid(format!(
                "node id {} is one of the nodes the cluster was founded with; a joining node needs an id of its own",
                config.node_id
            )));
        }
        nodes
    };
    tree.insert(KEY_INITIAL_NODES, bincode::serialize(&nodes)?)?;
    raft.flush().await?;
    Ok(nodes)
}

/// Ask each seed in turn for the founding node set until one answers.
async fn ask_seeds(config: &NodeConfig, peers: &Peers) -> Result<BTreeMap<NodeId, String>> {
    let deadline = tokio::time::Instant::now() + JOIN_DEADLINE;
    let mut last_error = String::new();
    tracing::info!(seeds = ?config.join, "joining an existing cluster");
    loop {
        for seed in &config.join {
            match ask_seed(config.node_id, seed, peers).await {
                Ok(r) => {
                    if let Some(addr) = r.nodes.get(&config.node_id) {
                        tracing::info!(%addr, "this node is already a member of the cluster");
                    } else {
                        tracing::info!(
                            "seed {seed} answered; waiting to be added with `wharf cluster peer add {} <addr>`",
                            config.node_id
                        );
                    }
                    return Ok(r.initial_nodes.into_iter().collect());
                }
                Err(e) => last_error = format!("{seed}: {e}"),
            }
        }
        if tokio::time::Instant::now() + JOIN_RETRY > deadline {
            return Err(ServerError::Unavailable(format!(
                "no --join seed answered within {JOIN_DEADLINE:?} (last error: {last_error})"
            )));
        }
        tokio::time::sleep(JOIN_RETRY).await;
    }
}

async fn ask_seed(id: NodeId, seed: &str, peers: &Peers) -> Result<pb::JoinInfoResponse> {
    let mut client = peers.client_at(seed)?;
    let mut req = tonic::Request::new(pb::JoinInfoRequest { id });
    req.set_timeout(JOIN_ATTEMPT_TIMEOUT);
    let answer = tokio::time::timeout(JOIN_ATTEMPT_TIMEOUT, client.join_info(req))
        .await
        .map_err(|_| ServerError::Unavailable("no answer".into()))??;
    Ok(answer.into_inner())
}
