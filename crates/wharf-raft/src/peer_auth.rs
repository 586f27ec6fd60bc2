//! What a node presents to its peers, and how an endpoint to a peer is built.
//!
//! Two ways for one node to prove to another that it belongs to the cluster:
//! - TLS on: a client certificate signed by the cluster CA (mutual TLS). The
//!   receiving side's TLS layer verifies it; the server crate then treats a
//!   call that came with a verified certificate as a peer call.
//! - TLS off: a shared cluster secret, sent in [`PEER_SECRET_HEADER`] on every
//!   call and compared in constant time by the receiver.
//!
//! [`PeerCredentials`] is set once per node (before any group starts) and
//! used for every peer channel: the Raft transport here and the server's
//! forwarding channels. Its `Debug` never prints the secret.
//!
//! Not here: checking credentials (the server crate does that, in one place).

use std::fmt;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// Header carrying the shared cluster secret when TLS is off.
pub const PEER_SECRET_HEADER: &str = "x-wharf-cluster-secret";

/// A channel to a peer that adds this node's credentials to every call.
pub type PeerChannel = InterceptedService<Channel, PeerAuth>;

/// This node's credentials towards its peers. `Default` is none: plain
/// HTTP/2 and no secret (a cluster that trusts its network).
#[derive(Clone, Default)]
pub struct PeerCredentials {
    tls: Option<ClientTlsConfig>,
    secret: Option<MetadataValue<Ascii>>,
}

impl fmt::Debug for PeerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerCredentials")
            .field("tls", &self.tls.is_some())
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl PeerCredentials {
    /// `tls`: the cluster CA and this node's certificate as client identity.
    /// `secret`: the shared cluster secret (printable ASCII).
    pub fn new(tls: Option<ClientTlsConfig>, secret: Option<&str>) -> Result<Self, String> {
        let secret = match secret {
            Some(s) => Some(
                s.parse::<MetadataValue<Ascii>>()
                    .map_err(|_| "the cluster secret must be printable ASCII".to_string())?,
            ),
            None => None,
        };
        Ok(PeerCredentials { tls, secret })
    }

    /// An endpoint to `addr` ("host:port"): `https` with the cluster's TLS
    /// settings when TLS is on, `http` otherwise.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| format!("bad peer address {addr}: {e}"))?
            .connect_timeout(Duration::from_secs(1));
        if let Some(tls) = &self.tls {
            endpoint = endpoint
                .tls_config(tls.clone())
                .map_err(|e| format!("TLS settings for peer {addr}: {e}"))?;
        }
        Ok(endpoint)
    }

    /// The interceptor adding the secret header (a no-op without a secret).
    pub fn interceptor(&self) -> PeerAuth {
        PeerAuth {
            secret: self.secret.clone(),
        }
    }
}

/// Adds [`PEER_SECRET_HEADER`] to every outgoing peer call.
#[derive(Clone)]
pub struct PeerAuth {
    secret: Option<MetadataValue<Ascii>>,
}

impl Interceptor for PeerAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(secret) = &self.secret {
            req.metadata_mut()
                .insert(PEER_SECRET_HEADER, secret.clone());
        }
        Ok(req)
    }
}
