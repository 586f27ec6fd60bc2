//! A stream group's state machine: the message index in memory, payloads in sled.
//!
//! `wharf_core::stream::StreamState` decides sequences and what the limits
//! remove; this wrapper stores each message (subject, publish time, payload)
//! in the stream's own sled tree, in blocks of consecutive sequences
//! (`payload_blocks`), and deletes what the limits remove. Replaying the log
//! rewrites the same keys, so apply is idempotent at the storage level.
//!
//! Commands: `Publish` (a batch; each item may carry a message id for the
//! duplicate window), `Expire` (age limit and duplicate window, proposed by
//! the leader as time passes), `UpdateConfig` (the leader follows the
//! catalog's config), `Purge` and `DeleteMsg` (answer the number removed),
//! and for work-queue and interest retention `SetConsumers` (the consumers
//! the catalog lists for the stream) and `Progress` (what they finished, as
//! the leader read it from its consumer replicas; see
//! `wharf_core::stream::retention`).
//!
//! Invariants:
//! - A message is readable from the tree before `applied_seq` announces it, so
//!   a consumer leader that sees `last_seq = n` can read every stored seq <= n.
//! - Time comes from the leader inside the command, never from a local clock.
//!
//! Snapshots: the stored one holds the message index but no payloads (they
//! are in the tree, which the snapshot store flushes first); the one sent to
//! a node that must catch up adds the payloads (see `expand_snapshot`).
//!
//! Left out: compaction of the tree itself (sled does that); a transfer still
//! holds the whole stream in memory on both ends while it is sent.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use wharf_core::stream::{ConsumerInterest, ConsumerProgress, Purge, StreamConfig, StreamState};
use wharf_raft::StateMachine;

use crate::error::{Result, ServerError};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PublishItem {
    pub subject: String,
    pub payload: Bytes,
    /// Deduplication id, if the publisher gave one.
    pub msg_id: Option<String>,
    /// Headers, in name order.
    pub headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StreamCommand {
    /// A batch of publishes, in arrival order.
    Publish {
        now_ms: i64,
        items: Vec<PublishItem>,
    },
    /// Remove messages older than max age.
    Expire { now_ms: i64 },
    /// Apply the catalog's config with this revision; an entry whose
    /// revision is not newer than the applied one is ignored, so a leader
    /// whose catalog lags cannot bring an old config back.
    UpdateConfig {
        config: StreamConfig,
        revision: u64,
        now_ms: i64,
    },
    /// Remove what `purge` selects; answers the number removed.
    Purge { purge: Purge },
    /// Remove one message; answers 1, or NotFound.
    DeleteMsg { seq: u64 },
    /// Work-queue/interest retention: the consumers to wait for.
    SetConsumers { consumers: Vec<ConsumerInterest> },
    /// Work-queue/interest retention: (name, catalog id, progress) of
    /// consumers, read from committed consumer state.
    Progress {
        items: Vec<(String, u64, ConsumerProgress)>,
    },
}

/// Where a publish landed: a new sequence, or (`duplicate`) the original
/// sequence of a message id still inside the duplicate window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishOutcome {
    pub seq: u64,
    pub duplicate: bool,
}

/// One result per published item: where it landed, or why it was refused.
pub type PublishResults = Vec<std::result::Result<PublishOutcome, ServerError>>;

/// What `Purge` and `DeleteMsg` answer: how many messages were removed.
pub type RemovedCount = std::result::Result<u64, ServerError>;

use crate::payload_blocks::PayloadWrites;
pub use crate::payload_blocks::StoredMessage;

/// A stream snapshot. As stored on its own node `messages` is empty: the
/// payloads are in the stream's tree, flushed before the snapshot was stored.
/// As sent to another node it holds every payload the tree has up to the
/// snapshot's `last_seq`.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    state: StreamState,
    config_revision: u64,
    messages: Vec<(u64, StoredMessage)>,
}

/// [`Snapshot`] as this node writes its own, borrowing the state: bincode
/// lays out a reference and a slice as it does the owned fields, so it
/// reads back as a `Snapshot`. A clone of the state would be a second copy
/// of the stream's index at every snapshot (76 MiB at a million messages
/// in `bench/results/heap-20261208.txt`).
#[derive(Serialize)]
struct StoredSnapshot<'a> {
    state: &'a StreamState,
    config_revision: u64,
    messages: &'a [(u64, StoredMessage)],
}

/// Adds the payloads to a stored snapshot, read from the tree as it is now.
///
/// The tree may be ahead of the snapshot: a message the snapshot lists may
/// have been removed since (it is then left out), and later messages exist
/// (they are not sent: above `last_seq`). The receiver replays the log after
/// the snapshot's index, which removes the first kind again and stores the
/// second, so once it has caught up its tree equals ours. Until then a read
/// of a message removed on the leader finds no payload, exactly as a read
/// racing a removal does on the leader itself.
fn expand_snapshot(tree: &sled::Tree, stored: &[u8]) -> std::result::Result<Vec<u8>, String> {
    let mut snap: Snapshot = bincode::deserialize(stored).map_err(|e| e.to_string())?;
    let last_seq = snap.state.stats().last_seq;
    snap.messages = crate::payload_blocks::read_up_to(tree, last_seq).map_err(|e| e.to_string())?;
    bincode::serialize(&snap).map_err(|e| e.to_string())
}

