//! Pipelined AppendEntries: one long-lived bidirectional gRPC stream per
//! (group, peer) replication session.
//!
//! openraft's replication task produces AppendEntries requests as entries
//! are submitted to the leader's log, and consumes the answers in order. Its
//! default transport sends one unary call per request and waits for the
//! answer before asking for the next request, so an entry proposed while a
//! request is in flight (which takes a round trip plus the follower's fsync)
//! waits for it, and so does the commit index the next request carries. Over
//! a stream, each request goes out as soon as openraft makes it; the
//! follower's `Raft::stream_append` hands them to its Raft core as they come
//! (its appends share the node's group-commit flush) and answers each once
//! its entries are on disk.
//!
//! Wire: the `AppendStream` RPC. The group is named by the
//! [`GROUP_HEADER`] request header, so the server can answer the call before
//! the first request exists; each request frame is the bincode
//! `AppendEntriesRequest`, each answer frame the bincode
//! `WireResult<StreamAppendResult>`, one per request, in order.
//!
//! Invariants:
//! - Answers are yielded in request order, one per request (HTTP/2 keeps a
//!   stream's frames in order; the follower answers in order).
//! - The stream makes progress or fails: while a request is unanswered, an
//!   answer must come within the deadline (the soft TTL, at least
//!   [`MIN_APPEND_DEADLINE`]) of the oldest unanswered request, or the client
//!   yields `Timeout` and ends the session (openraft then backs off and opens
//!   a new one). An idle stream has no deadline.
//! - After the first error, the client's output stream ends.
//! - A frame that does not decode ends the server's input; the server answers
//!   what it has, then `INVALID_ARGUMENT`. Nothing here panics on input.
//!
//! Not here: heartbeats (openraft sends each as a stream of one request; they
//! keep the unary `Append` call, see `network`), and flow control beyond
//! HTTP/2's per-stream window and openraft's follower-side buffer of 64
//! requests.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use futures::StreamExt;
use openraft::base::BoxStream;
use openraft::errors::NetworkError;
use openraft::errors::RPCError;
use openraft::raft::AppendEntriesRequest;
use openraft::raft::StreamAppendResult;
use tokio::time::Instant;
use tonic::Status;
use tonic::Streaming;
use wharf_proto::v1::raft::RaftFrame;

use crate::types::decode;
use crate::types::encode;
use crate::types::TypeConfig;
use crate::types::WharfRaft;
use crate::types::WireResult;
use crate::GroupId;

/// Request header naming the group of an `AppendStream` call.
pub(crate) const GROUP_HEADER: &str = "wharf-raft-group";

/// Shortest deadline for an AppendEntries answer. openraft gives replication
/// the heartbeat interval (its soft TTL is 3/4 of it: 112 ms at the default
/// 150 ms). A follower that must fsync a large catch-up batch on a loaded
/// machine can need longer, and a replication stream that always times out
/// never catches the follower up (seen in a 30-minute chaos run: a 20 s
/// stall). Heartbeats keep their own, shorter, openraft-side timeout.
pub(crate) const MIN_APPEND_DEADLINE: Duration = Duration::from_secs(1);

type Answer = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

/// What the client side needs to turn transport failures into openraft
/// errors (the peer network implements it).
pub(crate) trait StreamErrors {
    fn timeout(&self, ttl: Duration) -> RPCError<TypeConfig>;
    fn status(&self, ttl: Duration, status: Status) -> RPCError<TypeConfig>;
    fn remote(&self, message: String) -> RPCError<TypeConfig>;
}

/// Send times of the requests not answered yet, oldest first.
type Unanswered = Arc<Mutex<VecDeque<Instant>>>;

/// The request frames of one session: each request encoded, its send time
/// recorded. An encoding failure ends the requests and is kept in `failed`.
pub(crate) fn request_frames<S>(
    input: S,
    group_id: GroupId,
    from_node: u64,
    unanswered: Unanswered,
    failed: Arc<Mutex<Option<String>>>,
) -> impl Stream<Item = RaftFrame> + Send + 'static
where
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
{
    input
        .map(move |req| {
            crate::timeline::mark(
                "send",
                req.entries.last().map(|e| e.log_id.index).unwrap_or(0),
            );
            encode(&req)
        })
        .take_while(move |encoded| {
            let ok = encoded.is_ok();
            if let Err(e) = encoded {
                if let Ok(mut f) = failed.lock() {
                    *f = Some(e.clone());
                }
            }
            futures::future::ready(ok)
        })
        .filter_map(move |encoded| {
            let frame = encoded.ok().map(|payload| {
                if let Ok(mut u) = unanswered.lock() {
                    u.push_back(Instant::now());
                }
                RaftFrame {
                    group_id,
                    payload: Bytes::from(payload),
                    from_node,
                }
            });
            futures::future::ready(frame)
        })
}

