//! The duplicate window: message ids a stream has stored recently.
//!
//! A publish may carry a message id. While the id is inside the stream's
//! duplicate window, a second publish with it is answered with the original
//! sequence and stores nothing. The window is part of the replicated stream
//! index, so it survives leader changes and snapshots.
//!
//! Invariants:
//! - `ids` and `order` hold the same set of ids, each once;
//! - `order` is sorted by time (entries are recorded with the stream's
//!   non-decreasing publish time), so pruning stops at the first young entry;
//! - time is an argument (the leader-stamped `now_ms` of the command): the
//!   same calls give the same window on every replica.
//!
//! Left out: a bound on the number of ids other than the window itself
//! (NATS has none either), and the `Nats-Expected-*` optimistic-concurrency
//! checks.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

/// Recently seen message ids, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DedupWindow {
    /// id -> the sequence it was stored at.
    ids: BTreeMap<String, u64>,
    /// (recorded at, id), in recording order.
    order: VecDeque<(i64, String)>,
}

impl DedupWindow {
    /// Forgets ids recorded at or before `now_ms - window_ms`.
    pub fn prune(&mut self, now_ms: i64, window_ms: u64) {
        let window_ms = i64::try_from(window_ms).unwrap_or(i64::MAX);
        while let Some((at_ms, _)) = self.order.front() {
            if at_ms.saturating_add(window_ms) > now_ms {
                break;
            }
            if let Some((_, id)) = self.order.pop_front() {
                self.ids.remove(&id);
            }
        }
    }

    /// The sequence stored under `id`, if it is still remembered (call
    /// [`Self::prune`] first).
    pub fn get(&self, id: &str) -> Option<u64> {
        self.ids.get(id).copied()
    }

    /// Remembers `id` as stored at `seq` at time `at_ms` (not below the
    /// previous record's time). An id already present keeps its first record.
    pub fn record(&mut self, id: &str, seq: u64, at_ms: i64) {
        if self.ids.contains_key(id) {
            return;
        }
        let at_ms = self
            .order
            .back()
            .map_or(at_ms, |(last, _)| at_ms.max(*last));
        self.ids.insert(id.to_string(), seq);
        self.order.push_back((at_ms, id.to_string()));
    }

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Is the window empty?
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// When the oldest remembered id was recorded.
    pub fn oldest_ms(&self) -> Option<i64> {
        self.order.front().map(|(at, _)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_the_window_passes() {
        let mut w = DedupWindow::default();
        w.record("a", 1, 1_000);
        w.record("b", 2, 1_500);
        w.prune(1_999, 1_000);
        assert_eq!((w.get("a"), w.get("b")), (Some(1), Some(2)));
        w.prune(2_000, 1_000);
        assert_eq!((w.get("a"), w.get("b")), (None, Some(2)));
        w.prune(2_500, 1_000);
        assert!(w.is_empty());
        assert_eq!(w.oldest_ms(), None);
    }

    #[test]
    fn first_record_wins_and_time_never_goes_back() {
        let mut w = DedupWindow::default();
        w.record("a", 1, 1_000);
        w.record("a", 7, 5_000);
        assert_eq!(w.get("a"), Some(1));
        // A clock behind the previous record is clamped up to it.
        w.record("b", 2, 500);
        assert_eq!(w.len(), 2);
        w.prune(1_999, 1_000);
        assert_eq!(w.len(), 2);
        w.prune(2_000, 1_000);
        assert!(w.is_empty());
    }
}
