//! The Raft log and vote of one group, in two sled trees, made durable by
//! the node's journal.
//!
//! Layout: `g{id}.log` maps the log index (big-endian `u64`, so byte order is
//! index order) to the bincode `Entry`; `g{id}.meta` holds `vote`,
//! `committed`, `last_purged` and (written by [`crate::sm_store`]) `snapshot`.
//!
//! Every write to these trees is made in sled and then recorded in the
//! node's journal buffer (`crate::journal`); durability comes from the
//! journal's sync, not from a sled flush.
//!
//! Invariants:
//! - `append` inserts its entries one by one in index order, so they are
//!   readable by every reader as soon as it returns, and records them; the
//!   flush callback goes to the node's group-commit [`Flusher`] and fires
//!   only after the journal holding them is synced. A follower's append
//!   (entries proposed by another node) is synced in the caller's task
//!   when the node's journal is idle (`Flusher::try_sync_inline`); a
//!   leader's always goes through the flusher thread, so that its append
//!   returns at once and replication starts. It uses no
//!   `sled::Batch`: sled 0.34 writes out its current IO buffer before and
//!   after every batch, each write an `fdatasync` (`crate::sled_files`).
//! - Purges and truncations remove key by key, not in a batch either: sled
//!   0.34 holds every page a batch touched, and the IO buffers it filled,
//!   until the whole batch is applied, and a purge of a large log made one
//!   batch hold most of a node's heap (384 MiB of 606 at the peak of a
//!   million messages drained, in `bench/results/heap-20261208.txt`). So a
//!   crash can keep part of a removal: a purge removes from the lowest
//!   index up and a truncation from the highest down, so that what is left
//!   is still one run of indexes, and replay finishes both (the journal's
//!   `LogRemove`, and [`remove_purged_entries`]).
//! - `save_vote` and `truncate_after` return only after their records are
//!   synced. For the truncation this is what makes replay safe: no append
//!   ever follows a truncation that could still be lost (see
//!   `crate::journal`).
//! - `purge` records `last_purged` before the removals and needs no sync of
//!   its own; if a crash loses it after sled kept some of it, replay can
//!   bring back entries at or below `last_purged`, and
//!   [`remove_purged_entries`] removes them again.
//! - `committed` is written without a sync (it is a hint for replay at
//!   startup and may lag after a crash; see `enable_leader_restore` in
//!   [`crate::node`]).
//!
//! - The log is read and trimmed by index, one key at a time, never by a
//!   forward scan of the tree: after a simulated power loss sled 0.34 once
//!   recovered a tree whose forward iteration stopped early (at 34,023 of
//!   34,260 entries) while `get` and reverse iteration still saw every key
//!   (docs/RELIABILITY.md, bug 6). A Raft log's indexes are dense, so `get`
//!   from the first to the last index loses nothing; `first` and `last`
//!   (single seeks) give the bounds.
//!
//! Not here: the state machine and snapshots ([`crate::sm_store`]).

use std::fmt::Debug;
use std::io;
use std::ops::Bound;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::IOFlushed;
use openraft::storage::RaftLogStorage;
use openraft::LogState;
use openraft::OptionalSend;
use openraft::RaftLogReader;

use crate::fault::AppendFault;
use crate::flusher::Flusher;
use crate::journal::JournalBuffer;
use crate::journal::Record;
use crate::types::decode;
use crate::types::encode;
use crate::types::io_err;
use crate::types::Entry;
use crate::types::LogId;
use crate::types::TypeConfig;
use crate::types::Vote;
use crate::GroupId;

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// Names of the trees of a group.
pub(crate) fn tree_names(group_id: GroupId) -> (String, String) {
    (format!("g{group_id}.log"), format!("g{group_id}.meta"))
}

/// Log storage of one group; clones share the same trees (and serve as readers).
#[derive(Clone)]
pub(crate) struct LogStore {
    group_id: GroupId,
    /// This node: entries whose leader is another node are a follower's.
    node_id: u64,
    log: sled::Tree,
    meta: sled::Tree,
    journal: Arc<JournalBuffer>,
    flusher: Flusher,
    /// An injected storage fault (tests only; see `fault`).
    fault: Option<AppendFault>,
}

