//! The dead-letter publisher of a consumer group's leader.
//!
//! A consumer with a dead-letter subject keeps termed and exhausted messages
//! in a replicated outbox (`wharf_core::consumer::dead_letter`). While this
//! node leads the consumer group, this task takes up to [`BATCH`] outbox
//! entries, reads each message from the local stream replica, publishes a
//! copy to the dead-letter subject through the node's normal publish path
//! (so it lands in whichever stream captures that subject, on any node), and
//! then commits `DeadLettered` so the entries leave the outbox and are
//! counted.
//!
//! Once: each copy carries the message id `wharf-dlq:<stream>:<consumer
//! id>:<seq>`; a new leader that publishes an entry again after a crash
//! between the publish and the commit is answered "duplicate" by the target
//! stream's duplicate window, and the copy is stored once.
//!
//! Headers of a copy: the original's, plus `Wharf-Dead-Letter-Stream`,
//! `-Consumer`, `-Subject`, `-Stream-Seq`, `-Deliveries` and `-Reason`.
//!
//! Left out: a copy whose dead-letter subject no stream captures is dropped
//! (logged, not counted), as a publish to such a subject would be refused;
//! a message the stream already removed is dropped the same way. (One this
//! node's stream replica has not stored yet waits for it.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use wharf_proto::v1 as pb;
use wharf_raft::{Group, Role};

use crate::consumer_sm::{ConsumerCommand, ConsumerMachine};
use crate::error::ServerError;
use crate::node::NodeInner;
use crate::service::WharfService;
use crate::stream_sm::read_message;

/// Most outbox entries handled per round.
const BATCH: usize = 64;
/// Pause after a failed publish or proposal.
const RETRY_PAUSE: Duration = Duration::from_millis(500);
/// Re-check the outbox this often even without changes.
const TICK: Duration = Duration::from_secs(1);

pub struct DeadLetterTask {
    pub node: Weak<NodeInner>,
    pub stream: String,
    pub consumer: String,
    pub consumer_id: u64,
    pub group: Group,
    pub sm: Arc<Mutex<ConsumerMachine>>,
    pub changes: watch::Receiver<u64>,
    pub stream_tree: sled::Tree,
    /// Last sequence this node's stream replica has stored: a message above
    /// it is not here *yet* (the replica trails), which is not "gone".
    pub stream_last_seq: watch::Receiver<u64>,
}

/// One outbox entry ready to publish.
struct Entry {
    seq: u64,
    deliveries: u64,
    reason: String,
}

impl DeadLetterTask {
    pub fn spawn(self) {
        tokio::spawn(self.run());
    }

    async fn run(mut self) {
        let mut status = self.group.watch_role();
        loop {
            let leader = *status.borrow_and_update() == Role::Leader;
            let mut pause = TICK;
            if leader {
                match self.round().await {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::debug!(consumer = %self.consumer, "dead-letter round failed: {e}");
                        pause = RETRY_PAUSE;
                    }
                }
            }
            tokio::select! {
                r = status.changed() => if r.is_err() { return },
                r = self.changes.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Publishes one batch; answers whether there was anything to do.
    async fn round(&self) -> Result<bool, ServerError> {
        let (subject, entries) = {
            let sm = self.sm.lock().map_err(|_| poisoned())?;
            let state = sm.state();
            let Some(subject) = state.config().dead_letter_subject.clone() else {
                return Ok(false);
            };
            let entries: Vec<Entry> = (state.dead_letter_outbox())
                .take(BATCH)
                .map(|(seq, d)| Entry {
                    seq,
                    deliveries: d.deliveries,
                    reason: d.reason.describe(),
                })
                .collect();
            (subject, entries)
        };
        if entries.is_empty() {
            return Ok(false);
        }
        let node = self
            .node
            .upgrade()
            .ok_or_else(|| ServerError::Unavailable("node is shutting down".into()))?;
        let service = WharfService::new(node);
        let (mut published, mut dropped) = (Vec::new(), Vec::new());
        let stored_up_to = *self.stream_last_seq.borrow();
        for e in entries {
            // Not stored here yet: wait for this replica to catch up rather
            // than drop the copy (docs/RELIABILITY.md, bug 8).
            if e.seq > stored_up_to {
                break;
            }
            let Some(msg) = read_message(&self.stream_tree, e.seq)? else {
                tracing::warn!(stream = %self.stream, seq = e.seq, "dead-letter copy dropped: message gone");
                dropped.push(e.seq);
                continue;
            };
            let mut headers: HashMap<String, String> = msg.headers.into_iter().collect();
            headers.insert("Wharf-Dead-Letter-Stream".into(), self.stream.clone());
            headers.insert("Wharf-Dead-Letter-Consumer".into(), self.consumer.clone());
            headers.insert("Wharf-Dead-Letter-Subject".into(), msg.subject);
            headers.insert("Wharf-Dead-Letter-Stream-Seq".into(), e.seq.to_string());
            headers.insert(
                "Wharf-Dead-Letter-Deliveries".into(),
                e.deliveries.to_string(),
            );
            headers.insert("Wharf-Dead-Letter-Reason".into(), e.reason);
            let request = pb::PublishRequest {
                subject: subject.clone(),
                payload: msg.payload,
                msg_id: format!("wharf-dlq:{}:{}:{}", self.stream, self.consumer_id, e.seq),
                headers,
            };
            match service.publish(request, 0).await {
                Ok(_) => published.push(e.seq),
                Err(ServerError::NotFound(m)) => {
                    tracing::warn!(consumer = %self.consumer, "dead-letter copy dropped: {m}");
                    dropped.push(e.seq);
                }
                Err(e) if published.is_empty() && dropped.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        if published.is_empty() && dropped.is_empty() {
            return Err(ServerError::Unavailable(
                "this node's stream replica has not stored the dead letters yet".into(),
            ));
        }
        let cmd = ConsumerCommand::DeadLettered { published, dropped };
        self.group.write(bincode::serialize(&cmd)?).await?;
        Ok(true)
    }
}

fn poisoned() -> ServerError {
    ServerError::Internal("consumer state lock poisoned".into())
}
