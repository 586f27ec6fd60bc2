//! The public gRPC service (`wharf.v1.Wharf`) and the node's gRPC server.
//!
//! Handlers validate input, then either serve the call here (this node leads
//! the group) or forward it to the node that does (see `routing`, `forward`).
//! Every error leaves through `impl From<ServerError> for Status`.
//! Every handler first checks the caller's permission for what it is about to
//! do (`auth::authorize`), before any state changes; `security` attaches the
//! caller's identity and guards the Raft transport.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status, Streaming};
use wharf_proto::v1 as pb;
use wharf_proto::v1::wharf_server::{Wharf, WharfServer};

use crate::auth::{authorize, Action, Principal};
use crate::error::{Result, ServerError};
use crate::forward::{self, hops, onward, onward_admin, retry};
use crate::meta::MetaCommand;
use crate::node::NodeInner;
use crate::publish_pipe::enqueue_local;
use crate::publish_session::publish_acks;
use crate::request_check::check_publish;
use crate::request_check::{check_add_consumer, check_add_stream, check_consume_open};
use crate::routing::Route;
use crate::util::now_ms;

/// The admin target of cluster membership calls: no stream is named
/// `$cluster`, so only a user allowed to administer every stream (`>`) may.
const CLUSTER_ADMIN: &str = "$cluster";

/// Publishes in flight on one PublishStream call.
const PUBLISH_WINDOW: usize = 1024;

/// Streams a connection's peer may reset before this node accepted them,
/// before the connection is closed (hyper's rapid-reset guard; its default is
/// 20). Raft peers reset many such streams when this node is slow for a few
/// seconds (every heartbeat that times out is one), and at 20 the guard shut
/// the connection every ten seconds or so, taking a snapshot being sent over
/// it along: a new node never caught up (docs/RELIABILITY.md, bug 7). Still
/// a bound, so a flood of resets still closes the connection.
const MAX_PENDING_ACCEPT_RESETS: usize = 1024;
/// How long serving waits for the peers' addresses to resolve the first time.
const FIRST_PEER_RESOLVE: Duration = Duration::from_secs(2);

pub async fn serve(
    node: Arc<NodeInner>,
    listener: tokio::net::TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(crate::health::report(
        node.clone(),
        reporter,
        shutdown.clone(),
    ));
    let (reflection, reflection_alpha) = crate::reflection::services().unzip();
    let metered = crate::grpc_metrics::GrpcMetricsLayer::new(node.grpc_metrics.clone());
    let limits = node.config.limits.clone();
    // Oversize requests are refused by tonic itself (OUT_OF_RANGE, both sizes
    // in the message); calls on connections over the per-IP limit by the
    // connection interceptor (RESOURCE_EXHAUSTED), then unauthenticated ones
    // by the client guard.
    let wharf = WharfServer::new(WharfService { node: node.clone() })
        .max_decoding_message_size(limits.max_request_bytes);
    let wharf = InterceptedService::new(wharf, node.security.client_guard());
    let wharf = InterceptedService::new(wharf, crate::conn_limit::refuse_over_limit);
    let transport =
        InterceptedService::new(node.raft.transport_service(), node.security.peer_guard());
    let peer_ips = Arc::new(crate::conn_limit::PeerIps::default());
    let known = Arc::downgrade(&node);
    let known_addrs = move || {
        (known.upgrade())
            .map(|n| n.peers.known_addrs())
            .unwrap_or_default()
    };
    // Peers' IPs known before the first connection is accepted (bounded: a
    // name that does not resolve yet is left to the refresh loop).
    let first = peer_ips.resolve(known_addrs());
    if tokio::time::timeout(FIRST_PEER_RESOLVE, first)
        .await
        .is_err()
    {
        tracing::warn!(
            "peer addresses not all resolved within {FIRST_PEER_RESOLVE:?}; serving anyway"
        );
    }
    tokio::spawn(peer_ips.clone().refresh_loop(known_addrs, shutdown.clone()));
    let incoming = crate::conn_limit::incoming(
        listener,
        peer_ips,
        Default::default(),
        limits.max_connections_per_ip,
    );
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = node.security.server_tls() {
        builder = match builder.tls_config(tls) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!("TLS settings refused, not serving: {e}");
                return;
            }
        };
    }
    let result = builder
        .tcp_nodelay(true)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESETS))
        .http2_keepalive_interval(Some(Duration::from_secs(5)))
        .http2_keepalive_timeout(Some(Duration::from_secs(5)))
        .layer(metered)
        .add_service(health)
        .add_optional_service(reflection)
        .add_optional_service(reflection_alpha)
        .add_service(wharf)
        .add_service(transport)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.changed().await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!("gRPC server stopped: {e}");
    }
}

