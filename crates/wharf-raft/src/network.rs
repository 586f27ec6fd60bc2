//! Client side of the peer transport: openraft's network traits over tonic.
//!
//! One [`PeerPool`] per node holds ONE lazily connected tonic `Channel` per
//! peer address; every group's RPCs to that peer are multiplexed on it as
//! HTTP/2 streams. Each request frame names its `group_id` and `from_node`; the
//! payload is the bincode encoding of the openraft request.
//!
//! Error mapping (so openraft backs off instead of spinning): transport
//! failures, unknown groups (`NotFound`) and fatal errors reported by the remote
//! Raft become `Unreachable`; deadlines become `Timeout`. Every request carries
//! a deadline taken from `RPCOption::soft_ttl()`.
//!
//! Replication sessions send their AppendEntries over one pipelined stream
//! each (`append_stream`); heartbeats, which openraft sends as a stream of one
//! request, keep the unary `Append` call, as does a session to a peer that
//! does not know the streaming call (an older node during a rolling upgrade).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use openraft::base::BoxFuture;
use openraft::base::BoxStream;
use openraft::errors::NetworkError;
use openraft::errors::RPCError;
use openraft::errors::ReplicationClosed;
use openraft::errors::StreamingError;
use openraft::errors::Timeout;
use openraft::errors::Unreachable;
use openraft::network::RPCOption;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::AppendEntriesResponse;
use openraft::raft::SnapshotResponse;
use openraft::raft::StreamAppendResult;
use openraft::raft::TransferLeaderRequest;
use openraft::raft::TransferLeaderResponse;
use openraft::raft::VoteRequest;
use openraft::raft::VoteResponse;
use openraft::BasicNode;
use openraft::OptionalSend;
use openraft::RPCTypes;
use openraft::RaftNetworkFactory;
use openraft::RaftNetworkV2;
use serde::de::DeserializeOwned;
use serde::Serialize;
use wharf_proto::v1::raft::raft_transport_client::RaftTransportClient;
use wharf_proto::v1::raft::RaftFrame;
use wharf_proto::v1::raft::SnapshotChunk;

use crate::append_stream;
use crate::append_stream::StreamErrors;
use crate::append_stream::MIN_APPEND_DEADLINE;
use crate::peer_auth::PeerChannel;
use crate::peer_auth::PeerCredentials;
use crate::types::decode;
use crate::types::encode;
use crate::types::Snapshot;
use crate::types::SnapshotData;
use crate::types::TypeConfig;
use crate::types::Vote;
use crate::types::WireResult;
use crate::GroupId;
use crate::NodeId;

/// Size of one InstallSnapshot chunk.
pub(crate) const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest message either side decodes (AppendEntries batches can be big).
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// One tonic channel per peer address, shared by every group of the node.
pub(crate) struct PeerPool {
    node_id: NodeId,
    bind_ip: Option<std::net::IpAddr>,
    /// Set once, before the first group starts; none means plain HTTP/2.
    credentials: std::sync::OnceLock<PeerCredentials>,
    clients: Mutex<HashMap<String, RaftTransportClient<PeerChannel>>>,
}

impl PeerPool {
    pub(crate) fn new(node_id: NodeId, bind_ip: Option<std::net::IpAddr>) -> Self {
        PeerPool {
            node_id,
            bind_ip,
            credentials: std::sync::OnceLock::new(),
            clients: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Use `credentials` for every peer channel. Only the first call counts.
    pub(crate) fn set_credentials(&self, credentials: PeerCredentials) -> Result<(), String> {
        self.credentials
            .set(credentials)
            .map_err(|_| "peer credentials are already set".to_string())
    }

    /// The client for `addr` ("host:port"), creating its channel on first use.
    /// The channel connects lazily and reconnects by itself.
    pub(crate) fn client(&self, addr: &str) -> Result<RaftTransportClient<PeerChannel>, String> {
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| "peer pool lock poisoned".to_string())?;
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let credentials = self.credentials.get().cloned().unwrap_or_default();
        let endpoint = credentials
            .endpoint(addr)?
            .tcp_nodelay(true)
            .local_address(self.bind_ip)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let client = RaftTransportClient::with_interceptor(
            endpoint.connect_lazy(),
            credentials.interceptor(),
        )
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
        clients.insert(addr.to_string(), client.clone());
        Ok(client)
    }
}

/// Builds one [`PeerNetwork`] per (group, target) for openraft.
pub(crate) struct NetworkFactory {
    pub(crate) group_id: GroupId,
    pub(crate) pool: Arc<PeerPool>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        self.network(target, node, false)
    }

    async fn new_heartbeat_client(&mut self, target: NodeId, node: &BasicNode) -> Self::Network {
        self.network(target, node, true)
    }
}

