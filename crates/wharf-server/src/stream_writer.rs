//! Group commit of publishes on a stream leader.
//!
//! Publishes arriving at the leader queue on a bounded channel. One task takes
//! whatever has queued (up to `MAX_BATCH_MSGS` messages or `MAX_BATCH_BYTES`),
//! proposes it as one Raft entry, and keeps up to `MAX_INFLIGHT` entries in
//! flight, so a burst of publishes costs one log append and one fsync per batch
//! instead of one per message. Each publisher gets its own sequence (or error)
//! back once the entry is committed on a majority and applied.

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use wharf_raft::Group;

use crate::error::{Result, ServerError};
use crate::stream_sm::{PublishItem, PublishOutcome, PublishResults, StreamCommand};
use crate::util::now_ms;

const QUEUE_MSGS: usize = 8192;
const MAX_BATCH_MSGS: usize = 1024;
const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;
const MAX_INFLIGHT: usize = 4;

type Reply = oneshot::Sender<Result<PublishOutcome>>;

#[derive(Clone)]
pub struct StreamWriter {
    tx: mpsc::Sender<(PublishItem, Reply)>,
}

impl StreamWriter {
    pub fn spawn(group: Group) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_MSGS);
        tokio::spawn(run(group, rx));
        StreamWriter { tx }
    }

    /// Queue one publish and return at once with the future of its outcome,
    /// which answers once its batch is committed and applied. Publishes
    /// queued one after another by one caller are stored in that order (a
    /// `PublishStream` relies on it).
    pub async fn enqueue(
        &self,
        subject: String,
        payload: Bytes,
        msg_id: Option<String>,
        headers: Vec<(String, String)>,
    ) -> Result<impl std::future::Future<Output = Result<PublishOutcome>> + Send + 'static> {
        let (reply, rx) = oneshot::channel();
        let item = PublishItem {
            subject,
            payload,
            msg_id,
            headers,
        };
        self.tx
            .send((item, reply))
            .await
            .map_err(|_| ServerError::Unavailable("stream is shutting down".into()))?;
        Ok(async move {
            rx.await
                .map_err(|_| ServerError::Unavailable("stream is shutting down".into()))?
        })
    }
}

async fn run(group: Group, mut rx: mpsc::Receiver<(PublishItem, Reply)>) {
    let mut inflight = FuturesUnordered::new();
    loop {
        let next = if inflight.len() >= MAX_INFLIGHT {
            None
        } else {
            tokio::select! {
                item = rx.recv() => match item {
                    Some(item) => Some(item),
                    None if inflight.is_empty() => return,
                    None => None,
                },
                Some(()) = inflight.next(), if !inflight.is_empty() => continue,
            }
        };
        let Some(first) = next else {
            inflight.next().await;
            continue;
        };
        let mut bytes = first.0.payload.len();
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_MSGS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(item) => {
                    bytes += item.0.payload.len();
                    batch.push(item);
                }
                Err(_) => break,
            }
        }
        let group = group.clone();
        inflight.push(async move { commit(group, batch).await });
    }
}

async fn commit(group: Group, batch: Vec<(PublishItem, Reply)>) {
    let (items, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
    let cmd = StreamCommand::Publish {
        now_ms: now_ms(),
        items,
    };
    let outcome: Result<PublishResults> = async {
        let bytes = group.write(bincode::serialize(&cmd)?).await?;
        bincode::deserialize::<std::result::Result<PublishResults, ServerError>>(&bytes)?
    }
    .await;
    match outcome {
        Ok(results) => {
            for (reply, r) in replies.into_iter().zip(results) {
                let _ = reply.send(r);
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}
