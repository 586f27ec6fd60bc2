//! The node's write-ahead journal: what makes Raft log writes durable.
//!
//! Every write to a group's log and meta trees (log entries inserted or
//! removed, the vote, `committed`, `last_purged`, a group dropped) is done
//! in sled *and* appended, as a [`Record`], to one in-memory buffer shared by
//! every group of the node. The node's flusher thread writes the buffer to
//! the journal file and `fdatasync`s it; only then are the appends it
//! covers reported durable to openraft. sled itself is flushed only at a
//! checkpoint: when something asks for all of sled to be durable (a
//! snapshot, a dropped group, a shutdown) or once the journal file is larger
//! than [`CHECKPOINT_BYTES`]; after that flush the journal is emptied.
//!
//! Why: a sled flush hands the write of its IO buffer to sled's thread
//! pool, whose seven idle threads all wake on every job, and waits on a
//! condition variable for it: on our 2-core machines that was about a
//! quarter of each node's CPU under sync publishing (docs/BENCHMARKS.md).
//! Appending to a file and syncing it is done by the flusher alone.
//!
//! At open, before any group starts, the journal is replayed into sled
//! ([`replay`]), sled is flushed and the journal emptied. Replay is exact
//! because every record is a blind write of keys (insert or remove), applied
//! in the order they were made, on top of a sled that holds at least
//! everything up to the last checkpoint (sled recovers a prefix of its
//! writes).
//!
//! Invariants:
//! - A record enters the buffer after its write to sled; a waiter is queued
//!   after its records; the flusher takes the buffer after the waiters. So a
//!   waiter completed `Ok` has its records (and everything before them) in a
//!   synced journal, and a checkpoint's sled flush covers every record
//!   written to the file before it.
//! - sled may hold writes the journal lost (made after the last sync): none
//!   of them was reported durable. Replay then restores the journal's value
//!   of each key it names. That can never leave a log with entries of two
//!   histories, because a truncation is synced before `truncate_after`
//!   returns, so no append follows an unsynced truncation; entries a lost
//!   purge had removed come back, and [`crate::log_store`] removes them
//!   again after replay (those at or below `last_purged`).
//! - Replay stops at the first record that is short or fails its CRC (the
//!   unsynced tail of a power cut); nothing after it was reported durable.
//!
//! Left out: state-machine trees (a stream's payloads, a consumer's state):
//! they are rebuilt from the log after a crash, as before; the server's own
//! trees, which it flushes explicitly (`RaftNode::flush`).

use std::fs::File;
use std::io;
use std::io::Write;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::Deserialize;
use serde::Serialize;

use crate::log_store::index_key;
use crate::log_store::tree_names;
use crate::types::io_err;
use crate::GroupId;

/// Journal size past which the flusher checkpoints (flushes sled and
/// empties the journal). Bounds the journal on disk and the replay at open.
pub(crate) const CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// Bytes in front of each record: its length and CRC-32, little-endian.
const HEADER_BYTES: usize = 8;

/// One write to a group's log or meta tree.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Record {
    /// Log entries (index, encoded entry) inserted into the group's log.
    LogInsert {
        group: GroupId,
        entries: Vec<(u64, Vec<u8>)>,
    },
    /// Log entries `from..=to` removed.
    LogRemove { group: GroupId, from: u64, to: u64 },
    /// A key of the group's meta tree set.
    MetaSet {
        group: GroupId,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// The group's log and meta trees dropped.
    DropGroup { group: GroupId },
}

impl Record {
    fn group(&self) -> GroupId {
        match self {
            Record::LogInsert { group, .. }
            | Record::LogRemove { group, .. }
            | Record::MetaSet { group, .. }
            | Record::DropGroup { group } => *group,
        }
    }

    /// Does to `db` what the record says was done.
    fn apply(&self, db: &sled::Db) -> io::Result<()> {
        let (log_name, meta_name) = tree_names(self.group());
        match self {
            Record::LogInsert { entries, .. } => {
                let log = db.open_tree(log_name).map_err(io_err)?;
                for (index, bytes) in entries {
                    log.insert(index_key(*index), bytes.as_slice())
                        .map_err(io_err)?;
                }
            }
            Record::LogRemove { from, to, .. } => {
                let log = db.open_tree(log_name).map_err(io_err)?;
                for index in *from..=*to {
                    log.remove(index_key(index)).map_err(io_err)?;
                }
            }
            Record::MetaSet { key, value, .. } => {
                let meta = db.open_tree(meta_name).map_err(io_err)?;
                meta.insert(key.as_slice(), value.as_slice())
                    .map_err(io_err)?;
            }
            Record::DropGroup { .. } => {
                db.drop_tree(log_name).map_err(io_err)?;
                db.drop_tree(meta_name).map_err(io_err)?;
            }
        }
        Ok(())
    }
}

