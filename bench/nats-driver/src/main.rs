//! `nats-bench-driver`: `wharf bench`'s workloads run against NATS JetStream
//! through the `async-nats` crate, with the same flags (the flag and report
//! code is included from `crates/wharf/src/bench/`) and the same JSON report,
//! so `bench/compare.sh` can put the two side by side.
//!
//! The mapping, one for one with `wharf bench`:
//! - stream: file storage, `--replicas`, one subject; consumer: durable pull,
//!   explicit ack (ack policy all with `--ack all`), AckWait 30 s,
//!   `--max-ack-pending`;
//! - sync publish: `jetstream.publish(..)` then await its ack;
//! - async publish: up to `--window` ack futures outstanding per publisher;
//! - worker: fetch `--batch` (expires 500 ms), then `double_ack` each message
//!   (an ack the server confirms, like Wharf's committed ack), all of the
//!   batch's acks awaited together, as `wharf bench` does with `ack_each`;
//!   with `--ack all` (ack policy all) only the batch's highest sequence;
//!   with `--ack-next` a batch's confirmed acks and the next fetch are
//!   awaited together, as `wharf bench` does with `ack_and_fetch`;
//! - worker and sync publisher `i` connect to server `i % servers` first; a
//!   pipelined publisher (`--window`) connects to the stream leader's server
//!   first when it is found, as `wharf bench` opens its `PublishStream` at
//!   the leader.
//!
//! `leader --stream NAME` prints the server name of the stream's leader (for
//! the failover run).

#[path = "../../../crates/wharf/src/bench/args.rs"]
mod args;
#[path = "../../../crates/wharf/src/bench/report.rs"]
mod report;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_nats::jetstream::{self, consumer::pull, stream::StorageType};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use tokio::sync::{mpsc, Semaphore};

use args::{AckMode, BenchArgs};
use report::{payload, Clock, Pacer, Progress, PubStats, Report, SubStats};

const FETCH_WAIT: Duration = Duration::from_millis(500);
const IDLE_LIMIT: Duration = Duration::from_secs(10);
const FILL_WINDOW: u32 = 256;

#[derive(Parser)]
struct Cli {
    /// NATS servers, comma-separated host:port.
    #[arg(
        long,
        global = true,
        default_value = "127.0.0.1:4222,127.0.0.1:4223,127.0.0.1:4224"
    )]
    server: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a workload (same flags as `wharf bench`).
    Bench(BenchArgs),
    /// Print the server name of a stream's leader.
    Leader {
        #[arg(long, default_value = "BENCH")]
        stream: String,
    },
    /// Delete a stream if it exists.
    Rm {
        #[arg(long, default_value = "BENCH")]
        stream: String,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let addrs: Vec<String> = cli
        .server
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.contains("://") {
                s.to_string()
            } else {
                format!("nats://{s}")
            }
        })
        .collect();
    if addrs.is_empty() {
        bail!("no server address given");
    }
    match cli.command {
        Cmd::Bench(args) => bench(&addrs, args).await,
        Cmd::Leader { stream } => {
            let js = jetstream::new(connect(&addrs, 0).await?);
            let info = js.get_stream(&stream).await?.info().await?.clone();
            let leader = info.cluster.and_then(|c| c.leader).unwrap_or_default();
            println!("{leader}");
            Ok(())
        }
        Cmd::Rm { stream } => {
            let js = jetstream::new(connect(&addrs, 0).await?);
            let _ = js.delete_stream(&stream).await;
            Ok(())
        }
    }
}

/// A connection that tries `addrs[i % n]` first, then the others in order.
async fn connect(addrs: &[String], i: u32) -> Result<async_nats::Client> {
    let k = i as usize % addrs.len();
    let mut order = addrs[k..].to_vec();
    order.extend_from_slice(&addrs[..k]);
    let opts = async_nats::ConnectOptions::new()
        .retain_servers_order()
        .connection_timeout(Duration::from_secs(2));
    async_nats::connect_with_options(order.clone(), opts)
        .await
        .with_context(|| format!("connecting to {}", order[0]))
}

/// The index in `addrs` of the server that leads `stream`, as `wharf bench`
/// finds its stream's leader for pipelined publishers: by the leader's server
/// name, matched against the name each address answers with.
async fn leader_index(addrs: &[String], stream: &str) -> Option<usize> {
    let js = jetstream::new(connect(addrs, 0).await.ok()?);
    let info = js.get_stream(stream).await.ok()?.info().await.ok()?.clone();
    let leader = info.cluster.and_then(|c| c.leader)?;
    for (i, addr) in addrs.iter().enumerate() {
        let opts = async_nats::ConnectOptions::new().connection_timeout(Duration::from_secs(2));
        let Ok(client) = async_nats::connect_with_options(addr.as_str(), opts).await else {
            continue;
        };
        if client.server_info().server_name == leader {
            return Some(i);
        }
    }
    None
}

