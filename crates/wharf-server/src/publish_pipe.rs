//! Forwarding a `PublishStream`'s publishes over one stream per leader.
//!
//! A worker or producer may open its publish stream on any node. When that
//! node does not lead the stream a message goes to, the message is sent on to
//! the leader over one long-lived `PublishStream` call per (incoming stream,
//! leader) pair, a pipe, instead of one unary call per message: a unary call
//! costs a new HTTP/2 stream, its headers and a task on both sides.
//!
//! Invariants:
//! - A pipe answers its messages in the order sent (the leader's
//!   `PublishStream` acks in order), so each message's waiter is the front
//!   of the pipe's FIFO when its ack arrives.
//! - A pipe that ends, fails, or leaves a message unanswered for
//!   [`FORWARD_TIMEOUT`] is dropped; the messages it still owed fall back to
//!   the unary path (`WharfService::publish`, which re-routes and retries),
//!   exactly what a failed unary forward does.
//! - Bounded: at most [`MAX_PIPES`] pipes per incoming stream, each with at
//!   most `capacity` messages queued (the incoming stream's window).
//!
//! `WharfService::publish_in_order` (here) routes each message of a
//! `PublishStream`: down a pipe, or, when this node leads the stream itself
//! ([`PublishPipes::route_now`]), onto the stream's writer at once, so a
//! stream's messages are stored in the order they arrived.
//!
//! Left out: keeping that order across a failover (messages that fall back
//! are retried independently) and for messages whose leader is not known
//! here yet (they take the unary path too).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use wharf_proto::v1 as pb;
use wharf_raft::NodeId;

use crate::error::{Result, ServerError};
use crate::forward::{onward_unbounded, FORWARD_TIMEOUT};
use crate::node::{LocalStream, NodeInner};
use crate::service::WharfService;

/// Pipes one incoming stream may hold open (one per leader it publishes to).
const MAX_PIPES: usize = 8;

type Waiters = Arc<Mutex<VecDeque<oneshot::Sender<pb::PublishAck>>>>;

struct Pipe {
    tx: mpsc::Sender<pb::PublishRequest>,
    waiters: Waiters,
    broken: Arc<AtomicBool>,
}

/// The pipes of one incoming `PublishStream`.
pub(crate) struct PublishPipes {
    node: Arc<NodeInner>,
    hops: u32,
    capacity: usize,
    pipes: HashMap<NodeId, Pipe>,
}

/// Where a message of a `PublishStream` goes, as this node sees it now.
pub(crate) enum Target {
    /// This node leads the stream (named here).
    Local(String, Arc<LocalStream>),
    /// Another node leads it.
    Remote(NodeId),
}

/// What became of a piped message: its ack, or it must go the unary way.
pub(crate) enum Piped {
    Ack(pb::PublishAck),
    Fallback,
}

impl PublishPipes {
    pub(crate) fn new(node: Arc<NodeInner>, hops: u32, capacity: usize) -> Self {
        PublishPipes {
            node,
            hops,
            capacity,
            pipes: HashMap::new(),
        }
    }

    /// Where `subject`'s stream is led, if this node hosts a replica and
    /// knows the leader now.
    pub(crate) fn route_now(&self, subject: &str) -> Option<Target> {
        let name = self
            .node
            .with_catalog(|c| c.stream_for_subject(subject).map(|e| e.config.name.clone()))?;
        let local = self.node.local_stream(&name)?;
        match local.group.leader()? {
            leader if leader == self.node.id() => Some(Target::Local(name, local)),
            leader => Some(Target::Remote(leader)),
        }
    }

