//! Membership changes of one group: add a learner, change the voter set.
//!
//! The caller (the server's replica mover, or the meta group's `peer add`)
//! follows the safe order: add each new node as a learner and wait until it
//! has caught up (`add_learner` blocks on openraft's "up to date" signal),
//! then replace the voter set in one `change_membership` call, which openraft
//! runs as joint consensus: the old and the new voter sets must both reach a
//! majority for every entry in between, so a group never commits on fewer
//! than a majority of either set.
//!
//! Invariants:
//! - Only the leader changes membership; elsewhere `NotLeader`.
//! - Voters removed by `set_voters` are not kept as learners (`retain`
//!   false): the leader stops replicating to them once the change commits.
//!
//! Left out: changing a node's address (a node keeps the address it was
//! added with; remove it and add it again under a new id).

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use openraft::errors::ClientWriteError;
use openraft::BasicNode;
use openraft::ChangeMembers;

use crate::types::TypeConfig;
use crate::Group;
use crate::NodeId;
use crate::RaftError;

type WriteError = openraft::errors::RaftError<TypeConfig, ClientWriteError<TypeConfig>>;

fn from_write_error(e: WriteError) -> RaftError {
    match e {
        openraft::errors::RaftError::APIError(ClientWriteError::ForwardToLeader(f))
        | openraft::errors::RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => {
            RaftError::NotLeader {
                leader: f.leader_id,
            }
        }
        openraft::errors::RaftError::APIError(other) => RaftError::Membership(other.to_string()),
        openraft::errors::RaftError::Fatal(f) => RaftError::Stopped(f.to_string()),
    }
}

impl Group {
    /// Add `node` at `addr` as a learner and wait (up to `timeout`) until it
    /// has stored every entry the leader had when it was added. (openraft's
    /// own "blocking" add only waits until the lag is under its threshold of
    /// thousands of entries, which an unreachable node meets in a young
    /// group.) A node that already is a learner or a voter is re-added
    /// (openraft resets its replication), which is harmless.
    pub async fn add_learner(
        &self,
        node: NodeId,
        addr: &str,
        timeout: Duration,
    ) -> Result<(), RaftError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let add = self.raft().add_learner(node, BasicNode::new(addr), false);
        match tokio::time::timeout_at(deadline, add).await {
            Err(_) => return Err(RaftError::Timeout),
            Ok(r) => r.map_err(from_write_error)?,
        };
        let mut metrics = self.raft().metrics();
        let target = metrics.borrow_watched().last_log_index.unwrap_or(0);
        loop {
            {
                let m = metrics.borrow_watched();
                let Some(replication) = &m.replication else {
                    return Err(RaftError::NotLeader {
                        leader: m.current_leader,
                    });
                };
                let matched = replication.get(&node).and_then(|l| l.as_ref());
                if matched.is_some_and(|l| l.index() >= target) {
                    return Ok(());
                }
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Err(_) => return Err(RaftError::Timeout),
                Ok(Err(_)) => return Err(RaftError::Stopped(format!("group {}", self.id()))),
                Ok(Ok(())) => {}
            }
        }
    }

    /// Make exactly `voters` the group's voters (joint consensus). Every new
    /// voter must already be a learner. Resolves once the final membership is
    /// committed.
    pub async fn set_voters(&self, voters: BTreeSet<NodeId>) -> Result<(), RaftError> {
        self.raft()
            .change_membership(ChangeMembers::ReplaceAllVoters(voters), false)
            .await
            .map(|_| ())
            .map_err(from_write_error)
    }

    /// Drop learners (e.g. one whose catch-up failed) from the membership.
    pub async fn remove_learners(&self, learners: BTreeSet<NodeId>) -> Result<(), RaftError> {
        self.raft()
            .change_membership(ChangeMembers::RemoveNodes(learners), false)
            .await
            .map(|_| ())
            .map_err(from_write_error)
    }

    /// Every member (voters and learners) with the address it was added with.
    pub fn member_addrs(&self) -> BTreeMap<NodeId, String> {
        let metrics = self.raft().metrics();
        let m = metrics.borrow_watched();
        m.membership_config
            .membership()
            .nodes()
            .map(|(id, n)| (*id, n.addr.clone()))
            .collect()
    }
}
