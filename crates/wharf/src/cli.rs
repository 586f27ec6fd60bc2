//! Command-line definitions for `wharf`. Names mirror the `nats` CLI.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "wharf",
    version,
    about = "Wharf: a Raft-replicated message broker with shared pull consumers"
)]
pub struct Cli {
    /// Servers to contact, comma-separated host:port (any node will do).
    #[arg(long, global = true, env = "WHARF_SERVER", default_value = wharf_client::DEFAULT_SERVERS)]
    pub server: String,

    /// How long client commands keep retrying while the cluster fails over.
    #[arg(long, global = true, env = "WHARF_RETRY_FOR", default_value = "10s", value_parser = humantime::parse_duration)]
    pub retry_for: std::time::Duration,

    /// TLS and credentials of client commands.
    #[command(flatten)]
    pub conn: crate::security_cmd::ConnArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one node of a cluster.
    Server(ServerArgs),
    /// Run a local three-node cluster on 127.0.0.1:7001-7003 in this process.
    Dev(DevArgs),
    /// Manage streams.
    #[command(subcommand)]
    Stream(StreamCmd),
    /// Publish a message; prints the stream and sequence it was stored at.
    Pub(PubArgs),
    /// Manage consumers and pull messages.
    #[command(subcommand)]
    Consumer(ConsumerCmd),
    /// Cluster state.
    #[command(subcommand)]
    Cluster(ClusterCmd),
    /// Probe one node's gRPC health (the first --server address); exit 0 when
    /// SERVING. For container health checks: `wharf health --server 127.0.0.1:7001`.
    Health {
        /// `ready` (joined and caught up) or `live` (the process answers).
        #[arg(long, default_value = "ready", value_parser = ["ready", "live"])]
        service: String,
    },
    /// Load the cluster and report throughput and latency percentiles.
    Bench(crate::bench::BenchArgs),
    /// Print the argon2 hash of a password or token, for the server's
    /// `[[auth.users]]` `password_hash` / `token_hash` (see docs/SECURITY.md).
    Passwd(crate::security_cmd::PasswdArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// A TOML file with any of the settings below (node_id, listen, data,
    /// peers, heartbeat_ms, election_min_ms, election_max_ms, metrics_listen,
    /// log_format, a `[limits]` table with the max_* settings, and the
    /// `[tls]` and `[auth]` sections; see docs/CONFIG.md and docs/SECURITY.md).
    /// Flags and environment variables override it.
    #[arg(long, env = "WHARF_CONFIG")]
    pub config: Option<PathBuf>,
    /// This node's id (1 or more; must appear in --peers), or `ordinal`: the
    /// trailing number of the host name plus one (StatefulSet pod wharf-0 is node 1).
    #[arg(long, env = "WHARF_NODE_ID")]
    pub node_id: Option<String>,
    /// Address to serve clients and peers on, e.g. 0.0.0.0:7001.
    #[arg(long, env = "WHARF_LISTEN")]
    pub listen: Option<String>,
    /// Data directory (created if missing).
    #[arg(long, env = "WHARF_DATA")]
    pub data: Option<PathBuf>,
    /// Every node of the cluster: id=host:port,... Host names may not resolve
    /// yet; they are looked up again on every reconnect.
    #[arg(long, env = "WHARF_PEERS")]
    pub peers: Option<String>,
    /// Join an existing cluster instead of founding one: members to ask,
    /// host:port,... The node then waits until `wharf cluster peer add <id>
    /// <addr>` adds it (see docs/CONFIG.md). Excludes --peers.
    #[arg(long, env = "WHARF_JOIN")]
    pub join: Option<String>,
    /// Raft heartbeat interval of every group [default: 150].
    #[arg(long, env = "WHARF_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Smallest election timeout [default: 500].
    #[arg(long, env = "WHARF_ELECTION_MIN_MS")]
    pub election_min_ms: Option<u64>,
    /// Largest election timeout; also the leader lease: a follower that
    /// heard from its leader this recently votes for no one [default: 900].
    #[arg(long, env = "WHARF_ELECTION_MAX_MS")]
    pub election_max_ms: Option<u64>,
    /// Every group snapshots its state and purges its Raft log after this
    /// many applied entries; 0 never does (the log then grows without bound)
    /// [default: 10000].
    #[arg(long, env = "WHARF_SNAPSHOT_EVERY_ENTRIES")]
    pub snapshot_every_entries: Option<u64>,
    /// Threads of the server's async runtime, which serve requests and run
    /// every Raft group [default: one per CPU the process may use]. Where
    /// several nodes share a machine's CPUs, fewer threads each means fewer
    /// thread switches (docs/BENCHMARKS.md).
    #[arg(long, env = "WHARF_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    /// Memory for the node's cache of stored pages, in MiB, shared by every
    /// group; one part of the node's memory, beside its backlogs (docs/CONFIG.md,
    /// "Memory") [default: 256].
    #[arg(long, env = "WHARF_CACHE_MB")]
    pub cache_mb: Option<u64>,
    /// Address to serve Prometheus metrics on over HTTP (GET /metrics),
    /// e.g. 0.0.0.0:9090 [default: none, no metrics endpoint].
    #[arg(long, env = "WHARF_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Log lines on stderr as `text` or `json` (one JSON object per line)
    /// [default: text].
    #[arg(long, env = "WHARF_LOG_FORMAT", value_parser = ["text", "json"])]
    pub log_format: Option<String>,
    /// Server-wide limits (also the `[limits]` table of --config).
    #[command(flatten)]
    pub limits: crate::limits_config::LimitArgs,
}

#[derive(Args, Debug, Clone)]
pub struct RaftArgs {
    /// Raft heartbeat interval of every group.
    #[arg(long, default_value_t = 150)]
    pub heartbeat_ms: u64,
    /// Smallest election timeout.
    #[arg(long, default_value_t = 500)]
    pub election_min_ms: u64,
    /// Largest election timeout.
    #[arg(long, default_value_t = 900)]
    pub election_max_ms: u64,
}

#[derive(Args, Debug)]
pub struct DevArgs {
    /// Where the three nodes keep their data.
    #[arg(long, default_value = ".wharf-dev")]
    pub data: PathBuf,
    #[command(flatten)]
    pub raft: RaftArgs,
}

#[derive(Subcommand, Debug)]
pub enum StreamCmd {
    /// Create a stream.
    Add(StreamAddArgs),
    /// Show a stream's configuration and state.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
        /// Read the answering node's own replica instead of the leader's.
        #[arg(long)]
        local: bool,
        /// Also list the stored subjects with their message counts.
        #[arg(long)]
        subjects: bool,
    },
    /// Change a stream's subjects, limits, discard policy or duplicate
    /// window (name and replicas are fixed). Only the given flags change.
    Edit(StreamEditArgs),
    /// Remove messages: all of them, or only those of --subject, all but the
    /// newest --keep, or those below sequence --seq.
    Purge(StreamPurgeArgs),
    /// Show one stored message by sequence.
    Get {
        name: String,
        seq: u64,
        #[arg(long)]
        json: bool,
    },
    /// Delete one stored message by sequence.
    Rmm { name: String, seq: u64 },
    /// Move the stream's group leadership to another replica.
    Stepdown { name: String },
    /// List streams.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete a stream, its messages and its consumers.
    Rm { name: String },
}