/// The client's answers: one per request frame, in order, until the stream
/// ends or fails (see the module invariants for the deadline).
pub(crate) fn answers<'s, E: StreamErrors + Sync>(
    responses: Streaming<RaftFrame>,
    errors: &'s E,
    ttl: Duration,
    unanswered: Unanswered,
    failed: Arc<Mutex<Option<String>>>,
) -> BoxStream<'s, Answer> {
    struct State<'e, E> {
        responses: Streaming<RaftFrame>,
        errors: &'e E,
    }
    let state = Some(State { responses, errors });
    Box::pin(futures::stream::unfold(state, move |state| {
        let unanswered = unanswered.clone();
        let failed = failed.clone();
        async move {
            let mut st = state?;
            loop {
                let next = tokio::time::timeout(ttl, st.responses.message()).await;
                let frame = match next {
                    Ok(Ok(Some(frame))) => frame,
                    Ok(Ok(None)) => {
                        // The server ended the stream: our input ended, or
                        // our own encoding failure ended it.
                        let e = failed.lock().ok().and_then(|mut f| f.take());
                        return e.map(|e| {
                            let err = RPCError::Network(NetworkError::from_string(e));
                            (Err(err), None)
                        });
                    }
                    Ok(Err(status)) => {
                        let idle = unanswered.lock().map(|u| u.is_empty()).unwrap_or(false);
                        if idle {
                            // Nothing was lost: end the session as if the
                            // server had closed it, and the next one connects
                            // when there is something to send. An error here
                            // would count toward openraft's backoff, so a peer
                            // that was down while the group was idle would be
                            // caught up only after that backoff (up to
                            // seconds) once it is back; unary calls never
                            // fail while idle.
                            tracing::debug!(%status, "append stream: idle stream broke");
                            return None;
                        }
                        let err = st.errors.status(ttl, status);
                        return Some((Err(err), None));
                    }
                    Err(_elapsed) => {
                        let oldest = unanswered.lock().ok().and_then(|u| u.front().copied());
                        match oldest {
                            Some(sent) if sent.elapsed() >= ttl => {
                                let err = st.errors.timeout(ttl);
                                return Some((Err(err), None));
                            }
                            // Idle, or the oldest request is still young.
                            _ => continue,
                        }
                    }
                };
                crate::timeline::mark("answer", 0);
                if let Ok(mut u) = unanswered.lock() {
                    u.pop_front();
                }
                let answer: Answer =
                    match decode::<WireResult<StreamAppendResult<TypeConfig>>>(&frame.payload) {
                        Ok(Ok(result)) => Ok(result),
                        Ok(Err(remote)) => Err(st.errors.remote(remote)),
                        Err(e) => Err(RPCError::Network(NetworkError::from_string(e))),
                    };
                let go_on = matches!(answer, Ok(Ok(_)));
                return Some((answer, go_on.then_some(st)));
            }
        }
    }))
}

/// The server's answer frames.
pub(crate) type AnswerFrames = Pin<Box<dyn Stream<Item = Result<RaftFrame, Status>> + Send>>;

/// Serves one `AppendStream` call for `raft`. `slow_append` is the
/// slow-follower fault (tests only, see `fault`): answers to requests with
/// entries are held until that long after the request arrived.
pub(crate) fn serve(
    raft: &WharfRaft,
    group_id: GroupId,
    from_node: u64,
    input: impl Stream<Item = Result<RaftFrame, Status>> + Send + 'static,
    slow_append: Option<Duration>,
) -> AnswerFrames {
    let bad: Arc<Mutex<Option<Status>>> = Arc::new(Mutex::new(None));
    // Arrival time and "carries entries" of each request, for the fault.
    let arrivals: Arc<Mutex<VecDeque<(Instant, bool)>>> = Arc::default();
    let requests = {
        let bad = bad.clone();
        let arrivals = arrivals.clone();
        input
            .map(move |frame| {
                let frame = frame?;
                if frame.group_id != group_id {
                    return Err(Status::invalid_argument(
                        "append stream frames name different groups",
                    ));
                }
                let req: AppendEntriesRequest<TypeConfig> =
                    decode(&frame.payload).map_err(Status::invalid_argument)?;
                crate::timeline::mark(
                    "f_recv",
                    req.entries.last().map(|e| e.log_id.index).unwrap_or(0),
                );
                if slow_append.is_some() {
                    if let Ok(mut a) = arrivals.lock() {
                        a.push_back((Instant::now(), !req.entries.is_empty()));
                    }
                }
                Ok(req)
            })
            .take_while(move |req| {
                let ok = req.is_ok();
                if let Err(status) = req {
                    if let Ok(mut b) = bad.lock() {
                        *b = Some(status.clone());
                    }
                }
                futures::future::ready(ok)
            })
            .filter_map(|req| futures::future::ready(req.ok()))
    };
    let answers = raft.stream_append(requests).then(move |result| {
        let arrivals = arrivals.clone();
        async move {
            if let Some(delay) = slow_append {
                let arrival = arrivals.lock().ok().and_then(|mut a| a.pop_front());
                if let Some((arrived, true)) = arrival {
                    tokio::time::sleep_until(arrived + delay).await;
                }
            }
            crate::timeline::mark("f_answer", 0);
            let wire: WireResult<StreamAppendResult<TypeConfig>> =
                result.map_err(|fatal| fatal.to_string());
            let payload = encode(&wire).map_err(Status::internal)?;
            Ok(RaftFrame {
                group_id,
                payload: Bytes::from(payload),
                from_node,
            })
        }
    });
    // Once openraft's answers end (the input ended, or an answer ended the
    // session), a bad frame is reported.
    let trailer = futures::stream::once(async move { bad.lock().ok().and_then(|mut b| b.take()) })
        .filter_map(|bad| futures::future::ready(bad.map(Err)));
    Box::pin(answers.chain(trailer))
}