pub struct WharfService {
    pub(crate) node: Arc<NodeInner>,
}

impl WharfService {
    /// The service over `node`, also used inside the node (dead-letter copies).
    pub(crate) fn new(node: Arc<NodeInner>) -> Self {
        WharfService { node }
    }
}

pub(crate) type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

impl WharfService {
    async fn publish_once(&self, msg: pb::PublishRequest, hops: u32) -> Result<pb::PublishAck> {
        let node = &self.node;
        let entry = match node.with_catalog(|c| c.stream_for_subject(&msg.subject).cloned()) {
            Some(e) => e,
            None => match node.route_meta().await? {
                Route::Local => {
                    return Err(ServerError::NotFound(format!(
                        "no stream matches subject {:?}",
                        msg.subject
                    )))
                }
                Route::Remote(n) => {
                    return Ok(node
                        .peers
                        .client(n)?
                        .publish(onward(msg, hops)?)
                        .await?
                        .into_inner())
                }
            },
        };
        let local = node.local_stream(&entry.config.name);
        match node
            .route(local.as_ref().map(|l| &l.group), &entry.replicas)
            .await?
        {
            Route::Local => {
                let local =
                    local.ok_or_else(|| ServerError::Unavailable("stream not local".into()))?;
                let mut ack = enqueue_local(&local, entry.config.name, msg).await?.await?;
                // Lets the client send this subject here next time.
                ack.stored_by = node.peers.addr_of(node.config.node_id).unwrap_or_default();
                Ok(ack)
            }
            Route::Remote(n) => Ok(node
                .peers
                .client(n)?
                .publish(onward(msg, hops)?)
                .await?
                .into_inner()),
        }
    }

    pub(crate) async fn publish(
        &self,
        msg: pb::PublishRequest,
        hops: u32,
    ) -> Result<pb::PublishAck> {
        check_publish(&self.node.config.limits, &msg)?;
        retry(|| self.publish_once(msg.clone(), hops)).await
    }

    async fn add_consumer_here(
        &self,
        stream: &str,
        config: wharf_core::consumer::ConsumerConfig,
    ) -> Result<()> {
        let name = config.name.clone();
        let gid = self
            .node
            .meta_write(self.node.config.limits.bound(MetaCommand::AddConsumer {
                stream: stream.to_string(),
                config,
                now_ms: now_ms(),
            }))
            .await?;
        self.node.wait_group_ready(gid).await;
        self.node.wait_consumer_started(stream, &name).await;
        self.node.wait_retention_registered(stream, &name).await
    }
}

