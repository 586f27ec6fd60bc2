//! Per-client connection and pull-session limits at the front door.
//!
//! Every accepted TCP connection is counted against its remote IP
//! ([`ClientKey`]). What happens to one over `max_connections_per_ip`:
//! - up to [`REFUSED_GRACE`] connections over the limit are served, but
//!   every call to the public `wharf.v1.Wharf` service on them fails with
//!   RESOURCE_EXHAUSTED "too many connections from <ip>:
//!   max_connections_per_ip is N". The client gets a clear error instead of
//!   a reset it cannot tell from a crash. Health checks still answer.
//! - beyond that, the connection is closed at once (no response): a client
//!   that ignores the error cannot make the node hold unbounded sockets.
//!
//! Peers are never limited: connections from an address of a cluster member
//! (the `--peers` hosts, resolved before the node serves and again every
//! [`PEER_REFRESH`]) are not counted, and forwarded pull sessions arriving
//! from peers are counted only at the node the client is connected to.
//! Whether a connection is a peer's is asked again at each call, not only
//! when it is accepted: a peer's long-lived channel may have connected
//! before its address was first resolved (at start, or a pod whose name
//! resolves late), and must not count its forwarded sessions against a
//! client limit for as long as it lives. The catch: a client running on a
//! cluster member's own IP is not limited either.
//!
//! Left out: limits on HTTP/2 streams per connection (hyper's defaults
//! apply), and TLS (with TLS the connect info would be wrapped and must be
//! unwrapped in [`conn_info`]).

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::server::Connected;

use crate::error::ServerError;
use crate::limits::{ClientCounts, ClientKey, CountGuard};

/// Connections over the limit that are still served (with errors) before
/// further ones are closed unanswered.
pub const REFUSED_GRACE: u32 = 16;
/// How often peer host names are resolved again (pods get new IPs).
pub const PEER_REFRESH: Duration = Duration::from_secs(10);

/// What the service knows about the connection a call came on.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    /// The cluster members' IPs as known now.
    peers: Arc<PeerIps>,
    /// Set when the connection was over the limit when it was accepted: the
    /// refusal message (not given to a peer).
    pub refused: Option<Arc<str>>,
}

impl ConnInfo {
    /// The remote IP is a cluster member's, as far as is known now.
    pub fn is_from_peer(&self) -> bool {
        self.remote.is_some_and(|a| self.peers.contains(&a.ip()))
    }
}

/// An accepted connection, holding its place in the per-IP count.
pub struct ClientConn {
    io: TcpStream,
    info: ConnInfo,
    _count: Option<CountGuard>,
}

impl Connected for ClientConn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for ClientConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for ClientConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The IP addresses of the cluster's nodes.
#[derive(Debug, Default)]
pub struct PeerIps {
    ips: RwLock<HashSet<IpAddr>>,
}