impl NetworkFactory {
    fn network(&self, target: NodeId, node: &BasicNode, heartbeat: bool) -> PeerNetwork {
        PeerNetwork {
            target,
            addr: node.addr.clone(),
            group_id: self.group_id,
            pool: self.pool.clone(),
            unary_appends: Arc::new(AtomicBool::new(heartbeat)),
        }
    }
}

/// openraft's connection from one group to one target node.
pub(crate) struct PeerNetwork {
    target: NodeId,
    addr: String,
    group_id: GroupId,
    pool: Arc<PeerPool>,
    /// Send AppendEntries as unary calls: set for heartbeats, and once the
    /// peer answered that it has no `AppendStream`.
    unary_appends: Arc<AtomicBool>,
}

/// The unary RPCs of the transport.
#[derive(Clone, Copy)]
enum Rpc {
    Append,
    Vote,
    PreVote,
    TransferLeader,
}

impl Rpc {
    fn rpc_type(self) -> RPCTypes {
        match self {
            Rpc::Append => RPCTypes::AppendEntries,
            Rpc::Vote | Rpc::PreVote => RPCTypes::Vote,
            Rpc::TransferLeader => RPCTypes::TransferLeader,
        }
    }
}

fn unreachable(msg: impl ToString) -> RPCError<TypeConfig> {
    RPCError::Unreachable(Unreachable::from_string(msg))
}

impl PeerNetwork {
    fn timeout_error(&self, rpc: RPCTypes, ttl: Duration) -> Timeout<TypeConfig> {
        Timeout {
            action: rpc,
            id: self.pool.node_id(),
            target: self.target,
            timeout: ttl,
        }
    }

    fn status_error(
        &self,
        rpc: RPCTypes,
        ttl: Duration,
        status: tonic::Status,
    ) -> RPCError<TypeConfig> {
        match status.code() {
            tonic::Code::DeadlineExceeded => RPCError::Timeout(self.timeout_error(rpc, ttl)),
            _ => unreachable(format!("{} ({}): {}", self.target, self.addr, status)),
        }
    }

    async fn unary<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        rpc: Rpc,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let payload = encode(req).map_err(|e| RPCError::Network(NetworkError::from_string(e)))?;
        let mut client = self.pool.client(&self.addr).map_err(unreachable)?;
        let mut request = tonic::Request::new(RaftFrame {
            group_id: self.group_id,
            payload: Bytes::from(payload),
            from_node: self.pool.node_id(),
        });
        request.set_timeout(ttl);
        let call = async move {
            match rpc {
                Rpc::Append => client.append(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::PreVote => client.pre_vote(request).await,
                Rpc::TransferLeader => client.transfer_leader(request).await,
            }
        };
        let frame = match tokio::time::timeout(ttl, call).await {
            Err(_) => return Err(RPCError::Timeout(self.timeout_error(rpc.rpc_type(), ttl))),
            Ok(Err(status)) => return Err(self.status_error(rpc.rpc_type(), ttl, status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        let result: WireResult<Resp> =
            decode(&frame.payload).map_err(|e| RPCError::Network(NetworkError::from_string(e)))?;
        result.map_err(|remote| {
            unreachable(format!("remote raft error on {}: {remote}", self.target))
        })
    }

    /// Opens a pipelined `AppendStream` session (see `append_stream`).
    async fn open_append_stream<'s, S>(
        &'s self,
        input: S,
        option: RPCOption,
    ) -> Result<
        BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
        RPCError<TypeConfig>,
    >
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        // openraft sleeps out its backoff (after a failed session) inside
        // the making of a request: take the first one before connecting, or
        // a peer that refuses connections is retried in a tight loop.
        let mut input = input;
        let Some(first) = input.next().await else {
            return Ok(Box::pin(futures::stream::empty()));
        };
        tracing::debug!(
            group_id = self.group_id,
            target = self.target,
            "append stream: opening"
        );
        let input = futures::stream::once(futures::future::ready(first)).chain(input);
        let ttl = option.soft_ttl().max(MIN_APPEND_DEADLINE);
        let unanswered = Arc::default();
        let failed = Arc::default();
        let frames = append_stream::request_frames(
            input,
            self.group_id,
            self.pool.node_id(),
            Arc::clone(&unanswered),
            Arc::clone(&failed),
        );
        let mut request = tonic::Request::new(frames);
        let group = tonic::metadata::MetadataValue::from(self.group_id);
        request
            .metadata_mut()
            .insert(append_stream::GROUP_HEADER, group);
        let mut client = self.pool.client(&self.addr).map_err(unreachable)?;
        let responses = match tokio::time::timeout(ttl, client.append_stream(request)).await {
            Err(_) => return Err(StreamErrors::timeout(self, ttl)),
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                // An older peer: unary calls from now on; openraft retries a
                // network error at once.
                self.unary_appends.store(true, Ordering::Relaxed);
                return Err(RPCError::Network(NetworkError::from_string(format!(
                    "{} has no AppendStream; using unary appends",
                    self.target
                ))));
            }
            Ok(Err(status)) => return Err(StreamErrors::status(self, ttl, status)),
            Ok(Ok(resp)) => resp.into_inner(),
        };
        Ok(append_stream::answers(
            responses, self, ttl, unanswered, failed,
        ))
    }

