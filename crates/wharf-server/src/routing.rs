//! Finding where a request is served, and the reads and writes that need a leader.
//!
//! `route` answers "here" when this node leads the group, or the node to
//! forward to. Catalog lookups that miss locally are retried once the meta
//! group has caught up, because a follower's catalog may trail the leader's by
//! a few milliseconds right after a create.

use std::sync::atomic::Ordering;
use std::time::Duration;

use wharf_proto::v1 as pb;
use wharf_raft::{Group, NodeId};

use crate::convert::{consumer_config_to_pb, stream_config_to_pb};
use crate::error::{Result, ServerError};
use crate::forward::{onward, onward_admin};
use crate::meta::{ConsumerEntry, MetaCommand, MetaResponse, StreamEntry};
use crate::node::NodeInner;
use crate::util::now_ms;

/// How long a request waits for a group to elect a leader.
const LEADER_WAIT: Duration = Duration::from_secs(3);
/// How long a lookup waits for a lagging catalog.
const CATALOG_GRACE: Duration = Duration::from_millis(500);

pub enum Route {
    Local,
    Remote(NodeId),
}

impl NodeInner {
    pub async fn route(&self, group: Option<&Group>, replicas: &[NodeId]) -> Result<Route> {
        match group {
            Some(g) => {
                let status = g
                    .wait_for(LEADER_WAIT, |s| s.leader.is_some())
                    .await
                    .map_err(|_| {
                        ServerError::Unavailable(format!("group {} has no leader yet", g.id()))
                    })?;
                match status.leader {
                    Some(l) if l == self.id() => Ok(Route::Local),
                    Some(l) => Ok(Route::Remote(l)),
                    None => Err(ServerError::Unavailable("no leader".into())),
                }
            }
            None => replicas
                .iter()
                .copied()
                .find(|n| *n != self.id())
                .map(Route::Remote)
                .ok_or_else(|| ServerError::Unavailable("group is starting on this node".into())),
        }
    }

    pub async fn route_meta(&self) -> Result<Route> {
        self.route(Some(&self.meta), &[]).await
    }

    pub async fn meta_write(&self, cmd: MetaCommand) -> Result<u64> {
        let bytes = self.meta.write(bincode::serialize(&cmd)?).await?;
        let response: MetaResponse = bincode::deserialize(&bytes)?;
        response
    }

    /// Wait until the catalog no longer trails: used before answering "not found".
    async fn catalog_grace(&self) {
        let mut version = self.meta_version.clone();
        let _ = tokio::time::timeout(CATALOG_GRACE, version.changed()).await;
    }

    pub async fn find_stream(&self, name: &str) -> Result<StreamEntry> {
        if let Ok(e) = self.with_catalog(|c| c.stream(name).cloned()) {
            return Ok(e);
        }
        self.catalog_grace().await;
        self.with_catalog(|c| c.stream(name).cloned())
    }

    pub async fn find_consumer(&self, stream: &str, name: &str) -> Result<ConsumerEntry> {
        if let Ok(e) = self.with_catalog(|c| c.consumer(stream, name).cloned()) {
            return Ok(e);
        }
        self.catalog_grace().await;
        self.with_catalog(|c| c.consumer(stream, name).cloned())
    }

    /// Wait (bounded) until a group created through the catalog runs here
    /// with a leader, so the next request to it succeeds at once.
    pub async fn wait_group_ready(&self, group_id: u64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut version = self.meta_version.clone();
        while tokio::time::Instant::now() < deadline {
            if let Some(g) = self.raft.group(group_id) {
                let _ = g
                    .wait_for(Duration::from_secs(3), |s| s.leader.is_some())
                    .await;
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(50), version.changed()).await;
        }
    }

