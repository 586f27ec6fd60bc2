//! `wharf bench`: load a cluster the way `nats bench` does and report
//! throughput and HDR latency percentiles.
//!
//! A run creates its own stream (one subject) and, with workers, one durable
//! pull consumer, then:
//! - publishers send `--msgs` messages (or publish for `--duration`), either
//!   synchronously through `Client::publish` (one call, one ack after a
//!   majority fsync) or pipelined over one `PublishStream` per publisher with
//!   at most `--window` acks outstanding;
//! - workers share the consumer: each loops `fetch(--batch)` then acks every
//!   message of the batch with `Consumer::ack_each` (each ack committed; the
//!   batch's acks are sent together and awaited together), or with `--ack
//!   all` (the consumer's ack policy "all") acks only the batch's highest
//!   sequence, which settles the rest; with `--ack-next` a batch's acks go
//!   out with the next pull (`Consumer::ack_and_fetch`) and both are awaited
//!   together;
//! - with `--pub 0` the stream is first filled (unmeasured) and the workers
//!   drain it, which measures the work queue alone.
//!
//! With `--rate` sends follow a fixed timeline and latencies count from the
//! intended send time (no coordinated omission). The stream and consumer are
//! deleted at the end unless `--keep`. Worker `i` and sync publisher `i`
//! start at server `i % servers` (the client then follows the leader, see
//! `wharf_client`); a pipelined publisher opens its `PublishStream` at the
//! stream's leader when that is one of the servers, else at server
//! `i % servers`. The NATS driver connects the same way.
//!
//! Not measured: publish deduplication (there is none), redelivery timing.

mod args;
mod report;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use wharf_client::proto::wharf_client::WharfClient;
use wharf_client::{proto as pb, Client};

use args::AckMode;
pub use args::BenchArgs;
use report::{payload, Clock, Pacer, Progress, PubStats, Report, SubStats};

/// How long a worker's fetch waits for messages before asking again.
const FETCH_WAIT: Duration = Duration::from_millis(500);
/// Workers give up when nothing arrived for this long after publishing ended.
const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// Window used to fill the stream when only workers are measured.
const FILL_WINDOW: u32 = 256;

pub async fn run(servers: &str, retry_for: Duration, args: BenchArgs) -> Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let addrs: Vec<String> = servers
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if addrs.is_empty() {
        bail!("no server address given");
    }
    let admin = Client::new(servers)?.with_retry_for(retry_for);
    setup(&admin, &args).await?;
    let outcome = measure(&addrs, retry_for, &args).await;
    if !args.keep {
        if let Err(e) = admin.delete_stream(&args.stream).await {
            eprintln!("warning: could not delete stream {}: {e}", args.stream);
        }
    }
    let report = outcome?;
    let text = if args.json {
        serde_json::to_string_pretty(&report.to_json())?
    } else {
        report.to_text()
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = writeln!(std::io::stdout(), "{text}");
    Ok(())
}

async fn setup(admin: &Client, args: &BenchArgs) -> Result<()> {
    let stream = pb::StreamConfig {
        name: args.stream.clone(),
        subjects: vec![args.subject.clone()],
        replicas: args.replicas,
        max_msgs: -1,
        max_bytes: -1,
        max_age_ms: 0,
        max_msg_size: -1,
        ..Default::default()
    };
    admin.add_stream(stream).await.with_context(|| {
        format!(
            "cannot create stream {} (delete a leftover one with `wharf stream rm {}`)",
            args.stream, args.stream
        )
    })?;
    if args.subs > 0 {
        let consumer = pb::ConsumerConfig {
            name: args.consumer.clone(),
            filter_subject: String::new(),
            ack_wait_ms: 30_000,
            max_ack_pending: args.max_ack_pending,
            max_waiting: 512,
            ack_policy: match args.ack {
                AckMode::Each => pb::AckPolicy::AckExplicit,
                AckMode::All => pb::AckPolicy::AckAll,
            } as i32,
            ..Default::default()
        };
        admin.add_consumer(&args.stream, consumer).await?;
    }
    Ok(())
}

