//! A consumer group's state machine: the one shared position of a durable consumer.
//!
//! Wraps `wharf_core::consumer::ConsumerState`. Only the leader proposes
//! commands: `Deliver` (a batch of messages it has chosen for waiting pulls,
//! stamped with its clock, plus messages the stream no longer has and
//! messages that reached MaxDeliver), `Acks` (a batch of acks, naks,
//! in-progress and terms from any workers), `UpdateConfig`, `Start` and
//! `DeadLettered` (the leader published dead-letter copies), and
//! `AcksThenDeliver` (acks that arrived while a delivery was planned,
//! applied just before it: the same as an `Acks` entry followed by a
//! `DeliverAfter` entry, in one commit). A message is
//! sent to a worker only after its `Deliver` entry is applied, so a new leader
//! never forgets what was handed out.
//!
//! Invariants: the state is a pure function of the applied commands; apply
//! never fails, it skips what no longer applies (an ack of an acked message).
//! Left out: waiting pulls and sessions, which are leader memory (see `dispatch`).

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use wharf_core::consumer::{ConsumerConfig, ConsumerState, Delivery};
use wharf_raft::StateMachine;

use crate::error::ServerError;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ConsumerCommand {
    Deliver {
        now_ms: i64,
        stream_seqs: Vec<u64>,
        gone: Vec<u64>,
        exhausted: Vec<u64>,
    },
    /// A batch of acks of every kind, applied in order.
    Acks {
        now_ms: i64,
        items: Vec<(u64, AckKind)>,
    },
    UpdateConfig {
        config: ConsumerConfig,
    },
    /// Where the consumer starts, resolved by the leader from its stream replica.
    Start {
        after_seq: u64,
        backlog: Vec<u64>,
    },
    /// The leader published the dead-letter copies of `published`; the
    /// messages of `dropped` were gone before their copy could be made.
    DeadLettered {
        published: Vec<u64>,
        dropped: Vec<u64>,
    },
    /// `Deliver` for a plan made while earlier ones were in flight: its first
    /// deliveries count only if the consumer is at `first_after` (see
    /// `ConsumerState::apply_deliver_after`). A variant of its own, last, so
    /// logs written before it still decode.
    DeliverAfter {
        now_ms: i64,
        stream_seqs: Vec<u64>,
        gone: Vec<u64>,
        exhausted: Vec<u64>,
        first_after: Option<u64>,
    },
    /// `Acks` then `DeliverAfter`, applied in that order, in one entry: a
    /// worker that acks and pulls again ("ack next") waits for one commit,
    /// not two. Last, so logs written before it still decode.
    AcksThenDeliver {
        now_ms: i64,
        acks: Vec<(u64, AckKind)>,
        stream_seqs: Vec<u64>,
        gone: Vec<u64>,
        exhausted: Vec<u64>,
        first_after: Option<u64>,
    },
}

