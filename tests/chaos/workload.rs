//! The workload: publishers of unique ids, workers sharing one durable
//! consumer, and a poller of leaders, all writing to the history.
//!
//! Every loop is bounded in count and in time: publishers stop at the
//! workload's end or after `max_per_publisher`, workers and the poller when
//! told to, and every client call runs under a timeout, after which its
//! outcome is recorded as unknown (publish) or failed (ack) and the worker's
//! session is thrown away.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use wharf_client::Client;

use super::history::{Event, History};
use super::nemesis::GROUPS;

pub const STREAM: &str = "ORDERS";
pub const CONSUMER: &str = "shipping";
pub const SUBJECT: &str = "orders.shipped";

/// How long the client library itself retries one call through failover.
const CLIENT_RETRY: Duration = Duration::from_secs(10);
/// The harness's own bound on one call, retries included.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// A client whose first seed is the `i`-th node, so that publishers and
/// workers spread over the nodes.
pub fn client_starting_at(addrs: &[String], i: usize) -> Client {
    let n = addrs.len();
    let seeds: Vec<String> = (0..n).map(|k| addrs[(i + k) % n].clone()).collect();
    Client::new(&seeds.join(","))
        .expect("client")
        .with_retry_for(CLIENT_RETRY)
}

/// Non-retryable codes: the server's verdict, so the message was not stored.
fn definite_failure(e: &wharf_client::ClientError) -> bool {
    use tonic::Code;
    matches!(
        e.code(),
        Some(
            Code::InvalidArgument
                | Code::NotFound
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::Unimplemented
        )
    )
}

pub struct Publisher {
    pub index: u32,
    pub client: Client,
    pub interval: Duration,
    pub until_ms: u64,
    pub max_count: u64,
}

impl Publisher {
    pub async fn run(self, history: Arc<History>, stop: Arc<AtomicBool>) -> u64 {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut n = 0;
        while n < self.max_count && history.now_ms() < self.until_ms && !stop.load(Ordering::SeqCst)
        {
            tick.tick().await;
            let id = format!("p{}-{n}", self.index);
            n += 1;
            history.push(Event::PublishInvoke {
                t_ms: history.now_ms(),
                publisher: self.index,
                id: id.clone(),
            });
            let r =
                tokio::time::timeout(CALL_TIMEOUT, self.client.publish(SUBJECT, id.clone())).await;
            let t_ms = history.now_ms();
            history.push(match r {
                Ok(Ok(ack)) if ack.error.is_empty() => Event::PublishOk {
                    t_ms,
                    id,
                    seq: ack.seq,
                },
                Ok(Ok(ack)) => Event::PublishFail {
                    t_ms,
                    id,
                    error: ack.error,
                },
                Ok(Err(e)) if definite_failure(&e) => Event::PublishFail {
                    t_ms,
                    id,
                    error: e.to_string(),
                },
                Ok(Err(e)) => Event::PublishUnknown {
                    t_ms,
                    id,
                    error: e.to_string(),
                },
                Err(_) => Event::PublishUnknown {
                    t_ms,
                    id,
                    error: format!("no answer within {CALL_TIMEOUT:?}"),
                },
            });
        }
        n
    }
}

pub struct Worker {
    pub index: u32,
    pub client: Client,
    pub max_deliveries: u64,
    /// Send each batch's acks with the next pull (`Consumer::ack_and_fetch`)
    /// instead of on their own before it.
    pub ack_next: bool,
}