impl LogStore {
    /// Opens (or creates) the trees of `group_id` in `db`.
    pub(crate) fn open(
        db: &sled::Db,
        node_id: u64,
        group_id: GroupId,
        journal: Arc<JournalBuffer>,
        flusher: Flusher,
        fault: Option<AppendFault>,
    ) -> sled::Result<(Self, sled::Tree)> {
        let (log_name, meta_name) = tree_names(group_id);
        let log = db.open_tree(log_name)?;
        let meta = db.open_tree(meta_name)?;
        Ok((
            LogStore {
                group_id,
                node_id,
                log,
                meta: meta.clone(),
                journal,
                flusher,
                fault,
            },
            meta,
        ))
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> io::Result<Option<T>> {
        match self.meta.get(key).map_err(io_err)? {
            Some(v) => decode(&v).map(Some).map_err(io_err),
            None => Ok(None),
        }
    }

    fn write_meta<T: serde::Serialize>(&self, key: &[u8], v: &T) -> io::Result<()> {
        let bytes = encode(v).map_err(io_err)?;
        self.meta.insert(key, bytes.as_slice()).map_err(io_err)?;
        self.journal.push(&Record::MetaSet {
            group: self.group_id,
            key: key.to_vec(),
            value: bytes,
        })
    }

    /// Index of the first or last entry in the tree (one seek each).
    fn bound_index(kv: sled::Result<Option<(sled::IVec, sled::IVec)>>) -> io::Result<Option<u64>> {
        match kv.map_err(io_err)? {
            Some((k, _)) => {
                let key: [u8; 8] = k.as_ref().try_into().map_err(|_| io_err("bad log key"))?;
                Ok(Some(u64::from_be_bytes(key)))
            }
            None => Ok(None),
        }
    }

    /// Removes the entries `[from, to]` that exist, key by key (module
    /// docs: no batch), in the order that keeps what is left one run of
    /// indexes if a crash keeps only some of the removals.
    fn remove_indexes(&self, from: u64, to: u64, order: RemoveOrder) -> io::Result<()> {
        remove_range(&self.log, from, to, order)?;
        self.journal.push(&Record::LogRemove {
            group: self.group_id,
            from,
            to,
        })
    }
}

/// Which end of the log a removal starts from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RemoveOrder {
    /// A purge: lowest index first, so a part kept is a shorter prefix gone.
    Ascending,
    /// A truncation: highest first, so a part kept is a shorter suffix gone.
    Descending,
}

/// Removes the log entries `[from, to]` that exist, one key at a time.
pub(crate) fn remove_range(
    log: &sled::Tree,
    from: u64,
    to: u64,
    order: RemoveOrder,
) -> io::Result<()> {
    let remove = |index| log.remove(index_key(index)).map(drop).map_err(io_err);
    match order {
        RemoveOrder::Ascending => (from..=to).try_for_each(remove),
        RemoveOrder::Descending => (from..=to).rev().try_for_each(remove),
    }
}

/// The sled key of a log index.
pub(crate) fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// After a journal replay: removes the entries of `group_id`'s log at or
/// below its `last_purged` (a purge the crash lost from the journal but not
/// from sled; see the module docs).
pub(crate) fn remove_purged_entries(db: &sled::Db, group_id: GroupId) -> io::Result<()> {
    let (log_name, meta_name) = tree_names(group_id);
    let meta = db.open_tree(meta_name).map_err(io_err)?;
    let Some(bytes) = meta.get(KEY_LAST_PURGED).map_err(io_err)? else {
        return Ok(());
    };
    let purged: LogId = decode(&bytes).map_err(io_err)?;
    let log = db.open_tree(log_name).map_err(io_err)?;
    match LogStore::bound_index(log.first())? {
        Some(first) if first <= purged.index => {
            remove_range(&log, first, purged.index, RemoveOrder::Ascending)
        }
        _ => Ok(()),
    }
}

