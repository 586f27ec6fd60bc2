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
//! than [`CHECKPOINT_BYTES`]; after that flush the journal is emptied (a new
//! generation starts at the front of the preallocated file, [`JournalFile`]).
//!
//! Why: a sled flush hands the write of its IO buffer to sled's thread
//! pool, whose seven idle threads all wake on every job, and waits on a
//! condition variable for it: on our 2-core machines that was about a
//! quarter of each node's CPU under sync publishing (docs/benchmarks-changes.md,
//! "What changed since runs G and H").
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
//! - Replay stops at the first frame (one per sync) that is short, fails its
//!   CRC or belongs to an older generation (the unsynced tail of a power
//!   cut, or what an earlier generation left); nothing after it was
//!   reported durable.
//!
//! Left out: state-machine trees (a stream's payloads, a consumer's state):
//! they are rebuilt from the log after a crash, as before; the server's own
//! trees, which it flushes explicitly (`RaftNode::flush`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::Deserialize;
use serde::Serialize;

use crate::direct_io;
use crate::direct_io::AlignedBlocks;
use crate::log_store::index_key;
use crate::log_store::remove_range;
use crate::log_store::tree_names;
use crate::log_store::RemoveOrder;
use crate::types::io_err;
use crate::GroupId;

/// Journal size past which the flusher checkpoints (flushes sled and
/// empties the journal). Bounds the journal on disk and the replay at open.
pub(crate) const CHECKPOINT_BYTES: u64 = 64 * 1024 * 1024;

/// Bytes in front of each record: its length and CRC-32, little-endian.
const HEADER_BYTES: usize = 8;
/// The journal file's first bytes: [`FILE_MAGIC`], then the generation
/// (u64, little-endian).
const FILE_HEADER_BYTES: usize = 16;
const FILE_MAGIC: &[u8; 8] = b"WHJRNL02";
/// Bytes in front of each frame: length and CRC-32 (u32 each), generation
/// (u64), little-endian.
const FRAME_HEADER_BYTES: usize = 16;
/// The file grows by this much at a time, as written zeros.
const GROW_BYTES: u64 = 4 * 1024 * 1024;
/// Zeros written per call while growing.
const ZERO_CHUNK_BYTES: usize = 1024 * 1024;

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
                // A replay cut short is replayed again whole: order is free.
                remove_range(&log, *from, *to, RemoveOrder::Ascending)?;
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
///
/// Layout: a [`FILE_HEADER_BYTES`] header (magic, generation), then one
/// frame per sync: length, CRC-32 over the generation and the bytes, the
/// generation, then the framed records the sync covered. The file is
/// preallocated with written zeros in [`GROW_BYTES`] steps and reused from
/// the start after each checkpoint (the generation goes up), so a sync
/// only ever overwrites allocated blocks: `fdatasync` then has no file size
/// or extent to commit. On our VMs that took the p50 of a small write and
/// sync from about 185 to 135-165 µs for one writer, and its p99 from about
/// 720 to 470-560 µs with three at once (bench/results/fsync-probe-*.txt).
/// Frames of an older generation left behind the current end fail the
/// generation check, so replay stops exactly where the current generation's
/// writes stop.
///
/// Writes go around the page cache (`O_DIRECT`, [`direct_io`]) where the file
/// system allows it, as whole aligned blocks: each frame rewrites the block
/// the previous one ended in (with the same bytes up to the current end)
/// and zero-pads its own last block. Where direct writes are refused, the
/// same blocks go through the page cache.
pub(crate) struct JournalFile {
    path: PathBuf,
    /// Opened for reads and writes: with `O_DIRECT` when `direct`.
    file: File,
    direct: bool,
    /// Holds the bytes of the block `pos` is in, up to `pos`.
    blocks: AlignedBlocks,
    /// This generation's frames carry it; bumped by every [`Self::clear`].
    generation: u64,
    /// Where the next frame goes.
    pos: u64,
    /// Bytes of the file already allocated (written, zeros or not).
    allocated: u64,
    /// The file does not (yet) hold a header of this format: the next
    /// clear truncates it first.
    needs_reset: bool,
    /// A clear has succeeded since open: frames may be written. Until then
    /// the file holds what was replayed, and a frame written after it
    /// would never be read back.
    cleared: bool,
    /// A write, sync or clear failed: what the file holds is unknown (a
    /// failed fsync may have dropped dirty pages, and a later fsync can
    /// succeed without them), so every later call fails and nothing more
    /// is reported durable. A restart replays what is on disk.
    failed: Option<String>,
}