pub struct StreamMachine {
    state: StreamState,
    /// Catalog revision of the applied config (0: the created config).
    config_revision: u64,
    tree: sled::Tree,
    last_seq: watch::Sender<u64>,
}

impl StreamMachine {
    pub fn new(config: StreamConfig, tree: sled::Tree) -> (Self, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0);
        (
            StreamMachine {
                state: StreamState::new(config),
                config_revision: 0,
                tree,
                last_seq: tx,
            },
            rx,
        )
    }

    pub fn state(&self) -> &StreamState {
        &self.state
    }

    /// Catalog revision of the config the stream applies.
    pub fn config_revision(&self) -> u64 {
        self.config_revision
    }

    fn publish(&mut self, now_ms: i64, items: Vec<PublishItem>) -> PublishResults {
        let mut writes = PayloadWrites::default();
        let mut results = Vec::with_capacity(items.len());
        for item in items {
            let size = item.payload.len() as u64;
            match (self.state).append_msg(&item.subject, size, item.msg_id.as_deref(), now_ms) {
                Ok(appended) if appended.duplicate => results.push(Ok(PublishOutcome {
                    seq: appended.seq,
                    duplicate: true,
                })),
                Ok(appended) => {
                    let published_ms =
                        (self.state.get(appended.seq)).map_or(now_ms, |m| m.published_ms);
                    let stored = StoredMessage {
                        subject: item.subject,
                        published_ms,
                        payload: item.payload,
                        headers: item.headers,
                    };
                    writes.insert(appended.seq, stored);
                    for seq in appended.removed {
                        writes.remove(seq);
                    }
                    results.push(Ok(PublishOutcome {
                        seq: appended.seq,
                        duplicate: false,
                    }));
                }
                Err(e) => results.push(Err(ServerError::from(e))),
            }
        }
        self.write(writes);
        results
    }

    /// Deletes the payloads of removed messages; answers how many.
    fn remove(&mut self, seqs: Vec<u64>) -> u64 {
        let mut writes = PayloadWrites::default();
        for seq in &seqs {
            writes.remove(*seq);
        }
        self.write(writes);
        seqs.len() as u64
    }

    fn write(&self, writes: PayloadWrites) {
        // A failed payload write cannot be undone in a replicated apply; the
        // Raft log still holds the message, so log loudly and go on.
        if let Err(e) = writes.apply(&self.tree) {
            tracing::error!("stream payload write failed: {e}");
        }
        self.last_seq.send_replace(self.state.stats().last_seq);
    }
}

/// Read a stored message by sequence from a stream's payload tree.
pub fn read_message(tree: &sled::Tree, seq: u64) -> Result<Option<StoredMessage>> {
    crate::payload_blocks::read(tree, seq)
}

/// Read many stored messages (those not stored are absent from the map).
pub fn read_messages(
    tree: &sled::Tree,
    seqs: &[u64],
) -> Result<std::collections::BTreeMap<u64, StoredMessage>> {
    crate::payload_blocks::read_many(tree, seqs)
}

