//! The redelivery schedule: pending messages ordered by when they may be
//! redelivered, then by stream seq.
//!
//! First deliveries arrive in order: delivery times never go back, a first
//! delivery waits AckWait (or BackOff's first step) from it, which changes
//! only with the config (and then every entry is retimed), and new stream
//! seqs only grow. Their entries go to the back of a [`SortedDeque`], which
//! reuses its memory; one that does not sort last there (after AckWait was
//! shortened) goes to the B-tree. Every other entry (a redelivery, a nak, work in
//! progress, a retime after a config change, a restored snapshot) goes to a
//! B-tree, so an entry due far ahead, such as a nak of an hour, never sits
//! at the deque's back and sends the first deliveries after it to the
//! B-tree too. Reading the schedule merges the two.
//!
//! Invariant: each (due time, stream seq) is in at most one of the two
//! parts.
//!
//! Two schedules are equal, and serialize, as their entries in order (as the
//! `BTreeSet<(i64, u64)>` this replaces did, byte for byte under bincode),
//! so how a replica's entries are split does not show.
//!
//! Left out: which entries are due; the consumer reads them in order and
//! stops at its clock.

use std::collections::{btree_set, BTreeSet};
use std::iter::{Copied, Map};

use serde::{Deserialize, Serialize, Serializer};

use super::merged::Merged;
use super::sorted_deque::{self, SortedDeque};

/// (due time in ms, stream seq) of every pending message.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(from = "BTreeSet<(i64, u64)>")]
pub(crate) struct RedeliverySchedule {
    first_deliveries: SortedDeque<(i64, u64), ()>,
    others: BTreeSet<(i64, u64)>,
}

impl RedeliverySchedule {
    /// Adds a first delivery of `seq`, due at `at_ms`. Like a set, adding
    /// an entry held already changes nothing.
    pub(crate) fn insert_first_delivery(&mut self, at_ms: i64, seq: u64) {
        let key = (at_ms, seq);
        if self.contains(&key) {
            return;
        }
        if self.first_deliveries.sorts_last(&key) {
            self.first_deliveries.push_back(key, ());
        } else {
            self.others.insert(key);
        }
    }

    /// Adds any other entry for `seq`, due at `at_ms`. Like a set, adding
    /// an entry held already changes nothing.
    pub(crate) fn insert(&mut self, at_ms: i64, seq: u64) {
        let key = (at_ms, seq);
        if !self.contains(&key) {
            self.others.insert(key);
        }
    }

    fn contains(&self, key: &(i64, u64)) -> bool {
        self.first_deliveries.get(key).is_some() || self.others.contains(key)
    }

    /// Removes `seq`, due at `at_ms`; returns whether it was there.
    pub(crate) fn remove(&mut self, at_ms: i64, seq: u64) -> bool {
        let key = (at_ms, seq);
        self.first_deliveries.remove(&key).is_some() || self.others.remove(&key)
    }

    /// Entries, earliest first.
    pub(crate) fn iter(&self) -> Iter<'_> {
        Merged::new(
            self.first_deliveries.iter().map(key as Key),
            self.others.iter().copied(),
            self.first_deliveries.len() + self.others.len(),
            |x, y| x < y,
        )
    }

    /// The earliest entry.
    pub(crate) fn first(&self) -> Option<(i64, u64)> {
        let front = self.first_deliveries.first_key();
        match (front, self.others.first().copied()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }
}

type Key = for<'a> fn(((i64, u64), &'a ())) -> (i64, u64);

fn key((k, _): ((i64, u64), &())) -> (i64, u64) {
    k
}

/// The two parts' entries read as one ascending run.
pub(crate) type Iter<'a> = Merged<
    Map<sorted_deque::Iter<'a, (i64, u64), ()>, Key>,
    Copied<btree_set::Iter<'a, (i64, u64)>>,
>;

impl PartialEq for RedeliverySchedule {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for RedeliverySchedule {}

impl From<BTreeSet<(i64, u64)>> for RedeliverySchedule {
    fn from(others: BTreeSet<(i64, u64)>) -> Self {
        RedeliverySchedule {
            first_deliveries: SortedDeque::default(),
            others,
        }
    }
}

impl Serialize for RedeliverySchedule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(s: &RedeliverySchedule) -> Vec<(i64, u64)> {
        s.iter().collect()
    }

