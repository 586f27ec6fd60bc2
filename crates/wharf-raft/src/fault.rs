//! A storage fault injected on purpose, for tests of per-group isolation.
//!
//! `WHARF_FAULT_FAIL_GROUP=<node>:<group>:<after>` makes node `<node>`'s log
//! store of group `<group>` fail every append from its `<after>`-th append
//! on, as a broken disk would. Unset (the normal case) it costs one `None`
//! check per append. openraft treats the error as fatal for that group only:
//! its Raft core stops, the group reports [`crate::Role::Failed`], and every
//! other group of the node goes on.
//!
//! Left out: read faults, latency, torn writes (see the chaos harness for
//! process-level faults).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
