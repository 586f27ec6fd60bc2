//! One `PublishStream` call at this node: read its publishes, answer them in
//! order.
//!
//! The call's acks are produced by an [`AckWindow`], driven as a stream by
//! the call's own task, which reads the requests in the same turn: an ack
//! travels from the stream's writer straight to the task that writes it to
//! the connection, with no task of ours in between.
//!
//! Invariants (the window's own are in [`crate::ack_window`]):
//! - Acks come in request order, one per request (a publish refused here
//!   gets an ack carrying its error).
//! - At most `window` publishes are in flight; past that no request is read
//!   until an ack is taken, so a client that reads no acks is held back by
//!   HTTP/2 flow control, not buffered.
//! - The stream ends once the client has half-closed and every publish read
//!   has been answered.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tonic::{Status, Streaming};
use wharf_proto::v1 as pb;

use crate::ack_window::{AckWindow, Starter};
use crate::auth::{Action, Principal};
use crate::error::Result;
use crate::publish_pipe::PublishPipes;
use crate::request_check::check_publish;
use crate::service::WharfService;

/// Starts each publish of one call: checks it, then queues it in order.
struct PublishStarter {
    service: Arc<WharfService>,
    pipes: PublishPipes,
    principal: Principal,
    hops: u32,
}

/// The acks of the call whose requests are `inbound`, at most `window`
/// publishes in flight, as the stream the call answers with.
pub(crate) fn publish_acks(
    service: Arc<WharfService>,
    principal: Principal,
    hops: u32,
    inbound: Streaming<pb::PublishRequest>,
    window: usize,
) -> impl Stream<Item = std::result::Result<pb::PublishAck, Status>> + Send + 'static {
    let starter = PublishStarter {
        pipes: PublishPipes::new(service.node.clone(), hops, window),
        service,
        principal,
        hops,
    };
    AckWindow::answers(inbound, starter, window).map(|answer: Result<pb::PublishAck>| {
        // A refused publish is answered with an ack carrying its error, so
        // the publishes after it go on.
        let ack = answer.unwrap_or_else(|e| {
            let status = Status::from(e);
            pb::PublishAck {
                error: status.message().to_string(),
                error_code: status.code() as u32,
                ..Default::default()
            }
        });
        wharf_raft::timeline::mark("svc_reply", ack.seq);
        Ok(ack)
    })
}

impl Starter for PublishStarter {
    type Request = pb::PublishRequest;
    type Answer = Result<pb::PublishAck>;

    async fn start(&mut self, msg: pb::PublishRequest) -> BoxFuture<'static, Self::Answer> {
        wharf_raft::timeline::mark("svc_recv", 0);
        let allowed = self
            .principal
            .check(Action::publish(&msg.subject))
            .and_then(|()| check_publish(&self.service.node.config.limits, &msg));
        match allowed {
            Ok(()) => {
                self.service
                    .publish_in_order(&mut self.pipes, msg, self.hops)
                    .await
            }
            Err(e) => async move { Err(e) }.boxed(),
        }
    }
}