#[derive(Args, Debug)]
pub struct StreamAddArgs {
    pub name: String,
    /// Subjects the stream stores, comma-separated; wildcards * and > allowed.
    #[arg(long, required = true, value_delimiter = ',')]
    pub subjects: Vec<String>,
    /// Replicas: 1 or 3.
    #[arg(long, default_value_t = 3)]
    pub replicas: u32,
    /// Keep at most this many messages (oldest removed first); -1 unlimited.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub max_msgs: i64,
    /// Keep at most this many bytes of payload; -1 unlimited.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub max_bytes: i64,
    /// Remove messages older than this (e.g. 1h); 0 keeps them.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub max_age: std::time::Duration,
    /// Largest message accepted, in bytes; -1 for the server's limit (1 MiB).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub max_msg_size: i32,
    /// Keep at most this many messages per subject (that subject's oldest
    /// removed first); -1 unlimited.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub max_msgs_per_subject: i64,
    /// At a limit: `old` removes the oldest messages, `new` refuses the
    /// publish ("maximum messages exceeded").
    #[arg(long, default_value = "old", value_parser = ["old", "new"])]
    pub discard: String,
    /// How long a message id (`wharf pub --id`) is remembered: a publish with
    /// the same id inside this window is stored once. Default 2m (or
    /// --max-age if shorter).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub dupe_window: Option<std::time::Duration>,
    /// When messages leave the stream besides the limits: limits (never),
    /// workqueue (once the one consumer matching it has acked, termed or
    /// given up on it; consumers may not overlap) or interest (once every
    /// consumer whose filter matches has). Fixed once the stream exists.
    #[arg(long, default_value = "limits", value_parser = ["limits", "workqueue", "interest"])]
    pub retention: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StreamEditArgs {
    pub name: String,
    /// Subjects the stream stores, comma-separated (replaces the list).
    #[arg(long, value_delimiter = ',')]
    pub subjects: Option<Vec<String>>,
    /// Keep at most this many messages; -1 unlimited.
    #[arg(long, allow_hyphen_values = true)]
    pub max_msgs: Option<i64>,
    /// Keep at most this many bytes of payload; -1 unlimited.
    #[arg(long, allow_hyphen_values = true)]
    pub max_bytes: Option<i64>,
    /// Remove messages older than this (e.g. 1h); 0s keeps them.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_age: Option<std::time::Duration>,
    /// Largest message accepted, in bytes; -1 for the server's limit.
    #[arg(long, allow_hyphen_values = true)]
    pub max_msg_size: Option<i32>,
    /// Keep at most this many messages per subject; -1 unlimited.
    #[arg(long, allow_hyphen_values = true)]
    pub max_msgs_per_subject: Option<i64>,
    /// At a limit: `old` removes the oldest messages, `new` refuses publishes.
    #[arg(long, value_parser = ["old", "new"])]
    pub discard: Option<String>,
    /// How long a message id is remembered for deduplication.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub dupe_window: Option<std::time::Duration>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct StreamPurgeArgs {
    pub name: String,
    /// Only messages whose subject matches this filter (wildcards allowed).
    #[arg(long)]
    pub subject: Option<String>,
    /// Keep the newest N (matching) messages.
    #[arg(long, conflicts_with = "seq")]
    pub keep: Option<u64>,
    /// Only messages below this sequence (it is kept).
    #[arg(long)]
    pub seq: Option<u64>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PubArgs {
    pub subject: String,
    pub payload: String,
    /// Message id for deduplication: inside the stream's duplicate window a
    /// publish with an id already stored is acknowledged as a duplicate with
    /// the original sequence and stored only once.
    #[arg(long)]
    pub id: Option<String>,
    /// A header, Name:value; repeat for more.
    #[arg(short = 'H', long = "header", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    #[arg(long)]
    pub json: bool,
}

fn parse_header(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("expected Name:value, got {s:?}")),
    }
}

