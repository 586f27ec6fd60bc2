//! [`Group`]: the handle of one running Raft group on this node.
//!
//! A cheap clone around the openraft handle, the group's state machine and a
//! watch channel of [`GroupStatus`] that a background task keeps in step with
//! openraft's metrics. It translates openraft's errors into [`RaftError`].
//!
//! Invariants:
//! - `status()` never blocks and never fails; after the group stops it
//!   reports `Role::Shutdown`, after a fatal (storage) error `Role::Failed`.
//! - `write` resolves only after the command is committed *and* applied here.
//!
//! Not here: forwarding to the leader (the server does it on `NotLeader`) and
//! deadlines on `write` (wrap it in `tokio::time::timeout`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use openraft::errors::ClientWriteError;
use openraft::errors::ForwardReason;
use openraft::errors::LinearizableReadError;
use openraft::RaftMetrics;
use openraft::ReadPolicy;
use openraft::ServerState;
use tokio::sync::watch;

use crate::types::Cmd;
use crate::types::TypeConfig;
use crate::types::WharfRaft;
use crate::GroupId;
use crate::GroupStatus;
use crate::NodeId;
use crate::RaftError;
use crate::Role;
use crate::SharedStateMachine;

/// Handle of one running Raft group.
#[derive(Clone)]
pub struct Group {
    inner: Arc<GroupInner>,
}

struct GroupInner {
    id: GroupId,
    raft: WharfRaft,
    sm: SharedStateMachine,
    status: watch::Receiver<GroupStatus>,
    /// This node's role alone: changes far less often than `status`.
    role: watch::Receiver<Role>,
    /// Closed (its sender dropped) once the Raft core is gone.
    core_gone: watch::Receiver<()>,
    read_timeout: Duration,
    /// How long `write` retries on a leader whose lease is not confirmed.
    lease_wait: Duration,
}

fn status_from(group_id: GroupId, m: &RaftMetrics<TypeConfig>) -> GroupStatus {
    // A deliberate stop is `Fatal::Stopped`; anything else (a storage error,
    // a panic) failed the group.
    let error = match &m.running_state {
        Ok(()) | Err(openraft::errors::Fatal::Stopped) => None,
        Err(e) => Some(e.to_string()),
    };
    let role = if error.is_some() {
        Role::Failed
    } else if m.running_state.is_err() {
        Role::Shutdown
    } else {
        match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Shutdown,
        }
    };
    GroupStatus {
        group_id,
        role,
        leader: m.current_leader,
        term: m.current_term,
        last_log_index: m.last_log_index.unwrap_or(0),
        committed: m.local_committed.as_ref().map(|l| l.index).unwrap_or(0),
        last_applied: m.last_applied.as_ref().map(|l| l.index).unwrap_or(0),
        snapshot_index: m.snapshot.as_ref().map(|l| l.index).unwrap_or(0),
        purged_index: m.purged.as_ref().map(|l| l.index).unwrap_or(0),
        voters: m.membership_config.membership().voter_ids().collect(),
        learners: m.membership_config.membership().learner_ids().collect(),
        leader_changes: 0,
        error,
    }
}

/// Poll interval while a new leader's lease is being confirmed.
const LEASE_RETRY: Duration = Duration::from_millis(10);

fn fatal<E: std::fmt::Display>(e: E) -> RaftError {
    RaftError::Stopped(e.to_string())
}

impl Group {
    pub(crate) fn new(
        id: GroupId,
        raft: WharfRaft,
        sm: SharedStateMachine,
        read_timeout: Duration,
        lease_wait: Duration,
    ) -> Self {
        let mut metrics = raft.metrics();
        let mut initial = status_from(id, &metrics.borrow_watched());
        let mut leader = initial.leader;
        let mut leader_changes = u64::from(leader.is_some());
        initial.leader_changes = leader_changes;
        let (role_tx, role_rx) = watch::channel(initial.role.clone());
        let (tx, rx) = watch::channel(initial);
        let (core_gone_tx, core_gone) = watch::channel(());
        // Mirrors openraft's metrics until the Raft core is gone. Holds no Raft
        // handle, so it never keeps a stopped group alive. openraft sends its
        // metrics on every turn of its core's loop, changed or not (heartbeat
        // times among them); receivers here are woken only when what they
        // see changed: every watcher woken per turn was a thread hand-off
        // per publish (docs/benchmarks-changes.md, "Where one sync publish's
        // time goes").
        tokio::spawn(async move {
            let _core_gone_tx = core_gone_tx;
            loop {
                if metrics.changed().await.is_err() {
                    // A failed group stays reported as failed.
                    tx.send_modify(|s| {
                        if s.role != Role::Failed {
                            s.role = Role::Shutdown;
                        }
                        role_tx.send_replace(s.role.clone());
                    });
                    break;
                }
                let mut status = status_from(id, &metrics.borrow_watched());
                // Counted when a (new) leader becomes known, not when the
                // old one is lost: an election that fails is not a change.
                if status.leader.is_some() && status.leader != leader {
                    leader_changes += 1;
                    leader = status.leader;
                }
                status.leader_changes = leader_changes;
                role_tx.send_if_modified(|r| {
                    let changed = *r != status.role;
                    if changed {
                        *r = status.role.clone();
                    }
                    changed
                });
                tx.send_if_modified(|s| {
                    let changed = *s != status;
                    if changed {
                        *s = status;
                    }
                    changed
                });
                if tx.is_closed() && role_tx.is_closed() {
                    break;
                }
            }
        });
        Group {
            inner: Arc::new(GroupInner {
                id,
                raft,
                sm,
                status: rx,
                role: role_rx,
                core_gone,
                read_timeout,
                lease_wait,
            }),
        }
    }