impl JournalFile {
    /// Opens the journal at `path`; it must have been replayed ([`replay`])
    /// and must be emptied by [`Self::clear`] (once sled holds what was
    /// replayed) before anything is written.
    pub(crate) fn open(path: &Path) -> io::Result<JournalFile> {
        Self::open_with(path, true)
    }

    /// [`Self::open`], with direct writes only if `allow_direct` (tests
    /// write through the page cache as on a file system without them).
    fn open_with(path: &Path, allow_direct: bool) -> io::Result<JournalFile> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        // The file may have just been created: its name must be durable
        // before anything in it is reported so.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
        let allocated = file.metadata()?.len();
        let mut header = [0u8; FILE_HEADER_BYTES];
        let generation = match file.read_exact_at(&mut header, 0) {
            Ok(()) => file_generation(&header),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => None,
            Err(e) => return Err(e),
        };
        let direct_file = match allow_direct {
            true => direct_io::open_direct(path)?,
            false => None,
        };
        let (file, direct) = match direct_file {
            Some(direct) => (direct, true),
            None => (file, false),
        };
        Ok(JournalFile {
            path: path.to_path_buf(),
            file,
            direct,
            blocks: AlignedBlocks::default(),
            generation: generation.unwrap_or(0),
            // Unknown content: treated as full until cleared.
            pos: allocated.max(FILE_HEADER_BYTES as u64),
            allocated,
            needs_reset: generation.is_none(),
            cleared: false,
            failed: None,
        })
    }

    /// Writes `bytes` as one frame after the last and syncs the file.
    pub(crate) fn write_and_sync(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.usable()?;
        if bytes.is_empty() {
            return Ok(());
        }
        if !self.cleared {
            return Err(io_err(
                "journal written before it was cleared after open (a bug)",
            ));
        }
        let len = u32::try_from(bytes.len()).map_err(|_| {
            io_err(format!(
                "journal sync of {} bytes is too large",
                bytes.len()
            ))
        })?;
        let res = self.write_frame(len, bytes);
        self.fail_on(res)
    }

    fn write_frame(&mut self, len: u32, bytes: &[u8]) -> io::Result<()> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        header[..4].copy_from_slice(&len.to_le_bytes());
        header[4..8].copy_from_slice(&frame_crc(self.generation, bytes).to_le_bytes());
        header[8..].copy_from_slice(&self.generation.to_le_bytes());
        let end = self.pos + (FRAME_HEADER_BYTES + bytes.len()) as u64;
        self.allocate(direct_io::round_up(end))?;
        self.write_blocks(&[&header, bytes])?;
        self.pos = end;
        self.file.sync_data()
    }

    /// Writes the tail block's bytes up to `pos`, then `parts`, as whole
    /// blocks from the start of the block `pos` is in.
    fn write_blocks(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        debug_assert_eq!(
            self.blocks.tail_len() as u64,
            self.pos - direct_io::round_down(self.pos),
            "the tail is the block pos is in"
        );
        let at = direct_io::round_down(self.pos);
        let data = self.blocks.fill(parts);
        write_aligned(&mut self.file, &mut self.direct, &self.path, data, at)?;
        self.blocks.keep_tail();
        Ok(())
    }

    /// Fails if an earlier call failed (see `failed`).
    fn usable(&self) -> io::Result<()> {
        match &self.failed {
            Some(e) => Err(io_err(format!(
                "journal failed earlier ({e}); restart the node"
            ))),
            None => Ok(()),
        }
    }

    /// Remembers a failure for good and passes the result on.
    fn fail_on(&mut self, res: io::Result<()>) -> io::Result<()> {
        if let Err(e) = &res {
            self.failed = Some(e.to_string());
        }
        res
    }

    /// Makes sure the file has written blocks up to `end`: zeros, synced
    /// with the new length, in [`GROW_BYTES`] steps.
    fn allocate(&mut self, end: u64) -> io::Result<()> {
        if end <= self.allocated {
            return Ok(());
        }
        let target = end.div_ceil(GROW_BYTES) * GROW_BYTES;
        let zeros = AlignedBlocks::zeroed(ZERO_CHUNK_BYTES);
        let mut at = self.allocated;
        if !at.is_multiple_of(direct_io::BLOCK_BYTES as u64) {
            // Not a size this journal leaves (it grows in whole steps): the
            // partial block's end reads as zeros once the length covers it.
            at = direct_io::round_up(at);
            self.file.set_len(at)?;
        }
        while at < target {
            let n = (target - at).min(ZERO_CHUNK_BYTES as u64);
            let chunk = zeros.zeros(n as usize);
            write_aligned(&mut self.file, &mut self.direct, &self.path, chunk, at)?;
            at += n;
        }
        self.file.sync_all()?;
        self.allocated = target;
        Ok(())
    }

    /// Bytes of the current generation, its header included.
    pub(crate) fn len_bytes(&self) -> u64 {
        self.pos
    }

    /// Whether the journal has grown past [`CHECKPOINT_BYTES`].
    pub(crate) fn wants_checkpoint(&self) -> bool {
        self.pos > CHECKPOINT_BYTES
    }

    /// Empties the journal; call only once sled holds everything in it.
    /// Starts a new generation at the front of the file, which stays
    /// allocated (shrunk only if a burst grew it past twice the limit).
    ///
    /// Crash safety: until the new header is synced, the old one stands and
    /// a replay applies all of the old generation again (harmless: sled
    /// already holds its final values); after, the old frames are stale. So
    /// the file is shrunk only after the header, never leaving a prefix of
    /// the old generation to replay. A file of no known format is truncated
    /// first: nothing of it is replayed then, and nothing needs to be.
    pub(crate) fn clear(&mut self) -> io::Result<()> {
        self.usable()?;
        if self.cleared && self.pos == FILE_HEADER_BYTES as u64 {
            return Ok(());
        }
        let res = self.start_generation();
        self.fail_on(res)
    }

    fn start_generation(&mut self) -> io::Result<()> {
        if self.needs_reset {
            self.file.set_len(0)?;
            self.file.sync_all()?;
            self.allocated = 0;
            self.needs_reset = false;
        }
        let generation = self.generation + 1;
        let mut header = [0u8; FILE_HEADER_BYTES];
        header[..8].copy_from_slice(FILE_MAGIC);
        header[8..].copy_from_slice(&generation.to_le_bytes());
        self.allocate(direct_io::BLOCK_BYTES as u64)?;
        // The header's block is written whole, so it carries the old bytes
        // after the header unchanged: if the write tears and the old header
        // stands, the old generation still replays in full, never a prefix
        // of it (which could set a key back to an older value). It is read
        // through the fd that writes (direct where that is), so no stale
        // cached page can stand in for what is on disk.
        let block = self.blocks.read_buffer(direct_io::BLOCK_BYTES);
        self.file.read_exact_at(block, 0)?;
        block[..FILE_HEADER_BYTES].copy_from_slice(&header);
        write_aligned(&mut self.file, &mut self.direct, &self.path, block, 0)?;
        self.file.sync_data()?;
        self.blocks.set_tail(&header);
        self.generation = generation;
        self.pos = FILE_HEADER_BYTES as u64;
        self.cleared = true;
        let keep = CHECKPOINT_BYTES + GROW_BYTES;
        if self.allocated > 2 * keep {
            self.file.set_len(keep)?;
            self.file.sync_all()?;
            self.allocated = keep;
        }
        Ok(())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes whole aligned blocks `data` at `at`; if the kernel refuses them as
/// misaligned for a direct write, reopens the file for writes through the
/// page cache and writes them there (`direct` is then false for good).
fn write_aligned(
    file: &mut File,
    direct: &mut bool,
    path: &Path,
    data: &[u8],
    at: u64,
) -> io::Result<()> {
    match file.write_all_at(data, at) {
        Err(e) if *direct && direct_io::is_misaligned(&e) => {
            tracing::warn!(
                path = %path.display(),
                error = %e,
                "journal: direct writes refused, writing through the page cache"
            );
            *file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)?;
            *direct = false;
            file.write_all_at(data, at)
        }
        res => res,
    }
}

