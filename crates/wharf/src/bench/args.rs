//! The workload flags of `wharf bench`, shared word for word with the NATS
//! driver in `bench/nats-driver` (which includes this file by path), so both
//! brokers run the same workload from the same command line.
//!
//! Every knob is bounded: windows, batches and worker counts have upper limits
//! checked in [`BenchArgs::validate`], so a typo cannot start a million tasks.

use std::time::Duration;

use clap::{Args, ValueEnum};

/// Largest publish window (outstanding acks per publisher).
pub const MAX_WINDOW: u32 = 65_536;
/// Largest pull batch.
pub const MAX_BATCH: u32 = 10_000;
/// Most publishers or workers.
pub const MAX_CLIENTS: u32 = 256;
/// Largest message, in bytes.
pub const MAX_SIZE: usize = 1024 * 1024;
/// The payload starts with an 8-byte send timestamp and an 8-byte tag.
pub const MIN_SIZE: usize = 16;

/// How the bench's workers acknowledge what they fetched.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckMode {
    /// Ack every message (explicit ack policy).
    Each,
    /// Ack the highest sequence of each batch (ack policy "all").
    All,
}

impl AckMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AckMode::Each => "each",
            AckMode::All => "all",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Stream created for the run (deleted at the end unless --keep).
    #[arg(long, default_value = "BENCH")]
    pub stream: String,
    /// Subject published to (the stream stores exactly this subject).
    #[arg(long, default_value = "bench.data")]
    pub subject: String,
    /// Durable consumer the workers share.
    #[arg(long, default_value = "workers")]
    pub consumer: String,
    /// Concurrent publishers.
    #[arg(long = "pub", default_value_t = 1)]
    pub pubs: u32,
    /// Pull workers sharing one consumer. With --pub 0 the stream is first
    /// filled with --msgs messages (not measured) and the workers drain it.
    #[arg(long = "sub", default_value_t = 0)]
    pub subs: u32,
    /// Messages to publish in total (split across publishers); ignored with --duration.
    #[arg(long, default_value_t = 100_000)]
    pub msgs: u64,
    /// Publish for this long instead of a message count (e.g. 20s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Payload size in bytes (at least 16: a send timestamp and a tag).
    #[arg(long, default_value_t = 128)]
    pub size: usize,
    /// Outstanding publish acks per publisher: 0 publishes synchronously (one
    /// call, one ack); N > 0 pipelines up to N publishes on one stream.
    #[arg(long, default_value_t = 0)]
    pub window: u32,
    /// Messages per pull request.
    #[arg(long, default_value_t = 100)]
    pub batch: u32,
    /// How workers acknowledge: `each` acks every message of a batch; `all`
    /// gives the consumer ack policy "all" and acks only the highest
    /// sequence of each batch, which settles everything up to it.
    #[arg(long, value_enum, default_value_t = AckMode::Each)]
    pub ack: AckMode,
    /// Send a batch's acks together with the next pull and wait for both
    /// (NATS' "ack next", with every ack still confirmed), instead of
    /// waiting for the acks before pulling again.
    #[arg(long)]
    pub ack_next: bool,
    /// Stream and consumer replicas.
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Open loop: total publish rate in msgs/s, spread over the publishers.
    /// Sends follow a fixed timeline and latency counts from the intended
    /// send time, so a stall is charged to every message it delays. 0 = as
    /// fast as acks allow (closed loop).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// The consumer's MaxAckPending.
    #[arg(long, default_value_t = 1000)]
    pub max_ack_pending: i64,
    /// Print one JSON object on stdout instead of the text report.
    #[arg(long)]
    pub json: bool,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Keep the stream and consumer after the run.
    #[arg(long)]
    pub keep: bool,
}

impl BenchArgs {
    pub fn validate(&self) -> Result<(), String> {
        if self.pubs == 0 && self.subs == 0 {
            return Err("nothing to do: --pub and --sub are both 0".into());
        }
        if self.pubs > MAX_CLIENTS || self.subs > MAX_CLIENTS {
            return Err(format!("at most {MAX_CLIENTS} publishers and workers"));
        }
        if !(MIN_SIZE..=MAX_SIZE).contains(&self.size) {
            return Err(format!("--size must be {MIN_SIZE}..={MAX_SIZE} bytes"));
        }
        if self.window > MAX_WINDOW {
            return Err(format!("--window must be at most {MAX_WINDOW}"));
        }
        if self.batch == 0 || self.batch > MAX_BATCH {
            return Err(format!("--batch must be 1..={MAX_BATCH}"));
        }
        if self.replicas != 1 && self.replicas != 3 {
            return Err("--replicas must be 1 or 3".into());
        }
        if self.duration.is_none() && self.msgs == 0 {
            return Err("--msgs must be at least 1".into());
        }
        if self.duration.is_some() && self.pubs == 0 {
            return Err("--duration needs publishers".into());
        }
        Ok(())
    }

    /// Messages publisher `i` sends in count mode.
    pub fn share(&self, i: u32) -> u64 {
        let n = u64::from(self.pubs.max(1));
        self.msgs / n + u64::from(u64::from(i) < self.msgs % n)
    }

    /// The rate of one publisher, in msgs/s (0: unpaced).
    pub fn rate_per_pub(&self) -> f64 {
        if self.rate == 0 || self.pubs == 0 {
            0.0
        } else {
            self.rate as f64 / f64::from(self.pubs)
        }
    }
}
