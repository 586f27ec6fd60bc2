//! A map whose keys arrive in ascending order, kept in a deque.
//!
//! The consumer's per-message structures (`pending_set`,
//! `redelivery_schedule`, `consumer_seq_index`) get most of their keys in
//! order: stream seqs and consumer seqs only grow, and first deliveries'
//! due times do not go down between config changes. A key that sorts last
//! is pushed at the back; a lookup is a binary search; a removed key's slot
//! is emptied in place. Empty slots leave from either end, or all at once
//! when they outnumber the full ones by more than [`EMPTY_SLACK`]. So the
//! deque reuses its memory and an in-order insert does not allocate, where
//! a B-tree makes a node about every sixth key inserted in order.
//!
//! The price: a compaction or a shrink copies the whole deque in one
//! removal (amortised over the removals before it, but about 48 MB for a
//! million pending messages, milliseconds on the apply path); a B-tree's
//! worst case is logarithmic.
//!
//! Invariants:
//! - keys ascend strictly, empty slots included; the first and last slots,
//!   if any, are full;
//! - there are at most twice as many slots as full ones, plus
//!   [`EMPTY_SLACK`]; the capacity is at most four times the slots, plus
//!   [`KEPT_CAPACITY`], so a burst's memory is given back.
//!
//! Left out: a cheap place for keys that do not sort last. `insert` shifts
//! the keys above one (linear), so callers that expect such keys keep them
//! in a B-tree instead (`pending_set`, `redelivery_schedule`).

use std::collections::{vec_deque, VecDeque};

/// Empty slots tolerated beyond the full count before a compaction, so a
/// small deque is not compacted on every removal.
const EMPTY_SLACK: usize = 64;
/// Capacity always kept, however few slots are in use (slots; a few KiB
/// per consumer).
const KEPT_CAPACITY: usize = 64;

/// Keys in ascending order with their values; see the module doc.
#[derive(Debug, Clone)]
pub(crate) struct SortedDeque<K, V> {
    slots: VecDeque<(K, Option<V>)>,
    /// Slots holding a value.
    full: usize,
}

impl<K, V> Default for SortedDeque<K, V> {
    fn default() -> Self {
        SortedDeque {
            slots: VecDeque::new(),
            full: 0,
        }
    }
}

/// The deque's entries in ascending key order, with their number known up
/// front (serializers want it).
pub(crate) struct Iter<'a, K, V> {
    slots: vec_deque::Iter<'a, (K, Option<V>)>,
    left: usize,
}

impl<'a, K: Copy, V> Iterator for Iter<'a, K, V> {
    type Item = (K, &'a V);

    fn next(&mut self) -> Option<(K, &'a V)> {
        let next = self
            .slots
            .by_ref()
            .find_map(|slot| slot.1.as_ref().map(|v| (slot.0, v)));
        self.left = self.left.saturating_sub(1);
        next
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<K: Copy, V> ExactSizeIterator for Iter<'_, K, V> {}

impl<K: Ord + Copy, V> SortedDeque<K, V> {
    /// Whether `key` sorts after every key held, empty slots included.
    pub(crate) fn sorts_last(&self, key: &K) -> bool {
        self.slots.back().is_none_or(|s| s.0 < *key)
    }

    /// Adds `key` at the back; [`Self::sorts_last`] holds for it.
    pub(crate) fn push_back(&mut self, key: K, value: V) {
        debug_assert!(self.sorts_last(&key));
        self.slots.push_back((key, Some(value)));
        self.full += 1;
    }

    fn index(&self, key: &K) -> Option<usize> {
        self.slots.binary_search_by(|s| s.0.cmp(key)).ok()
    }

    /// The value at `key`, if held.
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        let i = self.index(key)?;
        self.slots.get(i).and_then(|s| s.1.as_ref())
    }

    /// The value at `key`, if held, to change.
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        let i = self.index(key)?;
        self.slots.get_mut(i).and_then(|s| s.1.as_mut())
    }

    /// Adds `key` where it sorts: at the back when it sorts last (the case
    /// this is for), in its slot when the deque still has one, otherwise by
    /// shifting the keys above it (linear; for input that breaks the
    /// caller's ordering, so that it stays correct).
    pub(crate) fn insert(&mut self, key: K, value: V) {
        if self.sorts_last(&key) {
            self.push_back(key, value);
        } else if let Err(value) = self.fill(&key, value) {
            let at = self.slots.partition_point(|s| s.0 < key);
            self.slots.insert(at, (key, Some(value)));
            self.full += 1;
        }
    }

    /// Puts `value` in `key`'s slot, full or emptied, if the deque still has
    /// one; otherwise hands `value` back.
    pub(crate) fn fill(&mut self, key: &K, value: V) -> Result<(), V> {
        let Some(slot) = self.index(key).and_then(|i| self.slots.get_mut(i)) else {
            return Err(value);
        };
        if slot.1.replace(value).is_none() {
            self.full += 1;
        }
        Ok(())
    }

    /// Takes the value at `key` out, if held.
    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        let i = self.index(key)?;
        let taken = self.slots.get_mut(i).and_then(|s| s.1.take())?;
        self.full -= 1;
        self.trim();
        Some(taken)
    }