/// The generation in a journal file's header, if it has this format's.
fn file_generation(header: &[u8; FILE_HEADER_BYTES]) -> Option<u64> {
    if &header[..8] != FILE_MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(header[8..].try_into().ok()?))
}

/// A frame's CRC: over its generation and its bytes, so a stale frame that
/// happens to have a plausible length still fails.
fn frame_crc(generation: u64, bytes: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&generation.to_le_bytes());
    hasher.update(bytes);
    hasher.finalize()
}

/// What a replay found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    /// Records applied.
    pub(crate) records: u64,
    /// Groups whose log the records changed.
    pub(crate) groups: Vec<GroupId>,
    /// Bytes of a frame of the current generation that was cut short or
    /// failed its CRC (a sync a power cut interrupted), ignored.
    pub(crate) torn_bytes: u64,
}

/// Applies every whole record of the journal at `path` (if any) to `db`, in
/// order. The caller then flushes sled and empties the journal.
///
/// A file without this format's header is read as the earlier format, which
/// had no file header and no frames: records from the first byte on.
pub(crate) fn replay(path: &Path, db: &sled::Db) -> io::Result<Replayed> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Replayed::default()),
        Err(e) => return Err(e),
    };
    let mut out = Replayed::default();
    let generation = data
        .first_chunk::<FILE_HEADER_BYTES>()
        .and_then(file_generation);
    let Some(generation) = generation else {
        let end = apply_records(&data, db, &mut out)?;
        out.torn_bytes = (data.len() - end) as u64;
        return Ok(out);
    };
    let mut pos = FILE_HEADER_BYTES;
    loop {
        match read_frame(&data, pos, generation) {
            Frame::Whole { bytes, next } => {
                let end = apply_records(bytes, db, &mut out)?;
                if end != bytes.len() {
                    // A frame whose CRC holds always parses whole; if it
                    // does not, nothing after it can be trusted either.
                    out.torn_bytes = (bytes.len() - end) as u64;
                    break;
                }
                pos = next;
            }
            Frame::Torn { bytes } => {
                out.torn_bytes = bytes;
                break;
            }
            Frame::End => break,
        }
    }
    Ok(out)
}