#[derive(Subcommand, Debug)]
pub enum ConsumerCmd {
    /// Create a durable pull consumer on a stream.
    #[command(
        long_about = "Create a durable pull consumer on a stream.\n\n\
Every worker that pulls from the consumer shares its one position: each \
message goes to exactly one worker, round-robin over the workers that have a \
pull open. A message not acknowledged within --ack-wait (or the --backoff step \
for its delivery) goes to another worker with its delivery count raised; after \
--max-deliver deliveries it is given up on. --max-pending caps delivered but \
unacknowledged messages across all workers together.",
        after_help = "Examples:\n  \
wharf consumer add ORDERS shipping --filter orders.shipped\n  \
wharf consumer add ORDERS billing --ack-wait 10s --max-pending 5000\n  \
wharf consumer add ORDERS retry --backoff 1s,10s,1m --max-deliver 5\n  \
wharf consumer add ORDERS audit --deliver last-per-subject --ack-policy all\n  \
wharf consumer add ORDERS primary --priority pinned"
    )]
    Add(ConsumerAddArgs),
    /// Change a consumer's AckWait, MaxAckPending or max waiting pulls.
    Edit(ConsumerEditArgs),
    /// Show a consumer's configuration, cluster placement and state.
    Info {
        stream: String,
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// List a stream's consumers.
    Ls {
        stream: String,
        #[arg(long)]
        json: bool,
    },
    /// Delete a consumer.
    Rm { stream: String, name: String },
    /// Move the consumer's group leadership to another replica.
    Stepdown { stream: String, name: String },
    /// Stop deliveries until a time (waiting pulls stay open).
    Pause(PauseArgs),
    /// Resume deliveries of a paused consumer.
    Resume { stream: String, name: String },
    /// Pull messages as one worker of the consumer.
    Next(NextArgs),
}

