//! Forwarding requests to the node that can serve them.
//!
//! Every node accepts every call. When the group a call needs is led by
//! another node, the call is re-sent there over one lazily connected gRPC
//! channel per peer, marked with a hop count so a stale view of leadership
//! can never bounce a request around forever. `retry` re-routes calls that
//! failed because leadership was moving, for a bounded time. Peer channels
//! carry this node's credentials (mutual TLS or the cluster secret, see
//! `security`): the receiving node trusts a forwarded call as authorized here.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use wharf_proto::v1::wharf_client::WharfClient;
use wharf_raft::{NodeId, PeerChannel, PeerCredentials};

use crate::error::{Result, ServerError};

pub const HOPS_HEADER: &str = "x-wharf-hops";
/// A request may be forwarded at most this many times.
pub const MAX_HOPS: u32 = 2;
/// How long a call keeps re-routing while a group elects a leader.
pub const ROUTE_DEADLINE: Duration = Duration::from_secs(6);

pub struct Peers {
    /// Every node address ever learned (the bootstrap set, then the
    /// catalog's nodes): a removed node keeps its entry, since it may still
    /// lead a group for a moment while its replicas move away.
    addrs: Mutex<BTreeMap<NodeId, String>>,
    bind_ip: Option<std::net::IpAddr>,
    /// Mutual TLS or the cluster secret: the peer then trusts the call as
    /// already authorized here.
    credentials: PeerCredentials,
    /// Cached clients, with the address each was made for.
    clients: Mutex<HashMap<NodeId, (String, WharfClient<PeerChannel>)>>,
}

impl Peers {
    pub fn new(
        addrs: BTreeMap<NodeId, String>,
        bind_ip: Option<std::net::IpAddr>,
        credentials: PeerCredentials,
    ) -> Self {
        Peers {
            addrs: Mutex::new(addrs),
            bind_ip,
            credentials,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// Learn (or update) node addresses, e.g. from the catalog.
    pub fn learn(&self, nodes: &BTreeMap<NodeId, String>) {
        if let Ok(mut addrs) = self.addrs.lock() {
            for (id, addr) in nodes {
                addrs.insert(*id, addr.clone());
            }
        }
    }

    /// The address the cluster knows `node` by, if any.
    pub fn addr_of(&self, node: NodeId) -> Option<String> {
        self.addrs.lock().ok()?.get(&node).cloned()
    }

    /// Every address known, for the connection limiter's peer exemption.
    pub fn known_addrs(&self) -> Vec<String> {
        self.addrs
            .lock()
            .map(|a| a.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn client(&self, node: NodeId) -> Result<WharfClient<PeerChannel>> {
        let addr = self
            .addrs
            .lock()
            .map_err(|_| ServerError::Internal("poisoned".into()))?
            .get(&node)
            .cloned()
            .ok_or_else(|| ServerError::Internal(format!("no address for node {node}")))?;
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| ServerError::Internal("poisoned".into()))?;
        if let Some((cached_addr, c)) = clients.get(&node) {
            if *cached_addr == addr {
                return Ok(c.clone());
            }
        }
        let client = self.client_at(&addr)?;
        clients.insert(node, (addr, client.clone()));
        Ok(client)
    }

    /// A client for `addr` with this node's peer credentials, not cached
    /// (for seeds and nodes not yet in the cluster).
    pub fn client_at(&self, addr: &str) -> Result<WharfClient<PeerChannel>> {
        let channel = self
            .credentials
            .endpoint(addr)
            .map_err(ServerError::Internal)?
            .local_address(self.bind_ip)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .connect_lazy();
        Ok(
            WharfClient::with_interceptor(channel, self.credentials.interceptor())
                .max_decoding_message_size(64 * 1024 * 1024)
                .max_encoding_message_size(64 * 1024 * 1024),
        )
    }
}

/// The hop count a request arrived with.
pub fn hops<T>(req: &tonic::Request<T>) -> u32 {
    req.metadata()
        .get(HOPS_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// How long a forwarded read, publish or pull-session open may wait for the
/// peer's answer: a frozen peer (paused process, half-open connection) must
/// not hold the call until keep-alive gives up; the caller re-routes instead.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(3);
/// The same for admin calls, which wait for groups to start or move.
pub const FORWARD_ADMIN_TIMEOUT: Duration = Duration::from_secs(20);

/// A request to send to a peer, one hop further than the one being served,
/// with a deadline of [`FORWARD_TIMEOUT`] (enforced by the channel).
pub fn onward<T>(msg: T, hops: u32) -> Result<tonic::Request<T>> {
    let mut req = onward_unbounded(msg, hops)?;
    req.set_timeout(FORWARD_TIMEOUT);
    Ok(req)
}

/// [`onward`] for admin calls, with [`FORWARD_ADMIN_TIMEOUT`].
pub fn onward_admin<T>(msg: T, hops: u32) -> Result<tonic::Request<T>> {
    let mut req = onward_unbounded(msg, hops)?;
    req.set_timeout(FORWARD_ADMIN_TIMEOUT);
    Ok(req)
}

/// [`onward`] without a deadline, for long-lived streams.
pub fn onward_unbounded<T>(msg: T, hops: u32) -> Result<tonic::Request<T>> {
    if hops >= MAX_HOPS {
        return Err(ServerError::Unavailable(
            "request forwarded too many times: leadership is moving; retry".into(),
        ));
    }
    let mut req = tonic::Request::new(msg);
    let value = (hops + 1)
        .to_string()
        .parse()
        .map_err(|_| ServerError::Internal("hops".into()))?;
    req.metadata_mut().insert(HOPS_HEADER, value);
    Ok(req)
}

/// Run `attempt` until it succeeds, fails for good, or the deadline passes.
/// Only "try again" failures (no leader, leader moved, peer down) are retried.
pub async fn retry<T, F, Fut>(mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + ROUTE_DEADLINE;
    let mut backoff = Duration::from_millis(20);
    loop {
        match attempt().await {
            Err(ServerError::Unavailable(_) | ServerError::NotLeader { .. })
                if tokio::time::Instant::now() + backoff < deadline =>
            {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Name the node leading the consumer in a `Consume` response's headers
/// (nothing when its address is unknown or not a valid header value).
pub fn name_consumer_leader<T>(response: &mut tonic::Response<T>, addr: Option<String>) {
    if let Some(value) = addr.and_then(|a| a.parse().ok()) {
        response
            .metadata_mut()
            .insert(wharf_proto::v1::CONSUMER_LEADER_HEADER, value);
    }
}