/// The records not yet written to the file; shared by every group's log
/// store and the flusher.
#[derive(Default)]
pub(crate) struct JournalBuffer {
    bytes: Mutex<Vec<u8>>,
}

impl JournalBuffer {
    /// Appends `record`, framed, to the buffer.
    pub(crate) fn push(&self, record: &Record) -> io::Result<()> {
        let mut buf = self
            .bytes
            .lock()
            .map_err(|_| io_err("journal buffer lock poisoned"))?;
        let start = buf.len();
        buf.extend_from_slice(&[0u8; HEADER_BYTES]);
        if let Err(e) = bincode::serialize_into(&mut *buf, record) {
            buf.truncate(start);
            return Err(io_err(format!("journal record: {e}")));
        }
        let payload = &buf[start + HEADER_BYTES..];
        let len = u32::try_from(payload.len()).map_err(|_| {
            io_err(format!(
                "journal record of {} bytes is too large",
                payload.len()
            ))
        });
        let len = match len {
            Ok(len) => len,
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        };
        let crc = crc32fast::hash(payload);
        buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        buf[start + 4..start + HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Takes what is buffered, leaving `spare` (emptied) in its place.
    pub(crate) fn take(&self, spare: Vec<u8>) -> io::Result<Vec<u8>> {
        let mut buf = self
            .bytes
            .lock()
            .map_err(|_| io_err("journal buffer lock poisoned"))?;
        let mut spare = spare;
        spare.clear();
        Ok(std::mem::replace(&mut *buf, spare))
    }
}

/// The journal file; owned by the flusher thread.
pub(crate) struct JournalFile {
    path: PathBuf,
    file: File,
    len: u64,
}

impl JournalFile {
    /// Opens the journal at `path` for appending; it must have been replayed
    /// and emptied ([`replay`]).
    pub(crate) fn open(path: &Path) -> io::Result<JournalFile> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let len = file.metadata()?.len();
        Ok(JournalFile {
            path: path.to_path_buf(),
            file,
            len,
        })
    }

    /// Writes `bytes` at the end and syncs the file.
    pub(crate) fn write_and_sync(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        self.file.write_all(bytes)?;
        self.len += bytes.len() as u64;
        self.file.sync_data()
    }

    /// Whether the journal has grown past [`CHECKPOINT_BYTES`].
    pub(crate) fn wants_checkpoint(&self) -> bool {
        self.len > CHECKPOINT_BYTES
    }

    /// Empties the journal; call only once sled holds everything in it.
    pub(crate) fn clear(&mut self) -> io::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        self.file.set_len(0)?;
        self.file.sync_all()?;
        self.len = 0;
        Ok(())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// What a replay found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    /// Records applied.
    pub(crate) records: u64,
    /// Groups whose log the records changed.
    pub(crate) groups: Vec<GroupId>,
    /// Bytes after the last whole record (a torn tail), ignored.
    pub(crate) torn_bytes: u64,
}

/// Applies every whole record of the journal at `path` (if any) to `db`, in
/// order. The caller then flushes sled and empties the journal.
pub(crate) fn replay(path: &Path, db: &sled::Db) -> io::Result<Replayed> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Replayed::default()),
        Err(e) => return Err(e),
    };
    let mut out = Replayed::default();
    let mut pos = 0usize;
    while let Some((record, next)) = read_record(&data, pos) {
        record.apply(db)?;
        if !out.groups.contains(&record.group()) {
            out.groups.push(record.group());
        }
        out.records += 1;
        pos = next;
    }
    out.torn_bytes = (data.len() - pos) as u64;
    Ok(out)
}

