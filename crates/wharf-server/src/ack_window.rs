//! A bounded window of in-flight requests on one streaming call: read a
//! request, start it, answer the started requests in the order read.
//!
//! This is the part of a `PublishStream` call that decides when to read,
//! kept apart from what a publish does so that its bound can be tested
//! without a cluster.
//!
//! Invariants:
//! - At most `window` requests are started and not yet answered; with that
//!   many out, the next request is not read until an answer is taken, so a
//!   peer that sends faster than its requests complete is held back by the
//!   transport's flow control instead of being buffered here.
//! - Answers come one per request, in the order the requests were read,
//!   whatever order they complete in.
//! - Each request is started only after the one before it has been queued
//!   ([`Starter::start`] resolves), so the order read is the order queued.
//! - A read error ends reading as the end of input does; the requests
//!   already started are still answered, then the answers end.
//!
//! Left out: what a request does, and turning its failure into an answer;
//! both belong to the [`Starter`].

use std::future::Future;

use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use futures::{Stream, StreamExt};

/// What a window does with each request it reads.
pub(crate) trait Starter: Send {
    type Request: Send;
    type Answer: Send + 'static;

    /// Queues `request`; resolves, once it is queued, to its answer.
    fn start(
        &mut self,
        request: Self::Request,
    ) -> impl Future<Output = BoxFuture<'static, Self::Answer>> + Send;
}

pub(crate) struct AckWindow<S, T: Starter> {
    inbound: S,
    starter: T,
    inflight: FuturesOrdered<BoxFuture<'static, T::Answer>>,
    window: usize,
    /// Whether requests may still come (no end of input nor read error).
    open: bool,
}