/// The seed that leads `stream`, where pipelined publishers open their
/// `PublishStream` (a unary publish finds the leader by itself, see
/// `wharf_client`'s routes); `None` (each publisher then opens at its own
/// seed) when it is not known.
async fn leader_seed(addrs: &[String], retry_for: Duration, stream: &str) -> Option<String> {
    let client = Client::new(&addrs.join(","))
        .ok()?
        .with_retry_for(retry_for);
    match client.stream_leader_seed(stream).await {
        Ok(seed) => seed,
        Err(e) => {
            tracing::debug!("stream leader not known: {e}");
            None
        }
    }
}

/// `servers` rotated so that `addrs[i % n]` comes first.
fn rotated(addrs: &[String], i: u32) -> String {
    let k = i as usize % addrs.len();
    let mut v = addrs[k..].to_vec();
    v.extend_from_slice(&addrs[..k]);
    v.join(",")
}

async fn measure<'a>(
    addrs: &[String],
    retry_for: Duration,
    args: &'a BenchArgs,
) -> Result<Report<'a>> {
    let clock = Clock::new();
    let mut notes = Vec::new();
    if args.pubs == 0 {
        let fill = BenchArgs {
            window: FILL_WINDOW,
            rate: 0,
            pubs: 1,
            ..args.clone()
        };
        let fill_at = leader_seed(addrs, retry_for, &args.stream)
            .await
            .unwrap_or_else(|| addrs[0].clone());
        let stats = publish_async(&fill_at, &fill, 0, clock, Progress::new(), None, false).await?;
        if stats.ok < args.msgs {
            bail!(
                "filling the stream: only {} of {} stored",
                stats.ok,
                args.msgs
            );
        }
        notes.push(format!(
            "stream filled with {} messages before the workers started (not measured)",
            stats.ok
        ));
    }
    let progress = Progress::new();
    if args.pubs == 0 {
        progress.target.store(args.msgs, Ordering::Relaxed);
    }
    let ticker = (!args.quiet).then(|| report::spawn_progress(progress.clone(), "wharf"));
    let start = Instant::now();
    let deadline = args.duration.map(|d| start + d);

    let mut workers = Vec::new();
    for i in 0..args.subs {
        let client = Client::new(&rotated(addrs, i))?.with_retry_for(retry_for);
        let (args, progress) = (args.clone(), progress.clone());
        workers.push(tokio::spawn(async move {
            worker(client, &args, clock, progress).await
        }));
    }
    let leader = if args.pubs > 0 && args.window > 0 {
        leader_seed(addrs, retry_for, &args.stream).await
    } else {
        None
    };
    let mut publishers = Vec::new();
    for i in 0..args.pubs {
        let (args, progress) = (args.clone(), progress.clone());
        let addr = leader
            .clone()
            .unwrap_or_else(|| addrs[i as usize % addrs.len()].clone());
        let seeds = rotated(addrs, i);
        publishers.push(tokio::spawn(async move {
            if args.window == 0 {
                let client = Client::new(&seeds)?.with_retry_for(retry_for);
                publish_sync(client, &args, i, clock, progress, deadline, start).await
            } else {
                publish_async(&addr, &args, i, clock, progress, deadline, true).await
            }
        }));
    }

    let mut published = PubStats::default();
    for p in publishers {
        published.merge(p.await??);
    }
    progress.target.store(
        if args.pubs == 0 {
            args.msgs
        } else {
            published.ok
        },
        Ordering::Relaxed,
    );
    progress.publishers_done.store(true, Ordering::Relaxed);
    let mut consumed = SubStats::default();
    for w in workers {
        consumed.merge(w.await??);
    }
    progress.stop.store(true, Ordering::Relaxed);
    if let Some(t) = ticker {
        let _ = t.await;
    }
    if args.subs > 0 && consumed.received < progress.target.load(Ordering::Relaxed) {
        notes.push(format!(
            "workers received {} of {} messages before going idle for {}s",
            consumed.received,
            progress.target.load(Ordering::Relaxed),
            IDLE_LIMIT.as_secs()
        ));
    }
    if args.subs > 0 && args.batch > 1 {
        notes.push("end-to-end latency is taken when a worker's fetch returns, so it includes filling the batch".into());
    }
    Ok(Report {
        broker: "wharf",
        args,
        publish: (args.pubs > 0).then_some((published, start)),
        consume: (args.subs > 0).then_some((consumed, start)),
        notes,
    })
}