#[tonic::async_trait]
impl Wharf for WharfService {
    async fn add_stream(
        &self,
        req: Request<pb::AddStreamRequest>,
    ) -> Result<Response<pb::StreamInfo>, Status> {
        let hops = hops(&req);
        let name = req.get_ref().config.as_ref().map(|c| c.name.as_str());
        authorize(&req, Action::admin(name.unwrap_or_default()))?;
        let msg = req.into_inner();
        let node = &self.node;
        let config = check_add_stream(&node.config.limits, &msg)?;
        let info = retry(|| async {
            match node.route_meta().await? {
                Route::Local => {
                    let gid = node
                        .meta_write(node.config.limits.bound(MetaCommand::AddStream {
                            config: config.clone(),
                            now_ms: now_ms(),
                        }))
                        .await?;
                    node.wait_group_ready(gid).await;
                    node.stream_info(&config.name, hops).await
                }
                Route::Remote(n) => Ok(node
                    .peers
                    .client(n)?
                    .add_stream(onward_admin(msg.clone(), hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await?;
        Ok(Response::new(info))
    }

    async fn get_stream(
        &self,
        req: Request<pb::GetStreamRequest>,
    ) -> Result<Response<pb::StreamInfo>, Status> {
        authorize(&req, Action::Read)?;
        let hops = hops(&req);
        let msg = req.into_inner();
        if msg.local {
            self.node.find_stream(&msg.name).await?;
            let info = self.node.local_stream_info_with(&msg.name, msg.subjects)?;
            return Ok(Response::new(info));
        }
        let info = retry(|| self.node.stream_info_with(&msg.name, hops, msg.subjects)).await?;
        Ok(Response::new(info))
    }

    async fn list_streams(
        &self,
        req: Request<pb::ListStreamsRequest>,
    ) -> Result<Response<pb::ListStreamsResponse>, Status> {
        authorize(&req, Action::Read)?;
        let hops = hops(&req);
        let node = &self.node;
        if let Route::Remote(n) = node.route_meta().await? {
            if hops < crate::forward::MAX_HOPS {
                let r = node
                    .peers
                    .client(n)?
                    .list_streams(onward_admin(req.into_inner(), hops)?)
                    .await;
                return Ok(r.map_err(ServerError::from)?);
            }
        }
        let mut streams = Vec::new();
        for name in node.catalog().streams.keys() {
            streams.push(retry(|| node.stream_info(name, hops)).await?);
        }
        Ok(Response::new(pb::ListStreamsResponse { streams }))
    }

    async fn delete_stream(
        &self,
        req: Request<pb::DeleteStreamRequest>,
    ) -> Result<Response<pb::DeleteStreamResponse>, Status> {
        authorize(&req, Action::admin(&req.get_ref().name))?;
        let hops = hops(&req);
        let msg = req.into_inner();
        let node = &self.node;
        retry(|| async {
            match node.route_meta().await? {
                Route::Local => {
                    node.meta_write(MetaCommand::DeleteStream {
                        name: msg.name.clone(),
                    })
                    .await?;
                    Ok(pb::DeleteStreamResponse {})
                }
                Route::Remote(n) => Ok(node
                    .peers
                    .client(n)?
                    .delete_stream(onward_admin(msg.clone(), hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await?;
        Ok(Response::new(pb::DeleteStreamResponse {}))
    }

    async fn update_stream(
        &self,
        req: Request<pb::AddStreamRequest>,
    ) -> Result<Response<pb::StreamInfo>, Status> {
        let name = req.get_ref().config.as_ref().map(|c| c.name.as_str());
        authorize(&req, Action::admin(name.unwrap_or_default()))?;
        let hops = hops(&req);
        let info = self.node.update_stream(req.into_inner(), hops).await?;
        Ok(Response::new(info))
    }

    async fn purge_stream(
        &self,
        req: Request<pb::PurgeStreamRequest>,
    ) -> Result<Response<pb::PurgeStreamResponse>, Status> {
        authorize(&req, Action::admin(&req.get_ref().stream))?;
        let hops = hops(&req);
        Ok(Response::new(
            self.node.purge_stream(req.into_inner(), hops).await?,
        ))
    }

    async fn get_message(
        &self,
        req: Request<pb::GetMessageRequest>,
    ) -> Result<Response<pb::StreamMessage>, Status> {
        authorize(&req, Action::admin(&req.get_ref().stream))?;
        let hops = hops(&req);
        Ok(Response::new(
            self.node.get_message(req.into_inner(), hops).await?,
        ))
    }

    async fn delete_message(
        &self,
        req: Request<pb::DeleteMessageRequest>,
    ) -> Result<Response<pb::DeleteMessageResponse>, Status> {
        authorize(&req, Action::admin(&req.get_ref().stream))?;
        let hops = hops(&req);
        Ok(Response::new(
            self.node.delete_message(req.into_inner(), hops).await?,
        ))
    }

    async fn publish(
        &self,
        req: Request<pb::PublishRequest>,
    ) -> Result<Response<pb::PublishAck>, Status> {
        authorize(&req, Action::publish(&req.get_ref().subject))?;
        let hops = hops(&req);
        Ok(Response::new(self.publish(req.into_inner(), hops).await?))
    }

    type PublishStreamStream = ResponseStream<pb::PublishAck>;

    async fn publish_stream(
        &self,
        req: Request<Streaming<pb::PublishRequest>>,
    ) -> Result<Response<Self::PublishStreamStream>, Status> {
        let principal = Principal::of(&req)?;
        let hops = hops(&req);
        let service = Arc::new(WharfService {
            node: self.node.clone(),
        });
        // The acks are a stream the call's own task polls (through
        // `end_on_shutdown`), which also reads the requests: a spawned task
        // in between would be one more thread woken per ack.
        let acks = publish_acks(service, principal, hops, req.into_inner(), PUBLISH_WINDOW);
        let acks = Box::pin(acks);
        Ok(Response::new(crate::stream_end::end_on_shutdown(
            self.node.shutdown.clone(),
            acks,
        )))
    }

    async fn add_consumer(
        &self,
        req: Request<pb::AddConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        authorize(&req, Action::admin(&req.get_ref().stream))?;
        let hops = hops(&req);
        let msg = req.into_inner();
        let config = check_add_consumer(&msg)?;
        let node = &self.node;
        let info = retry(|| async {
            match node.route_meta().await? {
                Route::Local => {
                    self.add_consumer_here(&msg.stream, config.clone()).await?;
                    node.consumer_info(&msg.stream, &config.name, hops).await
                }
                Route::Remote(n) => Ok(node
                    .peers
                    .client(n)?
                    .add_consumer(onward_admin(msg.clone(), hops)?)
                    .await?
                    .into_inner()),
            }
        })
        .await?;
        Ok(Response::new(info))
    }

    async fn update_consumer(
        &self,
        req: Request<pb::AddConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        authorize(&req, Action::admin(&req.get_ref().stream))?;
        let hops = hops(&req);
        let msg = req.into_inner();
        let config = check_add_consumer(&msg)?;
        let node = &self.node;
        retry(|| async {
            match node.route_meta().await? {
                Route::Local => {
                    let cmd = MetaCommand::UpdateConsumer {
                        stream: msg.stream.clone(),
                        config: config.clone(),
                    };
                    node.meta_write(cmd).await.map(|_| ())
                }
                Route::Remote(n) => node
                    .peers
                    .client(n)?
                    .update_consumer(onward_admin(msg.clone(), hops)?)
                    .await
                    .map(|_| ())
                    .map_err(ServerError::from),
            }
        })
        .await?;
        // The consumer's leader applies the new config shortly after the
        // catalog has it; answer once it reads back.
        let want = crate::convert::consumer_config_to_pb(&config);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let info = retry(|| node.consumer_info(&msg.stream, &config.name, hops)).await?;
            if info.config.as_ref() == Some(&want) || tokio::time::Instant::now() > deadline {
                return Ok(Response::new(info));
            }
            let mut version = node.meta_version.clone();
            let _ = tokio::time::timeout(Duration::from_millis(50), version.changed()).await;
        }
    }

    async fn get_consumer(
        &self,
        req: Request<pb::GetConsumerRequest>,
    ) -> Result<Response<pb::ConsumerInfo>, Status> {
        authorize(&req, Action::Read)?;
        let hops = hops(&req);
        let msg = req.into_inner();
        let info = retry(|| self.node.consumer_info(&msg.stream, &msg.name, hops)).await?;
        Ok(Response::new(info))
    }

    async fn list_consumers(
        &self,
        req: Request<pb::ListConsumersRequest>,
    ) -> Result<Response<pb::ListConsumersResponse>, Status> {
        authorize(&req, Action::Read)?;
        let hops = hops(&req);
        let stream = req.into_inner().stream;
        let node = &self.node;
        node.find_stream(&stream).await?;
        let names: Vec<String> = node
            .catalog()
            .consumers_of(&stream)
            .map(|c| c.config.name.clone())
            .collect();
        let mut consumers = Vec::new();
        for name in names {
            consumers.push(retry(|| node.consumer_info(&stream, &name, hops)).await?);
        }
        Ok(Response::new(pb::ListConsumersResponse { consumers }))
    }

    async fn delete_consumer(
        &self,
        req: Request<pb::DeleteConsumerRequest>,
    ) -> Result<Response<pb::DeleteConsumerResponse>, Status> {
        authorize(&req, Action::admin(&req.get_ref().stream))?;
        let hops = hops(&req);
        let msg = req.into_inner();
        let node = &self.node;
        retry(|| async {
            match node.route_meta().await? {
                Route::Local => {
                    let cmd = MetaCommand::DeleteConsumer {
                        stream: msg.stream.clone(),
                        name: msg.name.clone(),
                    };
                    node.meta_write(cmd).await.map(|_| ())
                }
                Route::Remote(n) => node
                    .peers
                    .client(n)?
                    .delete_consumer(onward_admin(msg.clone(), hops)?)
                    .await
                    .map(|_| ())
                    .map_err(ServerError::from),
            }
        })
        .await?;
        Ok(Response::new(pb::DeleteConsumerResponse {}))
    }

    type ConsumeStream = ResponseStream<pb::ConsumeResponse>;

    async fn consume(
        &self,
        req: Request<Streaming<pb::ConsumeRequest>>,
    ) -> Result<Response<Self::ConsumeStream>, Status> {
        let principal = Principal::of(&req)?;
        let hops = hops(&req);
        // Counted at the node the client is connected to; sessions forwarded
        // from peers carry no key.
        let session_guard = match crate::conn_limit::client_key(&req) {
            Some(key) => {
                let max = self.node.config.limits.max_pulls_per_client;
                let guard = self.node.pull_sessions.try_add(key.clone(), max);
                Some(guard.ok_or_else(|| {
                    ServerError::Exhausted(format!(
                        "too many concurrent pull sessions from {key}: max_pulls_per_client is {max}"
                    ))
                })?)
            }
            None => None,
        };
        let mut inbound = req.into_inner();
        let open = match inbound.message().await? {
            Some(pb::ConsumeRequest {
                kind: Some(pb::consume_request::Kind::Open(open)),
            }) => open,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of a Consume session must be `open`",
                ))
            }
        };
        check_consume_open(&open)?;
        principal.check(Action::Consume {
            stream: &open.stream,
            consumer: &open.consumer,
        })?;
        let node = &self.node;
        let entry = node.find_consumer(&open.stream, &open.consumer).await?;
        let local = node.local_consumer(&open.stream, &open.consumer);
        let (stream, leader) = match node
            .route(local.as_ref().map(|l| &l.group), &entry.replicas)
            .await?
        {
            Route::Local => {
                let local =
                    local.ok_or_else(|| ServerError::Unavailable("consumer not local".into()))?;
                let stream = self.attach(local.runtime.clone(), inbound).await?;
                (stream, node.config.node_id)
            }
            Route::Remote(n) => (self.proxy(n, open, inbound, hops).await?, n),
        };
        // The session's place in the count is given back when the response
        // stream is dropped (the client went away or the session ended).
        let stream = stream.map(move |item| {
            let _held = &session_guard;
            item
        });
        let stream = crate::stream_end::end_on_shutdown(node.shutdown.clone(), Box::pin(stream));
        let mut response = Response::new(stream);
        forward::name_consumer_leader(&mut response, node.peers.addr_of(leader));
        Ok(response)
    }

    async fn step_down(
        &self,
        req: Request<pb::StepDownRequest>,
    ) -> Result<Response<pb::StepDownResponse>, Status> {
        authorize(&req, Action::admin(&req.get_ref().stream))?;
        let hops = hops(&req);
        let msg = req.into_inner();
        let r = retry(|| self.node.step_down(msg.clone(), hops)).await?;
        Ok(Response::new(r))
    }

    async fn peer_add(
        &self,
        req: Request<pb::PeerAddRequest>,
    ) -> Result<Response<pb::PeerAddResponse>, Status> {
        authorize(&req, Action::admin(CLUSTER_ADMIN))?;
        let hops = hops(&req);
        Ok(Response::new(
            self.node.peer_add(req.into_inner(), hops).await?,
        ))
    }

    async fn peer_remove(
        &self,
        req: Request<pb::PeerRemoveRequest>,
    ) -> Result<Response<pb::PeerRemoveResponse>, Status> {
        authorize(&req, Action::admin(CLUSTER_ADMIN))?;
        let hops = hops(&req);
        let r = self.node.peer_remove(req.into_inner(), hops).await?;
        Ok(Response::new(r))
    }

    async fn join_info(
        &self,
        req: Request<pb::JoinInfoRequest>,
    ) -> Result<Response<pb::JoinInfoResponse>, Status> {
        authorize(&req, Action::admin(CLUSTER_ADMIN))?;
        Ok(Response::new(self.node.join_info()))
    }

    async fn move_done(
        &self,
        req: Request<pb::MoveDoneRequest>,
    ) -> Result<Response<pb::MoveDoneResponse>, Status> {
        authorize(&req, Action::admin(CLUSTER_ADMIN))?;
        let hops = hops(&req);
        self.node.move_done(req.into_inner(), hops).await?;
        Ok(Response::new(pb::MoveDoneResponse {}))
    }

    async fn removal_status(
        &self,
        req: Request<pb::RemovalStatusRequest>,
    ) -> Result<Response<pb::RemovalStatusResponse>, Status> {
        authorize(&req, Action::admin(CLUSTER_ADMIN))?;
        let hops = hops(&req);
        let r = self.node.removal_status(req.into_inner(), hops).await?;
        Ok(Response::new(r))
    }

    async fn cluster_status(
        &self,
        req: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        authorize(&req, Action::Read)?;
        Ok(Response::new(
            crate::status::cluster_status(&self.node).await,
        ))
    }
}

/// Longest term reason kept (it travels in the dead-letter headers).
const MAX_TERM_REASON_BYTES: usize = 512;

/// `reason` cut to [`MAX_TERM_REASON_BYTES`] at a character boundary.
pub(crate) fn truncate_reason(reason: &str) -> String {
    let mut end = reason.len().min(MAX_TERM_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}
