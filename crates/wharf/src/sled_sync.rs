//! Makes sled's `sync_file_range` an `fdatasync` (docs/RELIABILITY.md,
//! bug 6).
//!
//! sled 0.34 writes each of its IO buffers with `pwrite` followed by
//! `sync_file_range`, and from then on treats that part of its log as stable:
//! it may relocate pages and reuse the segments they came from. But
//! `sync_file_range` neither flushes the disk's write cache nor writes file
//! metadata, so after a power cut the relocated pages can be gone while the
//! reuse is not. In a chaos run with simulated power loss a node's sled then
//! recovered a tree whose forward scan stopped early and whose deleted keys
//! came back. Wharf's own flusher already follows every flush with an
//! `fdatasync` (`wharf_raft::sled_files`), but sled also writes a buffer as
//! soon as it fills, and syncs it the same way.
//!
//! This symbol, defined in the executable, is the one sled's call binds to
//! at link time (a definition in the program wins over the shared libc's), so
//! every sync sled makes is a real `fdatasync` of the whole file, after the
//! blob files it may point to (`wharf_raft::sync_sled_write`). The range and
//! flags are ignored: a whole-file data sync covers any range.
//!
//! Left out: other platforms (sled calls `fsync` there already).

#[cfg(target_os = "linux")]
#[no_mangle]
pub extern "C" fn sync_file_range(fd: i32, _offset: i64, _nbytes: i64, _flags: u32) -> i32 {
    match wharf_raft::sync_sled_write(fd) {
        Ok(()) => 0,
        // errno is still the one the failed sync set; sled reads it on -1.
        Err(_) => -1,
    }
}
