//! The pending messages of a consumer, by stream seq.
//!
//! First deliveries take stream seqs above every one delivered before, so
//! nearly every message enters at the back of a [`SortedDeque`], which
//! reuses its memory; a message that would not sort last there goes to a
//! B-tree instead, and reading the set merges the two. That happens after a
//! snapshot restore (the restored messages all go to the B-tree, so new
//! deliveries start an empty deque) and for a last-per-subject backlog seq
//! delivered after higher ones (an earlier plan failed), which is rare.
//!
//! Invariants: a stream seq is in at most one of the two parts; a message
//! whose deque slot was emptied and which becomes pending again is put back
//! in that slot while the deque still has it.
//!
//! Two sets are equal, and serialize, as their messages in order (as the
//! `BTreeMap<u64, Pending>` this replaces did, byte for byte under bincode),
//! so how a replica's messages are split does not show.
//!
//! Left out: what a pending message means; that is the consumer's.

use std::collections::{btree_map, BTreeMap};
use std::iter::Map;

use serde::{Deserialize, Serialize, Serializer};

use super::merged::Merged;
use super::sorted_deque::{self, SortedDeque};
use crate::consumer::Pending;

/// Pending messages by stream seq.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "BTreeMap<u64, Pending>")]
pub(crate) struct PendingSet {
    in_order: SortedDeque<u64, Pending>,
    others: BTreeMap<u64, Pending>,
}

impl PendingSet {
    /// The message at `seq`, if pending.
    pub(crate) fn get(&self, seq: u64) -> Option<&Pending> {
        self.in_order.get(&seq).or_else(|| self.others.get(&seq))
    }

    /// The message at `seq`, if pending, to change.
    pub(crate) fn get_mut(&mut self, seq: u64) -> Option<&mut Pending> {
        match self.in_order.get_mut(&seq) {
            Some(p) => Some(p),
            None => self.others.get_mut(&seq),
        }
    }

    /// Whether `seq` is pending.
    pub(crate) fn contains(&self, seq: u64) -> bool {
        self.get(seq).is_some()
    }

    /// Makes `p` the pending message at `seq`, replacing any.
    pub(crate) fn insert(&mut self, seq: u64, p: Pending) {
        let Err(p) = self.in_order.fill(&seq, p) else {
            return;
        };
        if !self.others.contains_key(&seq) && self.in_order.sorts_last(&seq) {
            self.in_order.push_back(seq, p);
        } else {
            self.others.insert(seq, p);
        }
    }

    /// Takes the message at `seq` out, if pending.
    pub(crate) fn remove(&mut self, seq: u64) -> Option<Pending> {
        self.in_order
            .remove(&seq)
            .or_else(|| self.others.remove(&seq))
    }

    /// How many messages are pending.
    pub(crate) fn len(&self) -> usize {
        self.in_order.len() + self.others.len()
    }

    /// The lowest pending stream seq.
    pub(crate) fn first_seq(&self) -> Option<u64> {
        let front = self.in_order.first_key();
        match (front, self.others.keys().next().copied()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Pending messages, ascending by stream seq.
    pub(crate) fn iter(&self) -> Iter<'_> {
        Merged::new(
            self.in_order.iter(),
            self.others.iter().map(entry as Entry),
            self.len(),
            seq_before,
        )
    }
}

type Entry = for<'a> fn((&'a u64, &'a Pending)) -> (u64, &'a Pending);

fn entry<'a>((seq, p): (&'a u64, &'a Pending)) -> (u64, &'a Pending) {
    (*seq, p)
}

/// The two parts' messages read as one ascending run.
pub(crate) type Iter<'a> =
    Merged<sorted_deque::Iter<'a, u64, Pending>, Map<btree_map::Iter<'a, u64, Pending>, Entry>>;

fn seq_before(x: &(u64, &Pending), y: &(u64, &Pending)) -> bool {
    x.0 < y.0
}

impl PartialEq for PendingSet {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for PendingSet {}

impl Serialize for PendingSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl From<BTreeMap<u64, Pending>> for PendingSet {
    fn from(others: BTreeMap<u64, Pending>) -> Self {
        PendingSet {
            in_order: SortedDeque::default(),
            others,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(consumer_seq: u64) -> Pending {
        Pending {
            consumer_seq,
            deliveries: 1,
            delivered_ms: 0,
            redeliver_at_ms: 0,
        }
    }

    fn seqs(set: &PendingSet) -> Vec<u64> {
        set.iter().map(|(s, _)| s).collect()
    }

    proptest::proptest! {
        /// Any mix of inserts (mostly ascending, some below) and removes
        /// reads back as a `BTreeMap` given the same operations does.
        #[test]
        fn behaves_as_a_btree_map(ops in proptest::collection::vec((0u8..4, 0u64..64), 0..400)) {
            let mut set = PendingSet::default();
            let mut map = BTreeMap::new();
            let mut next = 0;
            for (i, (op, n)) in ops.into_iter().enumerate() {
                let seq = match op {
                    0 | 1 => { next += 1 + n % 3; next }
                    _ => n,
                };
                if op == 3 {
                    assert_eq!(set.remove(seq), map.remove(&seq));
                } else {
                    set.insert(seq, p(i as u64));
                    map.insert(seq, p(i as u64));
                }
                assert_eq!(set.get(seq), map.get(&seq));
                assert_eq!(set.len(), map.len());
                assert_eq!(set.first_seq(), map.keys().next().copied());
                assert!(set.iter().eq(map.iter().map(|(s, p)| (*s, p))));
                assert_eq!(set.iter().len(), map.len());
            }
        }
    }

    #[test]
    fn out_of_order_seqs_merge_into_one_order() {
        let mut set = PendingSet::default();
        for seq in [10, 11, 12, 3, 13, 5] {
            set.insert(seq, p(seq));
        }
        assert_eq!(seqs(&set), [3, 5, 10, 11, 12, 13]);
        assert_eq!((set.len(), set.first_seq()), (6, Some(3)));
        assert_eq!(set.remove(3), Some(p(3)));
        assert_eq!(set.remove(10), Some(p(10)));
        assert_eq!(set.remove(10), None, "removed twice");
        assert_eq!(set.first_seq(), Some(5));
        assert!(!set.contains(10) && set.contains(11));
        set.insert(11, p(99));
        assert_eq!(set.get(11).map(|p| p.consumer_seq), Some(99));
        assert_eq!((seqs(&set), set.len()), (vec![5, 11, 12, 13], 4));
    }

    #[test]
    fn an_emptied_slot_taken_again_is_filled_in_place() {
        let mut set = PendingSet::default();
        for seq in 1..=3 {
            set.insert(seq, p(seq));
        }
        set.remove(2);
        set.insert(2, p(7));
        assert_eq!((seqs(&set), set.len()), (vec![1, 2, 3], 3));
        assert!(set.others.is_empty(), "filled in place");
    }

    #[test]
    fn equal_and_serialized_as_the_map_of_its_messages() {
        let mut split = PendingSet::default();
        split.insert(20, p(1));
        split.insert(10, p(2));
        let map: BTreeMap<u64, Pending> = [(10, p(2)), (20, p(1))].into_iter().collect();
        let bytes = bincode::serialize(&split).unwrap();
        assert_eq!(bytes, bincode::serialize(&map).unwrap());
        let back: PendingSet = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, split);
        assert_eq!(back.in_order.len(), 0, "restored into the B-tree");
    }
}
