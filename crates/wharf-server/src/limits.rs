//! Server-wide limits: their settings, defaults and checks, and the
//! per-client counters behind the "per client" ones.
//!
//! Every limit refuses with a gRPC status whose message names the setting
//! and its value (`max_streams is 2`), through the crate's one
//! `ServerError -> Status` conversion:
//! - sizes and ranges of one request (message, pull batch, pull bytes):
//!   `ServerError::Invalid` (INVALID_ARGUMENT);
//! - counts (streams, consumers, connections, concurrent pulls):
//!   `ServerError::Exhausted` (RESOURCE_EXHAUSTED).
//!
//! The request size limit is tonic's `max_decoding_message_size`: tonic
//! refuses an oversize request itself, with OUT_OF_RANGE and a message that
//! gives both sizes, before any handler runs.
//!
//! "Per client" is keyed by [`ClientKey`] (built in `conn_limit::client_key`):
//! the logged-in user when authentication is on, else the remote IP address.
//! Connections are counted when accepted, before any login, so
//! `max_connections_per_ip` is always per address.
//!
//! Invariants: counters never go below zero and never leak (a count is held
//! by a [`CountGuard`] and given back on drop); the stream and consumer
//! counts are checked inside the meta state machine (see
//! `MetaCommand::Bounded`), so every replica refuses the same command.
//!
//! Left out: per-account quotas (no accounts), storage quotas across
//! streams, and rate limits (requests per second).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use wharf_core::stream::MAX_MSG_SIZE_LIMIT;

use crate::error::{Result, ServerError};
use crate::meta::MetaCommand;

/// Hard ceiling of `max_pull_batch` (the consumer runtime refuses above it).
pub const MAX_PULL_BATCH_CEILING: u32 = crate::consumer_runtime::MAX_PULL_BATCH;
/// Hard ceiling of `max_request_bytes`.
pub const MAX_REQUEST_BYTES_CEILING: usize = 64 * 1024 * 1024;
/// Room a publish request needs beyond its payload (subject, id, framing).
pub const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;
/// Longest deduplication id accepted, in bytes: ids are kept in memory for
/// the stream's duplicate window.
pub const MAX_MSG_ID_BYTES: usize = 256;

/// The server-wide limits of one node. Give every node the same values:
/// a call can be refused by the node it reaches or by the node it is
/// forwarded to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest message payload, in bytes (NATS `max_payload`). At most
    /// 1 MiB, the ceiling stream configurations are checked against.
    pub max_message_bytes: u32,
    /// Largest gRPC request the public API decodes, in bytes.
    pub max_request_bytes: usize,
    /// Most messages one pull request may ask for.
    pub max_pull_batch: u32,
    /// Largest `max_bytes` one pull request may ask for (0 in a request
    /// means "no byte bound"; the batch limit still applies).
    pub max_pull_bytes: u64,
    /// Most streams in the cluster.
    pub max_streams: u32,
    /// Most consumers in the cluster, all streams together.
    pub max_consumers: u32,
    /// Most open TCP connections from one client IP to this node.
    pub max_connections_per_ip: u32,
    /// Most open pull sessions (Consume calls) of one client on this node.
    pub max_pulls_per_client: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: MAX_MSG_SIZE_LIMIT,
            max_request_bytes: 2 * MAX_MSG_SIZE_LIMIT as usize,
            max_pull_batch: MAX_PULL_BATCH_CEILING,
            max_pull_bytes: 64 * 1024 * 1024,
            max_streams: 1000,
            max_consumers: 10_000,
            max_connections_per_ip: 1024,
            max_pulls_per_client: 256,
        }
    }
}

impl Limits {
    /// Checks the settings themselves (at startup).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ServerError::Invalid(format!("limits: {m}")));
        if self.max_message_bytes == 0 || self.max_message_bytes > MAX_MSG_SIZE_LIMIT {
            return bad(format!(
                "max_message_bytes must be 1 to {MAX_MSG_SIZE_LIMIT}, not {}",
                self.max_message_bytes
            ));
        }
        let min_request = self.max_message_bytes as usize + REQUEST_OVERHEAD_BYTES;
        if self.max_request_bytes < min_request
            || self.max_request_bytes > MAX_REQUEST_BYTES_CEILING
        {
            return bad(format!(
                "max_request_bytes must be {min_request} (max_message_bytes + {REQUEST_OVERHEAD_BYTES}) to {MAX_REQUEST_BYTES_CEILING}, not {}",
                self.max_request_bytes
            ));
        }
        if self.max_pull_batch == 0 || self.max_pull_batch > MAX_PULL_BATCH_CEILING {
            return bad(format!(
                "max_pull_batch must be 1 to {MAX_PULL_BATCH_CEILING}, not {}",
                self.max_pull_batch
            ));
        }
        if self.max_pull_bytes < u64::from(self.max_message_bytes) {
            return bad(format!(
                "max_pull_bytes ({}) must be at least max_message_bytes ({})",
                self.max_pull_bytes, self.max_message_bytes
            ));
        }
        for (name, v) in [
            ("max_streams", self.max_streams),
            ("max_consumers", self.max_consumers),
            ("max_connections_per_ip", self.max_connections_per_ip),
            ("max_pulls_per_client", self.max_pulls_per_client),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        Ok(())
    }

