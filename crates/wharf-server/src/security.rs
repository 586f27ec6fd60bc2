//! TLS, peer authentication and client authentication for one node's port.
//!
//! One port serves clients (`wharf.v1.Wharf`) and peers (the Raft transport).
//! With `[tls]` set, the port speaks only TLS; a client certificate is
//! optional at the TLS layer but, when presented, must be signed by the
//! cluster CA. Two guards then decide, per call:
//! - the peer guard (Raft transport): only other nodes, i.e. callers that
//!   presented a certificate signed by the cluster CA (mutual TLS) and, when
//!   `cluster_secret` is set, sent it in `x-wharf-cluster-secret` (compared in
//!   constant time). With neither TLS nor a secret the network is trusted.
//! - the client guard (public API): a peer passes as [`Principal::Peer`]
//!   (it forwards calls its own node already authorized); otherwise, when
//!   users are configured, the call needs `authorization: Bearer <token>` or
//!   `authorization: Basic base64(user:password)` and runs as that user;
//!   without users everyone is [`Principal::Anyone`].
//!
//! Invariants: a user client never passes as a peer unless it holds a
//! certificate signed by the cluster CA (so such certificates are given to
//! nodes only); auth on requires TLS or a cluster secret (else forwarded calls
//! could not be told from clients' calls).
//!
//! Certificates are read when the node starts: replacing the files (e.g. a
//! renewed Kubernetes secret) takes effect on the node's next restart.
//! Left out: reloading on file change, revocation lists, health checks behind
//! auth (health stays open for probes).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};
use wharf_raft::{PeerCredentials, PEER_SECRET_HEADER};

use crate::auth::{Principal, UserConfig, Users};
use crate::error::{Result, ServerError};

/// Longest a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest accepted cluster secret.
const MAX_SECRET_BYTES: usize = 4096;

/// The `[tls]` section: PEM files, read at start.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// This node's certificate (chain), presented to clients and peers.
    pub cert_file: PathBuf,
    /// Its private key.
    pub key_file: PathBuf,
    /// The cluster CA: verifies other nodes' certificates.
    pub ca_file: PathBuf,
}