    proptest::proptest! {
        /// First deliveries (mostly in order), other entries anywhere, and
        /// removes of held and missing entries read back as a `BTreeSet`
        /// given the same operations does.
        #[test]
        fn behaves_as_a_btree_set(ops in proptest::collection::vec((0u8..5, 0i64..32, 0usize..64), 0..400)) {
            let mut s = RedeliverySchedule::default();
            let mut set = BTreeSet::new();
            let (mut at, mut seq) = (0, 0);
            for (op, dt, pick) in ops {
                let held = set.iter().nth(pick % set.len().max(1)).copied();
                match (op, held) {
                    (0 | 1, _) | (_, None) => {
                        at += dt % 3;
                        seq += 1;
                        s.insert_first_delivery(at, seq);
                        set.insert((at, seq));
                    }
                    (2, Some(key)) => {
                        assert!(s.remove(key.0, key.1) && set.remove(&key));
                        assert!(!s.remove(key.0, key.1));
                    }
                    (3, Some(key)) => {
                        // A nak or work in progress: the entry moves.
                        assert!(s.remove(key.0, key.1) && set.remove(&key));
                        s.insert(key.0 + dt - 16, key.1);
                        set.insert((key.0 + dt - 16, key.1));
                    }
                    (_, Some(key)) => {
                        // A first delivery out of order (after a retime).
                        let key = (key.0 - 1, seq + 1);
                        seq += 1;
                        s.insert_first_delivery(key.0, key.1);
                        set.insert(key);
                    }
                }
                assert_eq!(s.first(), set.first().copied());
                assert!(s.iter().eq(set.iter().copied()));
                assert_eq!(s.iter().len(), set.len());
            }
        }
    }

    #[test]
    fn first_deliveries_and_others_merge_into_one_order() {
        let mut s = RedeliverySchedule::default();
        for (at, seq) in [(100, 1), (100, 2), (200, 3), (300, 5)] {
            s.insert_first_delivery(at, seq);
        }
        // A redelivery of 4 and a first delivery that does not sort last.
        s.insert(150, 4);
        s.insert_first_delivery(100, 0);
        assert_eq!(
            entries(&s),
            [(100, 0), (100, 1), (100, 2), (150, 4), (200, 3), (300, 5)]
        );
        assert_eq!(s.first(), Some((100, 0)));
        assert!(s.remove(100, 0));
        assert!(s.remove(100, 1));
        assert!(!s.remove(100, 1), "removed twice");
        assert_eq!(s.first(), Some((100, 2)));
        assert!(s.remove(200, 3));
        assert_eq!(entries(&s), [(100, 2), (150, 4), (300, 5)]);
    }

    #[test]
    fn adding_an_entry_held_already_changes_nothing() {
        let mut s = RedeliverySchedule::default();
        s.insert_first_delivery(100, 1);
        s.insert_first_delivery(200, 2);
        s.insert_first_delivery(100, 1);
        s.insert(100, 1);
        s.insert(50, 3);
        s.insert_first_delivery(50, 3);
        assert_eq!(entries(&s), [(50, 3), (100, 1), (200, 2)]);
        assert_eq!(s.iter().len(), 3);
        assert!(s.remove(100, 1));
        assert!(s.remove(50, 3));
        assert_eq!(entries(&s), [(200, 2)]);
    }

    #[test]
    fn a_long_nak_does_not_push_later_first_deliveries_out_of_the_deque() {
        let mut s = RedeliverySchedule::default();
        s.insert_first_delivery(100, 1);
        assert!(s.remove(100, 1));
        s.insert(3_600_000, 1);
        for seq in 2..=100 {
            s.insert_first_delivery(100 + seq as i64, seq);
        }
        assert_eq!(s.first_deliveries.len(), 99);
        assert_eq!(s.others.len(), 1);
        assert_eq!(entries(&s).last(), Some(&(3_600_000, 1)));
    }

    #[test]
    fn equal_and_serialized_as_the_set_of_its_entries() {
        let mut split = RedeliverySchedule::default();
        split.insert_first_delivery(200, 2);
        split.insert(100, 1);
        let set: BTreeSet<(i64, u64)> = [(100, 1), (200, 2)].into_iter().collect();
        let bytes = bincode::serialize(&split).unwrap();
        assert_eq!(bytes, bincode::serialize(&set).unwrap());
        let back: RedeliverySchedule = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, split);
        assert_eq!(back.first_deliveries.len(), 0, "restored into the B-tree");
    }
}
