//! Which pending message has the lowest consumer seq: the consumer-seq half
//! of the ack floor.
//!
//! Consumer seqs are handed out in increasing order, so every delivery's
//! entry goes to the back of a [`SortedDeque`] (consumer seq -> stream
//! seq), which reuses its memory; a message that leaves `pending`, or is
//! delivered again under a new consumer seq, has its old entry removed by
//! binary search.
//!
//! Invariant: it holds exactly one entry per pending message, its latest
//! delivery's.
//!
//! Serialized as its entries in order, as the `BTreeMap<u64, u64>` this
//! replaces was (byte for byte under bincode), so either build reads the
//! other's snapshots.
//!
//! Left out: the stream-seq half of the floor, which is `pending`'s lowest
//! seq.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer};

use super::sorted_deque::SortedDeque;

/// Consumer seq of each pending message's latest delivery -> its stream seq.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "BTreeMap<u64, u64>")]
pub(crate) struct ConsumerSeqIndex {
    entries: SortedDeque<u64, u64>,
}

impl ConsumerSeqIndex {
    /// Records a delivery. Its `consumer_seq` is above every one recorded
    /// before (they are handed out in order), which keeps this at the
    /// deque's back; a state that breaks that still indexes correctly, only
    /// slower.
    pub(crate) fn push(&mut self, consumer_seq: u64, stream_seq: u64) {
        self.entries.insert(consumer_seq, stream_seq);
    }

    /// Forgets the delivery with `consumer_seq`.
    pub(crate) fn remove(&mut self, consumer_seq: u64) {
        self.entries.remove(&consumer_seq);
    }

    /// The lowest consumer seq held.
    pub(crate) fn first(&self) -> Option<u64> {
        self.entries.first_key()
    }
}

impl PartialEq for ConsumerSeqIndex {
    fn eq(&self, other: &Self) -> bool {
        self.entries.iter().eq(other.entries.iter())
    }
}

impl Eq for ConsumerSeqIndex {}

impl Serialize for ConsumerSeqIndex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.entries.iter())
    }
}

impl From<BTreeMap<u64, u64>> for ConsumerSeqIndex {
    fn from(map: BTreeMap<u64, u64>) -> Self {
        let mut index = ConsumerSeqIndex::default();
        for (consumer_seq, stream_seq) in map {
            index.push(consumer_seq, stream_seq);
        }
        index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_front_is_the_lowest_consumer_seq_held() {
        let mut index = ConsumerSeqIndex::default();
        for (c, s) in [(1, 10), (2, 11), (3, 12)] {
            index.push(c, s);
        }
        // 10 acked, 11 redelivered as consumer seq 4.
        index.remove(1);
        index.remove(2);
        index.push(4, 11);
        assert_eq!(index.first(), Some(3));
        index.remove(3);
        assert_eq!(index.first(), Some(4));
        index.remove(4);
        assert_eq!(index.first(), None);
    }

    #[test]
    fn serializes_as_the_map_it_replaced() {
        let mut index = ConsumerSeqIndex::default();
        for (c, s) in [(1, 10), (2, 12), (3, 11)] {
            index.push(c, s);
        }
        index.remove(2);
        let map: BTreeMap<u64, u64> = [(1, 10), (3, 11)].into_iter().collect();
        let bytes = bincode::serialize(&index).unwrap();
        assert_eq!(bytes, bincode::serialize(&map).unwrap());
        let back: ConsumerSeqIndex = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, index);
    }
}
