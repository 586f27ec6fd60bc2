//! A stream's payloads in its sled tree, many messages to a value.
//!
//! Each applied `Publish` entry stores its new messages as a few *blocks*:
//! runs of consecutive sequences, at most `MAX_BLOCK_BYTES` of encoded
//! messages each, under the big-endian sequence of the block's first
//! message. One sled insert per block instead of one per message: under
//! pipelined publishing an entry carries hundreds of messages, and sled's
//! insert (tree descent, page fragment, allocation) was the largest single
//! cost of applying it on every replica (docs/benchmarks-history.md, "The
//! storage path", item 3).
//!
//! Invariants:
//! - Blocks never overlap: a block holds sequences `>=` its key and below
//!   the next block's key (sequences only grow, and a block is written once
//!   by the entry that stored its messages). So the block that may hold
//!   `seq` is the one with the greatest key `<= seq`: one reverse seek.
//! - Removing messages rewrites each block they are in once per applied
//!   entry, without them, under the same key; a block left empty is
//!   deleted.
//! - Everything is deterministic in the applied entries, so replaying the log
//!   rewrites the same keys with the same values (the state machine's
//!   replay after a restart relies on it).
//! - Blocks stay well under sled's blob threshold (about 128 KiB): a blob is
//!   a file of its own, created and fsynced per value.
//!
//! Left out: merging blocks that removals left small (a work queue's blocks
//! empty out and go, in order); reading one message decodes its whole block.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Result, ServerError};

/// Encoded messages in one block, at most (a single bigger message gets a
/// block of its own).
const MAX_BLOCK_BYTES: usize = 32 * 1024;
/// First byte of every block value: the layout's version.
const BLOCK_FORMAT_V1: u8 = 1;

/// A stored message as kept in the payload tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredMessage {
    pub subject: String,
    pub published_ms: i64,
    pub payload: bytes::Bytes,
    pub headers: Vec<(String, String)>,
}

/// One block: `(seq, message)` in sequence order.
type Block = Vec<(u64, StoredMessage)>;

