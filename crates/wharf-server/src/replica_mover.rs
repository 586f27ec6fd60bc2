//! Making each group's Raft membership follow the catalog's replicas.
//!
//! After `peer remove`, the catalog lists new replicas for the moved groups
//! (`meta_nodes`). Every reconcile pass, each node looks at the groups it
//! leads and, where the Raft voters differ from the catalog's replicas:
//! - if this node is not among the replicas any more, it hands leadership to
//!   a voter that stays (leadership moves first; the new leader does the rest);
//! - otherwise it adds each new replica as a learner and waits until the
//!   learner has caught up, then replaces the voter set in one joint-consensus
//!   change, and reports `MoveDone` to the meta group.
//!
//! The new replica's node starts the group empty (it is not in the group's
//! `initialize_on`), so it only ever receives the existing log. The node
//! being left keeps its replica until `MoveDone` is committed (`node`'s
//! reconciler), so the old voter set stays intact for the whole change.
//!
//! The meta group's leader also removes nodes that `peer remove` took out of
//! the catalog from the meta group's membership, once no replica is moving.
//!
//! Invariants:
//! - At most one change per group at a time on this node (`NodeInner::moving`).
//! - A group never runs on fewer than a majority of either voter set:
//!   learner first, then joint consensus (see `wharf_raft::Group::set_voters`).
//!
//! Left out: moving replicas for balance (only removal moves them).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use wharf_proto::v1 as pb;
use wharf_raft::{Group, GroupId, NodeId, Role};

use crate::error::{Result, ServerError};
use crate::meta::{Catalog, MetaCommand, META_GROUP};
use crate::node::NodeInner;
use crate::routing::Route;

/// How long a new replica may take to catch up before the move is retried.
const CATCH_UP_WAIT: Duration = Duration::from_secs(60);
/// How long a leadership handover may take before it is retried.
const HANDOVER_WAIT: Duration = Duration::from_secs(3);

struct Wanted {
    group: Group,
    label: String,
    replicas: BTreeSet<NodeId>,
    moving: bool,
}

/// Start whatever membership changes the catalog asks of the groups this
/// node leads. Each runs in its own task; the next pass retries failures.
pub(crate) fn follow_catalog(node: &Arc<NodeInner>, catalog: &Catalog) {
    let mut wanted = Vec::new();
    for (name, e) in &catalog.streams {
        if let Some(l) = node.local_stream(name).filter(|l| l.group_id == e.group_id) {
            wanted.push(Wanted {
                group: l.group.clone(),
                label: name.clone(),
                replicas: e.replicas.iter().copied().collect(),
                moving: !e.leaving.is_empty(),
            });
        }
    }
    for ((stream, name), e) in &catalog.consumers {
        if let Some(l) = node
            .local_consumer(stream, name)
            .filter(|l| l.group_id == e.group_id)
        {
            wanted.push(Wanted {
                group: l.group.clone(),
                label: format!("{stream}/{name}"),
                replicas: e.replicas.iter().copied().collect(),
                moving: !e.leaving.is_empty(),
            });
        }
    }
    for w in wanted {
        let status = w.group.status();
        if status.role != Role::Leader {
            continue;
        }
        let voters: BTreeSet<NodeId> = status.voters.iter().copied().collect();
        if voters == w.replicas && !w.moving {
            continue;
        }
        if !claim(node, w.group.id()) {
            continue;
        }
        let node = node.clone();
        tokio::spawn(async move {
            let gid = w.group.id();
            if let Err(e) = move_group(&node, &w.group, &w.replicas).await {
                tracing::warn!(group = %w.label, "moving replicas: {e}");
            }
            release(&node, gid);
        });
    }
    remove_departed_from_meta(node, catalog);
}

fn claim(node: &NodeInner, gid: GroupId) -> bool {
    node.moving
        .lock()
        .map(|mut m| m.insert(gid))
        .unwrap_or(false)
}

fn release(node: &NodeInner, gid: GroupId) {
    if let Ok(mut m) = node.moving.lock() {
        m.remove(&gid);
    }
}