async fn bench(addrs: &[String], args: BenchArgs) -> Result<()> {
    args.validate().map_err(anyhow::Error::msg)?;
    let js = jetstream::new(connect(addrs, 0).await?);
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: args.stream.clone(),
            subjects: vec![args.subject.clone()],
            num_replicas: args.replicas as usize,
            storage: StorageType::File,
            ..Default::default()
        })
        .await
        .with_context(|| format!("cannot create stream {}", args.stream))?;
    if args.subs > 0 {
        stream
            .create_consumer(pull::Config {
                durable_name: Some(args.consumer.clone()),
                ack_policy: match args.ack {
                    AckMode::Each => jetstream::consumer::AckPolicy::Explicit,
                    AckMode::All => jetstream::consumer::AckPolicy::All,
                },
                ack_wait: Duration::from_secs(30),
                max_ack_pending: args.max_ack_pending,
                ..Default::default()
            })
            .await?;
    }
    let outcome = measure(addrs, &args).await;
    if !args.keep {
        if let Err(e) = js.delete_stream(&args.stream).await {
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

async fn measure<'a>(addrs: &[String], args: &'a BenchArgs) -> Result<Report<'a>> {
    let clock = Clock::new();
    let mut notes = Vec::new();
    if args.pubs == 0 {
        let fill = BenchArgs {
            window: FILL_WINDOW,
            rate: 0,
            pubs: 1,
            ..args.clone()
        };
        let at = leader_index(addrs, &args.stream).await.unwrap_or(0);
        let js = jetstream::new(connect(addrs, at as u32).await?);
        let stats = publish_async(js, &fill, 0, clock, Progress::new(), None, false).await?;
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
    let ticker = (!args.quiet).then(|| report::spawn_progress(progress.clone(), "nats"));
    let start = Instant::now();
    let deadline = args.duration.map(|d| start + d);

    let mut workers = Vec::new();
    for i in 0..args.subs {
        let js = jetstream::new(connect(addrs, i).await?);
        let (args, progress) = (args.clone(), progress.clone());
        workers.push(tokio::spawn(async move {
            worker(js, &args, clock, progress).await
        }));
    }
    let leader = if args.pubs > 0 && args.window > 0 {
        leader_index(addrs, &args.stream).await
    } else {
        None
    };
    let mut publishers = Vec::new();
    for i in 0..args.pubs {
        let first = leader.map_or(i, |l| l as u32);
        let js = jetstream::new(connect(addrs, first).await?);
        let (args, progress) = (args.clone(), progress.clone());
        publishers.push(tokio::spawn(async move {
            if args.window == 0 {
                publish_sync(js, &args, i, clock, progress, deadline, start).await
            } else {
                publish_async(js, &args, i, clock, progress, deadline, true).await
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
        broker: "nats",
        args,
        publish: (args.pubs > 0).then_some((published, start)),
        consume: (args.subs > 0).then_some((consumed, start)),
        notes,
    })
}

async fn publish_sync(
    js: jetstream::Context,
    args: &BenchArgs,
    i: u32,
    clock: Clock,
    progress: Arc<Progress>,
    deadline: Option<Instant>,
    start: Instant,
) -> Result<PubStats> {
    let mut stats = PubStats::default();
    let mut pacer =
        Pacer::new(args.rate_per_pub(), start).context("starting the pacer thread")?;
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
        let outcome = match js.publish(args.subject.clone(), body).await {
            Ok(ack) => ack.await.map(|_| ()).map_err(anyhow::Error::from),
            Err(e) => Err(e.into()),
        };
        match outcome {
            Ok(()) => {
                stats.ack(intended, Instant::now(), args.size);
                progress.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                stats.errors += 1;
                progress.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    Ok(stats)
}

async fn publish_async(
    js: jetstream::Context,
    args: &BenchArgs,
    i: u32,
    clock: Clock,
    progress: Arc<Progress>,
    deadline: Option<Instant>,
    stamp: bool,
) -> Result<PubStats> {
    let window = args.window.max(1) as usize;
    let permits = Arc::new(Semaphore::new(window));
    // Ack futures of the outstanding publishes, in send order, with their intended times.
    let (sent_tx, mut sent_rx) = mpsc::channel(window + 1);
    // The connection closes when its last handle drops, failing every ack
    // still outstanding: keep one here until all acks are in.
    let _connection = js.clone();
    let sender = {
        let (args, permits, progress) = (args.clone(), permits.clone(), progress.clone());
        let mut pacer = Pacer::new(args.rate_per_pub(), Instant::now())
            .context("starting the pacer thread")?;
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
                let body = Bytes::from(payload(args.size, stamp_ns, tag | k));
                let ack = js.publish(args.subject.clone(), body).await;
                if sent_tx.send((intended, ack)).await.is_err() {
                    break;
                }
            }
        })
    };
    let mut stats = PubStats::default();
    while let Some((intended, ack)) = sent_rx.recv().await {
        let outcome = match ack {
            Ok(fut) => fut.await.map(|_| ()).map_err(anyhow::Error::from),
            Err(e) => Err(e.into()),
        };
        permits.add_permits(1);
        match outcome {
            Ok(()) => {
                stats.ack(intended, Instant::now(), args.size);
                progress.published.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                if stats.errors < 3 {
                    eprintln!("publish failed: {e:#}");
                }
                stats.errors += 1;
                progress.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let _ = sender.await;
    Ok(stats)
}

async fn worker(
    js: jetstream::Context,
    args: &BenchArgs,
    clock: Clock,
    progress: Arc<Progress>,
) -> Result<SubStats> {
    let consumer: jetstream::consumer::PullConsumer = js
        .get_consumer_from_stream(&args.consumer, &args.stream)
        .await?;
    let mut stats = SubStats::default();
    let mut last_seen = Instant::now();
    // With --ack-next: the last batch, whose acks go out with the next fetch.
    let mut unacked: Vec<jetstream::Message> = Vec::new();
    while !progress.workers_done() {
        let (fetched, acks) = tokio::join!(fetch(&consumer, args.batch), settle(&unacked, args.ack));
        if !unacked.is_empty() {
            count_errors(acks, &mut stats, &progress);
            progress
                .consumed
                .fetch_add(unacked.len() as u64, Ordering::Relaxed);
            unacked.clear();
        }
        let (msgs, fetch_errors) = fetched;
        for _ in 0..fetch_errors {
            stats.errors += 1;
            progress.errors.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        if msgs.is_empty() {
            if progress.publishers_done.load(Ordering::Relaxed) && now - last_seen > IDLE_LIMIT {
                break;
            }
            continue;
        }
        last_seen = now;
        for m in &msgs {
            let delivered = m.info().map(|i| i.delivered.max(1) as u64).unwrap_or(1);
            stats.received(&clock, &m.payload, delivered, now);
        }
        if args.ack_next {
            unacked = msgs;
            continue;
        }
        let acks = settle(&msgs, args.ack).await;
        count_errors(acks, &mut stats, &progress);
        progress
            .consumed
            .fetch_add(msgs.len() as u64, Ordering::Relaxed);
    }
    if !unacked.is_empty() {
        let acks = settle(&unacked, args.ack).await;
        count_errors(acks, &mut stats, &progress);
        progress
            .consumed
            .fetch_add(unacked.len() as u64, Ordering::Relaxed);
    }
    Ok(stats)
}

/// One fetch of up to `batch` messages: the messages and how many errors came with them.
async fn fetch(
    consumer: &jetstream::consumer::PullConsumer,
    batch: u32,
) -> (Vec<jetstream::Message>, u64) {
    let mut msgs = Vec::with_capacity(batch as usize);
    let mut errors = 0;
    match consumer
        .fetch()
        .max_messages(batch as usize)
        .expires(FETCH_WAIT)
        .messages()
        .await
    {
        Ok(mut batch) => {
            while let Some(m) = batch.next().await {
                match m {
                    Ok(m) => msgs.push(m),
                    Err(_) => errors += 1,
                }
            }
        }
        Err(_) => {
            errors += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    (msgs, errors)
}

/// Ack a fetched batch, each ack confirmed by the server (`double_ack`):
/// every message, or with ack policy all the highest stream sequence,
/// which settles the batch. Nothing to do for an empty batch.
async fn settle(
    msgs: &[jetstream::Message],
    mode: AckMode,
) -> Vec<Result<(), async_nats::Error>> {
    if msgs.is_empty() {
        return Vec::new();
    }
    match mode {
        AckMode::Each => futures::future::join_all(msgs.iter().map(|m| m.double_ack())).await,
        AckMode::All => {
            let last = msgs
                .iter()
                .max_by_key(|m| m.info().map(|i| i.stream_sequence).unwrap_or(0))
                .expect("a non-empty batch");
            vec![last.double_ack().await]
        }
    }
}

fn count_errors(acks: Vec<Result<(), async_nats::Error>>, stats: &mut SubStats, progress: &Progress) {
    for ack in acks {
        if ack.is_err() {
            stats.errors += 1;
            progress.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
