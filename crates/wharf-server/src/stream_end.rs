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
//! The wrapper is a stream polled by the call's own task, not a forwarding
//! task: every item of every long-lived stream (each publish ack, each
//! delivered message) would otherwise wake one more thread on its way out.
//!
//! Invariants:
//! - A stream that ends by itself ends exactly as before (no extra item).
//! - Once the shutdown signal is seen, the next item is the UNAVAILABLE and
//!   nothing follows it; the signal is checked before each inner item, so a
//!   busy stream cannot hold a stopping node open.
//! - It buffers nothing.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::Status;

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

const SHUTDOWN_MESSAGE: &str = "node shutting down: reconnect to another node";

/// `inner`, ended with UNAVAILABLE once `shutdown` turns true.
pub fn end_on_shutdown<T: Send + 'static>(
    mut shutdown: watch::Receiver<bool>,
    inner: ResponseStream<T>,
) -> ResponseStream<T> {
    let stopping = async move {
        // A dropped sender means the node is gone: same as shutting down.
        let _ = shutdown.wait_for(|s| *s).await;
    };
    Box::pin(EndOnShutdown {
        inner: Some(inner),
        stopping: Box::pin(stopping),
    })
}

struct EndOnShutdown<T> {
    /// `None` once ended, by itself or by the shutdown.
    inner: Option<ResponseStream<T>>,
    stopping: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<T> Stream for EndOnShutdown<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.inner.is_none() {
            return Poll::Ready(None);
        }
        // The signal first: an item taken from the inner stream is always
        // passed on, never dropped for the shutdown.
        if self.stopping.as_mut().poll(cx).is_ready() {
            // Dropping the inner stream now releases what it holds (a
            // session's slot, its publishes' waiters) at once.
            self.inner = None;
            return Poll::Ready(Some(Err(Status::unavailable(SHUTDOWN_MESSAGE))));
        }
        let item = match self.inner.as_mut() {
            Some(inner) => inner.poll_next_unpin(cx),
            None => Poll::Ready(None),
        };
        if let Poll::Ready(None) = item {
            self.inner = None;
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use tokio::sync::{mpsc, watch};
    use tokio_stream::wrappers::ReceiverStream;

    use super::end_on_shutdown;

    #[tokio::test]
    async fn a_stream_that_ends_by_itself_ends_unchanged() {
        let (_stop_tx, stop_rx) = watch::channel(false);
        let inner = futures::stream::iter([Ok(1), Ok(2)]);
        let items: Vec<_> = end_on_shutdown(stop_rx, Box::pin(inner))
            .map(|r| r.expect("no error"))
            .collect()
            .await;
        assert_eq!(items, vec![1, 2]);
    }

    #[tokio::test]
    async fn shutdown_sends_one_unavailable_then_ends() {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (tx, rx) = mpsc::channel::<Result<u32, tonic::Status>>(4);
        let mut s = end_on_shutdown(stop_rx, Box::pin(ReceiverStream::new(rx)));
        tx.send(Ok(7)).await.expect("open");
        assert_eq!(s.next().await.expect("an item").expect("ok"), 7);
        stop_tx.send(true).expect("receiver alive");
        // Items still queued do not hold the stream open.
        tx.send(Ok(8)).await.expect("open");
        let err = s.next().await.expect("an item").expect_err("unavailable");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(s.next().await.is_none());
        // The inner stream was dropped: its sender sees the receiver gone.
        assert!(tx.send(Ok(9)).await.is_err());
    }

    #[tokio::test]
    async fn a_dropped_shutdown_sender_counts_as_shutdown() {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (_tx, rx) = mpsc::channel::<Result<u32, tonic::Status>>(1);
        let mut s = end_on_shutdown(stop_rx, Box::pin(ReceiverStream::new(rx)));
        drop(stop_tx);
        let err = s.next().await.expect("an item").expect_err("unavailable");
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(s.next().await.is_none());
    }
}