    pub(crate) fn raft(&self) -> &WharfRaft {
        &self.inner.raft
    }

    /// Resolves once the group's Raft core is gone (stopped or failed).
    pub(crate) fn core_gone(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut gone = self.inner.core_gone.clone();
        async move { while gone.changed().await.is_ok() {} }
    }

    /// Stops the Raft core of this group and waits for its tasks.
    pub(crate) async fn shutdown(&self) -> Result<(), RaftError> {
        self.inner.raft.shutdown().await.map_err(fatal)
    }

    /// The group id.
    pub fn id(&self) -> GroupId {
        self.inner.id
    }

    /// Propose a command; resolves with the state machine's response once
    /// committed and applied. Not leader -> `RaftError::NotLeader`.
    pub async fn write(&self, command: Vec<u8>) -> Result<Vec<u8>, RaftError> {
        let cmd = Cmd(Bytes::from(command));
        let lease_deadline = tokio::time::Instant::now() + self.inner.lease_wait;
        crate::timeline::mark("write_start", 0);
        loop {
            match self.inner.raft.client_write(cmd.clone()).await {
                Ok(resp) => {
                    crate::timeline::mark("write_done", resp.log_id.index);
                    return Ok(Vec::from(resp.data.0));
                }
                Err(openraft::errors::RaftError::APIError(e)) => match e {
                    // A leader whose quorum lease is not (yet, or no longer)
                    // confirmed refuses writes without appending them, e.g.
                    // right after its election. Safe to retry briefly: either
                    // the heartbeats confirm it or it steps down.
                    ClientWriteError::ForwardToLeader(f)
                        if f.reason == ForwardReason::LeaseExpired
                            && tokio::time::Instant::now() < lease_deadline =>
                    {
                        tokio::time::sleep(LEASE_RETRY).await;
                    }
                    ClientWriteError::ForwardToLeader(f) => {
                        return Err(RaftError::NotLeader {
                            leader: f.leader_id,
                        })
                    }
                    // Outcome unknown: the server must treat it like NotLeader
                    // and rely on deduplication (see `RaftError::NotLeader`).
                    ClientWriteError::LogEntryDiscarded(f) => {
                        return Err(RaftError::NotLeader {
                            leader: f.leader_id,
                        })
                    }
                    other => return Err(RaftError::Config(other.to_string())),
                },
                Err(openraft::errors::RaftError::Fatal(f)) => return Err(fatal(f)),
            }
        }
    }

    /// The latest status of this group on this node. It mirrors openraft's
    /// metrics asynchronously, so it may trail a `write` that just returned
    /// by a moment; wait with [`Group::wait_for`] instead of polling.
    pub fn status(&self) -> GroupStatus {
        self.inner.status.borrow().clone()
    }

    /// The leader this node knows of now, without copying the status.
    pub fn leader(&self) -> Option<NodeId> {
        self.inner.status.borrow().leader
    }

    /// A receiver updated whenever the group's status changes.
    pub fn watch(&self) -> watch::Receiver<GroupStatus> {
        self.inner.status.clone()
    }

    /// A receiver updated only when this node's role in the group changes;
    /// closed once the Raft core is gone (its last value `Shutdown` or
    /// `Failed`). For tasks that act on leadership alone.
    pub fn watch_role(&self) -> watch::Receiver<Role> {
        self.inner.role.clone()
    }

    /// Wait until `pred(status)` holds, or `Err(RaftError::Timeout)`.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        pred: impl Fn(&GroupStatus) -> bool,
    ) -> Result<GroupStatus, RaftError> {
        let mut rx = self.watch();
        let wait = async {
            loop {
                {
                    let s = rx.borrow_and_update();
                    if pred(&s) {
                        return Ok(s.clone());
                    }
                }
                if rx.changed().await.is_err() {
                    let s = rx.borrow().clone();
                    return if pred(&s) {
                        Ok(s)
                    } else {
                        Err(RaftError::Stopped(format!("group {} stopped", self.id())))
                    };
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or(Err(RaftError::Timeout))
    }

    /// Linearizable read barrier: on the leader, confirms leadership with a
    /// quorum (read index) and waits until the state machine has applied up to
    /// that index. `NotLeader` elsewhere; `Timeout` when no quorum answers.
    pub async fn ensure_linearizable(&self) -> Result<(), RaftError> {
        let read = self.inner.raft.ensure_linearizable(ReadPolicy::ReadIndex);
        match tokio::time::timeout(self.inner.read_timeout, read).await {
            Err(_) => Err(RaftError::Timeout),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(openraft::errors::RaftError::APIError(e))) => Err(match e {
                LinearizableReadError::ForwardToLeader(f) => RaftError::NotLeader {
                    leader: f.leader_id,
                },
                LinearizableReadError::QuorumNotEnough(_) => RaftError::Timeout,
            }),
            Ok(Err(openraft::errors::RaftError::Fatal(f))) => Err(fatal(f)),
        }
    }

    /// Ask the leader (this node) to hand leadership to `to`. Returns once the
    /// request is queued; watch the status for the outcome.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<(), RaftError> {
        let status = self.status();
        if status.role != Role::Leader {
            return Err(RaftError::NotLeader {
                leader: status.leader,
            });
        }
        if !status.voters.contains(&to) {
            return Err(RaftError::Config(format!(
                "node {to} is not a voter of group {}",
                self.id()
            )));
        }
        self.inner
            .raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(fatal)
    }

    /// The group's state machine.
    pub fn state_machine(&self) -> SharedStateMachine {
        self.inner.sm.clone()
    }
}
