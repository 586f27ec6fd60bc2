//! gRPC request counts and latencies: a tower layer on the node's tonic server.
//!
//! Every call on the node's port (the public `wharf.v1.Wharf` API, health,
//! reflection and the peer Raft transport) is counted once, when it ends,
//! labeled by service, method and gRPC status code:
//! - a trailers-only response (how tonic answers most errors) ends at the
//!   response headers, with `grpc-status` in them;
//! - any other response ends when its body yields the trailers (which carry
//!   `grpc-status`); a body dropped before that (the client went away) counts
//!   as `Cancelled`, one that ends without trailers as `Unknown`.
//!
//! So the latency of a streaming call (`Consume`, `PublishStream`) is the
//! life of the stream, not of one message.
//!
//! Invariant: at most [`MAX_SERIES`] (service, method, code) series. Paths are
//! chosen by clients, so once the bound is reached new ones are folded into
//! service and method `other`.
//!
//! Left out: in-flight gauges, message counts within streams, client-side metrics.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use tonic::Code;

use crate::metrics_text::{Exposition, Histogram, Kind};

/// Bound on distinct (service, method, code) series.
pub const MAX_SERIES: usize = 512;

/// One (service, method, code) series.
#[derive(Default)]
struct Series {
    latency: Histogram,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    service: String,
    method: String,
    code: Code,
}

/// The registry of gRPC call metrics of one node.
#[derive(Default)]
pub struct GrpcMetrics {
    series: Mutex<HashMap<Key, Arc<Series>>>,
}

/// `OK`, `NotFound`, ...: the code names Prometheus users know from
/// go-grpc-prometheus.
fn code_name(code: Code) -> String {
    match code {
        Code::Ok => "OK".to_string(),
        other => format!("{other:?}"),
    }
}

/// `/wharf.v1.Wharf/Publish` -> (`wharf.v1.Wharf`, `Publish`).
fn split_path(path: &str) -> (String, String) {
    let trimmed = path.strip_prefix('/').unwrap_or(path);
    match trimmed.split_once('/') {
        Some((service, method)) if !service.is_empty() && !method.is_empty() => {
            (service.to_string(), method.to_string())
        }
        _ => ("other".to_string(), "other".to_string()),
    }
}

impl GrpcMetrics {
    pub fn record(&self, path: &str, code: Code, elapsed: std::time::Duration) {
        let (service, method) = split_path(path);
        let series = {
            let Ok(mut map) = self.series.lock() else {
                return;
            };
            let mut key = Key {
                service,
                method,
                code,
            };
            if !map.contains_key(&key) && map.len() >= MAX_SERIES {
                key.service = "other".into();
                key.method = "other".into();
            }
            // The "other" series of a code may push the map a little past
            // MAX_SERIES: at most one per code (17).
            map.entry(key).or_default().clone()
        };
        series.latency.observe(elapsed);
    }

    /// Append the two families to `e`, series sorted for stable output.
    pub fn render(&self, e: &mut Exposition) {
        let mut rows: Vec<(Key, Arc<Series>)> = match self.series.lock() {
            Ok(map) => map.iter().map(|(k, s)| (k.clone(), s.clone())).collect(),
            Err(_) => return,
        };
        rows.sort_by(|a, b| {
            (&a.0.service, &a.0.method, a.0.code as i32).cmp(&(
                &b.0.service,
                &b.0.method,
                b.0.code as i32,
            ))
        });
        let snaps: Vec<_> = rows
            .iter()
            .map(|(k, s)| (k, code_name(k.code), s.latency.snapshot()))
            .collect();
        let handled = "wharf_grpc_server_handled_total";
        e.family(
            handled,
            "gRPC calls served by this node that have ended, by service, method and status code.",
            Kind::Counter,
        );
        for (k, code, snap) in &snaps {
            let labels = [
                ("grpc_service", k.service.as_str()),
                ("grpc_method", k.method.as_str()),
                ("grpc_code", code.as_str()),
            ];
            e.sample(handled, &labels, snap.count);
        }
        let seconds = "wharf_grpc_server_handling_seconds";
        e.family(
            seconds,
            "Time from a gRPC call's arrival to its end (a stream's whole life), in seconds.",
            Kind::Histogram,
        );
        for (k, code, snap) in &snaps {
            let labels = [
                ("grpc_service", k.service.as_str()),
                ("grpc_method", k.method.as_str()),
                ("grpc_code", code.as_str()),
            ];
            e.histogram(seconds, &labels, snap);
        }
    }
}