fn key(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

fn encode(block: &Block) -> Result<Vec<u8>> {
    let mut out = vec![BLOCK_FORMAT_V1];
    bincode::serialize_into(&mut out, block)?;
    Ok(out)
}

fn decode(value: &[u8]) -> Result<Block> {
    match value.split_first() {
        Some((&BLOCK_FORMAT_V1, rest)) => Ok(bincode::deserialize(rest)?),
        _ => Err(ServerError::Internal(
            "payload block in an unknown format (a data dir from an earlier build?)".into(),
        )),
    }
}

fn seq_of_key(k: &[u8]) -> Result<u64> {
    let raw: [u8; 8] = k
        .try_into()
        .map_err(|_| ServerError::Internal("bad payload key".into()))?;
    Ok(u64::from_be_bytes(raw))
}

/// The block that may hold `seq`: the one with the greatest key `<= seq`.
fn block_for(tree: &sled::Tree, seq: u64) -> Result<Option<(u64, Block)>> {
    match tree.range(..=key(seq)).next_back() {
        Some(kv) => {
            let (k, v) = kv?;
            Ok(Some((seq_of_key(&k)?, decode(&v)?)))
        }
        None => Ok(None),
    }
}

/// Reads one message.
pub fn read(tree: &sled::Tree, seq: u64) -> Result<Option<StoredMessage>> {
    Ok(block_for(tree, seq)?.and_then(|(_, block)| {
        let i = block.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
        block.into_iter().nth(i).map(|(_, m)| m)
    }))
}

/// Reads many messages, each block once; `None` for those not stored.
pub fn read_many(tree: &sled::Tree, seqs: &[u64]) -> Result<BTreeMap<u64, StoredMessage>> {
    let mut wanted: Vec<u64> = seqs.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < wanted.len() {
        let Some((_, block)) = block_for(tree, wanted[i])? else {
            i += 1;
            continue;
        };
        let end = block.last().map_or(0, |(s, _)| *s);
        if end < wanted[i] {
            // In the gap after that block: not stored.
            i += 1;
            continue;
        }
        // Every wanted seq up to the block's last message is in it or gone.
        let mut msgs = block.into_iter().peekable();
        while i < wanted.len() && wanted[i] <= end {
            let seq = wanted[i];
            while msgs.next_if(|(s, _)| *s < seq).is_some() {}
            if let Some((_, m)) = msgs.next_if(|(s, _)| *s == seq) {
                out.insert(seq, m);
            }
            i += 1;
        }
    }
    Ok(out)
}

/// Every stored message up to `last_seq`, in order.
pub fn read_up_to(tree: &sled::Tree, last_seq: u64) -> Result<Vec<(u64, StoredMessage)>> {
    let mut out = Vec::new();
    for kv in tree.range(..=key(last_seq)) {
        let (_, v) = kv?;
        out.extend(decode(&v)?.into_iter().filter(|(s, _)| *s <= last_seq));
    }
    Ok(out)
}

/// Replaces the whole tree with `messages` (in sequence order), in blocks.
pub fn write_all(tree: &sled::Tree, messages: Vec<(u64, StoredMessage)>) -> Result<()> {
    tree.clear()?;
    let mut writes = PayloadWrites::default();
    for (seq, m) in messages {
        writes.insert(seq, m);
    }
    writes.apply(tree)
}

/// The payload inserts and removals of one applied entry.
///
/// Applied block by block, with no `sled::Batch`: sled 0.34 writes out its
/// current IO buffer before and after every batch, and each such write is an
/// `fdatasync` (`wharf_raft::sync_sled_write`), which cost two syncs of the
/// node's whole database per applied entry on every replica. Atomicity is
/// not needed here: after a crash the state machine is rebuilt from its
/// snapshot and the log after it, and replaying an entry rewrites the same
/// keys.
#[derive(Default)]
pub struct PayloadWrites {
    /// Messages this entry stores (and did not remove again itself).
    new: BTreeMap<u64, StoredMessage>,
    /// Earlier messages this entry removes.
    removed: Vec<u64>,
}

impl PayloadWrites {
    pub fn insert(&mut self, seq: u64, msg: StoredMessage) {
        self.new.insert(seq, msg);
    }

    pub fn remove(&mut self, seq: u64) {
        if self.new.remove(&seq).is_none() {
            self.removed.push(seq);
        }
    }

    pub fn apply(self, tree: &sled::Tree) -> Result<()> {
        self.apply_removals(tree)?;
        let mut block: Block = Vec::new();
        let mut bytes = 0usize;
        for (seq, msg) in self.new {
            let size = msg.payload.len() + msg.subject.len() + 64;
            if !block.is_empty() && bytes + size > MAX_BLOCK_BYTES {
                write_block(tree, std::mem::take(&mut block))?;
                bytes = 0;
            }
            bytes += size;
            block.push((seq, msg));
        }
        if !block.is_empty() {
            write_block(tree, block)?;
        }
        Ok(())
    }

    /// Rewrites each block holding a removed seq once, or deletes it.
    fn apply_removals(&self, tree: &sled::Tree) -> Result<()> {
        let mut removed = self.removed.clone();
        removed.sort_unstable();
        removed.dedup();
        let mut i = 0;
        while i < removed.len() {
            let Some((first, block)) = block_for(tree, removed[i])? else {
                i += 1;
                continue;
            };
            let end = block.last().map_or(first, |(s, _)| *s);
            if end < removed[i] {
                // Already gone.
                i += 1;
                continue;
            }
            let mut gone = Vec::new();
            while i < removed.len() && removed[i] <= end {
                gone.push(removed[i]);
                i += 1;
            }
            let kept: Block = block
                .into_iter()
                .filter(|(s, _)| gone.binary_search(s).is_err())
                .collect();
            if kept.is_empty() {
                tree.remove(key(first))?;
            } else {
                tree.insert(key(first), encode(&kept)?)?;
            }
        }
        Ok(())
    }
}

fn write_block(tree: &sled::Tree, block: Block) -> Result<()> {
    let first = block.first().map_or(0, |(s, _)| *s);
    tree.insert(key(first), encode(&block)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(i: u64, size: usize) -> StoredMessage {
        StoredMessage {
            subject: "orders.created".into(),
            published_ms: i as i64,
            payload: bytes::Bytes::from(vec![i as u8; size]),
            headers: Vec::new(),
        }
    }

    fn tree() -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().unwrap();
        db.open_tree("s1.msgs").unwrap()
    }

    fn store(tree: &sled::Tree, seqs: impl IntoIterator<Item = u64>, size: usize) {
        let mut w = PayloadWrites::default();
        for s in seqs {
            w.insert(s, msg(s, size));
        }
        w.apply(tree).unwrap();
    }

    fn stored(tree: &sled::Tree) -> Vec<u64> {
        read_up_to(tree, u64::MAX)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect()
    }

    #[test]
    fn an_entry_of_many_messages_is_a_few_blocks_and_each_reads_back() {
        let t = tree();
        store(&t, 1..=1000, 128);
        assert!(t.len() < 10, "{} blocks", t.len());
        for s in [1, 2, 500, 999, 1000] {
            assert_eq!(read(&t, s).unwrap(), Some(msg(s, 128)), "seq {s}");
        }
        assert_eq!(read(&t, 0).unwrap(), None);
        assert_eq!(read(&t, 1001).unwrap(), None);
    }

    #[test]
    fn removals_rewrite_blocks_and_empty_blocks_go() {
        let t = tree();
        store(&t, 1..=10, 16);
        store(&t, 11..=20, 16);
        let mut w = PayloadWrites::default();
        for s in [2, 3, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 99] {
            w.remove(s);
        }
        w.apply(&t).unwrap();
        assert_eq!(stored(&t), vec![1, 4, 5, 6, 7, 8, 9, 10]);
        assert_eq!(t.len(), 1, "the block 11..=20 is deleted");
        assert_eq!(read(&t, 2).unwrap(), None);
        assert_eq!(read(&t, 4).unwrap(), Some(msg(4, 16)));
        assert_eq!(read(&t, 15).unwrap(), None);
    }

    #[test]
    fn a_message_removed_by_its_own_entry_is_never_written() {
        let t = tree();
        store(&t, 1..=3, 16);
        let mut w = PayloadWrites::default();
        w.insert(4, msg(4, 16));
        w.remove(1);
        w.insert(5, msg(5, 16));
        w.remove(4);
        w.apply(&t).unwrap();
        assert_eq!(stored(&t), vec![2, 3, 5]);
    }

    #[test]
    fn read_many_finds_each_stored_seq_across_blocks_and_gaps() {
        let t = tree();
        store(&t, 1..=400, 512); // several blocks
        let mut w = PayloadWrites::default();
        for s in (100..200).step_by(2) {
            w.remove(s);
        }
        w.apply(&t).unwrap();
        let want: Vec<u64> = vec![0, 1, 99, 100, 101, 150, 151, 250, 400, 401, 5000];
        let got = read_many(&t, &want).unwrap();
        let expect: Vec<u64> = vec![1, 99, 101, 151, 250, 400];
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), expect);
        for (s, m) in got {
            assert_eq!(m, msg(s, 512));
        }
    }

    #[test]
    fn replaying_the_same_entries_gives_the_same_tree() {
        let run = |t: &sled::Tree| {
            store(t, 1..=300, 300);
            let mut w = PayloadWrites::default();
            (1..=150).for_each(|s| w.remove(s));
            w.apply(t).unwrap();
            store(t, 301..=310, 300);
        };
        let (a, b) = (tree(), tree());
        run(&a);
        run(&b);
        run(&b); // a replay on top of the same state
        let dump = |t: &sled::Tree| -> Vec<(Vec<u8>, Vec<u8>)> {
            t.iter()
                .map(|kv| {
                    let (k, v) = kv.unwrap();
                    (k.to_vec(), v.to_vec())
                })
                .collect()
        };
        assert_eq!(dump(&a), dump(&b));
    }

    #[test]
    fn a_value_of_an_unknown_format_is_an_error_not_a_panic() {
        let t = tree();
        t.insert(key(1), &b"\x07junk"[..]).unwrap();
        assert!(read(&t, 1).is_err());
    }
}