    async fn send_snapshot(
        &self,
        vote: Vote,
        snapshot: Snapshot,
        ttl: Duration,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let meta = encode(&(vote, snapshot.meta))
            .map_err(|e| StreamingError::Network(NetworkError::from_string(e)))?;
        // Reading back what the state machine left out of its stored
        // snapshot (a stream's payloads) is blocking sled I/O.
        let data = tokio::task::spawn_blocking(move || snapshot.snapshot.into_transfer_bytes())
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|e| {
                StreamingError::Network(NetworkError::from_string(format!(
                    "snapshot for transfer: {e}"
                )))
            })?;
        let data = Bytes::from(data);
        let n_chunks = data.len().div_ceil(SNAPSHOT_CHUNK_BYTES).max(1);
        let mut chunks = Vec::with_capacity(n_chunks);
        for i in 0..n_chunks {
            let start = i * SNAPSHOT_CHUNK_BYTES;
            let end = (start + SNAPSHOT_CHUNK_BYTES).min(data.len());
            chunks.push(SnapshotChunk {
                group_id: self.group_id,
                meta: if i == 0 {
                    Bytes::from(meta.clone())
                } else {
                    Bytes::new()
                },
                data: data.slice(start..end),
                last: i + 1 == n_chunks,
                from_node: self.pool.node_id(),
            });
        }
        // The deadline grows with the size: `ttl` per chunk.
        let deadline = ttl.saturating_mul(n_chunks as u32);
        let mut client = self
            .pool
            .client(&self.addr)
            .map_err(|e| StreamingError::Unreachable(Unreachable::from_string(e)))?;
        let mut request = tonic::Request::new(futures::stream::iter(chunks));
        request.set_timeout(deadline);
        let frame = match tokio::time::timeout(deadline, client.install_snapshot(request)).await {
            Err(_) => {
                return Err(StreamingError::Timeout(
                    self.timeout_error(RPCTypes::InstallSnapshot, deadline),
                ))
            }
            Ok(Err(status)) => {
                return Err(self
                    .status_error(RPCTypes::InstallSnapshot, deadline, status)
                    .into())
            }
            Ok(Ok(resp)) => resp.into_inner(),
        };
        let result: WireResult<SnapshotResponse<TypeConfig>> = decode(&frame.payload)
            .map_err(|e| StreamingError::Network(NetworkError::from_string(e)))?;
        result.map_err(|remote| {
            StreamingError::Unreachable(Unreachable::from_string(format!(
                "remote raft error on {}: {remote}",
                self.target
            )))
        })
    }
}

impl StreamErrors for PeerNetwork {
    fn timeout(&self, ttl: Duration) -> RPCError<TypeConfig> {
        RPCError::Timeout(self.timeout_error(RPCTypes::AppendEntries, ttl))
    }

    fn status(&self, ttl: Duration, status: tonic::Status) -> RPCError<TypeConfig> {
        self.status_error(RPCTypes::AppendEntries, ttl, status)
    }

    fn remote(&self, message: String) -> RPCError<TypeConfig> {
        unreachable(format!("remote raft error on {}: {message}", self.target))
    }
}

impl RaftNetworkV2<TypeConfig> for PeerNetwork {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // openraft gives replication the heartbeat interval (its soft TTL is
        // 3/4 of it: 112 ms at the default 150 ms). A follower that must
        // fsync a large catch-up batch on a loaded machine can need longer,
        // and a replication stream that always times out never catches the
        // follower up (seen in a 30-minute chaos run: a 20 s stall).
        // Heartbeats keep their own, shorter, openraft-side timeout.
        let ttl = option.soft_ttl().max(MIN_APPEND_DEADLINE);
        self.unary(Rpc::Append, &rpc, ttl).await
    }

    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        if self.unary_appends.load(Ordering::Relaxed) {
            return openraft::network::stream_append_sequential(self, input, option);
        }
        Box::pin(self.open_append_stream(input, option))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(Rpc::Vote, &rpc, option.soft_ttl()).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(Rpc::PreVote, &rpc, option.soft_ttl()).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            res = self.send_snapshot(vote, snapshot, option.soft_ttl()) => res,
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(Rpc::TransferLeader, &req, option.soft_ttl())
            .await
    }
}
