//! Faults injected on purpose, for tests (never set them in production).
//!
//! `WHARF_FAULT_FAIL_GROUP=<node>:<group>:<after>` makes node `<node>`'s log
//! store of group `<group>` fail every append from its `<after>`-th append
//! on, as a broken disk would. Unset (the normal case) it costs one `None`
//! check per append. openraft treats the error as fatal for that group only:
//! its Raft core stops, the group reports [`crate::Role::Failed`], and every
//! other group of the node goes on.
//!
//! `WHARF_FAULT_SLOW_APPEND_MS=<ms>` makes the process that has it in its
//! environment a slow follower: it answers every AppendEntries that carries
//! entries (for any group) no sooner than `<ms>` after the call arrived. The
//! entries are appended and flushed as usual; only the answer, the leader's
//! evidence that they are durable here, is late, and it is late on every
//! attempt, also when an earlier attempt already wrote the same entries (a
//! follower starved of CPU or disk, or receiving large batches, is slow on
//! each call). Heartbeats (no entries) and votes are answered at once. Set
//! it on one server process only (the test harness has per-node
//! environments, `Cluster::node_env`).
//!
//! `WHARF_FAULT_NO_APPEND_STREAM=1` makes the node answer the streaming
//! `AppendStream` call with `UNIMPLEMENTED`, as a node of a version without
//! it would; its peers then replicate to it with unary calls.
//!
//! Left out: read faults, torn writes, a slow fsync of the node's own
//! appends as a leader (see the chaos harness for process-level faults).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::{GroupId, NodeId};

/// The environment variable read once when a group's log store opens.
pub const FAULT_ENV: &str = "WHARF_FAULT_FAIL_GROUP";

/// Fails appends once `after` have been counted.
#[derive(Clone, Debug)]
pub(crate) struct AppendFault {
    after: u64,
    appends: Arc<AtomicU64>,
}

impl AppendFault {
    /// The fault configured for this node's replica of `group`, if any.
    pub(crate) fn from_env(node: NodeId, group: GroupId) -> Option<AppendFault> {
        let spec = std::env::var(FAULT_ENV).ok()?;
        let mut parts = spec.split(':').map(|p| p.trim().parse::<u64>());
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(n)), Some(Ok(g)), Some(Ok(after))) if n == node && g == group => {
                tracing::warn!(
                    group,
                    after,
                    "storage fault armed for this group ({FAULT_ENV})"
                );
                Some(AppendFault {
                    after,
                    appends: Arc::new(AtomicU64::new(0)),
                })
            }
            _ => None,
        }
    }

    /// Counts one append; answers whether it must fail.
    pub(crate) fn hit(&self) -> bool {
        self.appends.fetch_add(1, Ordering::Relaxed) + 1 >= self.after
    }
}

/// The environment variable of the slow-follower fault, read once when the
/// node opens.
pub const SLOW_APPEND_ENV: &str = "WHARF_FAULT_SLOW_APPEND_MS";

/// The answer delay configured by [`SLOW_APPEND_ENV`], if any (unset, 0 or
/// not a number: none).
pub(crate) fn slow_append_from_env() -> Option<Duration> {
    let ms: u64 = std::env::var(SLOW_APPEND_ENV).ok()?.trim().parse().ok()?;
    if ms == 0 {
        return None;
    }
    tracing::warn!(
        delay_ms = ms,
        "slow-follower fault armed: AppendEntries with entries are answered late ({SLOW_APPEND_ENV})"
    );
    Some(Duration::from_millis(ms))
}

/// The environment variable of the no-append-stream fault, read once when
/// the node opens.
pub const NO_APPEND_STREAM_ENV: &str = "WHARF_FAULT_NO_APPEND_STREAM";

/// Whether [`NO_APPEND_STREAM_ENV`] is set to 1.
pub(crate) fn no_append_stream_from_env() -> bool {
    let on = std::env::var(NO_APPEND_STREAM_ENV).is_ok_and(|v| v.trim() == "1");
    if on {
        tracing::warn!("AppendStream refused as by an older node ({NO_APPEND_STREAM_ENV})");
    }
    on
}
