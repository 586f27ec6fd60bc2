//! Makes sled's flush an fsync.
//!
//! On Linux sled 0.34 ends a flush with `sync_file_range` over the bytes it
//! wrote: that writes the pages, but neither the file's metadata (its size,
//! which grows as segments are added) nor the drive's write cache, and it
//! never syncs blob files (values too large for a segment, such as a big
//! batch of publishes). Its own `fsync` runs only every `flush_every_ms`
//! (500 ms). So a power cut can lose writes that `flush_async` reported
//! done; the simulated power loss test (`tests/tests/power_loss.rs`) showed
//! acknowledged publishes lost on every node.
//!
//! [`SledFiles::sync`] runs after each `flush_async`: it `fdatasync`s the main
//! file, and `fsync`s every blob file that is new or has grown since it was
//! last synced (sled may still be writing a blob of a later, unflushed write
//! while this runs), and then the blob directory. Only after it returns does
//! the flusher report writes durable.
//!
//! Left out: sled's `conf` and snapshot files (sled fsyncs its snapshots; the
//! `conf` file is rewritten at open when missing).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Handles on a sled database's files, for syncing them.
pub(crate) struct SledFiles {
    dir: PathBuf,
    db_file: File,
    /// Blob files already fsynced, with their length then (those still
    /// present at the last sync).
    synced_blobs: HashMap<OsString, u64>,
}

impl SledFiles {
    /// `dir` is the path sled was opened with; the database must be open.
    pub(crate) fn open(dir: &Path) -> io::Result<SledFiles> {
        Ok(SledFiles {
            dir: dir.to_path_buf(),
            db_file: File::open(dir.join("db"))?,
            synced_blobs: HashMap::new(),
        })
    }

    /// Everything sled wrote before this call is on disk when it returns Ok.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.db_file.sync_data()?;
        let blobs = self.dir.join("blobs");
        let entries = match std::fs::read_dir(&blobs) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
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
            if self.synced_blobs.get(&name) != Some(&len) {
                match File::open(blobs.join(&name)) {
                    Ok(f) => f.sync_all()?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                synced_new = true;
            }
            present.insert(name, len);
        }
        self.synced_blobs = present;
        if synced_new {
            File::open(&blobs)?.sync_all()?;
        }
        Ok(())
    }
}
