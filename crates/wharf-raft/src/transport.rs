//! Server side of the peer transport: the `RaftTransport` gRPC service.
//!
//! Each frame names a group; the service looks the group up in the node's
//! registry and hands the decoded openraft request to that group's Raft. The
//! reply frame carries the bincode `WireResult` of the call: the openraft
//! response, or the text of the remote (fatal) error. `AppendStream` names
//! its group in a request header and answers a stream of frames
//! (`append_stream`).
//!
//! Invariants:
//! - An unknown group answers `NOT_FOUND` (the caller backs off); a frame that
//!   does not decode answers `INVALID_ARGUMENT`. Nothing here panics on input.
//! - The service holds only a weak reference to the node, so a running gRPC
//!   server never keeps a shut-down node (and its sled `Db`) alive.
//!
//! Not here: authentication of peers. The server crate wraps this service in
//! its peer guard (mutual TLS or the cluster secret, see `wharf-server`
//! `security`); without either, the node trusts its cluster network.

use std::sync::Arc;
use std::sync::Weak;

use bytes::Bytes;
use futures::StreamExt;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::VoteRequest;
use serde::Serialize;
use tonic::Request;
use tonic::Response;
use tonic::Status;
use tonic::Streaming;
use wharf_proto::v1::raft::raft_transport_server::RaftTransport;
use wharf_proto::v1::raft::RaftFrame;
use wharf_proto::v1::raft::SnapshotChunk;

use crate::append_stream;
use crate::append_stream::AnswerFrames;
use crate::append_stream::GROUP_HEADER;
use crate::types::decode;
use crate::types::encode;
use crate::types::Snapshot;
use crate::types::SnapshotData;
use crate::types::SnapshotMeta;
use crate::types::TypeConfig;
use crate::types::Vote;
use crate::types::WharfRaft;
use crate::types::WireResult;
use crate::Group;
use crate::GroupId;
use crate::RaftNode;

/// The gRPC service answering peers' Raft RPCs for every group of a node.
pub struct TransportService {
    node: Weak<RaftNode>,
}

impl TransportService {
    pub(crate) fn new(node: &Arc<RaftNode>) -> Self {
        TransportService {
            node: Arc::downgrade(node),
        }
    }

    fn node(&self) -> Result<Arc<RaftNode>, Status> {
        self.node
            .upgrade()
            .ok_or_else(|| Status::unavailable("node is shut down"))
    }

    fn group(&self, group_id: GroupId) -> Result<Group, Status> {
        self.node()?
            .group(group_id)
            .ok_or_else(|| Status::not_found(format!("raft group {group_id} not found")))
    }

    fn raft(&self, group_id: GroupId) -> Result<WharfRaft, Status> {
        self.group(group_id).map(|g| g.raft().clone())
    }

    fn reply<T: Serialize>(
        &self,
        group_id: GroupId,
        result: WireResult<T>,
    ) -> Result<Response<RaftFrame>, Status> {
        let payload = encode(&result).map_err(Status::internal)?;
        let from_node = self.node.upgrade().map(|n| n.node_id()).unwrap_or_default();
        Ok(Response::new(RaftFrame {
            group_id,
            payload: Bytes::from(payload),
            from_node,
        }))
    }
}

fn bad_frame(e: String) -> Status {
    Status::invalid_argument(e)
}

#[tonic::async_trait]
impl RaftTransport for TransportService {
    async fn append(&self, request: Request<RaftFrame>) -> Result<Response<RaftFrame>, Status> {
        let arrived = tokio::time::Instant::now();
        let frame = request.into_inner();
        let raft = self.raft(frame.group_id)?;
        let rpc: AppendEntriesRequest<TypeConfig> = decode(&frame.payload).map_err(bad_frame)?;
        let carries_entries = !rpc.entries.is_empty();
        let res = raft.append_entries(rpc).await.map_err(|e| e.to_string());
        // The slow-follower fault (tests only, see `fault`).
        if let Some(delay) = self.node()?.slow_append().filter(|_| carries_entries) {
            tokio::time::sleep_until(arrived + delay).await;
        }
        self.reply(frame.group_id, res)
    }

