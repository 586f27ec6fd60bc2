//! Two ascending runs read as one, for the consumer's structures that keep
//! what arrived in order apart from what did not (`pending_set`,
//! `redelivery_schedule`).
//!
//! Invariant: when both runs ascend by `before` and share no item, the
//! merge ascends and yields each item once. Its length is given up front
//! (serializers want it), so the caller passes the runs' total.

use std::iter::Peekable;

/// The merge of runs `A` and `B`.
pub(crate) struct Merged<A: Iterator, B: Iterator<Item = A::Item>> {
    /// Items not yet read.
    left: usize,
    a: Peekable<A>,
    b: Peekable<B>,
    /// Whether the first item sorts before the second.
    before: fn(&A::Item, &A::Item) -> bool,
}

impl<A: Iterator, B: Iterator<Item = A::Item>> Merged<A, B> {
    /// Merges `a` and `b`, `len` items in all, ordered by `before`.
    pub(crate) fn new(a: A, b: B, len: usize, before: fn(&A::Item, &A::Item) -> bool) -> Self {
        Merged {
            left: len,
            a: a.peekable(),
            b: b.peekable(),
            before,
        }
    }
}

impl<A: Iterator, B: Iterator<Item = A::Item>> Iterator for Merged<A, B> {
    type Item = A::Item;

    fn next(&mut self) -> Option<A::Item> {
        let next = match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if (self.before)(y, x) => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        };
        self.left = self.left.saturating_sub(1);
        next
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<A: Iterator, B: Iterator<Item = A::Item>> ExactSizeIterator for Merged<A, B> {}
