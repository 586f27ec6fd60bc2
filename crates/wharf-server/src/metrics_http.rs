//! The `/metrics` HTTP endpoint, on its own listen address.
//!
//! Plain HTTP/1.1 (hyper, already in the tree through tonic): `GET /metrics`
//! answers the Prometheus text of `metrics::render`; any other path is 404.
//! It has its own port so that scrapes never compete with client or Raft
//! traffic for the gRPC server, and so it can stay inside the cluster network.
//!
//! Bounds: at most [`MAX_CONNECTIONS`] connections at once (more wait in the
//! accept queue), each closed after [`CONNECTION_LIFETIME`], so a slow or
//! stuck scraper cannot hold resources for long.
//!
//! Left out: TLS, authentication, gzip.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{watch, Semaphore};

use crate::metrics_text::CONTENT_TYPE;
use crate::node::NodeInner;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// A connection (keep-alive included) is closed after this long.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

fn respond(
    node: &NodeInner,
    req: &hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let builder = hyper::Response::builder();
    let response = if req.uri().path() == "/metrics" && req.method() == hyper::Method::GET {
        let snap = crate::metrics::collect(node);
        let text = crate::metrics::render(&snap, Some(&node.grpc_metrics));
        builder
            .header(hyper::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(Full::new(Bytes::from(text)))
    } else {
        builder
            .status(hyper::StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"not found; try /metrics\n")))
    };
    response.unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}

/// Serve `/metrics` on `listener` until `shutdown` turns true.
pub async fn serve(
    node: Arc<NodeInner>,
    listener: tokio::net::TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
            _ = shutdown.changed() => return,
        };
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!("metrics accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let node = node.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = respond(&node, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
            drop(permit);
        });
    }
}