impl<S, E, T> AckWindow<S, T>
where
    S: Stream<Item = Result<T::Request, E>> + Unpin + Send + 'static,
    E: Send + 'static,
    T: Starter + 'static,
{
    /// The answers to the requests of `inbound`, started by `starter`, at
    /// most `window` (at least 1) of them in flight.
    pub(crate) fn answers(
        inbound: S,
        starter: T,
        window: usize,
    ) -> impl Stream<Item = T::Answer> + Send + 'static {
        let window = AckWindow {
            inbound,
            starter,
            inflight: FuturesOrdered::new(),
            window: window.max(1),
            open: true,
        };
        futures::stream::unfold(window, |mut window| async move {
            let answer = window.next_answer().await?;
            Some((answer, window))
        })
    }

    /// The next answer, reading requests meanwhile; `None` once done.
    async fn next_answer(&mut self) -> Option<T::Answer> {
        loop {
            if !self.open && self.inflight.is_empty() {
                return None;
            }
            tokio::select! {
                m = self.inbound.next(), if self.open && self.inflight.len() < self.window => {
                    match m {
                        Some(Ok(request)) => {
                            let answer = self.starter.start(request).await;
                            self.inflight.push_back(answer);
                        }
                        Some(Err(_)) | None => self.open = false,
                    }
                }
                Some(answer) = self.inflight.next(), if !self.inflight.is_empty() => {
                    return Some(answer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Scripts of a peer that sends 50 requests at once against a window of
    //! 8, with the test deciding when each request completes.

    use std::collections::HashMap;
    use std::pin::Pin;
    use std::sync::{Arc, Mutex};
    use std::task::Poll;

    use futures::FutureExt;
    use tokio::sync::oneshot;

    use super::*;

    const WINDOW: usize = 8;
    const SENT: u64 = 50;

    /// Starts request `n` as a future the test completes with `finish(n)`.
    #[derive(Clone, Default)]
    struct Held {
        started: Arc<Mutex<Vec<u64>>>,
        finishers: Arc<Mutex<HashMap<u64, oneshot::Sender<()>>>>,
    }

    impl Held {
        fn started(&self) -> usize {
            self.started.lock().unwrap().len()
        }

        fn finish(&self, n: u64) {
            let tx = self.finishers.lock().unwrap().remove(&n);
            tx.expect("finish: request not started or finished twice")
                .send(())
                .unwrap();
        }
    }

    impl Starter for Held {
        type Request = u64;
        type Answer = u64;

        async fn start(&mut self, n: u64) -> BoxFuture<'static, u64> {
            let (tx, rx) = oneshot::channel();
            self.started.lock().unwrap().push(n);
            self.finishers.lock().unwrap().insert(n, tx);
            async move {
                let _ = rx.await;
                n
            }
            .boxed()
        }
    }

    type Answers = Pin<Box<dyn Stream<Item = u64> + Send>>;

    fn window_over(requests: Vec<Result<u64, &'static str>>, held: &Held) -> Answers {
        let inbound = futures::stream::iter(requests);
        Box::pin(AckWindow::answers(inbound, held.clone(), WINDOW))
    }

    /// Polls once: the answer if one is ready, `None` if the window waits.
    fn poll_once(answers: &mut Answers) -> Option<Option<u64>> {
        let waker = futures::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        match answers.as_mut().poll_next(&mut cx) {
            Poll::Ready(a) => Some(a),
            Poll::Pending => None,
        }
    }

    fn all_sent() -> Vec<Result<u64, &'static str>> {
        (1..=SENT).map(Ok).collect()
    }

    #[tokio::test]
    async fn reads_no_request_past_the_window() {
        let held = Held::default();
        let mut answers = window_over(all_sent(), &held);

        // Every request is ready to read, none completes: exactly a window's
        // worth is read, and polling again reads no more.
        assert_eq!(poll_once(&mut answers), None);
        assert_eq!(held.started(), WINDOW);
        assert_eq!(poll_once(&mut answers), None);
        assert_eq!(held.started(), WINDOW);

        // A later request completing first frees no room: its answer waits
        // behind the first, and so does the next read.
        held.finish(2);
        assert_eq!(poll_once(&mut answers), None);
        assert_eq!(held.started(), WINDOW);

        // The first completes: both answers come, in order, and one more
        // request is read for each answer taken.
        held.finish(1);
        assert_eq!(poll_once(&mut answers), Some(Some(1)));
        assert_eq!(poll_once(&mut answers), Some(Some(2)));
        assert_eq!(poll_once(&mut answers), None);
        assert_eq!(held.started(), WINDOW + 2);
        assert_eq!(
            *held.started.lock().unwrap(),
            (1..=WINDOW as u64 + 2).collect::<Vec<_>>(),
            "requests started out of the order read"
        );
    }

    #[tokio::test]
    async fn answers_every_request_in_order_then_ends() {
        let held = Held::default();
        let mut answers = window_over(all_sent(), &held);
        let mut taken = Vec::new();
        // Complete requests newest first within each window, so completion
        // order is never the order read.
        loop {
            match poll_once(&mut answers) {
                Some(Some(n)) => taken.push(n),
                Some(None) => break,
                None => {
                    let started = held.started.lock().unwrap().clone();
                    let out = started.len() - taken.len();
                    assert!(out <= WINDOW, "{out} requests in flight");
                    let open: Vec<u64> = held.finishers.lock().unwrap().keys().copied().collect();
                    let newest = open.into_iter().max().expect("waiting on nothing");
                    held.finish(newest);
                }
            }
        }
        assert_eq!(taken, (1..=SENT).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_read_error_ends_reading_but_answers_what_was_started() {
        let held = Held::default();
        let requests = vec![Ok(1), Ok(2), Err("reset by peer"), Ok(3)];
        let mut answers = window_over(requests, &held);
        assert_eq!(poll_once(&mut answers), None);
        assert_eq!(held.started(), 2, "read past the error");
        held.finish(1);
        held.finish(2);
        assert_eq!(poll_once(&mut answers), Some(Some(1)));
        assert_eq!(poll_once(&mut answers), Some(Some(2)));
        assert_eq!(poll_once(&mut answers), Some(None));
        assert_eq!(held.started(), 2);
    }
}