    /// Wraps a meta command so the meta state machine checks the stream and
    /// consumer counts when it applies it (deterministically, on every
    /// replica, with this node's settings carried in the entry).
    pub fn bound(&self, command: MetaCommand) -> MetaCommand {
        MetaCommand::Bounded {
            max_streams: self.max_streams,
            max_consumers: self.max_consumers,
            command: Box::new(command),
        }
    }
}

/// Who a per-client limit counts against. Today the remote IP address; the
/// authenticated identity will be another variant (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientKey {
    /// A client without a login, by its remote address.
    Addr(IpAddr),
    /// A logged-in user (authentication on), wherever it connects from.
    User(String),
}

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientKey::Addr(ip) => write!(f, "{ip}"),
            ClientKey::User(name) => write!(f, "user {name:?}"),
        }
    }
}

/// Live counts per client (connections, or pull sessions).
#[derive(Debug, Default)]
pub struct ClientCounts {
    counts: Mutex<HashMap<ClientKey, u32>>,
}

/// One counted thing; the count goes down when it is dropped.
#[derive(Debug)]
pub struct CountGuard {
    counts: Arc<ClientCounts>,
    key: ClientKey,
}

impl ClientCounts {
    /// Count one more for `key`. Returns the guard and how many `key` had
    /// before this one (so the caller decides what "over" means).
    pub fn add(self: &Arc<Self>, key: ClientKey) -> (CountGuard, u32) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(key.clone()).or_insert(0);
        let before = *n;
        *n = n.saturating_add(1);
        let guard = CountGuard {
            counts: self.clone(),
            key,
        };
        (guard, before)
    }

    /// Count one more for `key` if it has fewer than `max`.
    pub fn try_add(self: &Arc<Self>, key: ClientKey, max: u32) -> Option<CountGuard> {
        let (guard, before) = self.add(key);
        // Dropping the guard gives the count back.
        (before < max).then_some(guard)
    }

    /// The live count of `key` (tests and status).
    pub fn get(&self, key: &ClientKey) -> u32 {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(key).copied().unwrap_or(0)
    }
}

impl Drop for CountGuard {
    fn drop(&mut self) {
        let mut counts = self.counts.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_settings_are_named() {
        assert_eq!(Limits::default().validate(), Ok(()));
        let err = |l: Limits| l.validate().unwrap_err().to_string();
        let d = Limits::default;
        assert!(err(Limits {
            max_message_bytes: 0,
            ..d()
        })
        .contains("max_message_bytes"));
        assert!(err(Limits {
            max_request_bytes: 1000,
            ..d()
        })
        .contains("max_request_bytes"));
        assert!(err(Limits {
            max_pull_batch: 20_000,
            ..d()
        })
        .contains("max_pull_batch"));
        assert!(err(Limits {
            max_pull_bytes: 10,
            ..d()
        })
        .contains("max_pull_bytes"));
        assert!(err(Limits {
            max_streams: 0,
            ..d()
        })
        .contains("max_streams"));
    }

    #[test]
    fn counts_go_up_and_back_down() {
        let counts = Arc::new(ClientCounts::default());
        let key = ClientKey::Addr("10.0.0.1".parse().unwrap());
        let a = counts.try_add(key.clone(), 2).unwrap();
        let b = counts.try_add(key.clone(), 2).unwrap();
        assert!(counts.try_add(key.clone(), 2).is_none());
        assert_eq!(counts.get(&key), 2, "a refused add is not kept");
        drop(a);
        let c = counts.try_add(key.clone(), 2).unwrap();
        drop((b, c));
        assert_eq!(counts.get(&key), 0);
    }
}
