//! One `PublishStream` call at this node: read its publishes, answer them in
//! order.
//!
//! The call's acks are produced by [`PublishSession::next_ack`], driven as a
//! stream by the call's own task, which reads the requests in the same
//! turn: an ack travels from the stream's writer straight to the task that
//! writes it to the connection, with no task of ours in between.
//!
//! Invariants:
//! - Acks come in request order, one per request (a publish refused here
//!   gets an ack carrying its error).
//! - At most `window` publishes are in flight; past that no request is read
//!   until an ack is taken, so a client that reads no acks is held back by
//!   HTTP/2 flow control, not buffered.
//! - The stream ends once the client has half-closed and every publish read
//!   has been answered.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{FutureExt, Stream, StreamExt};
use tonic::{Status, Streaming};
use wharf_proto::v1 as pb;

use crate::auth::{Action, Principal};
use crate::error::Result;
use crate::publish_pipe::PublishPipes;
use crate::request_check::check_publish;
use crate::service::WharfService;

pub(crate) struct PublishSession {
    service: Arc<WharfService>,
    pipes: PublishPipes,
    principal: Principal,
    hops: u32,
    inbound: Streaming<pb::PublishRequest>,
    inflight: FuturesOrdered<BoxFuture<'static, Result<pb::PublishAck>>>,
    window: usize,
    /// Whether requests may still come (the client has not half-closed).
    open: bool,
}

impl PublishSession {
    /// The acks of the call whose requests are `inbound`, at most `window`
    /// publishes in flight, as the stream the call answers with.
    pub(crate) fn acks(
        service: Arc<WharfService>,
        principal: Principal,
        hops: u32,
        inbound: Streaming<pb::PublishRequest>,
        window: usize,
    ) -> impl Stream<Item = std::result::Result<pb::PublishAck, Status>> + Send + 'static {
        let session = PublishSession {
            pipes: PublishPipes::new(service.node.clone(), hops, window),
            service,
            principal,
            hops,
            inbound,
            inflight: FuturesOrdered::new(),
            window,
            open: true,
        };
        futures::stream::unfold(session, |mut session| async move {
            let ack = session.next_ack().await?;
            Some((Ok(ack), session))
        })
    }

    /// The next ack, reading requests meanwhile; `None` once done.
    async fn next_ack(&mut self) -> Option<pb::PublishAck> {
        loop {
            if !self.open && self.inflight.is_empty() {
                return None;
            }
            tokio::select! {
                m = self.inbound.message(), if self.open && self.inflight.len() < self.window => {
                    match m {
                        Ok(Some(msg)) => self.start(msg).await,
                        _ => self.open = false,
                    }
                }
                Some(r) = self.inflight.next(), if !self.inflight.is_empty() => {
                    let ack = r.unwrap_or_else(|e| {
                        let status = Status::from(e);
                        pb::PublishAck {
                            error: status.message().to_string(),
                            error_code: status.code() as u32,
                            ..Default::default()
                        }
                    });
                    wharf_raft::timeline::mark("svc_reply", ack.seq);
                    return Some(ack);
                }
            }
        }
    }

    async fn start(&mut self, msg: pb::PublishRequest) {
        wharf_raft::timeline::mark("svc_recv", 0);
        let allowed = self
            .principal
            .check(Action::publish(&msg.subject))
            .and_then(|()| check_publish(&self.service.node.config.limits, &msg));
        let publish = match allowed {
            Ok(()) => {
                self.service
                    .publish_in_order(&mut self.pipes, msg, self.hops)
                    .await
            }
            Err(e) => async move { Err(e) }.boxed(),
        };
        self.inflight.push_back(publish);
    }
}
