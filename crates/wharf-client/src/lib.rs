//! Async Rust client for Wharf.
//!
//! `Client` talks to any node of a cluster given a list of seed addresses. A
//! call that fails because a node is down or leadership is moving is retried
//! on the next seed with backoff, for a bounded time (`retry_for`), so
//! publishers ride through node loss by themselves. `Consumer` is a worker's
//! session with a durable pull consumer: `fetch` pulls a batch, `ack`
//! acknowledges one message and returns once the ack is committed. A broken
//! session is reopened on the next call; acks are idempotent, so one that may
//! have been lost is simply sent again.
//!
//! `publish` learns from each ack which node stored the subject (the stream's
//! leader) and, when that node is one of the seeds, sends the subject's next
//! publishes straight there, saving the hop a follower would forward it on.
//! Those go on one long-lived `PublishStream` per seed that every publish
//! of the client shares (a "lane", `lanes`), not as a unary call each; a
//! lane that breaks sends its publishes the unary way, which retries.
//! A `Consumer` session likewise moves to the seed the answering node names
//! as the consumer's leader.
//!
//! A publish retried after an unknown outcome may be stored twice unless it
//! carries a message id (`publish_with_id`): the stream's duplicate window
//! then stores it once.
//!
//! TLS and credentials: [`Client::connect`] with [`ConnectOptions`].

mod connect;
mod consumer;
mod error;
mod lanes;
mod routes;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use wharf_proto::v1 as pb;
use wharf_proto::v1::wharf_client::WharfClient;

pub use connect::{ConnectOptions, Credentials, Grpc};
pub use consumer::{Consumer, Message};
pub use error::{ClientError, Result};
pub use tonic::Code;
pub use wharf_proto::v1 as proto;

/// Longest one attempt of a publish or read may take before the next seed is tried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(4);
/// The same for admin calls, which wait for groups to start or move.
const ADMIN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(25);

/// The dev cluster's addresses, the default for every client.
pub const DEFAULT_SERVERS: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    seeds: Vec<(String, Grpc)>,
    current: AtomicUsize,
    retry_for: Duration,
    /// Which seed leads the stream of a subject, learned from publish acks.
    routes: routes::Routes,
    /// One `PublishStream` per seed for publishes whose route is known.
    lanes: lanes::Lanes,
}

impl Client {
    /// A client for the comma-separated `host:port` list. Connections are made lazily.
    pub fn new(servers: &str) -> Result<Client> {
        Client::connect(servers, &ConnectOptions::default())
    }