    /// Send `msg` down the pipe to `leader` (opened if need be). The future
    /// resolves to its ack, or to `Fallback` when the pipe could not answer.
    pub(crate) async fn send(
        &mut self,
        leader: NodeId,
        msg: pb::PublishRequest,
    ) -> impl std::future::Future<Output = Piped> + Send + 'static {
        let (tx, rx) = oneshot::channel();
        let broken = match self.pipe(leader) {
            Some(pipe) => {
                // Queue the waiter first: the ack cannot arrive before the
                // message is sent, and sends and waiters keep one order.
                let queued = pipe.waiters.lock().map(|mut w| w.push_back(tx)).is_ok();
                if !queued || pipe.tx.send(msg).await.is_err() {
                    pipe.broken.store(true, Ordering::Release);
                }
                Some(pipe.broken.clone())
            }
            None => None,
        };
        async move {
            let Some(broken) = broken else {
                return Piped::Fallback;
            };
            match tokio::time::timeout(FORWARD_TIMEOUT, rx).await {
                // The leader moved on meanwhile: re-route as a unary
                // forward's failure would be.
                Ok(Ok(ack)) if ack.error_code == tonic::Code::Unavailable as u32 => Piped::Fallback,
                Ok(Ok(ack)) => Piped::Ack(ack),
                Ok(Err(_)) => Piped::Fallback,
                Err(_) => {
                    // The leader stopped answering: later messages take a new pipe.
                    broken.store(true, Ordering::Release);
                    Piped::Fallback
                }
            }
        }
    }

    /// The open pipe to `leader`, opening one if there is none or the last
    /// one broke. None when no more pipes may be opened or the request
    /// cannot be forwarded further.
    fn pipe(&mut self, leader: NodeId) -> Option<&Pipe> {
        let usable = self
            .pipes
            .get(&leader)
            .is_some_and(|p| !p.broken.load(Ordering::Acquire));
        if !usable {
            self.pipes.remove(&leader);
            if self.pipes.len() >= MAX_PIPES {
                return None;
            }
            let pipe = self.open(leader)?;
            self.pipes.insert(leader, pipe);
        }
        self.pipes.get(&leader)
    }

    fn open(&self, leader: NodeId) -> Option<Pipe> {
        let mut client = self.node.peers.client(leader).ok()?;
        let (tx, rx) = mpsc::channel(self.capacity);
        let req = onward_unbounded(ReceiverStream::new(rx), self.hops).ok()?;
        let waiters: Waiters = Arc::new(Mutex::new(VecDeque::new()));
        let broken = Arc::new(AtomicBool::new(false));
        let (w, b) = (waiters.clone(), broken.clone());
        tokio::spawn(async move {
            if let Ok(resp) = client.publish_stream(req).await {
                let mut acks = resp.into_inner();
                while let Ok(Some(ack)) = acks.message().await {
                    let waiter = w.lock().ok().and_then(|mut w| w.pop_front());
                    match waiter {
                        // The publisher may have gone; nothing to do then.
                        Some(waiter) => drop(waiter.send(ack)),
                        None => break,
                    }
                }
            }
            // Ended or failed: every message still owed falls back (its
            // waiter is dropped), and the pipe is not used again.
            b.store(true, Ordering::Release);
            if let Ok(mut w) = w.lock() {
                w.clear();
            }
        });
        Some(Pipe {
            tx,
            waiters,
            broken,
        })
    }
}

impl WharfService {
    /// [`Self::publish`] for a message of a `PublishStream`, started now so
    /// that the stream's messages are stored in the order they came: queued
    /// on this node's writer when it leads the stream, sent down the pipe to
    /// the leader when another node does (`publish_pipe`), else (leader not
    /// known here, or the stream not local) the unary way. Whatever could
    /// not be answered that way (the pipe broke, leadership moved) is
    /// published again the unary way, which re-routes and retries.
    pub(crate) async fn publish_in_order(
        self: &Arc<Self>,
        pipes: &mut PublishPipes,
        msg: pb::PublishRequest,
        hops: u32,
    ) -> BoxFuture<'static, Result<pb::PublishAck>> {
        let s = self.clone();
        match pipes.route_now(&msg.subject) {
            Some(Target::Local(stream, local)) => {
                match enqueue_local(&local, stream, msg.clone()).await {
                    Ok(ack) => async move {
                        match ack.await {
                            Ok(mut ack) => {
                                // As on `Publish`: a client learns where to send this subject.
                                ack.stored_by = s
                                    .node
                                    .peers
                                    .addr_of(s.node.config.node_id)
                                    .unwrap_or_default();
                                Ok(ack)
                            }
                            Err(ServerError::Unavailable(_) | ServerError::NotLeader { .. }) => {
                                s.publish(msg, hops).await
                            }
                            Err(e) => Err(e),
                        }
                    }
                    .boxed(),
                    Err(_) => async move { s.publish(msg, hops).await }.boxed(),
                }
            }
            Some(Target::Remote(leader)) => {
                let piped = pipes.send(leader, msg.clone()).await;
                async move {
                    match piped.await {
                        Piped::Ack(ack) => Ok(ack),
                        Piped::Fallback => s.publish(msg, hops).await,
                    }
                }
                .boxed()
            }
            None => async move { s.publish(msg, hops).await }.boxed(),
        }
    }
}

/// Queue `msg` on this node's writer for `stream` (this node leads it); the
/// future of its ack.
pub(crate) async fn enqueue_local(
    local: &LocalStream,
    stream: String,
    msg: pb::PublishRequest,
) -> Result<impl std::future::Future<Output = Result<pb::PublishAck>> + Send + 'static> {
    let msg_id = Some(msg.msg_id).filter(|id| !id.is_empty());
    let mut headers: Vec<(String, String)> = msg.headers.into_iter().collect();
    headers.sort_unstable();
    let outcome = local
        .writer
        .enqueue(msg.subject, msg.payload, msg_id, headers)
        .await?;
    Ok(async move {
        let outcome = outcome.await?;
        Ok(pb::PublishAck {
            stream,
            seq: outcome.seq,
            duplicate: outcome.duplicate,
            ..Default::default()
        })
    })
}
