//! How the client reaches a secured cluster: TLS and credentials.
//!
//! [`ConnectOptions`] holds the cluster CA (turns TLS on: addresses become
//! `https`), an optional client certificate, and either a bearer token or a
//! user and password. Credentials go in the `authorization` header of every
//! call (`Bearer <token>`, or `Basic base64(user:password)`); they are only as
//! private as the connection, so use them with TLS.
//!
//! Left out: system trust roots (a Wharf cluster has its own CA), token
//! refresh.

use std::fmt;
use std::time::Duration;

use base64::Engine;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use wharf_proto::v1::wharf_client::WharfClient;

use crate::error::{ClientError, Result};

/// The gRPC client of one seed, with credentials on every call.
pub type Grpc = WharfClient<InterceptedService<Channel, Credentials>>;

/// TLS and credentials; `Default` is plain HTTP/2 without credentials.
#[derive(Clone, Default)]
pub struct ConnectOptions {
    /// PEM of the CA that signed the nodes' certificates. Set: TLS on.
    pub tls_ca_pem: Option<Vec<u8>>,
    /// PEM certificate and key to present (only needed if nodes ask for it).
    pub tls_identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to verify in the node's certificate instead of the address's host.
    pub tls_server_name: Option<String>,
    /// Bearer token.
    pub token: Option<String>,
    /// User name and password.
    pub user: Option<(String, String)>,
    /// Source address of the client's connections (a multi-homed host);
    /// `None` lets the OS choose.
    pub local_address: Option<std::net::IpAddr>,
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("tls", &self.tls_ca_pem.is_some())
            .field("client_cert", &self.tls_identity_pem.is_some())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

impl ConnectOptions {
    /// An endpoint for `addr` (`host:port` or a URL) with these TLS settings.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint> {
        let url = if addr.contains("://") {
            addr.to_string()
        } else if self.tls_ca_pem.is_some() {
            format!("https://{addr}")
        } else {
            format!("http://{addr}")
        };
        let mut endpoint = Endpoint::from_shared(url)
            .map_err(|e| ClientError::InvalidAddress(format!("{addr}: {e}")))?
            .local_address(self.local_address);
        if let Some(ca) = &self.tls_ca_pem {
            let mut tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .timeout(Duration::from_secs(5));
            if let Some((cert, key)) = &self.tls_identity_pem {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            if let Some(name) = &self.tls_server_name {
                tls = tls.domain_name(name.clone());
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| ClientError::InvalidAddress(format!("{addr}: TLS settings: {e}")))?;
        }
        Ok(endpoint)
    }

    /// The interceptor adding the `authorization` header.
    pub fn credentials(&self) -> Result<Credentials> {
        let value = match (&self.token, &self.user) {
            (Some(_), Some(_)) => {
                return Err(ClientError::InvalidAddress(
                    "give a token or a user and password, not both".into(),
                ))
            }
            (Some(token), None) => Some(format!("Bearer {token}")),
            (None, Some((user, password))) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )),
            (None, None) => None,
        };
        let header = match value {
            Some(v) => Some(v.parse::<MetadataValue<Ascii>>().map_err(|_| {
                ClientError::InvalidAddress("credentials must be printable ASCII".into())
            })?),
            None => None,
        };
        Ok(Credentials { header })
    }
}

/// Adds the caller's credentials to every request.
#[derive(Clone)]
pub struct Credentials {
    header: Option<MetadataValue<Ascii>>,
}

impl Interceptor for Credentials {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}
