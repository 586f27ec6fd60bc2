//! Storage faults injected on purpose, for tests (never set in production).
//!
//! `WHARF_FAULT_FAIL_GROUP=<node>:<group>:<after>` makes node `<node>`'s log
//! store of group `<group>` fail every append from its `<after>`-th append
//! on, as a broken disk would. Unset (the normal case) it costs one `None`
//! check per append. openraft treats the error as fatal for that group only:
//! its Raft core stops, the group reports [`crate::Role::Failed`], and every
//! other group of the node goes on.
//!
//! `WHARF_FAULT_SLOW_APPEND_MS=<ms>` makes every log append of every group
//! of the process that has it in its environment report "flushed" `<ms>`
//! late, as a slow or overloaded disk would; a follower then answers each
//! AppendEntries that carries entries at least `<ms>` after it arrived. Set
//! it on one server process only (the test harness has per-node
//! environments). Votes and other flushes are not delayed.
//!
//! Left out: read faults, torn writes, slow votes (see the chaos harness for
//! process-level faults).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::storage::IOFlushed;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::flusher::Flusher;
use crate::types::io_err;
use crate::types::TypeConfig;
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

/// The environment variable of the slow-append fault, read once per group
/// when its log store opens.
pub const SLOW_APPEND_ENV: &str = "WHARF_FAULT_SLOW_APPEND_MS";

/// The delay configured by [`SLOW_APPEND_ENV`], if any (0 or garbage: none).
pub(crate) fn slow_append_from_env() -> Option<Duration> {
    let ms: u64 = std::env::var(SLOW_APPEND_ENV).ok()?.trim().parse().ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

/// Holds every log append's flush callback back by a fixed delay before it
/// goes to the group-commit flusher, as a disk that takes that long to make
/// a write durable would. The Raft core is not blocked (it goes on sending
/// heartbeats and answering votes); only the "appended and flushed"
/// notification, and therefore a follower's AppendEntries answer, is late.
///
/// One task per group, FIFO, so callbacks still complete in append order.
#[derive(Clone)]
pub(crate) struct SlowAppend {
    tx: mpsc::Sender<(Instant, IOFlushed<TypeConfig>)>,
    delay: Duration,
}

/// Appends held back at once per group; the appender waits beyond that.
const SLOW_APPEND_QUEUE: usize = 1024;

impl SlowAppend {
    /// Starts the delaying task of `group` on the current tokio runtime.
    pub(crate) fn spawn(group: GroupId, delay: Duration, flusher: Flusher) -> SlowAppend {
        tracing::warn!(
            group,
            delay_ms = delay.as_millis() as u64,
            "slow-append fault armed for this group ({SLOW_APPEND_ENV})"
        );
        let (tx, mut rx) = mpsc::channel::<(Instant, IOFlushed<TypeConfig>)>(SLOW_APPEND_QUEUE);
        tokio::spawn(async move {
            while let Some((due, callback)) = rx.recv().await {
                tokio::time::sleep_until(due).await;
                // On error the flusher has already failed the callback.
                let _ = flusher.submit_log(callback).await;
            }
        });
        SlowAppend { tx, delay }
    }

    /// Hands `callback` to the flusher `delay` from now.
    pub(crate) async fn submit(&self, callback: IOFlushed<TypeConfig>) -> io::Result<()> {
        let due = Instant::now() + self.delay;
        match self.tx.send((due, callback)).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError((_, callback))) => {
                callback.io_completed(Err(io_err("slow-append task stopped")));
                Err(io_err("slow-append task stopped"))
            }
        }
    }
}