/// What a worker said about a delivered message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AckKind {
    Ack,
    Nak {
        delay_ms: u64,
    },
    InProgress,
    /// Never redeliver; the reason goes into the dead-letter copy.
    Term {
        reason: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ConsumerResponse {
    Delivered(Vec<(u64, u64, u64)>),
    Acked(usize),
    Updated,
    Failed(ServerError),
}

impl ConsumerResponse {
    pub fn deliveries(self) -> Vec<Delivery> {
        match self {
            ConsumerResponse::Delivered(v) => v
                .into_iter()
                .map(|(stream_seq, consumer_seq, deliveries)| Delivery {
                    stream_seq,
                    consumer_seq,
                    deliveries,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

pub struct ConsumerMachine {
    state: ConsumerState,
    /// Bumped on every apply so the leader runtime re-plans.
    changes: watch::Sender<u64>,
}

impl ConsumerMachine {
    pub fn new(config: ConsumerConfig) -> (Self, watch::Receiver<u64>) {
        let (tx, rx) = watch::channel(0);
        (
            ConsumerMachine {
                state: ConsumerState::new(config),
                changes: tx,
            },
            rx,
        )
    }

    pub fn state(&self) -> &ConsumerState {
        &self.state
    }

    fn apply_deliver(
        &mut self,
        now_ms: i64,
        stream_seqs: &[u64],
        gone: &[u64],
        exhausted: &[u64],
        first_after: Option<u64>,
    ) -> ConsumerResponse {
        let d = (self.state).apply_deliver_after(stream_seqs, gone, now_ms, first_after);
        for seq in self.state.apply_exhausted(exhausted) {
            tracing::info!(stream_seq = seq, "message reached max_deliver: given up");
        }
        ConsumerResponse::Delivered(
            d.into_iter()
                .map(|d| (d.stream_seq, d.consumer_seq, d.deliveries))
                .collect(),
        )
    }

    /// Apply acks of every kind in order; how many settled something.
    fn apply_acks(&mut self, now_ms: i64, items: Vec<(u64, AckKind)>) -> usize {
        let mut settled = 0;
        for (seq, kind) in items {
            let hit = match kind {
                AckKind::Ack => self.state.apply_ack(&[seq]) > 0,
                AckKind::Nak { delay_ms } => self.state.apply_nak(seq, delay_ms, now_ms),
                AckKind::InProgress => self.state.apply_in_progress(seq, now_ms),
                AckKind::Term { reason } => self.state.apply_term(seq, &reason),
            };
            settled += usize::from(hit);
        }
        settled
    }

    fn apply_command(&mut self, cmd: ConsumerCommand) -> ConsumerResponse {
        match cmd {
            ConsumerCommand::Deliver {
                now_ms,
                stream_seqs,
                gone,
                exhausted,
            } => self.apply_deliver(now_ms, &stream_seqs, &gone, &exhausted, None),
            ConsumerCommand::DeliverAfter {
                now_ms,
                stream_seqs,
                gone,
                exhausted,
                first_after,
            } => self.apply_deliver(now_ms, &stream_seqs, &gone, &exhausted, first_after),
            ConsumerCommand::Acks { now_ms, items } => {
                ConsumerResponse::Acked(self.apply_acks(now_ms, items))
            }
            ConsumerCommand::AcksThenDeliver {
                now_ms,
                acks,
                stream_seqs,
                gone,
                exhausted,
                first_after,
            } => {
                self.apply_acks(now_ms, acks);
                self.apply_deliver(now_ms, &stream_seqs, &gone, &exhausted, first_after)
            }
            ConsumerCommand::DeadLettered { published, dropped } => {
                let n = self.state.apply_dead_lettered(&published, &dropped);
                ConsumerResponse::Acked(n as usize)
            }
            ConsumerCommand::Start { after_seq, backlog } => {
                self.state.apply_start(after_seq, backlog);
                ConsumerResponse::Updated
            }
            ConsumerCommand::UpdateConfig { config } => match self.state.update_config(config) {
                Ok(()) => ConsumerResponse::Updated,
                Err(e) => ConsumerResponse::Failed(e.into()),
            },
        }
    }
}

impl StateMachine for ConsumerMachine {
    fn apply(&mut self, _index: u64, command: &[u8]) -> Vec<u8> {
        let response = match bincode::deserialize::<ConsumerCommand>(command) {
            Ok(cmd) => self.apply_command(cmd),
            Err(e) => ConsumerResponse::Failed(ServerError::Internal(format!(
                "undecodable consumer command: {e}"
            ))),
        };
        self.changes.send_modify(|v| *v += 1);
        bincode::serialize(&response).unwrap_or_default()
    }

    fn snapshot(&self) -> Result<Vec<u8>, String> {
        bincode::serialize(&self.state).map_err(|e| e.to_string())
    }

    fn restore(&mut self, data: &[u8]) -> Result<(), String> {
        self.state = bincode::deserialize(data).map_err(|e| e.to_string())?;
        self.changes.send_modify(|v| *v += 1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(machine: &mut ConsumerMachine, cmd: &ConsumerCommand) -> ConsumerResponse {
        let bytes = bincode::serialize(cmd).expect("encodes");
        bincode::deserialize(&machine.apply(0, &bytes)).expect("decodes")
    }

    fn deliver(stream_seqs: Vec<u64>, first_after: Option<u64>) -> ConsumerCommand {
        ConsumerCommand::DeliverAfter {
            now_ms: 1_000,
            stream_seqs,
            gone: vec![],
            exhausted: vec![],
            first_after,
        }
    }

    /// What a consumer's state looks like from outside: position, ack
    /// floor and the pending messages with their delivery counts.
    fn view(machine: &ConsumerMachine) -> (u64, u64, Vec<(u64, u64)>) {
        let s = machine.state();
        let pending = s
            .pending_iter()
            .map(|(seq, p)| (seq, p.deliveries))
            .collect();
        (s.delivered().stream_seq, s.ack_floor().stream_seq, pending)
    }

    #[test]
    fn acks_then_deliver_is_an_acks_entry_followed_by_a_deliver_entry() {
        let config = ConsumerConfig::default();
        let (mut merged, _) = ConsumerMachine::new(config.clone());
        let (mut separate, _) = ConsumerMachine::new(config);
        for m in [&mut merged, &mut separate] {
            apply(m, &deliver(vec![1, 2], None));
        }
        let acks = vec![(1, AckKind::Ack), (2, AckKind::Nak { delay_ms: 0 })];
        let resp = apply(
            &mut merged,
            &ConsumerCommand::AcksThenDeliver {
                now_ms: 1_000,
                acks: acks.clone(),
                stream_seqs: vec![3],
                gone: vec![],
                exhausted: vec![],
                first_after: Some(2),
            },
        );
        apply(
            &mut separate,
            &ConsumerCommand::Acks {
                now_ms: 1_000,
                items: acks,
            },
        );
        let expected = apply(&mut separate, &deliver(vec![3], Some(2)));
        assert_eq!(resp.deliveries(), expected.deliveries());
        assert_eq!(view(&merged), view(&separate));
        // 1 acked; 2 nak'ed (still pending, due again); 3 newly delivered.
        assert_eq!(view(&merged), (3, 1, vec![(2, 1), (3, 1)]));
    }

    #[test]
    fn the_acks_of_a_combined_entry_count_even_when_its_deliveries_are_skipped() {
        let (mut machine, _) = ConsumerMachine::new(ConsumerConfig::default());
        apply(&mut machine, &deliver(vec![1, 2], None));
        // Planned after position 5, which the consumer never reached: the
        // first deliveries are skipped (planned again), the acks still hold.
        let resp = apply(
            &mut machine,
            &ConsumerCommand::AcksThenDeliver {
                now_ms: 1_000,
                acks: vec![(1, AckKind::Ack), (2, AckKind::Ack)],
                stream_seqs: vec![6],
                gone: vec![],
                exhausted: vec![],
                first_after: Some(5),
            },
        );
        assert!(resp.deliveries().is_empty());
        assert_eq!(view(&machine), (2, 2, vec![]));
    }
}