/// Converts an index range into `[lo, hi)`; `hi = None` means unbounded.
fn index_bounds<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let lo = match range.start_bound() {
        Bound::Included(&x) => x,
        Bound::Excluded(&x) => x.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let hi = match range.end_bound() {
        Bound::Included(&x) => x.checked_add(1),
        Bound::Excluded(&x) => Some(x),
        Bound::Unbounded => None,
    };
    (lo, hi)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        let (lo, hi) = index_bounds(&range);
        let first = LogStore::bound_index(self.log.first())?;
        let last = LogStore::bound_index(self.log.last())?;
        let (Some(first), Some(last)) = (first, last) else {
            return Ok(Vec::new());
        };
        let start = lo.max(first);
        let end = hi.unwrap_or(u64::MAX).min(last.saturating_add(1));
        // By index, not by a range scan (see the module docs); the entries
        // returned are contiguous.
        let mut out = Vec::with_capacity(end.saturating_sub(start).min(1024) as usize);
        for index in start..end {
            match self.log.get(index_key(index)).map_err(io_err)? {
                Some(v) => out.push(decode::<Entry>(&v).map_err(io_err)?),
                None => break,
            }
        }
        Ok(out)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        self.read_meta(KEY_VOTE)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged_log_id: Option<LogId> = self.read_meta(KEY_LAST_PURGED)?;
        let last_log_id = match self.log.last().map_err(io_err)? {
            Some((_, v)) => Some(decode::<Entry>(&v).map_err(io_err)?.log_id),
            None => last_purged_log_id,
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        self.write_meta(KEY_VOTE, vote)?;
        self.flusher.sync_journal().await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        self.write_meta(KEY_COMMITTED, &committed)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.read_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        if self.fault.as_ref().is_some_and(AppendFault::hit) {
            return Err(io::Error::other(
                "injected storage fault (WHARF_FAULT_FAIL_GROUP)",
            ));
        }
        // Key by key in index order, not as one `sled::Batch`: see the
        // module docs.
        let mut recorded = Vec::new();
        let mut from_other_leader = false;
        crate::timeline::mark("append_start", 0);
        for entry in entries {
            from_other_leader |= entry.log_id.leader_id.node_id != self.node_id;
            let bytes = encode(&entry).map_err(io_err)?;
            let index = entry.log_id.index;
            self.log
                .insert(index_key(index), bytes.as_slice())
                .map_err(io_err)?;
            recorded.push((index, bytes));
        }
        crate::timeline::mark("append_submit", recorded.last().map(|r| r.0).unwrap_or(0));
        self.journal.push(&Record::LogInsert {
            group: self.group_id,
            entries: recorded,
        })?;
        if from_other_leader {
            if let Some(synced) = self.flusher.try_sync_inline() {
                callback.io_completed(synced);
                return Ok(());
            }
        }
        self.flusher.submit_log(callback).await
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogId>) -> Result<(), io::Error> {
        let from = match &last_log_id {
            Some(l) => match l.index.checked_add(1) {
                Some(x) => x,
                None => return Ok(()),
            },
            None => 0,
        };
        match LogStore::bound_index(self.log.last())? {
            Some(last) if last >= from => {
                self.remove_indexes(from, last, RemoveOrder::Descending)?;
                // Synced before anything is appended after it (module docs).
                self.flusher.sync_journal().await
            }
            _ => Ok(()),
        }
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), io::Error> {
        self.write_meta(KEY_LAST_PURGED, &log_id)?;
        match LogStore::bound_index(self.log.first())? {
            Some(first) if first <= log_id.index => {
                self.remove_indexes(first, log_id.index, RemoveOrder::Ascending)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::index_bounds;

    #[test]
    fn index_bounds_cover_every_bound_kind() {
        assert_eq!(index_bounds(&(3..7)), (3, Some(7)));
        assert_eq!(index_bounds(&(3..=7)), (3, Some(8)));
        assert_eq!(index_bounds(&(..)), (0, None));
        assert_eq!(index_bounds(&(5..)), (5, None));
        assert_eq!(index_bounds(&(..=u64::MAX)), (0, None));
    }
}