    /// Wait (bounded) until a local consumer has resolved where it starts, so
    /// that a publish made after creation is never skipped by a `new` policy.
    pub async fn wait_consumer_started(&self, stream: &str, name: &str) {
        let Some(local) = self.local_consumer(stream, name) else {
            return;
        };
        let mut changes = local.changes.clone();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let started = local
                .sm
                .lock()
                .map(|c| !c.state().needs_start())
                .unwrap_or(true);
            if started || tokio::time::Instant::now() > deadline {
                return;
            }
            let _ = tokio::time::timeout_at(deadline, changes.changed()).await;
        }
    }

    /// On a work-queue or interest stream, waits until the stream group has
    /// registered consumer `name`, so no message published after the
    /// consumer was created can be removed without it. Bounded: answers
    /// Unavailable (the create may be retried; it is idempotent) after 10 s.
    pub async fn wait_retention_registered(&self, stream: &str, name: &str) -> Result<()> {
        let retention = self.with_catalog(|c| c.stream(stream).map(|e| e.config.retention))?;
        if retention == wharf_core::stream::RetentionPolicy::Limits {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(info) = self.stream_info(stream, 0).await {
                let state = info.state.unwrap_or_default();
                if state.retention_consumers.iter().any(|c| c == name) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ServerError::Unavailable(format!(
                    "consumer {name:?} is created but stream {stream:?} has not registered it for retention yet; retry"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stream_info(&self, name: &str, hops: u32) -> Result<pb::StreamInfo> {
        self.stream_info_with(name, hops, false).await
    }

    /// Stream info from the leader; `subjects` lists subjects with counts.
    pub async fn stream_info_with(
        &self,
        name: &str,
        hops: u32,
        subjects: bool,
    ) -> Result<pb::StreamInfo> {
        let entry = self.find_stream(name).await?;
        let local = self.local_stream(name);
        match self
            .route(local.as_ref().map(|l| &l.group), &entry.replicas)
            .await?
        {
            Route::Local => self.local_stream_info_with(name, subjects),
            Route::Remote(n) => {
                let req = onward(
                    pb::GetStreamRequest {
                        name: name.to_string(),
                        local: false,
                        subjects,
                    },
                    hops,
                )?;
                Ok(self.peers.client(n)?.get_stream(req).await?.into_inner())
            }
        }
    }

    /// Stream info from this node's own replica, whoever leads.
    /// The config is the one the stream group applies (it follows the
    /// catalog's shortly after an edit).
    pub fn local_stream_info_with(&self, name: &str, subjects: bool) -> Result<pb::StreamInfo> {
        let catalog = self.catalog();
        let entry = catalog.stream(name)?;
        let local = self.local_stream(name).ok_or_else(|| {
            ServerError::Conflict(format!(
                "node {} holds no replica of stream {name:?}",
                self.id()
            ))
        })?;
        let (config, stats, listed, retention_consumers) = {
            let sm = local.sm.lock().map_err(|_| poisoned())?;
            let state = sm.state();
            let listed = if subjects {
                state.subject_counts(None, crate::stream_admin::MAX_SUBJECTS_LISTED + 1)
            } else {
                Vec::new()
            };
            let retention: Vec<String> = state.interested().keys().cloned().collect();
            (state.config().clone(), state.stats(), listed, retention)
        };
        let status = local.group.status();
        let truncated = listed.len() > crate::stream_admin::MAX_SUBJECTS_LISTED;
        Ok(pb::StreamInfo {
            config: Some(stream_config_to_pb(&config)),
            state: Some(pb::StreamState {
                messages: stats.messages,
                bytes: stats.bytes,
                first_seq: stats.first_seq,
                last_seq: stats.last_seq,
                consumer_count: catalog.consumers_of(name).count() as u32,
                num_subjects: stats.num_subjects,
                subjects: (listed.into_iter())
                    .take(crate::stream_admin::MAX_SUBJECTS_LISTED)
                    .map(|(subject, messages)| pb::SubjectCount { subject, messages })
                    .collect(),
                subjects_truncated: truncated,
                retention_consumers,
            }),
            cluster: Some(pb::ClusterInfo {
                leader: status.leader.unwrap_or(0),
                replicas: entry.replicas.clone(),
                term: status.term,
                group_id: entry.group_id,
            }),
            created_ms: entry.created_ms,
        })
    }

    /// Move a group's leadership to another replica; answers (previous, new leader).
    pub async fn step_down(
        &self,
        req: pb::StepDownRequest,
        hops: u32,
    ) -> Result<pb::StepDownResponse> {
        let (group, replicas) = if req.consumer.is_empty() {
            let e = self.find_stream(&req.stream).await?;
            (
                self.local_stream(&req.stream).map(|l| l.group.clone()),
                e.replicas,
            )
        } else {
            let e = self.find_consumer(&req.stream, &req.consumer).await?;
            (
                self.local_consumer(&req.stream, &req.consumer)
                    .map(|l| l.group.clone()),
                e.replicas,
            )
        };
        match self.route(group.as_ref(), &replicas).await? {
            Route::Remote(n) => Ok(self
                .peers
                .client(n)?
                .step_down(onward_admin(req, hops)?)
                .await?
                .into_inner()),
            Route::Local => {
                let group =
                    group.ok_or_else(|| ServerError::Unavailable("group not local".into()))?;
                let me = self.id();
                let targets: Vec<NodeId> = replicas.iter().copied().filter(|n| *n != me).collect();
                if targets.is_empty() {
                    return Err(ServerError::Conflict(
                        "a group with one replica has no other node to lead it".into(),
                    ));
                }
                for to in targets {
                    if group.transfer_leader(to).await.is_err() {
                        continue;
                    }
                    let moved = |s: &wharf_raft::GroupStatus| s.leader.is_some_and(|l| l != me);
                    if let Ok(s) = group.wait_for(Duration::from_secs(3), moved).await {
                        return Ok(pb::StepDownResponse {
                            previous_leader: me,
                            leader: s.leader.unwrap_or(0),
                        });
                    }
                }
                Err(ServerError::Unavailable(
                    "no other replica took over leadership; retry".into(),
                ))
            }
        }
    }

    pub async fn consumer_info(
        &self,
        stream: &str,
        name: &str,
        hops: u32,
    ) -> Result<pb::ConsumerInfo> {
        let entry = self.find_consumer(stream, name).await?;
        let local = self.local_consumer(stream, name);
        match self
            .route(local.as_ref().map(|l| &l.group), &entry.replicas)
            .await?
        {
            Route::Local => {
                let local =
                    local.ok_or_else(|| ServerError::Unavailable("consumer not local".into()))?;
                let stream_sm = self
                    .local_stream(stream)
                    .ok_or_else(|| ServerError::Unavailable("stream not local".into()))?;
                let status = local.group.status();
                let c = local.sm.lock().map_err(|_| poisoned())?;
                let state = c.state();
                let delivered = state.delivered();
                let floor = state.ack_floor();
                let num_pending = stream_sm
                    .sm
                    .lock()
                    .map(|s| state.num_pending(s.state()))
                    .map_err(|_| poisoned())?;
                Ok(pb::ConsumerInfo {
                    stream_name: stream.to_string(),
                    name: name.to_string(),
                    config: Some(consumer_config_to_pb(state.config())),
                    delivered: Some(pb::SequencePair {
                        consumer_seq: delivered.consumer_seq,
                        stream_seq: delivered.stream_seq,
                    }),
                    ack_floor: Some(pb::SequencePair {
                        consumer_seq: floor.consumer_seq,
                        stream_seq: floor.stream_seq,
                    }),
                    num_ack_pending: state.num_ack_pending(),
                    num_redelivered: state.num_redelivered(),
                    num_waiting: local.runtime.num_waiting.load(Ordering::Relaxed),
                    num_pending,
                    num_terminated: state.num_terminated(),
                    num_exhausted: state.num_exhausted(),
                    num_dead_lettered: state.num_dead_lettered(),
                    dead_letter_backlog: state.dead_letter_backlog(),
                    paused: state.is_paused(now_ms()),
                    pause_remaining_ms: (state.config().pause_until_ms - now_ms()).max(0),
                    cluster: Some(pb::ClusterInfo {
                        leader: status.leader.unwrap_or(0),
                        replicas: entry.replicas.clone(),
                        term: status.term,
                        group_id: entry.group_id,
                    }),
                    created_ms: entry.created_ms,
                })
            }
            Route::Remote(n) => {
                let req = onward(
                    pb::GetConsumerRequest {
                        stream: stream.to_string(),
                        name: name.to_string(),
                    },
                    hops,
                )?;
                Ok(self.peers.client(n)?.get_consumer(req).await?.into_inner())
            }
        }
    }
}

fn poisoned() -> ServerError {
    ServerError::Internal("state lock poisoned".into())
}
