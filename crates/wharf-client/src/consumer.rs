//! A worker's session with a durable pull consumer.
//!
//! One bidirectional `Consume` stream carries this worker's pulls and acks up
//! and its messages and statuses down. While the stream is open the worker is
//! one of the consumer's round-robin candidates whenever it has a pull
//! waiting; closing it (drop, crash, network cut) withdraws its pulls at once.
//! Messages it received and did not ack go to another worker after AckWait.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use wharf_proto::v1 as pb;
use wharf_proto::v1::consume_response::Kind;

use crate::error::{retryable, ClientError, Result};
use crate::Client;

/// Extra time, beyond a pull's own expiry, to wait for the server's verdict.
const PULL_GRACE: Duration = Duration::from_secs(3);
/// How long one synchronous ack (or one batch of them) waits for its replies
/// before the session is reopened.
const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Acks one `ack_each` call has in flight at once (the rest wait their turn).
pub const MAX_ACKS_IN_FLIGHT: usize = 512;

#[derive(Debug, Clone)]
pub struct Message {
    pub subject: String,
    pub payload: Bytes,
    pub stream_seq: u64,
    pub consumer_seq: u64,
    /// Delivery count: 1 the first time, more on redelivery.
    pub delivered: u64,
    pub published_ms: i64,
    /// Headers given at publish (dead-letter copies carry `Wharf-Dead-Letter-*`).
    pub headers: std::collections::HashMap<String, String>,
}

impl From<pb::Message> for Message {
    fn from(m: pb::Message) -> Self {
        Message {
            subject: m.subject,
            payload: m.payload,
            stream_seq: m.stream_seq,
            consumer_seq: m.consumer_seq,
            delivered: m.delivered,
            published_ms: m.published_ms,
            headers: m.headers,
        }
    }
}

struct Session {
    tx: mpsc::Sender<pb::ConsumeRequest>,
    rx: tonic::Streaming<pb::ConsumeResponse>,
    /// The seed it was opened at.
    seed: usize,
}

pub struct Consumer {
    client: Client,
    stream: String,
    name: String,
    session: Option<Session>,
    /// The seed that led the consumer when a session was last opened: the
    /// next session is opened there first.
    leader_seed: Option<usize>,
    next_id: u64,
    /// Messages that arrived while waiting for something else.
    stash: VecDeque<Message>,
    /// Payload byte limit of each pull (0: none).
    max_bytes: u64,
    /// Idle heartbeat asked of each pull (0: none).
    idle_heartbeat_ms: u64,
    /// Overflow thresholds of each pull: (min_pending, min_ack_pending).
    overflow: (u64, u64),
}

impl Consumer {
    pub(crate) fn new(client: Client, stream: &str, name: &str) -> Self {
        Consumer {
            client,
            stream: stream.to_string(),
            name: name.to_string(),
            session: None,
            leader_seed: None,
            next_id: 1,
            stash: VecDeque::new(),
            max_bytes: 0,
            idle_heartbeat_ms: 0,
            overflow: (0, 0),
        }
    }

    /// As a standby worker of an overflow consumer: pulls are served only
    /// while the consumer has at least `min_pending` unprocessed or
    /// `min_ack_pending` outstanding messages (0: no such threshold).
    pub fn with_overflow(mut self, min_pending: u64, min_ack_pending: u64) -> Self {
        self.overflow = (min_pending, min_ack_pending);
        self
    }