/// Applies the framed records in `data` in order; returns where the first
/// record that does not read whole starts (or `data.len()`).
fn apply_records(data: &[u8], db: &sled::Db, out: &mut Replayed) -> io::Result<usize> {
    let mut pos = 0usize;
    while let Some((record, next)) = read_record(data, pos) {
        record.apply(db)?;
        if !out.groups.contains(&record.group()) {
            out.groups.push(record.group());
        }
        out.records += 1;
        pos = next;
    }
    Ok(pos)
}

/// What is at a frame position.
enum Frame<'a> {
    /// A frame of this generation with its bytes intact.
    Whole { bytes: &'a [u8], next: usize },
    /// A frame of this generation, cut short or failing its CRC.
    Torn { bytes: u64 },
    /// Zeros, an older generation's frame, or the end of the file.
    End,
}

fn read_frame(data: &[u8], pos: usize, generation: u64) -> Frame<'_> {
    let Some(header) = pos
        .checked_add(FRAME_HEADER_BYTES)
        .and_then(|end| data.get(pos..end))
    else {
        return Frame::End;
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let mut frame_generation = [0u8; 8];
    frame_generation.copy_from_slice(&header[8..]);
    if u64::from_le_bytes(frame_generation) != generation {
        return Frame::End;
    }
    let start = pos + FRAME_HEADER_BYTES;
    match start.checked_add(len).and_then(|end| data.get(start..end)) {
        Some(bytes) if frame_crc(generation, bytes) == crc => Frame::Whole {
            bytes,
            next: start + len,
        },
        Some(_) => Frame::Torn { bytes: len as u64 },
        None => Frame::Torn {
            bytes: (data.len() - pos) as u64,
        },
    }
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
#[path = "journal_tests.rs"]
mod tests;