async fn move_group(node: &NodeInner, group: &Group, want: &BTreeSet<NodeId>) -> Result<()> {
    let me = node.id();
    let status = group.status();
    let voters: BTreeSet<NodeId> = status.voters.iter().copied().collect();
    let staying: Vec<NodeId> = voters.intersection(want).copied().collect();
    if !want.contains(&me) && !staying.is_empty() {
        // Leadership moves first; the next leader makes the change.
        return hand_over(group, me, staying.into_iter()).await;
    }
    // Here this node stays, or no voter stays (a one-replica group): then
    // this leader adds its successor and hands the group over by the
    // membership change itself (it steps down once that commits).
    if voters != *want {
        let catalog = node.catalog();
        for n in want.difference(&voters) {
            let addr = catalog
                .nodes
                .get(n)
                .ok_or_else(|| ServerError::Internal(format!("no address for node {n}")))?;
            tracing::info!(group = group.id(), node = n, "adding replica as a learner");
            group.add_learner(*n, addr, CATCH_UP_WAIT).await?;
        }
        group.set_voters(want.clone()).await?;
        tracing::info!(group = group.id(), voters = ?want, "group membership changed");
    }
    report_move_done(node, group.id()).await
}

async fn hand_over(group: &Group, me: NodeId, targets: impl Iterator<Item = NodeId>) -> Result<()> {
    for to in targets {
        if group.transfer_leader(to).await.is_err() {
            continue;
        }
        let moved = |s: &wharf_raft::GroupStatus| s.leader.is_some_and(|l| l != me);
        if group.wait_for(HANDOVER_WAIT, moved).await.is_ok() {
            tracing::info!(
                group = group.id(),
                to,
                "leadership handed over before the move"
            );
            return Ok(());
        }
    }
    Err(ServerError::Unavailable(
        "no remaining replica took over leadership".into(),
    ))
}

async fn report_move_done(node: &NodeInner, group_id: GroupId) -> Result<()> {
    crate::forward::retry(|| async {
        match node.route_meta().await? {
            Route::Local => node
                .meta_write(MetaCommand::MoveDone { group_id })
                .await
                .map(|_| ()),
            Route::Remote(n) => {
                let req = crate::forward::onward_admin(pb::MoveDoneRequest { group_id }, 0)?;
                node.peers.client(n)?.move_done(req).await?;
                Ok(())
            }
        }
    })
    .await
}

/// On the meta leader: nodes removed from the catalog leave the meta group
/// once no replica is moving any more.
fn remove_departed_from_meta(node: &Arc<NodeInner>, catalog: &Catalog) {
    let status = node.meta.status();
    if status.role != Role::Leader || !catalog.moving_groups().is_empty() {
        return;
    }
    let members: BTreeSet<NodeId> = status
        .voters
        .iter()
        .chain(&status.learners)
        .copied()
        .collect();
    let departed: BTreeSet<NodeId> = members
        .iter()
        .copied()
        .filter(|n| catalog.removed_nodes.contains_key(n))
        .collect();
    if departed.is_empty() || !claim(node, META_GROUP) {
        return;
    }
    let node = node.clone();
    tokio::spawn(async move {
        let me = node.id();
        let meta = node.meta.clone();
        let result = if departed.contains(&me) {
            let stay: Vec<NodeId> = status
                .voters
                .iter()
                .copied()
                .filter(|n| !departed.contains(n))
                .collect();
            hand_over(&meta, me, stay.into_iter()).await
        } else {
            let voters: BTreeSet<NodeId> = status
                .voters
                .iter()
                .copied()
                .filter(|n| !departed.contains(n))
                .collect();
            let learners: BTreeSet<NodeId> = status
                .learners
                .iter()
                .copied()
                .filter(|n| departed.contains(n))
                .collect();
            let mut r = Ok(());
            if voters.len() < status.voters.len() {
                r = meta.set_voters(voters).await.map_err(ServerError::from);
            }
            if r.is_ok() && !learners.is_empty() {
                r = meta.remove_learners(learners).await.map_err(Into::into);
            }
            if r.is_ok() {
                tracing::info!(nodes = ?departed, "removed from the meta group");
            }
            r
        };
        if let Err(e) = result {
            tracing::warn!("removing {departed:?} from the meta group: {e}");
        }
        release(&node, META_GROUP);
    });
}
