//! The consumer leader's side of pulls: accepting a pull, ending it with its
//! final status, idle heartbeats and expiry, and the messages sent to worker
//! sessions (deliveries, statuses, ack replies).
//!
//! Invariant: a pull's final status goes out after its last message.

use super::*;

impl Runner {
    pub(super) fn on_pull(&mut self, session: SessionId, pull: pb::PullRequest) {
        if !self.sessions.contains_key(&session) {
            return;
        }
        if pull.batch == 0 || pull.batch > MAX_PULL_BATCH {
            self.fail_session(
                session,
                Status::invalid_argument(format!(
                    "pull batch must be between 1 and {MAX_PULL_BATCH}, got {}",
                    pull.batch
                )),
            );
            return;
        }
        let now = now_ms();
        let expires = if pull.no_wait {
            Some(now)
        } else if pull.expires_ms > 0 {
            Some(now.saturating_add(pull.expires_ms.min(i64::MAX as u64) as i64))
        } else {
            None
        };
        let max_waiting = self
            .ctx
            .consumer
            .lock()
            .map(|c| c.state().config().max_waiting);
        let max_waiting = max_waiting.unwrap_or(wharf_core::consumer::DEFAULT_MAX_WAITING);
        let added = self.dispatcher.add_pull_with_max_bytes(
            session,
            pull.id,
            pull.batch,
            expires,
            max_waiting,
            pull.max_bytes,
        );
        match added {
            Ok(()) => {
                let thresholds = Thresholds {
                    min_pending: pull.min_pending,
                    min_ack_pending: pull.min_ack_pending,
                };
                self.dispatcher.set_thresholds(session, pull.id, thresholds);
                if pull.no_wait {
                    self.no_wait.insert((session, pull.id));
                }
                if pull.idle_heartbeat_ms > 0 {
                    let every = pull.idle_heartbeat_ms.max(MIN_HEARTBEAT_MS);
                    let every = i64::try_from(every).unwrap_or(i64::MAX);
                    self.heartbeats
                        .insert((session, pull.id), (every, now.saturating_add(every)));
                }
            }
            Err(e) => self.send_status(
                session,
                pull.id,
                pb::pull_status::Code::TooManyWaiting,
                0,
                e.to_string(),
            ),
        }
    }

    pub(super) fn fail_session(&mut self, session: SessionId, status: Status) {
        if let Some(out) = self.sessions.remove(&session) {
            let _ = out.try_send(Err(status));
        }
        self.dispatcher.remove_session(session);
    }

    pub(super) fn send(&self, session: SessionId, kind: pb::consume_response::Kind) {
        if let Some(out) = self.sessions.get(&session) {
            // A full outbox means a stuck worker: the message stays pending
            // and AckWait hands it to someone else.
            let _ = out.try_send(Ok(pb::ConsumeResponse { kind: Some(kind) }));
        }
    }

    pub(super) fn send_status(
        &self,
        session: SessionId,
        pull_id: u64,
        code: pb::pull_status::Code,
        delivered: u32,
        text: String,
    ) {
        let status = pb::PullStatus {
            pull_id,
            code: code as i32,
            text,
            delivered,
        };
        self.send(session, pb::consume_response::Kind::Status(status));
    }

    pub(super) fn reply_ack(&self, session: SessionId, reply_id: u64, error: String) {
        self.send(
            session,
            pb::consume_response::Kind::AckReply(pb::AckReply { reply_id, error }),
        );
    }

    /// Record that a pull ended; its status goes out once its messages have.
    pub(super) fn end_pull(&mut self, key: PullKey, code: pb::pull_status::Code, delivered: u32) {
        self.no_wait.remove(&key);
        if self.pull_inflight.get(&key).copied().unwrap_or(0) > 0 {
            self.pull_end.insert(key, (code, delivered));
        } else {
            let text = match code {
                pb::pull_status::Code::Done => "batch complete",
                pb::pull_status::Code::NoMessages => "no messages",
                _ => "request expired",
            };
            self.send_status(key.0, key.1, code, delivered, text.into());
        }
    }

    /// A HEARTBEAT status to every waiting pull whose interval has passed.
    pub(super) fn send_heartbeats(&mut self) {
        if self.heartbeats.is_empty() {
            return;
        }
        let now = now_ms();
        let waiting: HashSet<PullKey> = self
            .dispatcher
            .waiting()
            .map(|w| (w.session, w.pull_id))
            .collect();
        self.heartbeats.retain(|key, _| waiting.contains(key));
        let due: Vec<PullKey> = self
            .heartbeats
            .iter()
            .filter(|(_, (_, next))| *next <= now)
            .map(|(k, _)| *k)
            .collect();
        for key in due {
            if let Some((every, next)) = self.heartbeats.get_mut(&key) {
                *next = now.saturating_add(*every);
            }
            let code = pb::pull_status::Code::Heartbeat;
            self.send_status(key.0, key.1, code, 0, "idle heartbeat".into());
        }
    }

    pub(super) fn expire_pulls(&mut self) {
        for f in self.dispatcher.expire(now_ms()) {
            let key = (f.session, f.pull_id);
            let code = if self.no_wait.contains(&key) && f.delivered == 0 {
                pb::pull_status::Code::NoMessages
            } else {
                pb::pull_status::Code::Expired
            };
            self.end_pull(key, code, f.delivered);
        }
    }
}