impl StateMachine for StreamMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        type Batch = std::result::Result<PublishResults, ServerError>;
        let command = match bincode::deserialize::<StreamCommand>(command) {
            Ok(c) => c,
            Err(e) => {
                let e = ServerError::Internal(format!("undecodable stream command: {e}"));
                return bincode::serialize(&Batch::Err(e)).unwrap_or_default();
            }
        };
        let encoded = match command {
            StreamCommand::Publish { now_ms, items } => {
                bincode::serialize(&Batch::Ok(self.publish(now_ms, items)))
            }
            StreamCommand::Expire { now_ms } => {
                let removed = self.state.expire(now_ms);
                self.remove(removed);
                bincode::serialize(&Batch::Ok(Vec::new()))
            }
            StreamCommand::UpdateConfig {
                config,
                revision,
                now_ms,
            } => {
                let r: Batch = if revision <= self.config_revision {
                    Ok(Vec::new())
                } else {
                    match self.state.update_config(config, now_ms) {
                        Ok(removed) => {
                            self.config_revision = revision;
                            self.remove(removed);
                            Ok(Vec::new())
                        }
                        Err(e) => Err(e.into()),
                    }
                };
                bincode::serialize(&r)
            }
            StreamCommand::Purge { purge } => {
                let r: RemovedCount = match self.state.purge(&purge) {
                    Ok(removed) => Ok(self.remove(removed)),
                    Err(e) => Err(e.into()),
                };
                bincode::serialize(&r)
            }
            StreamCommand::SetConsumers { consumers } => {
                let removed = self.state.set_consumers(consumers);
                self.remove(removed);
                bincode::serialize(&Batch::Ok(Vec::new()))
            }
            StreamCommand::Progress { items } => {
                let mut removed = Vec::new();
                for (name, id, progress) in items {
                    removed.extend(self.state.record_progress(&name, id, progress));
                }
                self.remove(removed);
                bincode::serialize(&Batch::Ok(Vec::new()))
            }
            StreamCommand::DeleteMsg { seq } => {
                let r: RemovedCount = match self.state.delete(seq) {
                    Ok(()) => Ok(self.remove(vec![seq])),
                    Err(e) => Err(e.into()),
                };
                bincode::serialize(&r)
            }
        };
        encoded.unwrap_or_default()
    }

    fn snapshot(&self) -> std::result::Result<Vec<u8>, String> {
        // Payloads stay in the tree: see `Snapshot`.
        bincode::serialize(&StoredSnapshot {
            state: &self.state,
            config_revision: self.config_revision,
            messages: &[],
        })
        .map_err(|e| e.to_string())
    }

    fn snapshot_expander(&self) -> Option<wharf_raft::SnapshotExpander> {
        let tree = self.tree.clone();
        Some(std::sync::Arc::new(move |stored: &[u8]| {
            expand_snapshot(&tree, stored)
        }))
    }

    fn restore_local(&mut self, data: &[u8]) -> std::result::Result<(), String> {
        // The tree holds every payload up to the snapshot (and maybe later
        // writes, which the log replayed after it repeats).
        let snap: Snapshot = bincode::deserialize(data).map_err(|e| e.to_string())?;
        self.state = snap.state;
        self.config_revision = snap.config_revision;
        self.last_seq.send_replace(self.state.stats().last_seq);
        Ok(())
    }

    fn restore(&mut self, data: &[u8]) -> std::result::Result<(), String> {
        let snap: Snapshot = bincode::deserialize(data).map_err(|e| e.to_string())?;
        crate::payload_blocks::write_all(&self.tree, snap.messages).map_err(|e| e.to_string())?;
        self.state = snap.state;
        self.config_revision = snap.config_revision;
        self.last_seq.send_replace(self.state.stats().last_seq);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(db: &sled::Db, tree: &str) -> StreamMachine {
        let config = StreamConfig {
            name: "ORDERS".into(),
            subjects: vec!["orders.>".into()],
            ..Default::default()
        };
        StreamMachine::new(config, db.open_tree(tree).unwrap()).0
    }

    fn run(sm: &mut StreamMachine, command: StreamCommand) {
        sm.apply(0, &bincode::serialize(&command).unwrap());
    }

    fn publish(sm: &mut StreamMachine, n: u64) {
        let items = (0..n)
            .map(|i| PublishItem {
                subject: "orders.created".into(),
                payload: Bytes::from(format!("order-{i}")),
                msg_id: None,
                headers: Vec::new(),
            })
            .collect();
        run(sm, StreamCommand::Publish { now_ms: 1, items });
    }

    fn payloads(sm: &StreamMachine) -> Vec<(u64, String)> {
        crate::payload_blocks::read_up_to(&sm.tree, u64::MAX)
            .unwrap()
            .into_iter()
            .map(|(seq, m)| (seq, String::from_utf8_lossy(&m.payload).into_owned()))
            .collect()
    }

    #[test]
    fn stored_snapshot_has_no_payloads_and_a_transfer_adds_them() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let mut leader = machine(&db, "leader");
        publish(&mut leader, 5);
        let stored = leader.snapshot().unwrap();
        let snap: Snapshot = bincode::deserialize(&stored).unwrap();
        assert!(snap.messages.is_empty());
        assert_eq!(snap.state.stats().messages, 5);

        // After the snapshot the leader removes seq 2 and stores seq 6: the
        // transfer reads the tree as it is now, up to the snapshot's last seq.
        run(&mut leader, StreamCommand::DeleteMsg { seq: 2 });
        publish(&mut leader, 1);
        let sent = leader.snapshot_expander().unwrap()(&stored).unwrap();
        let mut follower = machine(&db, "follower");
        follower.restore(&sent).unwrap();
        assert_eq!(follower.state.stats().messages, 5);
        let seqs: Vec<u64> = payloads(&follower).iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![1, 3, 4, 5]);

        // Replaying the log after the snapshot makes both equal.
        run(&mut follower, StreamCommand::DeleteMsg { seq: 2 });
        publish(&mut follower, 1);
        assert_eq!(payloads(&follower), payloads(&leader));
        assert_eq!(follower.state.stats(), leader.state.stats());
    }

    #[test]
    fn restore_local_keeps_the_tree() {
        let db = sled::Config::new().temporary(true).open().unwrap();
        let mut before = machine(&db, "stream");
        publish(&mut before, 3);
        let stored = before.snapshot().unwrap();
        let written = payloads(&before);

        let mut after = machine(&db, "stream");
        after.restore_local(&stored).unwrap();
        assert_eq!(after.state.stats(), before.state.stats());
        assert_eq!(payloads(&after), written);
    }
}