impl Worker {
    pub async fn run(self, history: Arc<History>, stop: Arc<AtomicBool>) -> u64 {
        let mut consumer = self.client.consumer(STREAM, CONSUMER);
        let mut received = 0u64;
        // With `ack_next`: the last batch, acked with the next pull.
        let mut held: Vec<(String, u64)> = Vec::new();
        while !stop.load(Ordering::SeqCst) && received < self.max_deliveries {
            let wait = Duration::from_millis(500);
            let fetched = if held.is_empty() {
                tokio::time::timeout(CALL_TIMEOUT, consumer.fetch(16, wait)).await
            } else {
                let seqs: Vec<u64> = held.iter().map(|(_, seq)| *seq).collect();
                let fetched =
                    tokio::time::timeout(CALL_TIMEOUT, consumer.ack_and_fetch(&seqs, 16, wait))
                        .await;
                let acked = matches!(fetched, Ok(Ok(_)));
                if fetched.is_err() {
                    consumer = self.client.consumer(STREAM, CONSUMER);
                }
                let batch = std::mem::take(&mut held);
                received += self.settle(batch, acked, &mut consumer, &history).await;
                fetched
            };
            let batch = match fetched {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    history.note(format!("worker {} fetch failed: {e}", self.index));
                    consumer = self.client.consumer(STREAM, CONSUMER);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
                Err(_) => {
                    history.note(format!("worker {} fetch timed out", self.index));
                    consumer = self.client.consumer(STREAM, CONSUMER);
                    continue;
                }
            };
            // Record the whole batch as received now, then process it: a
            // delivery's time is when the worker got it, not when it got to it.
            let t_ms = history.now_ms();
            let batch: Vec<(String, u64)> = batch
                .into_iter()
                .map(|m| {
                    let id = String::from_utf8_lossy(&m.payload).into_owned();
                    history.push(Event::Deliver {
                        t_ms,
                        worker: self.index,
                        id: id.clone(),
                        seq: m.stream_seq,
                        count: m.delivered,
                    });
                    (id, m.stream_seq)
                })
                .collect();
            if self.ack_next {
                held = batch;
                continue;
            }
            // The batch's acks go out together (one commit for the lot).
            let seqs: Vec<u64> = batch.iter().map(|(_, seq)| *seq).collect();
            let acked = tokio::time::timeout(CALL_TIMEOUT, consumer.ack_each(&seqs)).await;
            if acked.is_err() {
                consumer = self.client.consumer(STREAM, CONSUMER);
            }
            let acked = matches!(acked, Ok(Ok(())));
            received += self.settle(batch, acked, &mut consumer, &history).await;
        }
        if !held.is_empty() {
            received += self.settle(held, false, &mut consumer, &history).await;
        }
        received
    }

    /// Record the acks of a batch whose acks went out together: all OK when
    /// `acked`, else each is acked again alone (acks are idempotent) so the
    /// history holds each one's own outcome. Returns the batch's size.
    async fn settle(
        &self,
        batch: Vec<(String, u64)>,
        acked: bool,
        consumer: &mut wharf_client::Consumer,
        history: &History,
    ) -> u64 {
        let n = batch.len() as u64;
        for (id, seq) in batch {
            let (ok, error) = if acked {
                (true, String::new())
            } else {
                match tokio::time::timeout(CALL_TIMEOUT, consumer.ack(seq)).await {
                    Ok(Ok(())) => (true, String::new()),
                    Ok(Err(e)) => (false, e.to_string()),
                    Err(_) => {
                        *consumer = self.client.consumer(STREAM, CONSUMER);
                        (false, format!("no answer within {CALL_TIMEOUT:?}"))
                    }
                }
            };
            history.push(Event::Ack {
                t_ms: history.now_ms(),
                worker: self.index,
                id,
                seq,
                ok,
                error,
            });
        }
        n
    }
}

/// Poll every node's cluster status and record each change of a workload
/// group's (leader, term), taken at the highest term reported.
pub async fn poll_leaders(
    addrs: Vec<String>,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    every: Duration,
) {
    let clients: Vec<Client> = addrs
        .iter()
        .map(|a| {
            Client::new(a)
                .expect("client")
                .with_retry_for(Duration::ZERO)
        })
        .collect();
    let mut last: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut round = 0u64;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let sample = round.is_multiple_of(4);
        let views = futures::future::join_all(
            clients
                .iter()
                .map(|c| tokio::time::timeout(Duration::from_secs(1), c.cluster_status())),
        )
        .await;
        let mut now: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for s in views.into_iter().flatten().flatten() {
            for g in s.groups {
                if !GROUPS.contains(&g.name.as_str()) {
                    continue;
                }
                if sample && g.replicas.contains(&s.node_id) {
                    history.push(Event::Replica {
                        t_ms: history.now_ms(),
                        node: s.node_id,
                        group: g.name.clone(),
                        leader: g.leader,
                        term: g.term,
                        last_applied: g.last_applied,
                    });
                }
                if g.leader == 0 {
                    continue;
                }
                let e = now.entry(g.name).or_insert((0, 0));
                if g.term > e.1 {
                    *e = (g.leader, g.term);
                }
            }
        }
        for (group, (leader, term)) in now {
            let changed = match last.get(&group) {
                None => true,
                Some(&(l, t)) => term > t || (term == t && l != leader),
            };
            if changed {
                history.push(Event::Leader {
                    t_ms: history.now_ms(),
                    group: group.clone(),
                    leader,
                    term,
                });
                last.insert(group, (leader, term));
            }
        }
        tokio::time::sleep(every).await;
    }
}
