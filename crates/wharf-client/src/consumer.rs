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
        let id = self.send_pull(batch, wait, Vec::new()).await?;
        let session = self.open().await?;
        let deadline = tokio::time::Instant::now() + wait + PULL_GRACE;
        loop {
            let next = tokio::time::timeout_at(deadline, session.rx.message()).await;
            let resp = match next {
                Err(_) => return Err(tonic::Status::unavailable("no answer to pull").into()),
                Ok(resp) => received(resp)?,
            };
            let Some(resp) = resp else { continue };
            if let Kind::Message(m) = resp {
                out.push(m.into());
            } else if pull_ended(id, &resp)? {
                return Ok(());
            }
        }
    }

    /// Send a pull for up to `batch` messages waiting at most `wait`, with
    /// `acks` to settle first, on the session (opened if needed); returns
    /// the pull's id.
    async fn send_pull(
        &mut self,
        batch: u32,
        wait: Duration,
        acks: Vec<pb::AckRequest>,
    ) -> Result<u64> {
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
            acks,
        };
        let req = pb::ConsumeRequest {
            kind: Some(pb::consume_request::Kind::Pull(pull)),
        };
        session
            .tx
            .send(req)
            .await
            .map_err(|_| ClientError::Timeout("session closed".into()))?;
        Ok(id)
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

    /// Acknowledge these messages and pull the next batch in one go ("ack
    /// next"): the acks ride in the pull request, and the consumer's leader
    /// commits them in the same Raft entry as the pull's first delivery, so
    /// a worker waits for one commit per batch instead of two. Returns once every ack
    /// is committed and the pull has ended (with up to `batch` messages,
    /// possibly none), as `ack_each` then `fetch` would. When the session
    /// fails midway the unconfirmed acks are resent on a new one and the
    /// pull is made again if it had brought nothing.
    pub async fn ack_and_fetch(
        &mut self,
        stream_seqs: &[u64],
        batch: u32,
        wait: Duration,
    ) -> Result<Vec<Message>> {
        if stream_seqs.len() > MAX_ACKS_IN_FLIGHT || !self.stash.is_empty() {
            self.ack_each(stream_seqs).await?;
            return self.fetch(batch, wait).await;
        }
        let mut acks: Vec<pb::AckRequest> = stream_seqs
            .iter()
            .map(|&stream_seq| pb::AckRequest {
                stream_seq,
                ..Default::default()
            })
            .collect();
        let mut out = Vec::new();
        match self
            .ack_and_pull_once(&mut acks, batch, wait, &mut out)
            .await
        {
            Ok(()) => Ok(out),
            Err(e) => {
                self.broken();
                if !is_retryable(&e) {
                    // What arrived stays delivered to this worker: the next
                    // fetch hands it out.
                    self.stash.extend(out);
                    return Err(e);
                }
                if let Err(e) = self.replies(acks).await {
                    self.stash.extend(out);
                    return Err(e);
                }
                if out.is_empty() {
                    self.fetch(batch, wait).await
                } else {
                    Ok(out)
                }
            }
        }
    }

    /// One attempt of `ack_and_fetch`: confirmed acks leave `acks`, messages
    /// go to `out`; an error means acks are left or the pull did not end.
    async fn ack_and_pull_once(
        &mut self,
        acks: &mut Vec<pb::AckRequest>,
        batch: u32,
        wait: Duration,
        out: &mut Vec<Message>,
    ) -> Result<()> {
        for ack in acks.iter_mut() {
            ack.reply_id = self.next_id();
        }
        let pull_id = self.send_pull(batch, wait, acks.clone()).await?;
        let pull_deadline = tokio::time::Instant::now() + wait + PULL_GRACE;
        self.await_answers(acks, Some((pull_id, pull_deadline)), out)
            .await
    }

    /// Read the session until every ack in `acks` is answered (within
    /// `ACK_TIMEOUT`) and, given a pull, until that pull has ended (by its
    /// deadline). Confirmed acks leave `acks`; messages go to `out`. An
    /// error means acks are left or the pull did not end.
    async fn await_answers(
        &mut self,
        acks: &mut Vec<pb::AckRequest>,
        pull: Option<(u64, tokio::time::Instant)>,
        out: &mut Vec<Message>,
    ) -> Result<()> {
        let session = self.open().await?;
        let ack_deadline = tokio::time::Instant::now() + ACK_TIMEOUT;
        let mut waiting: HashSet<u64> = acks.iter().map(|a| a.reply_id).collect();
        let mut pull_open = pull.is_some();
        let mut result = Ok(());
        while pull_open || !waiting.is_empty() {
            let deadline = match pull {
                Some((_, at)) if pull_open && waiting.is_empty() => at,
                Some((_, at)) if pull_open => ack_deadline.min(at),
                _ => ack_deadline,
            };
            let next = match tokio::time::timeout_at(deadline, session.rx.message()).await {
                Err(_) => Err(tonic::Status::unavailable("no answer to acks or pull").into()),
                Ok(next) => received(next),
            };
            let resp = match next {
                Ok(Some(resp)) => resp,
                Ok(None) => continue,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            match resp {
                Kind::Message(m) => out.push(m.into()),
                Kind::AckReply(r) if waiting.remove(&r.reply_id) => {
                    if r.error.is_empty() {
                        acks.retain(|a| a.reply_id != r.reply_id);
                    } else {
                        result = Err(tonic::Status::unavailable(r.error).into());
                    }
                }
                status => match pull.map(|(id, _)| pull_ended(id, &status)) {
                    Some(Ok(ended)) => pull_open = pull_open && !ended,
                    Some(Err(e)) => {
                        result = Err(e);
                        break;
                    }
                    None => {}
                },
            }
        }
        if result.is_ok() && !acks.is_empty() {
            result = Err(tonic::Status::unavailable("acks not confirmed").into());
        }
        result
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
        // Messages that arrive meanwhile belong to an earlier pull: the
        // next fetch hands them out.
        let mut stash = Vec::new();
        let result = self.await_answers(acks, None, &mut stash).await;
        self.stash.extend(stash);
        result
    }

    /// End the session; the server drops this worker's waiting pulls.
    pub fn close(mut self) {
        self.session = None;
    }
}

/// One answer off the session (none for a response without a kind, which
/// only a newer server could send); an error when the session failed or ended.
fn received(
    next: std::result::Result<Option<pb::ConsumeResponse>, tonic::Status>,
) -> Result<Option<Kind>> {
    match next {
        Err(s) => Err(s.into()),
        Ok(None) => Err(tonic::Status::unavailable("session ended").into()),
        Ok(Some(resp)) => Ok(resp.kind),
    }
}

/// Whether `resp` is pull `id`'s final status; an error for the statuses
/// that end it badly. Heartbeats and other pulls' statuses are not final.
fn pull_ended(id: u64, resp: &Kind) -> Result<bool> {
    use pb::pull_status::Code;
    let Kind::Status(s) = resp else {
        return Ok(false);
    };
    if s.pull_id != id {
        return Ok(false);
    }
    match Code::try_from(s.code).ok() {
        Some(Code::Heartbeat) => Ok(false),
        Some(Code::TooManyWaiting) => Err(tonic::Status::resource_exhausted(s.text.clone()).into()),
        Some(Code::LeaderChanged) => Err(tonic::Status::unavailable(s.text.clone()).into()),
        Some(Code::ConsumerDeleted) => Err(tonic::Status::not_found(s.text.clone()).into()),
        _ => Ok(true),
    }
}

fn is_retryable(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) => retryable(s),
        ClientError::Timeout(_) => true,
        ClientError::InvalidAddress(_) => false,
    }
}