#[derive(Args, Debug)]
pub struct ConsumerAddArgs {
    /// The stream to consume.
    pub stream: String,
    /// The consumer's durable name; workers pull by this name.
    pub name: String,
    /// Only deliver messages whose subject matches this filter (wildcards *
    /// and > allowed). Repeat for several; they may not overlap.
    #[arg(long)]
    pub filter: Vec<String>,
    /// Delete the consumer after nobody has pulled from it for this long.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub inactive_threshold: Option<std::time::Duration>,
    /// How long a delivered message may stay unacked before it goes to another worker.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ack_wait: std::time::Duration,
    /// Most delivered-but-unacked messages across all workers; -1 unlimited.
    #[arg(long, default_value_t = 1000, allow_hyphen_values = true)]
    pub max_pending: i64,
    /// Most pull requests waiting at once.
    #[arg(long, default_value_t = 512)]
    pub max_waiting: i64,
    /// explicit: ack each message; all: an ack covers every earlier message;
    /// none: nothing is tracked, a delivered message is done.
    #[arg(long, default_value = "explicit", value_parser = ["explicit", "all", "none"])]
    pub ack_policy: String,
    /// Give a message up after this many deliveries; -1 unlimited.
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub max_deliver: i64,
    /// Delays before each redelivery, e.g. 1s,10s,1m (the last repeats);
    /// replaces --ack-wait. Needs --max-deliver above the number of delays.
    #[arg(long, value_delimiter = ',', value_parser = humantime::parse_duration)]
    pub backoff: Vec<std::time::Duration>,
    /// When a worker disconnects, its unacked messages go to other workers
    /// at once instead of after AckWait.
    #[arg(long)]
    pub redeliver_on_disconnect: bool,
    /// Where to start: all (every stored message), new (only messages stored
    /// from now on), last (the last matching message, then new ones),
    /// last-per-subject (the last message of each subject, then new ones).
    /// Fixed once the consumer exists.
    #[arg(long, default_value = "all", value_parser = ["all", "new", "last", "last-per-subject"],
          conflicts_with_all = ["start_seq", "start_time"])]
    pub deliver: String,
    /// Start at this stream sequence.
    #[arg(long, conflicts_with = "start_time")]
    pub start_seq: Option<u64>,
    /// Start at the first message stored at or after this time (RFC 3339,
    /// e.g. 2026-05-22T10:14:00Z).
    #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
    pub start_time: Option<std::time::SystemTime>,
    /// Share among workers as: none (round-robin), pinned (one worker gets
    /// everything until it disconnects, then another is pinned) or overflow
    /// (standby workers pulling with --min-pending/--min-ack-pending get
    /// messages only while the backlog exceeds their threshold).
    #[arg(long, default_value = "none", value_parser = ["none", "pinned", "overflow"])]
    pub priority: String,
    /// Labels for operators, key=value; repeat for more.
    #[arg(long = "metadata", value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,
    /// Publish a copy of every message that is termed or reaches
    /// --max-deliver to this subject, once, with Wharf-Dead-Letter-* headers
    /// naming stream, consumer, subject, sequence, deliveries and reason
    /// (create a stream on the subject to keep them).
    #[arg(long)]
    pub dead_letter_subject: Option<String>,
    #[arg(long)]
    pub json: bool,
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected key=value, got {s:?}")),
    }
}