    fn trim(&mut self) {
        while self.slots.front().is_some_and(|s| s.1.is_none()) {
            self.slots.pop_front();
        }
        while self.slots.back().is_some_and(|s| s.1.is_none()) {
            self.slots.pop_back();
        }
        if self.slots.len() > self.full.saturating_mul(2) + EMPTY_SLACK {
            self.slots.retain(|s| s.1.is_some());
        }
        let len = self.slots.len();
        if self.slots.capacity() > len.saturating_mul(4) + KEPT_CAPACITY {
            self.slots.shrink_to(len.saturating_mul(2) + KEPT_CAPACITY);
        }
    }

    /// How many keys hold a value.
    pub(crate) fn len(&self) -> usize {
        self.full
    }

    /// The lowest key.
    pub(crate) fn first_key(&self) -> Option<K> {
        self.slots.front().map(|s| s.0)
    }

    /// Keys and values, ascending.
    pub(crate) fn iter(&self) -> Iter<'_, K, V> {
        Iter {
            slots: self.slots.iter(),
            left: self.full,
        }
    }

    /// Slots held, empty ones included.
    #[cfg(test)]
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// The deque's capacity.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.capacity()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    proptest::proptest! {
        /// Ascending pushes, fills and removes of held and missing keys
        /// read back as a `BTreeMap` given the same operations does, and
        /// the deque stays within its bounds.
        #[test]
        fn behaves_as_a_btree_map(ops in proptest::collection::vec((0u8..4, 0usize..64), 0..600)) {
            let mut deque = SortedDeque::default();
            let mut map = BTreeMap::new();
            let mut next = 0u64;
            for (i, (op, pick)) in ops.into_iter().enumerate() {
                let held = map.keys().nth(pick % map.len().max(1)).copied();
                match (op, held) {
                    (0 | 1, _) | (_, None) => {
                        next += 1 + pick as u64 % 3;
                        deque.push_back(next, i);
                        map.insert(next, i);
                    }
                    (2, Some(key)) => {
                        assert_eq!(deque.remove(&key), map.remove(&key));
                        assert_eq!(deque.remove(&key), None);
                    }
                    (_, Some(key)) => {
                        assert!(deque.fill(&key, i).is_ok());
                        map.insert(key, i);
                    }
                }
                assert_eq!(deque.len(), map.len());
                assert_eq!(deque.first_key(), map.keys().next().copied());
                assert!(deque.iter().eq(map.iter().map(|(k, v)| (*k, v))));
                assert!(deque.slots() <= 2 * deque.len() + EMPTY_SLACK);
            }
        }
    }

    #[test]
    fn an_emptied_slot_is_filled_in_place_and_a_trimmed_one_is_not() {
        let mut deque = SortedDeque::default();
        for key in 1..=3 {
            deque.push_back(key, key);
        }
        assert_eq!(deque.remove(&2), Some(2));
        assert_eq!(deque.get(&2), None);
        assert!(deque.fill(&2, 20).is_ok());
        assert_eq!(deque.get(&2), Some(&20));
        assert_eq!(deque.remove(&1), Some(1));
        assert_eq!(deque.fill(&1, 10), Err(10), "trimmed from the front");
        assert_eq!(deque.remove(&3), Some(3));
        assert!(deque.sorts_last(&3), "trimmed from the back");
        assert_eq!((deque.len(), deque.slots()), (1, 1));
    }

    #[test]
    fn interior_removals_are_compacted_away() {
        let mut deque = SortedDeque::default();
        for key in 0..300u64 {
            deque.push_back(key, key);
        }
        for key in 1..=200u64 {
            assert_eq!(deque.remove(&key), Some(key));
        }
        let held: Vec<u64> = (0..1).chain(201..300).collect();
        assert!(deque.slots() < 300, "compacted");
        assert!(deque.slots() <= 2 * deque.len() + EMPTY_SLACK);
        assert_eq!(deque.len(), held.len());
        assert!(deque.iter().map(|(k, _)| k).eq(held.iter().copied()));
        assert_eq!(deque.first_key(), Some(0));
        assert_eq!(deque.get(&250), Some(&250));
        assert_eq!(deque.get(&100), None);
        assert_eq!(deque.fill(&5, 5), Err(5), "its slot was compacted away");
    }

    #[test]
    fn a_key_that_does_not_sort_last_still_goes_where_it_sorts() {
        let mut deque = SortedDeque::default();
        for key in [10u64, 20, 30] {
            deque.insert(key, key);
        }
        deque.remove(&20);
        deque.insert(20, 21); // its emptied slot
        deque.insert(15, 15); // shifted in
        deque.insert(5, 5);
        let all: Vec<(u64, u64)> = deque.iter().map(|(k, v)| (k, *v)).collect();
        assert_eq!(all, [(5, 5), (10, 10), (15, 15), (20, 21), (30, 30)]);
        assert_eq!((deque.len(), deque.first_key()), (5, Some(5)));
    }

    #[test]
    fn a_burst_gives_its_memory_back() {
        let mut deque = SortedDeque::default();
        for key in 0..100_000u64 {
            deque.push_back(key, ());
        }
        for key in 0..100_000u64 {
            deque.remove(&key);
        }
        assert_eq!(deque.len(), 0);
        assert!(
            deque.capacity() <= KEPT_CAPACITY * 2,
            "{}",
            deque.capacity()
        );
    }
}
