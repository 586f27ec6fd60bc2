//! Makes sled's syncs fsyncs, blob files before the file that points to them.
//!
//! On Linux sled 0.34 ends each write of its log with `sync_file_range` over
//! the bytes it wrote: that writes the pages, but neither the file's metadata
//! (its size, which grows as segments are added) nor the drive's write cache.
//! It never syncs blob files (page fragments over about 128 KiB, such as a
//! big batch of publishes), yet it writes a blob *before* the log record that
//! points to it. So a power cut could lose writes `flush_async` reported done
//! (bug 4 of docs/RELIABILITY.md), keep a pointer to a blob that was lost
//! (bug 5), or lose pages sled had already relocated from a segment it then
//! reused (bug 6: a tree whose forward scan stopped early).
//!
//! Two entry points, both syncing every blob file that is new or has grown
//! since it was last synced (and then the blob directory) *before* the main
//! file:
//! - [`sync_sled_write`] is what the `wharf` executable runs in place of
//!   sled's `sync_file_range` (`crates/wharf/src/sled_sync.rs`), so each log
//!   write sled considers stable is on disk with its blobs.
//! - [`SledFiles::sync`] runs after each `flush_async` of the node's flusher;
//!   only after it returns are writes reported durable. Once
//!   `sync_sled_write` has run in this process it does nothing: sled's flush
//!   returns only when every buffer up to then was written *and* synced
//!   through `sync_sled_write`, so a second `fdatasync` would only cost time
//!   (measured in docs/benchmarks-history.md, "The sync path"). Without the
//!   interposer (library tests, other executables) it syncs itself.
//!
//! sled's periodic flush thread is off (`flush_every_ms(None)` where the node
//! opens its database): its plain `fsync` of the main file would make
//! pointers durable before their blobs.
//!
//! Left out: a write sled makes while a sync runs can still be caught by the
//! main file's sync without its blob (sled writes the blob and the pointer
//! without a lock we could take); sled's `conf` and snapshot files (sled
//! fsyncs its snapshots; `conf` is rewritten at open when missing).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Blob files already fsynced, with their length then, per blob directory
/// (those still present at the last sync). Shared by both entry points.
static SYNCED_BLOBS: Mutex<Option<HashMap<PathBuf, HashMap<OsString, u64>>>> = Mutex::new(None);

/// Set once sled's syncs are known to go through [`sync_sled_write`].
static SLED_SYNCS_INTERPOSED: AtomicBool = AtomicBool::new(false);

/// Blob directory of each open [`SledFiles`]' main file, by (device,
/// inode), so a sync needs no `readlink`. An entry lives exactly as long as
/// its `SledFiles` (which holds the file open), so an inode cannot be reused
/// by another file meanwhile.
static BLOB_DIRS: Mutex<Option<BlobDirs>> = Mutex::new(None);

/// Blob directory by the (device, inode) of the sled main file beside it.
type BlobDirs = HashMap<(u64, u64), PathBuf>;

fn blob_dirs() -> io::Result<std::sync::MutexGuard<'static, Option<BlobDirs>>> {
    BLOB_DIRS
        .lock()
        .map_err(|_| io::Error::other("blob directory registry lock poisoned"))
}

/// Handles on a sled database's files, for syncing them.
pub(crate) struct SledFiles {
    dir: PathBuf,
    db_file: File,
    /// Key of `db_file` in `BLOB_DIRS`.
    key: (u64, u64),
}

impl Drop for SledFiles {
    fn drop(&mut self) {
        if let Ok(mut dirs) = blob_dirs() {
            if let Some(dirs) = dirs.as_mut() {
                dirs.remove(&self.key);
            }
        }
    }
}

impl SledFiles {
    /// `dir` is the path sled was opened with; the database must be open.
    pub(crate) fn open(dir: &Path) -> io::Result<SledFiles> {
        let db_file = File::open(dir.join("db"))?;
        let meta = db_file.metadata()?;
        let key = (meta.dev(), meta.ino());
        blob_dirs()?
            .get_or_insert_with(HashMap::new)
            .insert(key, dir.join("blobs"));
        Ok(SledFiles {
            dir: dir.to_path_buf(),
            db_file,
            key,
        })
    }

    /// Everything sled wrote before this call is on disk when it returns Ok.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        if SLED_SYNCS_INTERPOSED.load(Ordering::Acquire) {
            return Ok(());
        }
        sync_blobs(&self.dir.join("blobs"))?;
        self.db_file.sync_data()
    }
}

/// sled's `sync_file_range(fd, ..)`, made durable: if `fd` is a sled main
/// file (named `db`), its blob files first, then `fdatasync(fd)`.
pub fn sync_sled_write(fd: std::os::unix::io::RawFd) -> io::Result<()> {
    use std::mem::ManuallyDrop;
    use std::os::unix::io::FromRawFd;
    // SAFETY: the caller (sled) keeps `fd` open for the whole call, and
    // `ManuallyDrop` means it is never closed here.
    let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    if let Some(blobs) = blob_dir_of(&file, fd)? {
        sync_blobs(&blobs)?;
    }
    file.sync_data()?;
    SLED_SYNCS_INTERPOSED.store(true, Ordering::Release);
    Ok(())
}

/// The blob directory beside `fd` if it is a sled main file (named `db`):
/// from the registry, or else (a database not yet handed to a `SledFiles`,
/// such as during sled's recovery at open) from the file's path.
fn blob_dir_of(file: &File, fd: std::os::unix::io::RawFd) -> io::Result<Option<PathBuf>> {
    let meta = file.metadata()?;
    if let Some(dir) = blob_dirs()?
        .as_ref()
        .and_then(|dirs| dirs.get(&(meta.dev(), meta.ino())))
    {
        return Ok(Some(dir.clone()));
    }
    Ok(std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .ok()
        .filter(|path| path.file_name().is_some_and(|n| n == "db"))
        .and_then(|path| path.parent().map(|dir| dir.join("blobs"))))
}

/// fsync every blob in `blobs` that is new or has grown since its last sync,
/// then the directory if any was.
fn sync_blobs(blobs: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(blobs) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut guard = SYNCED_BLOBS
        .lock()
        .map_err(|_| io::Error::other("blob sync lock poisoned"))?;
    let synced = guard
        .get_or_insert_with(HashMap::new)
        .entry(blobs.to_path_buf())
        .or_default();
    let mut present = HashMap::new();
    let mut synced_new = false;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let len = match entry.metadata() {
            Ok(m) => m.len(),
            // Removed by sled's blob GC meanwhile: nothing to keep.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if synced.get(&name) != Some(&len) {
            match File::open(blobs.join(&name)) {
                Ok(f) => f.sync_all()?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            synced_new = true;
        }
        present.insert(name, len);
    }
    *synced = present;
    if synced_new {
        File::open(blobs)?.sync_all()?;
    }
    Ok(())
}
