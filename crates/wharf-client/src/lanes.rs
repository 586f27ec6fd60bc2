//! Publish lanes: one long-lived `PublishStream` per seed, shared by every
//! publish of the client that goes to that seed.
//!
//! A unary `Publish` costs a new HTTP/2 stream per message: request headers,
//! response headers and trailers, and a task on the server. On a lane each
//! publish is one DATA frame each way (docs/benchmarks-changes.md, "What
//! changed since runs R and S": sync publishing on lanes ran 1.20x the unary
//! calls). The server answers a
//! `PublishStream` in request order, so each ack belongs to the oldest
//! waiter.
//!
//! Invariants:
//! - A waiter is queued and its request handed to the lane under one lock,
//!   so the waiter queue and the request stream are in the same order.
//! - A lane that ends or fails is marked broken under that lock and drops
//!   every waiter, whose callers then fall back to the unary path (which
//!   retries across seeds); no waiter is queued on a broken lane.
//! - Bounded: at most [`LANE_CAPACITY`] requests queued per lane; a publish
//!   finding its lane full takes the unary path instead of waiting.
//!
//! Left out: keeping publish order across a lane that breaks (the fallback
//! retries each publish on its own, as a unary publish always has), and
//! lanes to nodes that are not seeds.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use wharf_proto::v1 as pb;

use crate::connect::Grpc;

/// Requests queued on one lane; the server reads up to its own window (1,024).
pub(crate) const LANE_CAPACITY: usize = 1024;

/// The lanes of one client, one slot per seed, opened on first use.
pub(crate) struct Lanes {
    slots: Vec<Mutex<Option<Lane>>>,
}

struct Lane {
    tx: mpsc::Sender<pb::PublishRequest>,
    state: Arc<Mutex<LaneState>>,
}

#[derive(Default)]
struct LaneState {
    broken: bool,
    waiters: VecDeque<oneshot::Sender<pb::PublishAck>>,
}

impl LaneState {
    /// The lane is done: nothing more is answered on it.
    fn close(&mut self) {
        self.broken = true;
        self.waiters.clear();
    }
}

impl Lanes {
    pub(crate) fn new(seeds: usize) -> Self {
        Lanes {
            slots: (0..seeds).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Send `req` on seed `i`'s lane, opening it on `grpc` when there is
    /// none or the last one broke. The receiver yields the server's ack; it
    /// fails when the lane breaks first. `None` when the lane is full.
    pub(crate) fn send(
        &self,
        i: usize,
        grpc: Grpc,
        req: pb::PublishRequest,
    ) -> Option<oneshot::Receiver<pb::PublishAck>> {
        let slot = self.slots.get(i)?;
        let mut slot = slot.lock().ok()?;
        let usable = slot
            .as_ref()
            .is_some_and(|lane| lane.state.lock().is_ok_and(|s| !s.broken));
        if !usable {
            *slot = Some(Lane::open(grpc));
        }
        let lane = slot.as_ref()?;
        let (tx, rx) = oneshot::channel();
        let mut state = lane.state.lock().ok()?;
        if state.broken {
            return None;
        }
        state.waiters.push_back(tx);
        if lane.tx.try_send(req).is_err() {
            state.waiters.pop_back();
            return None;
        }
        Some(rx)
    }

    /// Give up on seed `i`'s lane (it left a publish unanswered): the next
    /// send opens a new one.
    pub(crate) fn discard(&self, i: usize) {
        if let Some(Ok(mut slot)) = self.slots.get(i).map(|s| s.lock()) {
            if let Some(lane) = slot.take() {
                if let Ok(mut state) = lane.state.lock() {
                    state.close();
                }
            }
        }
    }
}

impl Lane {
    /// Open the stream on `grpc` and spawn the task that hands out its acks.
    fn open(mut grpc: Grpc) -> Lane {
        let (tx, rx) = mpsc::channel(LANE_CAPACITY);
        let state = Arc::new(Mutex::new(LaneState::default()));
        let answers = state.clone();
        tokio::spawn(async move {
            let why = match grpc.publish_stream(ReceiverStream::new(rx)).await {
                Ok(response) => {
                    let mut acks = response.into_inner();
                    loop {
                        match acks.message().await {
                            Ok(Some(ack)) => {
                                let waiter =
                                    answers.lock().ok().and_then(|mut s| s.waiters.pop_front());
                                // A waiter that gave up (timed out) is gone; its ack goes nowhere.
                                if let Some(waiter) = waiter {
                                    let _ = waiter.send(ack);
                                }
                            }
                            Ok(None) => break "ended by the server".to_string(),
                            Err(s) => break format!("{}: {}", s.code(), s.message()),
                        }
                    }
                }
                Err(s) => format!("not opened, {}: {}", s.code(), s.message()),
            };
            tracing::debug!("publish lane closed: {why}");
            if let Ok(mut s) = answers.lock() {
                s.close();
            }
        });
        Lane { tx, state }
    }
}
