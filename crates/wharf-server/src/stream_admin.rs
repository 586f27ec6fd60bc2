//! Stream administration beyond create and delete: edit, purge, and get or
//! delete one message by sequence.
//!
//! Every node serves these calls. An edit goes to the meta leader (the
//! catalog holds the config, `MetaCommand::UpdateStream` validates it inside
//! apply) and is answered once the stream's own leader reports the new
//! config (see `stream_runtime`), for at most `EDIT_WAIT`. Purge and delete
//! are replicated stream commands proposed on the stream's leader; get reads
//! the leader's replica, so it sees every acknowledged publish.
//!
//! Left out: `deny_delete`/`deny_purge`, erasing payload bytes on disk
//! (sled reclaims them), reading by subject (`nats stream get --last-for`).

use std::sync::Arc;
use std::time::Duration;

use wharf_core::stream::Purge;
use wharf_proto::v1 as pb;
use wharf_raft::NodeId;

use crate::convert::stream_config_to_pb;
use crate::error::{Result, ServerError};
use crate::forward::{onward, onward_admin, retry};
use crate::meta::MetaCommand;
use crate::node::{LocalStream, NodeInner};
use crate::routing::Route;
use crate::stream_sm::{read_message, RemovedCount, StreamCommand};

/// Most subjects listed in one stream info.
pub const MAX_SUBJECTS_LISTED: usize = 10_000;
/// How long an edit waits for the stream's leader to apply the new config.
const EDIT_WAIT: Duration = Duration::from_secs(5);

enum StreamRoute {
    Local(Arc<LocalStream>),
    Remote(NodeId),
}

impl NodeInner {
    /// This node's replica if it leads the stream's group, else the leader.
    async fn stream_route(&self, name: &str) -> Result<StreamRoute> {
        let entry = self.find_stream(name).await?;
        let local = self.local_stream(name);
        match (self.route(local.as_ref().map(|l| &l.group), &entry.replicas)).await? {
            Route::Local => local
                .map(StreamRoute::Local)
                .ok_or_else(|| ServerError::Unavailable("stream not local".into())),
            Route::Remote(n) => Ok(StreamRoute::Remote(n)),
        }
    }

    pub async fn update_stream(
        &self,
        msg: pb::AddStreamRequest,
        hops: u32,
    ) -> Result<pb::StreamInfo> {
        let config = crate::request_check::check_add_stream(&self.config.limits, &msg)?;
        let forwarded = retry(|| async {
            match self.route_meta().await? {
                Route::Local => {
                    let cmd = MetaCommand::UpdateStream {
                        config: config.clone(),
                    };
                    self.meta_write(cmd).await.map(|_| None)
                }
                Route::Remote(n) => Ok(Some(
                    (self.peers.client(n)?)
                        .update_stream(onward_admin(msg.clone(), hops)?)
                        .await?
                        .into_inner(),
                )),
            }
        })
        .await?;
        if let Some(info) = forwarded {
            return Ok(info);
        }
        let want = stream_config_to_pb(&config);
        let deadline = tokio::time::Instant::now() + EDIT_WAIT;
        loop {
            let info = retry(|| self.stream_info(&config.name, hops)).await?;
            if info.config.as_ref() == Some(&want) {
                return Ok(info);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ServerError::Unavailable(format!(
                    "stream {:?}: the catalog has the new config but the stream's leader has not applied it yet",
                    config.name
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn purge_stream(
        &self,
        msg: pb::PurgeStreamRequest,
        hops: u32,
    ) -> Result<pb::PurgeStreamResponse> {
        let purge = Purge {
            filter: Some(msg.filter.clone()).filter(|f| !f.is_empty()),
            keep: Some(msg.keep).filter(|&k| k > 0),
            below_seq: Some(msg.seq).filter(|&s| s > 0),
        };
        retry(|| async {
            match self.stream_route(&msg.stream).await? {
                StreamRoute::Local(l) => {
                    let purged = propose(
                        &l,
                        &StreamCommand::Purge {
                            purge: purge.clone(),
                        },
                    )
                    .await?;
                    Ok(pb::PurgeStreamResponse { purged })
                }
                StreamRoute::Remote(n) => Ok((self.peers.client(n)?)
                    .purge_stream(onward_admin(msg.clone(), hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await
    }

    pub async fn delete_message(
        &self,
        msg: pb::DeleteMessageRequest,
        hops: u32,
    ) -> Result<pb::DeleteMessageResponse> {
        check_seq(msg.seq)?;
        retry(|| async {
            match self.stream_route(&msg.stream).await? {
                StreamRoute::Local(l) => {
                    propose(&l, &StreamCommand::DeleteMsg { seq: msg.seq }).await?;
                    Ok(pb::DeleteMessageResponse {})
                }
                StreamRoute::Remote(n) => Ok((self.peers.client(n)?)
                    .delete_message(onward_admin(msg.clone(), hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await
    }

    pub async fn get_message(
        &self,
        msg: pb::GetMessageRequest,
        hops: u32,
    ) -> Result<pb::StreamMessage> {
        check_seq(msg.seq)?;
        retry(|| async {
            match self.stream_route(&msg.stream).await? {
                StreamRoute::Local(l) => {
                    let not_found = || {
                        ServerError::NotFound(format!(
                            "no message with sequence {} in stream {:?}",
                            msg.seq, msg.stream
                        ))
                    };
                    let stored = (l.sm.lock())
                        .map_err(|_| ServerError::Internal("state lock poisoned".into()))?
                        .state()
                        .get(msg.seq)
                        .is_some();
                    if !stored {
                        return Err(not_found());
                    }
                    let m = read_message(&l.tree, msg.seq)?.ok_or_else(not_found)?;
                    Ok(pb::StreamMessage {
                        subject: m.subject,
                        seq: msg.seq,
                        published_ms: m.published_ms,
                        payload: m.payload,
                        headers: m.headers.into_iter().collect(),
                    })
                }
                StreamRoute::Remote(n) => Ok((self.peers.client(n)?)
                    .get_message(onward(msg.clone(), hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await
    }
}

fn check_seq(seq: u64) -> Result<()> {
    if seq == 0 {
        return Err(ServerError::Invalid(
            "message sequence must be 1 or more".into(),
        ));
    }
    Ok(())
}

/// Propose a purge or delete on the local leader; answers the number removed.
async fn propose(local: &LocalStream, cmd: &StreamCommand) -> Result<u64> {
    let bytes = local.group.write(bincode::serialize(cmd)?).await?;
    bincode::deserialize::<RemovedCount>(&bytes)?
}
