//! A worker's `Consume` session on this node: attached to the local
//! consumer runtime when this node leads the consumer group, or proxied to
//! the leader over the peer channel.
//!
//! Both directions are bounded channels (`SESSION_OUTBOX`). A session ends
//! when the worker goes away, when the runtime ends it (leader change,
//! consumer deleted), or when the upstream leader's stream ends; the status
//! that ended it is passed on to the worker.
//!
//! Left out: resuming a session on another node (the client reopens it).

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use wharf_proto::v1 as pb;

use crate::consumer_runtime::{ConsumerRuntime, Event, PendingAck, SESSION_OUTBOX};
use crate::consumer_sm::AckKind;
use crate::error::{Result, ServerError};
use crate::forward::onward;
use crate::request_check::check_pull;
use crate::service::{truncate_reason, ResponseStream, WharfService};

impl WharfService {
    /// Attach a worker session to the local consumer runtime.
    pub(crate) async fn attach(
        &self,
        runtime: ConsumerRuntime,
        mut inbound: Streaming<pb::ConsumeRequest>,
    ) -> Result<ResponseStream<pb::ConsumeResponse>> {
        let session = self.node.next_session.fetch_add(1, Ordering::Relaxed);
        let limits = self.node.config.limits.clone();
        let (tx, rx) = mpsc::channel(SESSION_OUTBOX);
        runtime
            .send(Event::Open {
                session,
                out: tx.clone(),
            })
            .await?;
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = inbound.message() => m,
                    _ = tx.closed() => break,
                };
                let kind = match next {
                    Ok(Some(pb::ConsumeRequest { kind: Some(kind) })) => kind,
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                };
                let event = match kind {
                    pb::consume_request::Kind::Pull(mut pull) => {
                        if let Err(e) = check_pull(&limits, &pull) {
                            let _ = tx.send(Err(Status::from(e))).await;
                            break;
                        }
                        let acks = std::mem::take(&mut pull.acks)
                            .iter()
                            .map(|ack| pending_ack(session, ack))
                            .collect::<std::result::Result<Vec<_>, _>>();
                        match acks {
                            Ok(acks) => Event::Pull {
                                session,
                                pull,
                                acks,
                            },
                            Err(e) => {
                                let _ = tx.send(Err(e)).await;
                                break;
                            }
                        }
                    }
                    pb::consume_request::Kind::Ack(ack) => match pending_ack(session, &ack) {
                        Ok(ack) => Event::Ack(ack),
                        Err(e) => {
                            let _ = tx.send(Err(e)).await;
                            break;
                        }
                    },
                    pb::consume_request::Kind::Open(_) => {
                        let _ = tx
                            .send(Err(Status::invalid_argument(
                                "this session is already open",
                            )))
                            .await;
                        break;
                    }
                };
                if runtime.send(event).await.is_err() {
                    break;
                }
            }
            let _ = runtime.send(Event::Close { session }).await;
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }

    /// Relay a worker session to the consumer leader on another node.
    pub(crate) async fn proxy(
        &self,
        leader: u64,
        open: pb::ConsumeOpen,
        mut inbound: Streaming<pb::ConsumeRequest>,
        hops: u32,
    ) -> Result<ResponseStream<pb::ConsumeResponse>> {
        let (up_tx, up_rx) = mpsc::channel(SESSION_OUTBOX);
        let open = pb::ConsumeRequest {
            kind: Some(pb::consume_request::Kind::Open(open)),
        };
        up_tx
            .send(open)
            .await
            .map_err(|_| ServerError::Internal("proxy channel closed".into()))?;
        let req = onward(ReceiverStream::new(up_rx), hops)?;
        let mut upstream = self
            .node
            .peers
            .client(leader)?
            .consume(req)
            .await?
            .into_inner();
        tokio::spawn(async move {
            while let Ok(Some(m)) = inbound.message().await {
                if up_tx.send(m).await.is_err() {
                    break;
                }
            }
        });
        let (tx, rx) = mpsc::channel(SESSION_OUTBOX);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = upstream.message() => m,
                    _ = tx.closed() => break,
                };
                match next {
                    Ok(Some(m)) => {
                        if tx.send(Ok(m)).await.is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        let _ = tx.send(Err(Status::from(ServerError::from(status)))).await;
                        break;
                    }
                }
            }
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

/// A worker's ack as the runtime takes it; an unknown kind is refused.
fn pending_ack(session: u64, ack: &pb::AckRequest) -> std::result::Result<PendingAck, Status> {
    let kind = match pb::AckKind::try_from(ack.kind) {
        Ok(pb::AckKind::Ack) => AckKind::Ack,
        Ok(pb::AckKind::Nak) => AckKind::Nak {
            delay_ms: ack.delay_ms,
        },
        Ok(pb::AckKind::InProgress) => AckKind::InProgress,
        Ok(pb::AckKind::Term) => {
            if !ack.reason.is_empty() {
                tracing::info!(stream_seq = ack.stream_seq, reason = %ack.reason, "message termed");
            }
            AckKind::Term {
                reason: truncate_reason(&ack.reason),
            }
        }
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "unknown ack kind {}",
                ack.kind
            )))
        }
    };
    Ok(PendingAck {
        session,
        stream_seq: ack.stream_seq,
        reply_id: ack.reply_id,
        kind,
    })
}