    /// [`Client::new`] with TLS and credentials.
    pub fn connect(servers: &str, options: &ConnectOptions) -> Result<Client> {
        let credentials = options.credentials()?;
        let mut seeds = Vec::new();
        for addr in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let endpoint = options
                .endpoint(addr)?
                .connect_timeout(Duration::from_secs(1))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(5))
                .keep_alive_timeout(Duration::from_secs(5));
            let client =
                WharfClient::with_interceptor(endpoint.connect_lazy(), credentials.clone())
                    .max_decoding_message_size(64 * 1024 * 1024);
            seeds.push((addr.to_string(), client));
        }
        if seeds.is_empty() {
            return Err(ClientError::InvalidAddress(
                "no server address given".into(),
            ));
        }
        Ok(Client {
            inner: Arc::new(Inner {
                lanes: lanes::Lanes::new(seeds.len()),
                seeds,
                current: AtomicUsize::new(0),
                retry_for: Duration::from_secs(30),
                routes: routes::Routes::default(),
            }),
        })
    }

    /// How long calls keep retrying through failover before giving up.
    pub fn with_retry_for(self, retry_for: Duration) -> Client {
        let inner = Inner {
            seeds: self.inner.seeds.clone(),
            current: AtomicUsize::new(self.inner.current.load(Ordering::Relaxed)),
            retry_for,
            routes: routes::Routes::default(),
            lanes: lanes::Lanes::new(self.inner.seeds.len()),
        };
        Client {
            inner: Arc::new(inner),
        }
    }

    pub(crate) fn retry_for(&self) -> Duration {
        self.inner.retry_for
    }

    /// The gRPC client of the current seed.
    pub(crate) fn current(&self) -> Grpc {
        self.seed(self.current_index())
    }

    /// The index of the current seed.
    pub(crate) fn current_index(&self) -> usize {
        self.inner.current.load(Ordering::Relaxed) % self.inner.seeds.len()
    }

    /// The gRPC client of seed `i` (modulo the number of seeds).
    pub(crate) fn seed(&self, i: usize) -> Grpc {
        self.inner.seeds[i % self.inner.seeds.len()].1.clone()
    }

    /// The address of seed `i` (modulo the number of seeds), as given.
    pub(crate) fn seed_addr(&self, i: usize) -> &str {
        &self.inner.seeds[i % self.inner.seeds.len()].0
    }

    /// The seed with this address (as the cluster knows its nodes), if any.
    pub(crate) fn seed_named(&self, addr: &str) -> Option<usize> {
        self.inner
            .seeds
            .iter()
            .position(|(seed, _)| routes::same_addr(seed, addr))
    }

    /// Move to the next seed after a failure.
    pub(crate) fn rotate(&self) {
        self.inner.current.fetch_add(1, Ordering::Relaxed);
    }

    /// Run a unary call, moving across seeds while the failure is transient.
    async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnMut(Grpc) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_within(ATTEMPT_TIMEOUT, f).await
    }

    /// [`Self::call`] for admin calls, which may wait for groups to start or move.
    async fn call_admin<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnMut(Grpc) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_within(ADMIN_ATTEMPT_TIMEOUT, f).await
    }

    async fn call_within<T, F, Fut>(&self, attempt_timeout: Duration, mut f: F) -> Result<T>
    where
        F: FnMut(Grpc) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.retry_for;
        let mut backoff = Duration::from_millis(50);
        loop {
            // A frozen node (paused process, half-open connection) answers
            // nothing: bound each attempt so the next seed gets its turn.
            let attempt = tokio::time::timeout(attempt_timeout, f(self.current())).await;
            let result = attempt.unwrap_or_else(|_| {
                Err(tonic::Status::unavailable(
                    "no answer within the attempt timeout",
                ))
            });
            match result {
                Ok(r) => return Ok(r.into_inner()),
                Err(s)
                    if error::retryable(&s) && tokio::time::Instant::now() + backoff < deadline =>
                {
                    tracing::debug!("retrying after {}: {}", s.code(), s.message());
                    self.rotate();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                }
                Err(s) => {
                    // Out of time on a transient failure: the next call
                    // starts at the next seed, not again at this one (a
                    // joining node can spend the whole retry window
                    // waiting for a leader it will never learn).
                    if error::retryable(&s) {
                        self.rotate();
                    }
                    return Err(s.into());
                }
            }
        }
    }

    pub async fn add_stream(&self, config: pb::StreamConfig) -> Result<pb::StreamInfo> {
        let req = pb::AddStreamRequest {
            config: Some(config),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.add_stream(req).await }
        })
        .await
    }

    pub async fn stream_info(&self, name: &str) -> Result<pb::StreamInfo> {
        self.get_stream(name, false).await
    }

    /// Stream info from the answering node's own replica, without forwarding
    /// to the leader; use a client of one node to read that node's copy.
    pub async fn stream_info_local(&self, name: &str) -> Result<pb::StreamInfo> {
        self.get_stream(name, true).await
    }

    /// Stream info whose state lists the stored subjects with their message
    /// counts (at most 10,000; `subjects_truncated` says when there are more).
    pub async fn stream_info_subjects(&self, name: &str) -> Result<pb::StreamInfo> {
        let req = pb::GetStreamRequest {
            name: name.to_string(),
            local: false,
            subjects: true,
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.get_stream(req).await }
        })
        .await
    }

    /// Change a stream's editable settings (subjects, limits, discard policy,
    /// duplicate window); returns once the stream applies them.
    pub async fn update_stream(&self, config: pb::StreamConfig) -> Result<pb::StreamInfo> {
        let req = pb::AddStreamRequest {
            config: Some(config),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.update_stream(req).await }
        })
        .await
    }

    /// Remove messages from a stream: those matching `filter` (all with
    /// `None`), all but the newest `keep`, or those below sequence `seq`
    /// (0 for no bound). Returns how many were removed.
    pub async fn purge_stream(
        &self,
        stream: &str,
        filter: Option<&str>,
        keep: u64,
        seq: u64,
    ) -> Result<u64> {
        let req = pb::PurgeStreamRequest {
            stream: stream.to_string(),
            filter: filter.unwrap_or_default().to_string(),
            keep,
            seq,
        };
        let r = self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.purge_stream(req).await }
        });
        Ok(r.await?.purged)
    }

    /// One stored message by sequence.
    pub async fn get_message(&self, stream: &str, seq: u64) -> Result<pb::StreamMessage> {
        let req = pb::GetMessageRequest {
            stream: stream.to_string(),
            seq,
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.get_message(req).await }
        })
        .await
    }

    /// Delete one stored message by sequence.
    pub async fn delete_message(&self, stream: &str, seq: u64) -> Result<()> {
        let req = pb::DeleteMessageRequest {
            stream: stream.to_string(),
            seq,
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.delete_message(req).await }
        })
        .await
        .map(|_| ())
    }

    async fn get_stream(&self, name: &str, local: bool) -> Result<pb::StreamInfo> {
        let req = pb::GetStreamRequest {
            name: name.to_string(),
            local,
            subjects: false,
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.get_stream(req).await }
        })
        .await
    }

    /// Move the leadership of a stream's group (`consumer` None) or of a
    /// consumer's group to another replica.
    pub async fn step_down(
        &self,
        stream: &str,
        consumer: Option<&str>,
    ) -> Result<pb::StepDownResponse> {
        let req = pb::StepDownRequest {
            stream: stream.to_string(),
            consumer: consumer.unwrap_or_default().to_string(),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.step_down(req).await }
        })
        .await
    }

    pub async fn list_streams(&self) -> Result<Vec<pb::StreamInfo>> {
        let r =
            self.call_admin(|mut c| async move { c.list_streams(pb::ListStreamsRequest {}).await });
        Ok(r.await?.streams)
    }

    pub async fn delete_stream(&self, name: &str) -> Result<()> {
        let req = pb::DeleteStreamRequest {
            name: name.to_string(),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.delete_stream(req).await }
        })
        .await
        .map(|_| ())
    }

    /// Publish one message; returns once a majority of the stream's replicas
    /// has it on disk.
    pub async fn publish(
        &self,
        subject: &str,
        payload: impl Into<Bytes>,
    ) -> Result<pb::PublishAck> {
        self.publish_msg(subject, payload, None, HashMap::new())
            .await
    }

    /// Publish with a message id: inside the stream's duplicate window a
    /// second publish with the same id is stored once and acknowledged with
    /// the original sequence and `duplicate: true`. Retries after an unknown
    /// outcome are therefore safe.
    pub async fn publish_with_id(
        &self,
        subject: &str,
        payload: impl Into<Bytes>,
        msg_id: &str,
    ) -> Result<pb::PublishAck> {
        self.publish_msg(subject, payload, Some(msg_id), HashMap::new())
            .await
    }

    /// Publish with headers (and a message id, when not empty).
    pub async fn publish_with_headers(
        &self,
        subject: &str,
        payload: impl Into<Bytes>,
        msg_id: &str,
        headers: HashMap<String, String>,
    ) -> Result<pb::PublishAck> {
        let id = (!msg_id.is_empty()).then_some(msg_id);
        self.publish_msg(subject, payload, id, headers).await
    }

    async fn publish_msg(
        &self,
        subject: &str,
        payload: impl Into<Bytes>,
        msg_id: Option<&str>,
        headers: HashMap<String, String>,
    ) -> Result<pb::PublishAck> {
        let req = pb::PublishRequest {
            subject: subject.to_string(),
            payload: payload.into(),
            msg_id: msg_id.unwrap_or_default().to_string(),
            headers,
        };
        if let Some(i) = self.inner.routes.seed_for(subject) {
            // Straight to the node that stored this subject last time, on
            // its lane; any transient failure (it no longer leads, it is
            // down) forgets that and falls back to the seeds in turn.
            if let Some(answer) = self.inner.lanes.send(i, self.seed(i), req.clone()) {
                match tokio::time::timeout(ATTEMPT_TIMEOUT, answer).await {
                    Ok(Ok(ack)) if ack.error.is_empty() => {
                        if !ack.stored_by.is_empty() {
                            self.learn_route(subject, &ack);
                        }
                        return Ok(ack);
                    }
                    Ok(Ok(ack)) => {
                        let code = tonic::Code::from(ack.error_code as i32);
                        let status = tonic::Status::new(code, ack.error);
                        if !error::retryable(&status) {
                            return Err(status.into());
                        }
                    }
                    Ok(Err(_lane_broke)) => {}
                    Err(_elapsed) => self.inner.lanes.discard(i),
                }
                self.inner.routes.forget(subject);
                return self.publish_unary(subject, req).await;
            }
            let mut c = self.seed(i);
            match tokio::time::timeout(ATTEMPT_TIMEOUT, c.publish(req.clone())).await {
                Ok(Ok(r)) => {
                    let ack = r.into_inner();
                    self.learn_route(subject, &ack);
                    return Ok(ack);
                }
                Ok(Err(s)) if !error::retryable(&s) => return Err(s.into()),
                _ => self.inner.routes.forget(subject),
            }
        }
        self.publish_unary(subject, req).await
    }

    /// Publish through whichever seed answers, moving across seeds while
    /// the failure is transient; learns the subject's route from the ack.
    async fn publish_unary(
        &self,
        subject: &str,
        req: pb::PublishRequest,
    ) -> Result<pb::PublishAck> {
        let ack = self
            .call(|mut c| {
                let req = req.clone();
                async move { c.publish(req).await }
            })
            .await?;
        self.learn_route(subject, &ack);
        Ok(ack)
    }

    /// Remember which seed stored `subject`, when one did.
    fn learn_route(&self, subject: &str, ack: &pb::PublishAck) {
        match self.seed_named(&ack.stored_by) {
            Some(i) => self.inner.routes.learn(subject, i),
            None => self.inner.routes.forget(subject),
        }
    }

    pub async fn add_consumer(
        &self,
        stream: &str,
        config: pb::ConsumerConfig,
    ) -> Result<pb::ConsumerInfo> {
        let req = pb::AddConsumerRequest {
            stream: stream.to_string(),
            config: Some(config),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.add_consumer(req).await }
        })
        .await
    }

    pub async fn update_consumer(
        &self,
        stream: &str,
        config: pb::ConsumerConfig,
    ) -> Result<pb::ConsumerInfo> {
        let req = pb::AddConsumerRequest {
            stream: stream.to_string(),
            config: Some(config),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.update_consumer(req).await }
        })
        .await
    }

    pub async fn consumer_info(&self, stream: &str, name: &str) -> Result<pb::ConsumerInfo> {
        let req = pb::GetConsumerRequest {
            stream: stream.to_string(),
            name: name.to_string(),
        };
        self.call(|mut c| {
            let req = req.clone();
            async move { c.get_consumer(req).await }
        })
        .await
    }

    pub async fn list_consumers(&self, stream: &str) -> Result<Vec<pb::ConsumerInfo>> {
        let req = pb::ListConsumersRequest {
            stream: stream.to_string(),
        };
        let r = self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.list_consumers(req).await }
        });
        Ok(r.await?.consumers)
    }

    pub async fn delete_consumer(&self, stream: &str, name: &str) -> Result<()> {
        let req = pb::DeleteConsumerRequest {
            stream: stream.to_string(),
            name: name.to_string(),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.delete_consumer(req).await }
        })
        .await
        .map(|_| ())
    }

    /// Add node `id` (started with `wharf server --join`) at `addr`.
    pub async fn peer_add(&self, id: u64, addr: &str) -> Result<pb::PeerAddResponse> {
        let req = pb::PeerAddRequest {
            id,
            addr: addr.to_string(),
        };
        self.call_admin(|mut c| {
            let req = req.clone();
            async move { c.peer_add(req).await }
        })
        .await
    }

    /// One round of removing node `id`: answers within about 12 s with
    /// `done` or the groups still moving. Repeat until `done`.
    pub async fn peer_remove(&self, id: u64) -> Result<pb::PeerRemoveResponse> {
        let req = pb::PeerRemoveRequest { id };
        self.call_admin(|mut c| async move { c.peer_remove(req).await })
            .await
    }

    pub async fn cluster_status(&self) -> Result<pb::ClusterStatusResponse> {
        self.call(|mut c| async move { c.cluster_status(pb::ClusterStatusRequest {}).await })
            .await
    }

    /// The seed address (as configured) of the node that leads `stream`
    /// now, when the leader is known and is one of this client's seeds.
    /// For callers that open a `PublishStream` themselves: opened there, its
    /// publishes are stored without the hop between nodes a follower adds.
    /// Leadership can move at any time; a stream opened at a former leader
    /// still works (it forwards).
    pub async fn stream_leader_seed(&self, stream: &str) -> Result<Option<String>> {
        let info = self.stream_info(stream).await?;
        let leader = info.cluster.map(|c| c.leader).unwrap_or(0);
        if leader == 0 {
            return Ok(None);
        }
        let status = self.cluster_status().await?;
        let Some(node) = status.nodes.iter().find(|n| n.id == leader) else {
            return Ok(None);
        };
        Ok(self
            .seed_named(&node.addr)
            .map(|i| self.seed_addr(i).to_string()))
    }

    /// A worker's handle on a durable consumer.
    pub fn consumer(&self, stream: &str, name: &str) -> Consumer {
        Consumer::new(self.clone(), stream, name)
    }
}
