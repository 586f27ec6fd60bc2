//! `wharf server` limit settings: `--max-*` flags, `WHARF_MAX_*` environment
//! variables and the `[limits]` table of the config file.
//!
//! Precedence as for every server setting: flag, then environment (clap),
//! then the file, then the default of `wharf_server::Limits`. The values
//! are checked by `Limits::validate` when the node starts.

use clap::Args;
use serde::Deserialize;
use wharf_server::Limits;

/// Server-wide limits; see docs/LIMITS.md for what each refuses and how.
#[derive(Args, Debug, Default, Clone)]
pub struct LimitArgs {
    /// Largest message payload in bytes, at most 1048576 [default: 1048576].
    #[arg(long, env = "WHARF_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<u32>,
    /// Largest gRPC request in bytes; at least max-message-bytes + 65536
    /// [default: 2097152].
    #[arg(long, env = "WHARF_MAX_REQUEST_BYTES")]
    pub max_request_bytes: Option<usize>,
    /// Most messages one pull may ask for, at most 10000 [default: 10000].
    #[arg(long, env = "WHARF_MAX_PULL_BATCH")]
    pub max_pull_batch: Option<u32>,
    /// Largest max_bytes one pull may ask for [default: 67108864].
    #[arg(long, env = "WHARF_MAX_PULL_BYTES")]
    pub max_pull_bytes: Option<u64>,
    /// Most streams in the cluster [default: 1000].
    #[arg(long, env = "WHARF_MAX_STREAMS")]
    pub max_streams: Option<u32>,
    /// Most consumers in the cluster, all streams together [default: 10000].
    #[arg(long, env = "WHARF_MAX_CONSUMERS")]
    pub max_consumers: Option<u32>,
    /// Most open connections from one client IP to this node; cluster
    /// members are not counted [default: 1024].
    #[arg(long, env = "WHARF_MAX_CONNECTIONS_PER_IP")]
    pub max_connections_per_ip: Option<u32>,
    /// Most open pull sessions of one client (IP) on this node [default: 256].
    #[arg(long, env = "WHARF_MAX_PULLS_PER_CLIENT")]
    pub max_pulls_per_client: Option<u32>,
}

/// The `[limits]` table of the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    max_message_bytes: Option<u32>,
    max_request_bytes: Option<usize>,
    max_pull_batch: Option<u32>,
    max_pull_bytes: Option<u64>,
    max_streams: Option<u32>,
    max_consumers: Option<u32>,
    max_connections_per_ip: Option<u32>,
    max_pulls_per_client: Option<u32>,
}

pub fn resolve(args: &LimitArgs, file: Option<LimitsFile>) -> Limits {
    let f = file.unwrap_or_default();
    let d = Limits::default();
    Limits {
        max_message_bytes: args
            .max_message_bytes
            .or(f.max_message_bytes)
            .unwrap_or(d.max_message_bytes),
        max_request_bytes: args
            .max_request_bytes
            .or(f.max_request_bytes)
            .unwrap_or(d.max_request_bytes),
        max_pull_batch: args
            .max_pull_batch
            .or(f.max_pull_batch)
            .unwrap_or(d.max_pull_batch),
        max_pull_bytes: args
            .max_pull_bytes
            .or(f.max_pull_bytes)
            .unwrap_or(d.max_pull_bytes),
        max_streams: args.max_streams.or(f.max_streams).unwrap_or(d.max_streams),
        max_consumers: args
            .max_consumers
            .or(f.max_consumers)
            .unwrap_or(d.max_consumers),
        max_connections_per_ip: args
            .max_connections_per_ip
            .or(f.max_connections_per_ip)
            .unwrap_or(d.max_connections_per_ip),
        max_pulls_per_client: args
            .max_pulls_per_client
            .or(f.max_pulls_per_client)
            .unwrap_or(d.max_pulls_per_client),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_over_file_over_default() {
        let file: LimitsFile = toml::from_str("max_streams = 5\nmax_pull_batch = 7\n").unwrap();
        let args = LimitArgs {
            max_streams: Some(9),
            ..Default::default()
        };
        let l = resolve(&args, Some(file));
        assert_eq!(l.max_streams, 9);
        assert_eq!(l.max_pull_batch, 7);
        assert_eq!(l.max_consumers, Limits::default().max_consumers);
        assert!(toml::from_str::<LimitsFile>("max_stream = 1").is_err());
    }
}