/// Records a call once, when it ends (or is dropped unended).
struct CallRecorder {
    metrics: Arc<GrpcMetrics>,
    path: String,
    started: Instant,
}

impl CallRecorder {
    fn finish(self, code: Code) {
        self.metrics
            .record(&self.path, code, self.started.elapsed());
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<Code> {
    let value = headers.get("grpc-status")?.to_str().ok()?;
    value.parse::<i32>().ok().map(Code::from)
}

/// The tower layer that meters every call of the server it wraps.
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    metrics: Arc<GrpcMetrics>,
}

impl GrpcMetricsLayer {
    pub fn new(metrics: Arc<GrpcMetrics>) -> Self {
        GrpcMetricsLayer { metrics }
    }
}

impl<S> tower_layer::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

#[derive(Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: Arc<GrpcMetrics>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Body + Send + 'static,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqBody>) -> Self::Future {
        // The clone is fresh and maybe not ready; the one poll_ready readied
        // serves this call (the usual tower idiom).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let recorder = CallRecorder {
            metrics: self.metrics.clone(),
            path: req.uri().path().to_string(),
            started: Instant::now(),
        };
        Box::pin(async move {
            match inner.call(req).await {
                Ok(response) => {
                    let recorder = match grpc_status(response.headers()) {
                        Some(code) => {
                            recorder.finish(code);
                            None
                        }
                        None => Some(recorder),
                    };
                    Ok(response.map(|body| MeteredBody {
                        inner: Box::pin(body),
                        recorder,
                    }))
                }
                Err(e) => {
                    recorder.finish(Code::Unknown);
                    Err(e)
                }
            }
        })
    }
}

/// A response body that records its call when the trailers pass through.
pub struct MeteredBody<B> {
    inner: Pin<Box<B>>,
    recorder: Option<CallRecorder>,
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = self.inner.as_mut().poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = grpc_status(trailers).unwrap_or(Code::Unknown);
                    if let Some(r) = self.recorder.take() {
                        r.finish(code);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(r) = self.recorder.take() {
                    r.finish(Code::Internal);
                }
            }
            Poll::Ready(None) => {
                if let Some(r) = self.recorder.take() {
                    r.finish(Code::Unknown);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B> Drop for MeteredBody<B> {
    fn drop(&mut self) {
        if let Some(r) = self.recorder.take() {
            r.finish(Code::Cancelled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counts_by_method_and_code_and_bounds_series() {
        let m = GrpcMetrics::default();
        m.record(
            "/wharf.v1.Wharf/Publish",
            Code::Ok,
            Duration::from_millis(1),
        );
        m.record(
            "/wharf.v1.Wharf/Publish",
            Code::Ok,
            Duration::from_millis(2),
        );
        m.record(
            "/wharf.v1.Wharf/GetStream",
            Code::NotFound,
            Duration::from_millis(1),
        );
        m.record("garbage", Code::Unimplemented, Duration::ZERO);
        let mut e = Exposition::new();
        m.render(&mut e);
        let text = e.finish();
        assert!(text.contains(
            "wharf_grpc_server_handled_total{grpc_service=\"wharf.v1.Wharf\",grpc_method=\"Publish\",grpc_code=\"OK\"} 2\n"
        ), "{text}");
        assert!(text.contains(
            "wharf_grpc_server_handled_total{grpc_service=\"wharf.v1.Wharf\",grpc_method=\"GetStream\",grpc_code=\"NotFound\"} 1\n"
        ), "{text}");
        assert!(text.contains(
            "grpc_service=\"other\",grpc_method=\"other\",grpc_code=\"Unimplemented\"} 1\n"
        ));
        assert!(text.contains(
            "wharf_grpc_server_handling_seconds_count{grpc_service=\"wharf.v1.Wharf\",grpc_method=\"Publish\",grpc_code=\"OK\"} 2\n"
        ));

        for i in 0..2 * MAX_SERIES {
            m.record(&format!("/s/m{i}"), Code::Ok, Duration::ZERO);
        }
        let series = m.series.lock().unwrap().len();
        assert!(series <= MAX_SERIES + 17, "{series} series");
    }
}
