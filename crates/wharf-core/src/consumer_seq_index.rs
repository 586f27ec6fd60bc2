//! Which pending message has the lowest consumer seq: the consumer-seq half
//! of the ack floor.
//!
//! Consumer seqs are handed out in increasing order, so every delivery is
//! pushed at the back of a deque that stays sorted. A message that leaves
//! `pending`, or is delivered again under a new consumer seq, is not searched
//! for: its entry goes stale, and stale entries are dropped once they reach
//! the front, or all at once when they outnumber the live ones. The deque
//! then reuses its memory, so a delivery allocates only when the index grows
//! past its largest size so far (a B-tree, which this replaces, makes a node
//! about every sixth key inserted in order).
//!
//! Invariants:
//! - entries ascend by consumer seq;
//! - an entry is live when `pending` holds its stream seq under its consumer
//!   seq; after [`ConsumerSeqIndex::settle`] the front entry, if any, is live;
//! - after `settle` there are at most twice as many entries as live ones,
//!   plus [`STALE_SLACK`].
//!
//! Serialized as its entries in order (bincode lays them out as it did the
//! `BTreeMap<u64, u64>` this replaces), stale ones included, so a replica
//! restored from a snapshot holds what the others hold.
//!
//! Left out: the stream-seq half of the floor, which is `pending`'s first key.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::consumer::Pending;

/// Stale entries tolerated beyond the live count before a compaction, so a
/// small index is not compacted on every ack.
const STALE_SLACK: usize = 64;

/// (consumer seq, stream seq) of deliveries, ascending by consumer seq.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct ConsumerSeqIndex {
    entries: VecDeque<(u64, u64)>,
}

fn is_live(entry: (u64, u64), pending: &BTreeMap<u64, Pending>) -> bool {
    let (consumer_seq, stream_seq) = entry;
    pending
        .get(&stream_seq)
        .is_some_and(|p| p.consumer_seq == consumer_seq)
}

impl ConsumerSeqIndex {
    /// Records a delivery; `consumer_seq` is above every one recorded before.
    pub(crate) fn push(&mut self, consumer_seq: u64, stream_seq: u64) {
        debug_assert!(self.entries.back().is_none_or(|&(c, _)| c < consumer_seq));
        self.entries.push_back((consumer_seq, stream_seq));
    }

    /// Drops stale entries from the front, and every stale one when they
    /// outnumber the live `pending`. Call after `pending` lost a message or
    /// a message took a new consumer seq.
    pub(crate) fn settle(&mut self, pending: &BTreeMap<u64, Pending>) {
        while let Some(&front) = self.entries.front() {
            if is_live(front, pending) {
                break;
            }
            self.entries.pop_front();
        }
        if self.entries.len() > pending.len().saturating_mul(2) + STALE_SLACK {
            self.entries.retain(|&e| is_live(e, pending));
        }
    }

    /// The lowest live consumer seq (after [`Self::settle`]).
    pub(crate) fn first(&self) -> Option<u64> {
        self.entries.front().map(|&(c, _)| c)
    }

    /// Entries held, stale ones included.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(entries: &[(u64, u64)]) -> BTreeMap<u64, Pending> {
        entries
            .iter()
            .map(|&(consumer_seq, stream_seq)| {
                let p = Pending {
                    consumer_seq,
                    deliveries: 1,
                    delivered_ms: 0,
                    redeliver_at_ms: 0,
                };
                (stream_seq, p)
            })
            .collect()
    }

    #[test]
    fn the_front_is_the_lowest_live_consumer_seq() {
        let mut index = ConsumerSeqIndex::default();
        for (c, s) in [(1, 10), (2, 11), (3, 12)] {
            index.push(c, s);
        }
        // 10 acked, 11 redelivered as consumer seq 4: both old entries stale.
        let live = pending(&[(3, 12), (4, 11)]);
        index.push(4, 11);
        index.settle(&live);
        assert_eq!(index.first(), Some(3));
        index.settle(&pending(&[(4, 11)]));
        assert_eq!(index.first(), Some(4));
        index.settle(&pending(&[]));
        assert_eq!(index.first(), None);
        assert_eq!(index.len(), 0);
    }

    #[test]
    fn stale_entries_behind_a_live_front_are_compacted_when_they_outnumber_it() {
        let mut index = ConsumerSeqIndex::default();
        // Consumer seq 1 stays pending while 2..=1000 are delivered and acked.
        let stuck = pending(&[(1, 1)]);
        index.push(1, 1);
        for c in 2..=1_000 {
            index.push(c, c);
            index.settle(&stuck);
            assert!(index.len() <= 2 + STALE_SLACK, "{} entries", index.len());
        }
        assert_eq!(index.first(), Some(1));
    }

    #[test]
    fn serializes_as_the_map_it_replaced() {
        let mut index = ConsumerSeqIndex::default();
        index.push(1, 10);
        index.push(2, 12);
        let map: BTreeMap<u64, u64> = [(1, 10), (2, 12)].into_iter().collect();
        let bytes = bincode::serialize(&index).unwrap();
        assert_eq!(bytes, bincode::serialize(&map).unwrap());
        let back: ConsumerSeqIndex = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, index);
    }
}