    type AppendStreamStream = AnswerFrames;

    async fn append_stream(
        &self,
        request: Request<Streaming<RaftFrame>>,
    ) -> Result<Response<AnswerFrames>, Status> {
        let group_id: GroupId = request
            .metadata()
            .get(GROUP_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Status::invalid_argument(format!("missing {GROUP_HEADER} header")))?;
        let node = self.node()?;
        if node.no_append_stream() {
            return Err(Status::unimplemented("AppendStream is refused (fault)"));
        }
        let group = self.group(group_id)?;
        // A stream outlives neither its group (a stopped group's Raft would be
        // kept alive by an idle stream) nor, through that, a node shutdown
        // (a graceful server stop waits for every open stream): once the
        // core is gone, the requests end, and so do the answers.
        let requests = request.into_inner().take_until(group.core_gone());
        let answers = append_stream::serve(
            group.raft(),
            group_id,
            node.node_id(),
            requests,
            node.slow_append(),
        );
        let answers = Box::pin(answers.take_until(group.core_gone()));
        Ok(Response::new(answers))
    }

    async fn vote(&self, request: Request<RaftFrame>) -> Result<Response<RaftFrame>, Status> {
        let frame = request.into_inner();
        let raft = self.raft(frame.group_id)?;
        let rpc: VoteRequest<TypeConfig> = decode(&frame.payload).map_err(bad_frame)?;
        let res = raft.vote(rpc).await.map_err(|e| e.to_string());
        self.reply(frame.group_id, res)
    }

    async fn pre_vote(&self, request: Request<RaftFrame>) -> Result<Response<RaftFrame>, Status> {
        let frame = request.into_inner();
        let raft = self.raft(frame.group_id)?;
        let rpc: VoteRequest<TypeConfig> = decode(&frame.payload).map_err(bad_frame)?;
        let res = raft.pre_vote(rpc).await.map_err(|e| e.to_string());
        self.reply(frame.group_id, res)
    }

    async fn transfer_leader(
        &self,
        request: Request<RaftFrame>,
    ) -> Result<Response<RaftFrame>, Status> {
        let frame = request.into_inner();
        let raft = self.raft(frame.group_id)?;
        let rpc: TransferLeaderRequest<TypeConfig> = decode(&frame.payload).map_err(bad_frame)?;
        let res = raft
            .handle_transfer_leader(rpc)
            .await
            .map_err(|e| e.to_string());
        self.reply(frame.group_id, res)
    }

    async fn ping(&self, _request: Request<RaftFrame>) -> Result<Response<RaftFrame>, Status> {
        let node = self.node()?;
        Ok(Response::new(RaftFrame {
            group_id: 0,
            payload: Bytes::new(),
            from_node: node.node_id(),
        }))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<RaftFrame>, Status> {
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        let group_id = first.group_id;
        let raft = self.raft(group_id)?;
        let (vote, meta): (Vote, SnapshotMeta) = decode(&first.meta).map_err(bad_frame)?;
        let mut data = first.data.to_vec();
        let mut last = first.last;
        while !last {
            let chunk = stream.message().await?.ok_or_else(|| {
                Status::invalid_argument("snapshot stream ended before its last chunk")
            })?;
            if chunk.group_id != group_id {
                return Err(Status::invalid_argument(
                    "snapshot chunks name different groups",
                ));
            }
            data.extend_from_slice(&chunk.data);
            last = chunk.last;
        }
        let (from_node, bytes) = (first.from_node, data.len());
        let last_index = meta.last_log_id.as_ref().map_or(0, |l| l.index);
        let snapshot = Snapshot {
            meta,
            snapshot: SnapshotData::received(data),
        };
        let res = raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| e.to_string());
        if res.is_ok() {
            // Tests look for this line: a catch-up by snapshot, not by log.
            tracing::info!(
                group_id,
                from_node,
                last_index,
                bytes,
                "installed a snapshot sent by the leader"
            );
        }
        self.reply(group_id, res)
    }
}
