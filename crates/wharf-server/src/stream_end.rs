//! Ending a node's open response streams when it shuts down.
//!
//! tonic's graceful shutdown waits for every open call to finish, and
//! `Consume` sessions and `PublishStream` calls stay open as long as their
//! clients like. Without help a stopping node therefore waited out its whole
//! server grace period (5 s) whenever a worker was connected. Every
//! long-lived response stream is wrapped here: when the node's shutdown
//! signal fires it sends one UNAVAILABLE ("reconnect to another node"), which
//! the client library retries elsewhere, and ends.
//!
//! Invariant: a stream that ends by itself ends exactly as before (no extra
//! item); the forwarding task holds at most [`BUFFER`] items.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// Items buffered between the wrapped stream and the client.
const BUFFER: usize = 64;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// `inner`, ended with UNAVAILABLE once `shutdown` turns true.
pub fn end_on_shutdown<T: Send + 'static>(
    mut shutdown: watch::Receiver<bool>,
    mut inner: ResponseStream<T>,
) -> ResponseStream<T> {
    let (tx, rx) = mpsc::channel(BUFFER);
    tokio::spawn(async move {
        let stopping = async move {
            // A dropped sender means the node is gone: same as shutting down.
            let _ = shutdown.wait_for(|s| *s).await;
        };
        tokio::pin!(stopping);
        loop {
            tokio::select! {
                item = inner.next() => match item {
                    Some(item) => {
                        if tx.send(item).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                },
                () = &mut stopping => {
                    let msg = "node shutting down: reconnect to another node";
                    let _ = tx.send(Err(Status::unavailable(msg))).await;
                    return;
                }
                () = tx.closed() => return,
            }
        }
    });
    Box::pin(ReceiverStream::new(rx))
}