/// The whole record at `pos` and the position after it; `None` at the end
/// or at a record that is short, fails its CRC or does not decode.
fn read_record(data: &[u8], pos: usize) -> Option<(Record, usize)> {
    let header = data.get(pos..pos.checked_add(HEADER_BYTES)?)?;
    let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().ok()?);
    let start = pos + HEADER_BYTES;
    let payload = data.get(start..start.checked_add(len)?)?;
    if crc32fast::hash(payload) != crc {
        return None;
    }
    let record = bincode::deserialize(payload).ok()?;
    Some((record, start + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, sled::Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new()
            .path(dir.path().join("sled"))
            .open()
            .unwrap();
        (dir, db)
    }

    fn write(path: &Path, records: &[Record]) -> Vec<u8> {
        let buf = JournalBuffer::default();
        for r in records {
            buf.push(r).unwrap();
        }
        let bytes = buf.take(Vec::new()).unwrap();
        let mut f = JournalFile::open(path).unwrap();
        f.write_and_sync(&bytes).unwrap();
        bytes
    }

    fn log_of(db: &sled::Db, group: GroupId) -> Vec<(u64, Vec<u8>)> {
        let log = db.open_tree(tree_names(group).0).unwrap();
        log.iter()
            .map(|kv| {
                let (k, v) = kv.unwrap();
                let key: [u8; 8] = k.as_ref().try_into().unwrap();
                (u64::from_be_bytes(key), v.to_vec())
            })
            .collect()
    }

    #[test]
    fn replay_applies_every_record_in_order() {
        let (dir, db) = db();
        let path = dir.path().join("journal");
        write(
            &path,
            &[
                Record::LogInsert {
                    group: 7,
                    entries: vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"c".to_vec())],
                },
                Record::LogRemove {
                    group: 7,
                    from: 3,
                    to: 3,
                },
                Record::LogInsert {
                    group: 7,
                    entries: vec![(3, b"C".to_vec())],
                },
                Record::MetaSet {
                    group: 7,
                    key: b"vote".to_vec(),
                    value: b"v2".to_vec(),
                },
                Record::LogInsert {
                    group: 8,
                    entries: vec![(1, b"x".to_vec())],
                },
                Record::DropGroup { group: 8 },
            ],
        );
        let replayed = replay(&path, &db).unwrap();
        assert_eq!(replayed.records, 6);
        assert_eq!(replayed.groups, vec![7, 8]);
        assert_eq!(replayed.torn_bytes, 0);
        assert_eq!(
            log_of(&db, 7),
            vec![(1, b"a".to_vec()), (2, b"b".to_vec()), (3, b"C".to_vec())]
        );
        let meta = db.open_tree(tree_names(7).1).unwrap();
        assert_eq!(meta.get(b"vote").unwrap().unwrap().as_ref(), b"v2");
        assert!(log_of(&db, 8).is_empty(), "group 8 was dropped");
    }

    #[test]
    fn replay_stops_at_a_torn_or_corrupt_record() {
        let (dir, db) = db();
        let path = dir.path().join("journal");
        let first = Record::LogInsert {
            group: 1,
            entries: vec![(1, b"kept".to_vec())],
        };
        let second = Record::LogInsert {
            group: 1,
            entries: vec![(2, b"torn".to_vec())],
        };
        let bytes = write(&path, &[first, second]);
        // Cut the second record short: the first survives alone.
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let replayed = replay(&path, &db).unwrap();
        assert_eq!(replayed.records, 1);
        assert!(replayed.torn_bytes > 0);
        assert_eq!(log_of(&db, 1), vec![(1, b"kept".to_vec())]);

        // A flipped byte in the second record's payload: CRC mismatch.
        let mut bad = bytes.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        std::fs::write(&path, &bad).unwrap();
        let (_dir2, db2) = self::db();
        assert_eq!(replay(&path, &db2).unwrap().records, 1);
        assert_eq!(log_of(&db2, 1), vec![(1, b"kept".to_vec())]);
    }

    #[test]
    fn a_missing_journal_replays_nothing_and_clear_empties_the_file() {
        let (dir, db) = db();
        let path = dir.path().join("journal");
        assert_eq!(replay(&path, &db).unwrap(), Replayed::default());
        write(
            &path,
            &[
                Record::DropGroup { group: 3 },
                Record::DropGroup { group: 4 },
            ],
        );
        let mut f = JournalFile::open(&path).unwrap();
        assert!(!f.wants_checkpoint());
        f.clear().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(replay(&path, &db).unwrap().records, 0);
    }
}