    /// Limit each pull's batch to this many payload bytes (0: no limit).
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Ask the server for a heartbeat status this often while a pull waits.
    pub fn with_idle_heartbeat(mut self, every: Duration) -> Self {
        self.idle_heartbeat_ms = u64::try_from(every.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// The session, opened if there is none. A session is opened at the
    /// seed that led the consumer last time, else at the client's current
    /// seed; when the node that answers names another seed as the leader,
    /// the session is opened again there, so pulls and acks skip the proxy
    /// hop (the proxied session is kept if that fails).
    async fn open(&mut self) -> Result<&mut Session> {
        if self.session.is_none() {
            let first = self
                .leader_seed
                .take()
                .unwrap_or_else(|| self.client.current_index());
            let (session, leader) = match self.open_at(first).await {
                Ok(opened) => opened,
                Err(e) => {
                    self.client.rotate();
                    return Err(e);
                }
            };
            let session = match leader {
                Some(j) if j != first => match self.open_at(j).await {
                    Ok((direct, _)) => direct,
                    Err(e) => {
                        tracing::debug!("staying proxied: the consumer leader refused: {e}");
                        session
                    }
                },
                _ => session,
            };
            self.leader_seed = leader;
            self.session = Some(session);
        }
        Ok(self.session.as_mut().expect("opened above"))
    }

    /// Open a session at seed `i`: the session, and the seed that leads the
    /// consumer if the answer names one of the seeds.
    async fn open_at(&self, i: usize) -> Result<(Session, Option<usize>)> {
        let (tx, rx) = mpsc::channel(1024);
        let open = pb::ConsumeOpen {
            stream: self.stream.clone(),
            consumer: self.name.clone(),
        };
        let first = pb::ConsumeRequest {
            kind: Some(pb::consume_request::Kind::Open(open)),
        };
        tx.send(first)
            .await
            .map_err(|_| ClientError::Timeout("session closed".into()))?;
        let resp = self.client.seed(i).consume(ReceiverStream::new(rx)).await?;
        let leader = resp
            .metadata()
            .get(pb::CONSUMER_LEADER_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|addr| self.client.seed_named(addr));
        let session = Session {
            tx,
            rx: resp.into_inner(),
            seed: i,
        };
        Ok((session, leader))
    }

    /// The address of the seed this worker's session is open at, if one is.
    pub fn session_addr(&self) -> Option<&str> {
        self.session.as_ref().map(|s| self.client.seed_addr(s.seed))
    }

    fn broken(&mut self) {
        self.session = None;
        self.leader_seed = None;
        self.client.rotate();
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Pull up to `batch` messages, waiting at most `wait` for them. Returns
    /// fewer (possibly none) when the wait ends first. Rides through node
    /// failures by reopening the session; gives up with the last error only
    /// when no session could be had for the whole retry window.
    pub async fn fetch(&mut self, batch: u32, wait: Duration) -> Result<Vec<Message>> {
        let mut out: Vec<Message> = self.stash.drain(..).collect();
        if out.len() >= batch as usize {
            return Ok(out);
        }
        let give_up = tokio::time::Instant::now() + wait.max(self.client.retry_for());
        let wait_until = tokio::time::Instant::now() + wait;
        let mut backoff = Duration::from_millis(50);
        loop {
            let now = tokio::time::Instant::now();
            let remaining = wait_until.saturating_duration_since(now);
            match self
                .pull_once(batch - out.len() as u32, remaining, &mut out)
                .await
            {
                Ok(()) => return Ok(out),
                Err(e) if is_retryable(&e) && now < give_up => {
                    self.broken();
                    if !out.is_empty() {
                        return Ok(out);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => {
                    self.broken();
                    return Err(e);
                }
            }
        }
    }

    async fn pull_once(
        &mut self,
        batch: u32,
        wait: Duration,
        out: &mut Vec<Message>,
    ) -> Result<()> {
        let id = self.next_id();
        let (max_bytes, idle_heartbeat_ms) = (self.max_bytes, self.idle_heartbeat_ms);
        let (min_pending, min_ack_pending) = self.overflow;
        let session = self.open().await?;
        let pull = pb::PullRequest {
            id,
            batch,
            expires_ms: wait.as_millis().max(1) as u64,
            no_wait: wait.is_zero(),
            max_bytes,
            idle_heartbeat_ms,
            min_pending,
            min_ack_pending,
        };
        let req = pb::ConsumeRequest {
            kind: Some(pb::consume_request::Kind::Pull(pull)),
        };
        session
            .tx
            .send(req)
            .await
            .map_err(|_| ClientError::Timeout("session closed".into()))?;
        let deadline = tokio::time::Instant::now() + wait + PULL_GRACE;
        loop {
            let next = tokio::time::timeout_at(deadline, session.rx.message()).await;
            match next {
                Err(_) => return Err(tonic::Status::unavailable("no answer to pull").into()),
                Ok(Err(s)) => return Err(s.into()),
                Ok(Ok(None)) => return Err(tonic::Status::unavailable("session ended").into()),
                Ok(Ok(Some(resp))) => match resp.kind {
                    Some(Kind::Message(m)) => out.push(m.into()),
                    Some(Kind::Status(s)) if s.pull_id == id => {
                        use pb::pull_status::Code;
                        match Code::try_from(s.code).ok() {
                            Some(Code::Heartbeat) => {}
                            Some(Code::TooManyWaiting) => {
                                return Err(tonic::Status::resource_exhausted(s.text).into())
                            }
                            Some(Code::LeaderChanged) => {
                                return Err(tonic::Status::unavailable(s.text).into())
                            }
                            Some(Code::ConsumerDeleted) => {
                                return Err(tonic::Status::not_found(s.text).into())
                            }
                            _ => return Ok(()),
                        }
                    }
                    _ => {}
                },
            }
        }
    }

    /// Acknowledge one message; returns once the ack is committed.
    pub async fn ack(&mut self, stream_seq: u64) -> Result<()> {
        self.ack_each(&[stream_seq]).await
    }

    /// Acknowledge each of these messages; returns once every ack is
    /// committed. All acks (up to `MAX_ACKS_IN_FLIGHT` at a time) are sent
    /// before any reply is awaited, so the consumer's leader commits them
    /// together: one Raft entry for the lot instead of one round trip each.
    /// On an error some of the acks may have been committed; acking again is
    /// harmless.
    pub async fn ack_each(&mut self, stream_seqs: &[u64]) -> Result<()> {
        for chunk in stream_seqs.chunks(MAX_ACKS_IN_FLIGHT) {
            let acks = chunk
                .iter()
                .map(|&stream_seq| pb::AckRequest {
                    stream_seq,
                    ..Default::default()
                })
                .collect();
            self.replies(acks).await?;
        }
        Ok(())
    }

    /// Negative ack: the message goes to a worker again after `delay`
    /// (zero: at once). Returns once committed.
    pub async fn nak(&mut self, stream_seq: u64, delay: Duration) -> Result<()> {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let kind = pb::AckKind::Nak as i32;
        self.reply(pb::AckRequest {
            stream_seq,
            kind,
            delay_ms,
            ..Default::default()
        })
        .await
    }

    /// Still working on it: restarts the message's AckWait. Returns once committed.
    pub async fn in_progress(&mut self, stream_seq: u64) -> Result<()> {
        let kind = pb::AckKind::InProgress as i32;
        self.reply(pb::AckRequest {
            stream_seq,
            kind,
            ..Default::default()
        })
        .await
    }

    /// Terminate: the message is never redelivered. Returns once committed.
    pub async fn term(&mut self, stream_seq: u64, reason: &str) -> Result<()> {
        let kind = pb::AckKind::Term as i32;
        let reason = reason.to_string();
        self.reply(pb::AckRequest {
            stream_seq,
            kind,
            reason,
            ..Default::default()
        })
        .await
    }

    /// Send an ack of any kind and wait until it is committed.
    async fn reply(&mut self, ack: pb::AckRequest) -> Result<()> {
        self.replies(vec![ack]).await
    }

    /// Send acks of any kind and wait until each is committed, reopening the
    /// session and resending those not yet confirmed as often as needed
    /// within the retry window (acks are idempotent).
    async fn replies(&mut self, mut acks: Vec<pb::AckRequest>) -> Result<()> {
        let give_up = tokio::time::Instant::now() + self.client.retry_for();
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.acks_once(&mut acks).await {
                Ok(()) => return Ok(()),
                Err(e) if is_retryable(&e) && tokio::time::Instant::now() < give_up => {
                    self.broken();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt: sends every ack in `acks`, then waits for their replies.
    /// The acks confirmed are removed from `acks`; an error means some are left.
    async fn acks_once(&mut self, acks: &mut Vec<pb::AckRequest>) -> Result<()> {
        for ack in acks.iter_mut() {
            ack.reply_id = self.next_id();
        }
        let session = self.open().await?;
        for ack in acks.iter() {
            let req = pb::ConsumeRequest {
                kind: Some(pb::consume_request::Kind::Ack(ack.clone())),
            };
            session
                .tx
                .send(req)
                .await
                .map_err(|_| ClientError::Timeout("session closed".into()))?;
        }
        let mut waiting: HashSet<u64> = acks.iter().map(|a| a.reply_id).collect();
        let mut confirmed = HashSet::new();
        let deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        let mut stash = Vec::new();
        let mut result = Ok(());
        while !waiting.is_empty() {
            match tokio::time::timeout_at(deadline, session.rx.message()).await {
                Err(_) => {
                    result = Err(tonic::Status::unavailable("no answer to ack").into());
                    break;
                }
                Ok(Err(s)) => {
                    result = Err(s.into());
                    break;
                }
                Ok(Ok(None)) => {
                    result = Err(tonic::Status::unavailable("session ended").into());
                    break;
                }
                Ok(Ok(Some(resp))) => match resp.kind {
                    Some(Kind::AckReply(r)) if waiting.remove(&r.reply_id) => {
                        if r.error.is_empty() {
                            confirmed.insert(r.reply_id);
                        } else {
                            result = Err(tonic::Status::unavailable(r.error).into());
                        }
                    }
                    Some(Kind::Message(m)) => stash.push(Message::from(m)),
                    _ => {}
                },
            }
        }
        self.stash.extend(stash);
        acks.retain(|a| !confirmed.contains(&a.reply_id));
        if result.is_ok() && !acks.is_empty() {
            result = Err(tonic::Status::unavailable("acks not confirmed").into());
        }
        result
    }

    /// End the session; the server drops this worker's waiting pulls.
    pub fn close(mut self) {
        self.session = None;
    }
}

fn is_retryable(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) => retryable(s),
        ClientError::Timeout(_) => true,
        ClientError::InvalidAddress(_) => false,
    }
}
