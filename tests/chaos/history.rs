//! The recorded history of a chaos run: every client operation with its
//! outcome and the time it was seen, every fault, every leader change.
//!
//! Times are milliseconds since the run started, on one monotonic clock
//! shared by every task of the harness. The history is append-only and is
//! what the checker reads; nothing else is trusted.

use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A publisher sent a publish with this unique id as its payload.
    PublishInvoke {
        t_ms: u64,
        publisher: u32,
        id: String,
    },
    /// The publish was acknowledged: stored on a majority at `seq`.
    PublishOk { t_ms: u64, id: String, seq: u64 },
    /// The server rejected the publish outright: it is not stored.
    PublishFail {
        t_ms: u64,
        id: String,
        error: String,
    },
    /// Timeout or transport error: the message may or may not be stored.
    PublishUnknown {
        t_ms: u64,
        id: String,
        error: String,
    },
    /// A worker received a message.
    Deliver {
        t_ms: u64,
        worker: u32,
        id: String,
        seq: u64,
        count: u64,
    },
    /// A worker's ack call returned (ok: committed; otherwise the error).
    Ack {
        t_ms: u64,
        worker: u32,
        id: String,
        seq: u64,
        ok: bool,
        error: String,
    },
    /// A fault began (`phase` "start") or was healed ("end").
    Fault {
        t_ms: u64,
        phase: String,
        kind: String,
        node: u64,
        detail: String,
    },
    /// A group's leader (or term) changed, as polled from cluster status.
    Leader {
        t_ms: u64,
        group: String,
        leader: u64,
        term: u64,
    },
    /// One node's own view of a group, sampled about once a second: who it
    /// thinks leads, at what term, and how far it has applied.
    Replica {
        t_ms: u64,
        node: u64,
        group: String,
        leader: u64,
        term: u64,
        last_applied: u64,
    },
    /// A harness milestone (workload end, heal, drain) or a problem worth
    /// keeping next to the operations.
    Note { t_ms: u64, text: String },
}

impl Event {
    pub fn t_ms(&self) -> u64 {
        match self {
            Event::PublishInvoke { t_ms, .. }
            | Event::PublishOk { t_ms, .. }
            | Event::PublishFail { t_ms, .. }
            | Event::PublishUnknown { t_ms, .. }
            | Event::Deliver { t_ms, .. }
            | Event::Ack { t_ms, .. }
            | Event::Fault { t_ms, .. }
            | Event::Leader { t_ms, .. }
            | Event::Replica { t_ms, .. }
            | Event::Note { t_ms, .. } => *t_ms,
        }
    }
}

/// The shared recorder.
pub struct History {
    start: Instant,
    events: Mutex<Vec<Event>>,
}

impl History {
    pub fn new() -> History {
        History {
            start: Instant::now(),
            events: Mutex::new(Vec::new()),
        }
    }

    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn push(&self, e: Event) {
        self.events.lock().expect("history lock").push(e);
    }

    pub fn note(&self, text: impl Into<String>) {
        let text = text.into();
        eprintln!("[chaos {:>7.1}s] {text}", self.now_ms() as f64 / 1000.0);
        self.push(Event::Note {
            t_ms: self.now_ms(),
            text,
        });
    }

    pub fn snapshot(&self) -> Vec<Event> {
        let mut v = self.events.lock().expect("history lock").clone();
        v.sort_by_key(Event::t_ms);
        v
    }
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}