impl PeerIps {
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.ips.read().map(|s| s.contains(ip)).unwrap_or(false)
    }

    /// Resolve each of `addrs` (`host:port`) once and remember its IPs.
    /// Addresses that do not resolve are left for the next round; an
    /// address once seen is kept (a peer may come back on it).
    pub async fn resolve(&self, addrs: Vec<String>) {
        for addr in addrs {
            if let Ok(found) = tokio::net::lookup_host(addr.as_str()).await {
                let mut ips = self.ips.write().unwrap_or_else(|p| p.into_inner());
                ips.extend(found.map(|a| a.ip()));
            }
        }
    }

    /// [`PeerIps::resolve`] every peer address now and then every
    /// [`PEER_REFRESH`] until shutdown.
    pub async fn refresh_loop(
        self: Arc<Self>,
        peers: impl Fn() -> Vec<String>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            self.resolve(peers()).await;
            tokio::select! {
                _ = tokio::time::sleep(PEER_REFRESH) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// The listener's connections, each counted against its remote IP.
pub fn incoming(
    listener: TcpListener,
    peers: Arc<PeerIps>,
    counts: Arc<ClientCounts>,
    max_per_ip: u32,
) -> impl Stream<Item = io::Result<ClientConn>> {
    TcpListenerStream::new(listener).filter_map(move |accepted| {
        let conn = accepted.map(|io| admit(io, &peers, &counts, max_per_ip));
        async move {
            match conn {
                Ok(Some(c)) => Some(Ok(c)),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            }
        }
    })
}

fn admit(
    io: TcpStream,
    peers: &Arc<PeerIps>,
    counts: &Arc<ClientCounts>,
    max_per_ip: u32,
) -> Option<ClientConn> {
    // Small RPCs must not wait for Nagle.
    let _ = io.set_nodelay(true);
    let remote = io.peer_addr().ok();
    let info = |refused| ConnInfo {
        remote,
        peers: peers.clone(),
        refused,
    };
    // Uncounted: an unknown remote, or a peer's IP as known now.
    let Some(ip) = remote.map(|a| a.ip()).filter(|ip| !peers.contains(ip)) else {
        return Some(ClientConn {
            io,
            info: info(None),
            _count: None,
        });
    };
    let key = client_key_of_addr(ip);
    let (guard, before) = counts.add(key.clone());
    if before >= max_per_ip.saturating_add(REFUSED_GRACE) {
        tracing::warn!(client = %key, max_per_ip, "connection closed: far over max_connections_per_ip");
        return None;
    }
    let refused = (before >= max_per_ip).then(|| {
        tracing::warn!(client = %key, max_per_ip, "connection over max_connections_per_ip");
        Arc::from(format!(
            "too many connections from {key}: max_connections_per_ip is {max_per_ip}"
        ))
    });
    Some(ClientConn {
        io,
        info: info(refused),
        _count: Some(guard),
    })
}

/// The per-client key of a remote IP. The authentication hook: once calls
/// carry an identity, derive the key from it here instead.
fn client_key_of_addr(ip: IpAddr) -> ClientKey {
    ClientKey::Addr(ip)
}

/// The connection info of a call, when it came through [`incoming`] (with
/// TLS on, tonic wraps it in a `TlsConnectInfo`).
pub fn conn_info<T>(req: &tonic::Request<T>) -> Option<&ConnInfo> {
    let ext = req.extensions();
    ext.get::<ConnInfo>().or_else(|| {
        ext.get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
            .map(|t| t.get_ref())
    })
}

/// Whether the caller presented a (verified) TLS client certificate.
/// `Request::peer_certs` only knows tonic's own TCP listener, not
/// [`incoming`], so both wrappings are looked at here.
pub fn has_client_cert<T>(req: &tonic::Request<T>) -> bool {
    let ext = req.extensions();
    let ours = ext
        .get::<tonic::transport::server::TlsConnectInfo<ConnInfo>>()
        .and_then(|t| t.peer_certs());
    let certs = ours.or_else(|| req.peer_certs());
    certs.is_some_and(|c| !c.is_empty())
}

/// The key a call counts against, or `None` for peer traffic (and for calls
/// whose remote address is unknown).
pub fn client_key<T>(req: &tonic::Request<T>) -> Option<ClientKey> {
    let info = conn_info(req)?;
    if info.is_from_peer() {
        return None;
    }
    // With authentication on, a logged-in user is the client (the auth
    // interceptor ran before the handler that asks).
    match req.extensions().get::<crate::auth::Principal>() {
        Some(crate::auth::Principal::User(u)) => return Some(ClientKey::User(u.name.clone())),
        Some(crate::auth::Principal::Peer) => return None,
        _ => {}
    }
    Some(client_key_of_addr(info.remote?.ip()))
}

/// Interceptor of the public service: refuse every call on a connection
/// that is over `max_connections_per_ip`.
pub fn refuse_over_limit(req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    // The peer lookup only for a connection that was over the limit.
    let refused = conn_info(&req).and_then(|i| i.refused.clone().filter(|_| !i.is_from_peer()));
    match refused {
        Some(message) => Err(ServerError::Exhausted(message.to_string()).into()),
        None => Ok(req),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_on(info: ConnInfo) -> tonic::Request<()> {
        let mut req = tonic::Request::new(());
        req.extensions_mut().insert(info);
        req
    }

    /// A connection accepted from an IP not yet known as a peer's, and over
    /// the limit then, is a peer's from the moment the IP is resolved: its
    /// calls are neither refused nor counted.
    #[tokio::test]
    async fn a_peer_resolved_after_its_connection_is_not_limited() {
        let peers = Arc::new(PeerIps::default());
        let info = ConnInfo {
            remote: Some("127.0.0.9:40000".parse().unwrap()),
            peers: peers.clone(),
            refused: Some(Arc::from("too many connections from 127.0.0.9")),
        };
        assert!(!info.is_from_peer());
        assert!(refuse_over_limit(call_on(info.clone())).is_err());
        assert_eq!(
            client_key(&call_on(info.clone())),
            Some(ClientKey::Addr("127.0.0.9".parse().unwrap()))
        );

        peers.resolve(vec!["127.0.0.9:7001".to_string()]).await;
        assert!(info.is_from_peer());
        assert!(refuse_over_limit(call_on(info.clone())).is_ok());
        assert_eq!(client_key(&call_on(info)), None);
    }

    /// Another IP stays a client's, and keeps its refusal.
    #[tokio::test]
    async fn a_client_beside_resolved_peers_is_still_limited() {
        let peers = Arc::new(PeerIps::default());
        peers.resolve(vec!["127.0.0.9:7001".to_string()]).await;
        let info = ConnInfo {
            remote: Some("127.0.0.10:40000".parse().unwrap()),
            peers,
            refused: Some(Arc::from("too many connections from 127.0.0.10")),
        };
        assert!(!info.is_from_peer());
        let status = refuse_over_limit(call_on(info.clone())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(client_key(&call_on(info)).is_some());
    }
}