/// One synchronous publisher: one publish in flight, the next after its ack.
async fn publish_sync(
    client: Client,
    args: &BenchArgs,
    i: u32,
    clock: Clock,
    progress: Arc<Progress>,
    deadline: Option<Instant>,
    start: Instant,
) -> Result<PubStats> {
    let mut stats = PubStats::default();
    let mut pacer = Pacer::new(args.rate_per_pub(), start).context("starting the pacer thread")?;
    let count = if deadline.is_some() {
        u64::MAX
    } else {
        args.share(i)
    };
    let tag = u64::from(i) << 40;
    for k in 0..count {
        let intended = pacer.next().await;
        if deadline.is_some_and(|d| intended >= d) {
            break;
        }
        let body = Bytes::from(payload(args.size, clock.ns(intended), tag | k));
        match client.publish(&args.subject, body).await {
            Ok(_) => {
                stats.ack(intended, Instant::now(), args.size);
                progress.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                stats.errors += 1;
                progress.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("publish failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    Ok(stats)
}

/// One pipelined publisher on a `PublishStream`: up to `--window` publishes
/// outstanding, acks in order. A broken stream ends this publisher; what was
/// outstanding counts as errors.
async fn publish_async(
    addr: &str,
    args: &BenchArgs,
    i: u32,
    clock: Clock,
    progress: Arc<Progress>,
    deadline: Option<Instant>,
    stamp: bool,
) -> Result<PubStats> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let channel = Endpoint::from_shared(url)?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let mut grpc = WharfClient::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let window = args.window.max(1) as usize;
    let (tx, rx) = mpsc::channel::<pb::PublishRequest>(window);
    let mut acks = grpc
        .publish_stream(ReceiverStream::new(rx))
        .await?
        .into_inner();
    // Intended send times of the outstanding publishes, in send order.
    let (sent_tx, mut sent_rx) = mpsc::channel::<Instant>(window + 1);
    let permits = Arc::new(Semaphore::new(window));

    let sender = {
        let (args, permits, progress) = (args.clone(), permits.clone(), progress.clone());
        let mut pacer =
            Pacer::new(args.rate_per_pub(), Instant::now()).context("starting the pacer thread")?;
        tokio::spawn(async move {
            let count = if deadline.is_some() {
                u64::MAX
            } else {
                args.share(i)
            };
            let tag = u64::from(i) << 40;
            for k in 0..count {
                let mut intended = pacer.next().await;
                if deadline.is_some_and(|d| intended >= d) || progress.stop.load(Ordering::Relaxed)
                {
                    break;
                }
                let Ok(permit) = permits.acquire().await else {
                    break;
                };
                permit.forget();
                if !pacer.paced() {
                    intended = Instant::now();
                }
                let stamp_ns = if stamp { clock.ns(intended) } else { 0 };
                let req = pb::PublishRequest {
                    subject: args.subject.clone(),
                    payload: Bytes::from(payload(args.size, stamp_ns, tag | k)),
                    ..Default::default()
                };
                if sent_tx.send(intended).await.is_err() || tx.send(req).await.is_err() {
                    break;
                }
            }
        })
    };

    let mut stats = PubStats::default();
    loop {
        match acks.message().await {
            Ok(Some(ack)) => {
                let Some(intended) = sent_rx.recv().await else {
                    break;
                };
                permits.add_permits(1);
                if ack.error.is_empty() {
                    stats.ack(intended, Instant::now(), args.size);
                    progress.published.fetch_add(1, Ordering::Relaxed);
                } else {
                    stats.errors += 1;
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(None) => break,
            Err(status) => {
                tracing::debug!("publish stream broke: {status}");
                permits.close();
                sent_rx.close();
                while sent_rx.recv().await.is_some() {
                    stats.errors += 1;
                    progress.errors.fetch_add(1, Ordering::Relaxed);
                }
                break;
            }
        }
    }
    sender.abort();
    Ok(stats)
}

/// One pull worker: fetch a batch, ack each message (all of the batch's acks
/// in flight together, each confirmed once committed) or, with `--ack all`,
/// the batch's highest sequence, until the target count is reached or
/// nothing arrived for `IDLE_LIMIT` after publishing ended. With
/// `--ack-next` a batch's acks go out with the next pull
/// (`Consumer::ack_and_fetch`); a batch counts as consumed once its acks
/// are confirmed either way.
async fn worker(
    client: Client,
    args: &BenchArgs,
    clock: Clock,
    progress: Arc<Progress>,
) -> Result<SubStats> {
    let mut consumer = client.consumer(&args.stream, &args.consumer);
    let mut stats = SubStats::default();
    let mut last_seen = Instant::now();
    // With --ack-next: the last batch's acks, which go out with the next
    // pull, and how many messages they settle.
    let mut unacked: Vec<u64> = Vec::new();
    let mut unacked_msgs = 0u64;
    while !progress.workers_done() {
        let fetched = if unacked.is_empty() {
            consumer.fetch(args.batch, FETCH_WAIT).await
        } else {
            let fetched = consumer
                .ack_and_fetch(&unacked, args.batch, FETCH_WAIT)
                .await;
            // Counted even when the call failed, as `settle` does.
            progress
                .consumed
                .fetch_add(std::mem::take(&mut unacked_msgs), Ordering::Relaxed);
            unacked.clear();
            fetched
        };
        let msgs = match fetched {
            Ok(msgs) => msgs,
            Err(e) => {
                stats.errors += 1;
                progress.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!("fetch failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                Vec::new()
            }
        };
        let now = Instant::now();
        if msgs.is_empty() {
            if progress.publishers_done.load(Ordering::Relaxed) && now - last_seen > IDLE_LIMIT {
                break;
            }
            continue;
        }
        last_seen = now;
        for m in &msgs {
            stats.received(&clock, &m.payload, m.delivered, now);
        }
        let to_ack = match args.ack {
            AckMode::Each => msgs.iter().map(|m| m.stream_seq).collect(),
            AckMode::All => vec![highest_seq(&msgs)],
        };
        if args.ack_next {
            unacked = to_ack;
            unacked_msgs = msgs.len() as u64;
            // The batch is counted when its acks are confirmed, with the next pull.
            continue;
        }
        settle(&mut consumer, &to_ack, &mut stats, &progress).await;
        progress
            .consumed
            .fetch_add(msgs.len() as u64, Ordering::Relaxed);
    }
    if !unacked.is_empty() {
        settle(&mut consumer, &unacked, &mut stats, &progress).await;
        progress.consumed.fetch_add(unacked_msgs, Ordering::Relaxed);
    }
    consumer.close();
    Ok(stats)
}

/// Ack these sequences and wait for their confirmation; a failure is
/// counted as one error (the messages are then redelivered after AckWait).
async fn settle(
    consumer: &mut wharf_client::Consumer,
    seqs: &[u64],
    stats: &mut SubStats,
    progress: &Progress,
) {
    if let Err(e) = consumer.ack_each(seqs).await {
        stats.errors += 1;
        progress.errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("acks failed: {e}");
    }
}

/// The sequence an ack-all settles a fetched batch with: its highest (a
/// redelivered message may come after newer ones in a batch).
fn highest_seq(msgs: &[wharf_client::Message]) -> u64 {
    msgs.iter().map(|m| m.stream_seq).max().unwrap_or(0)
}