/// The `[auth]` section. Its `Debug` hides the secret.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Shared secret every node sends to its peers (needed when TLS is off).
    #[serde(default)]
    pub cluster_secret: Option<String>,
    /// The same, read from a file (a mounted Kubernetes secret).
    #[serde(default)]
    pub cluster_secret_file: Option<PathBuf>,
    #[serde(default)]
    pub users: Vec<UserConfig>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field(
                "cluster_secret",
                &self.cluster_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("cluster_secret_file", &self.cluster_secret_file)
            .field(
                "users",
                &self.users.iter().map(|u| &u.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Security settings of a node; the default is everything off.
#[derive(Debug, Clone, Default)]
pub struct SecurityConfig {
    pub tls: Option<TlsConfig>,
    pub auth: Option<AuthConfig>,
}

/// The loaded settings of a running node.
pub struct Security {
    server_tls: Option<ServerTlsConfig>,
    peer_credentials: PeerCredentials,
    tls_on: bool,
    cluster_secret: Option<Vec<u8>>,
    /// None: authentication is off.
    users: Option<Users>,
}

fn read(path: &PathBuf, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| ServerError::Invalid(format!("cannot read {what} {}: {e}", path.display())))
}

impl Security {
    /// Read the certificate files and check the users; any problem is an
    /// `Invalid` error that stops the node from starting.
    pub fn load(config: &SecurityConfig) -> Result<Arc<Security>> {
        let (server_tls, client_tls) = match &config.tls {
            None => (None, None),
            Some(tls) => {
                let cert = read(&tls.cert_file, "TLS certificate")?;
                let key = read(&tls.key_file, "TLS key")?;
                let ca = Certificate::from_pem(read(&tls.ca_file, "TLS CA")?);
                let identity = Identity::from_pem(cert, key);
                let server = ServerTlsConfig::new()
                    .identity(identity.clone())
                    .client_ca_root(ca.clone())
                    .client_auth_optional(true)
                    .timeout(TLS_HANDSHAKE_TIMEOUT);
                let client = ClientTlsConfig::new()
                    .ca_certificate(ca)
                    .identity(identity)
                    .timeout(TLS_HANDSHAKE_TIMEOUT);
                (Some(server), Some(client))
            }
        };
        let auth = config.auth.clone().unwrap_or_default();
        let secret = match (&auth.cluster_secret, &auth.cluster_secret_file) {
            (Some(_), Some(_)) => {
                return Err(ServerError::Invalid(
                    "set cluster_secret or cluster_secret_file, not both".into(),
                ))
            }
            (Some(s), None) => Some(s.clone()),
            (None, Some(path)) => {
                let bytes = read(path, "cluster secret file")?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    ServerError::Invalid("the cluster secret file is not UTF-8".into())
                })?;
                Some(text.trim().to_string())
            }
            (None, None) => None,
        };
        if let Some(s) = &secret {
            if s.is_empty() || s.len() > MAX_SECRET_BYTES {
                return Err(ServerError::Invalid(format!(
                    "the cluster secret must be 1 to {MAX_SECRET_BYTES} bytes"
                )));
            }
        }
        let users = if auth.users.is_empty() {
            None
        } else {
            if client_tls.is_none() && secret.is_none() {
                return Err(ServerError::Invalid(
                    "[auth] users need [tls] or a cluster secret: nodes must prove who they are \
                     to forward calls"
                        .into(),
                ));
            }
            Some(Users::new(&auth.users)?)
        };
        let peer_credentials =
            PeerCredentials::new(client_tls, secret.as_deref()).map_err(ServerError::Invalid)?;
        Ok(Arc::new(Security {
            tls_on: server_tls.is_some(),
            server_tls,
            peer_credentials,
            cluster_secret: secret.map(String::into_bytes),
            users,
        }))
    }

    /// The TLS settings of the port, when TLS is on.
    pub fn server_tls(&self) -> Option<ServerTlsConfig> {
        self.server_tls.clone()
    }

    /// What this node presents to its peers.
    pub fn peer_credentials(&self) -> PeerCredentials {
        self.peer_credentials.clone()
    }

    /// True when the caller proved it is a node of this cluster.
    fn is_peer(&self, req: &tonic::Request<()>) -> bool {
        // rustls verified any presented certificate against the cluster CA.
        let cert_ok = !self.tls_on || crate::conn_limit::has_client_cert(req);
        let secret_ok = match &self.cluster_secret {
            None => true,
            Some(want) => req
                .metadata()
                .get(PEER_SECRET_HEADER)
                .is_some_and(|got| constant_time_eq(got.as_bytes(), want)),
        };
        cert_ok && secret_ok
    }

    fn authenticate(&self, req: &tonic::Request<()>) -> Result<Principal> {
        let Some(users) = &self.users else {
            return Ok(Principal::Anyone);
        };
        if self.is_peer(req) {
            return Ok(Principal::Peer);
        }
        let header = req
            .metadata()
            .get("authorization")
            .ok_or_else(|| {
                ServerError::Unauthenticated(
                    "this cluster requires a token or a user and password".into(),
                )
            })?
            .to_str()
            .map_err(|_| ServerError::Unauthenticated("unreadable authorization header".into()))?;
        let bad = || ServerError::Unauthenticated("wrong credentials".into());
        let user = if let Some(token) = header.strip_prefix("Bearer ") {
            users.by_token(token.trim())
        } else if let Some(basic) = header.strip_prefix("Basic ") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(basic.trim())
                .map_err(|_| bad())?;
            let text = String::from_utf8(decoded).map_err(|_| bad())?;
            let (name, password) = text.split_once(':').ok_or_else(bad)?;
            users.by_password(name, password)
        } else {
            return Err(ServerError::Unauthenticated(
                "authorization must be `Bearer <token>` or `Basic <user:password>`".into(),
            ));
        };
        user.map(Principal::User).ok_or_else(bad)
    }

    /// Interceptor of the public API: attaches the caller's [`Principal`].
    pub fn client_guard(self: &Arc<Self>) -> ClientGuard {
        ClientGuard(self.clone())
    }

    /// Interceptor of the Raft transport: only peers pass.
    pub fn peer_guard(self: &Arc<Self>) -> PeerGuard {
        PeerGuard(self.clone())
    }
}

#[derive(Clone)]
pub struct ClientGuard(Arc<Security>);

impl Interceptor for ClientGuard {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let principal = self.0.authenticate(&req)?;
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}

#[derive(Clone)]
pub struct PeerGuard(Arc<Security>);

impl Interceptor for PeerGuard {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if self.0.is_peer(&req) {
            Ok(req)
        } else {
            Err(ServerError::Unauthenticated(
                "the Raft transport accepts only nodes of this cluster".into(),
            )
            .into())
        }
    }
}

/// Equal contents, in time that depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_constant_time_eq() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn security_users_without_peer_authentication_are_refused() {
        let config = SecurityConfig {
            tls: None,
            auth: Some(AuthConfig {
                users: vec![UserConfig {
                    name: "a".into(),
                    token_hash: Some(crate::auth::hash_secret("t").unwrap()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        };
        assert!(Security::load(&config).is_err());
    }
}