#[derive(Args, Debug)]
pub struct ConsumerEditArgs {
    pub stream: String,
    pub name: String,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ack_wait: Option<std::time::Duration>,
    #[arg(long, allow_hyphen_values = true)]
    pub max_pending: Option<i64>,
    #[arg(long)]
    pub max_waiting: Option<i64>,
    #[arg(long, allow_hyphen_values = true)]
    pub max_deliver: Option<i64>,
    #[arg(long, value_delimiter = ',', value_parser = humantime::parse_duration)]
    pub backoff: Option<Vec<std::time::Duration>>,
    #[arg(long)]
    pub redeliver_on_disconnect: Option<bool>,
    /// Dead-letter subject; an empty string turns dead-lettering off.
    #[arg(long)]
    pub dead_letter_subject: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct PauseArgs {
    pub stream: String,
    pub name: String,
    /// Pause for this long (e.g. 10m).
    #[arg(long = "for", value_parser = humantime::parse_duration, conflicts_with = "until")]
    pub duration: Option<std::time::Duration>,
    /// Pause until this time (RFC 3339).
    #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
    pub until: Option<std::time::SystemTime>,
}

#[derive(Args, Debug)]
pub struct NextArgs {
    pub stream: String,
    pub name: String,
    /// How many messages to pull.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    /// Acknowledge each message after printing it (the default).
    #[arg(long, conflicts_with = "no_ack")]
    pub ack: bool,
    /// Leave the messages unacknowledged.
    #[arg(long, conflicts_with_all = ["nak", "term"])]
    pub no_ack: bool,
    /// Negative-ack each message: it goes to a worker again (after --nak-delay).
    #[arg(long, conflicts_with_all = ["ack", "term"])]
    pub nak: bool,
    /// With --nak: how long before the message may be redelivered.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub nak_delay: std::time::Duration,
    /// Terminate each message: it is never redelivered.
    #[arg(long, conflicts_with_all = ["ack"])]
    pub term: bool,
    /// Stop the batch before its payloads exceed this many bytes.
    #[arg(long, default_value_t = 0)]
    pub max_bytes: u64,
    /// Overflow consumers: only take messages while at least this many are unprocessed.
    #[arg(long, default_value_t = 0)]
    pub min_pending: u64,
    /// Overflow consumers: only take messages while at least this many are outstanding.
    #[arg(long, default_value_t = 0)]
    pub min_ack_pending: u64,
    /// How long to wait for messages.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub wait: std::time::Duration,
    /// One JSON object per message.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCmd {
    /// Nodes, which are up, and every group with its leader and term.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Add or remove cluster nodes.
    #[command(subcommand)]
    Peer(PeerCmd),
}

#[derive(Subcommand, Debug)]
pub enum PeerCmd {
    /// Add a node started with `wharf server --join`: it joins the meta group
    /// (learner, then voter once caught up) and new streams may be placed on it.
    Add {
        /// The new node's id (its --node-id).
        id: u64,
        /// The address the other nodes reach it on (host:port).
        addr: String,
        #[arg(long)]
        json: bool,
    },
    /// Move every replica off a node (each group keeps a majority throughout),
    /// then remove it from the meta group. Waits until done.
    Remove {
        id: u64,
        /// Give up waiting after this long (the move goes on in the cluster).
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        #[arg(long)]
        json: bool,
    },
}
