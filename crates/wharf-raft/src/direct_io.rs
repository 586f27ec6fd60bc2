//! Writing the journal around the page cache (`O_DIRECT`), in whole blocks.
//!
//! Why: each journal sync is a small write and an `fdatasync`. Written
//! through the page cache, the sync first has the kernel find and write
//! back the dirty page; written with `O_DIRECT`, the data goes to the device
//! in the `pwrite` itself and the `fdatasync` only flushes the device's
//! cache. On our 2-core VMs (virtio disk, write-back cache, no FUA), with
//! three writers at once as the three nodes of a cluster on one disk, a
//! direct write and sync took 172-197 us at the median against 178-238 for
//! a 400-byte write through the page cache (four interleaved rounds; level,
//! 110-139 against 108-145, with one writer alone:
//! `bench/fsync_probe.py --direct`,
//! bench/results/fsync-probe-20261207-direct.txt). The journal written this
//! way moved the batch-1 queues by 1.09-1.11x and async publishing by 1.12x
//! (bench/results/ab-20261207-direct-journal.txt).
//!
//! `O_DIRECT` wants the file offset, the length and the memory of every
//! write aligned to the device's logical block. [`AlignedBlocks`] is the
//! buffer for that: its memory starts on a [`BLOCK_BYTES`] boundary, and it
//! keeps the bytes of the last, partly filled block, so the next write can
//! start at that block's start and carry them again.
//!
//! Invariants: [`AlignedBlocks::fill`] hands out whole blocks whose memory
//! is aligned; the caller writes them at a block-aligned offset.
//!
//! Left out: devices whose logical block is larger than [`BLOCK_BYTES`] or
//! file systems without `O_DIRECT` (tmpfs before Linux 6.6): [`open_direct`] reports them,
//! and a write the kernel refuses as misaligned (`EINVAL`) is the caller's
//! cue to go on through the page cache (see `journal`). The same aligned
//! writes are correct there, only not direct.

use std::fs::File;
use std::io;
use std::path::Path;

/// The alignment of every direct write: offset, length and memory. 4 KiB
/// covers 512-byte and 4 KiB logical blocks.
pub(crate) const BLOCK_BYTES: usize = 4096;

/// Opens `path` (which exists) for direct reads and writes; `Ok(None)`
/// where the file system refuses `O_DIRECT`.
#[cfg(target_os = "linux")]
pub(crate) fn open_direct(path: &Path) -> io::Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => Ok(Some(file)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Elsewhere (no `O_DIRECT` flag, e.g. macOS) the journal goes through the
/// page cache.
#[cfg(not(target_os = "linux"))]
pub(crate) fn open_direct(_path: &Path) -> io::Result<Option<File>> {
    Ok(None)
}

/// Whether an error is the kernel refusing a direct write's alignment.
pub(crate) fn is_misaligned(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// Rounds `n` up to whole blocks.
pub(crate) fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK_BYTES as u64) * BLOCK_BYTES as u64
}

/// Rounds `n` down to whole blocks.
pub(crate) fn round_down(n: u64) -> u64 {
    n / BLOCK_BYTES as u64 * BLOCK_BYTES as u64
}

/// Largest buffer kept between writes; a burst past it is let go after.
const KEEP_MAX_BYTES: usize = 4 * 1024 * 1024;

/// A growable buffer whose usable part starts on a block boundary, holding
/// at its front the bytes of the file's last partial block (the tail).
#[derive(Default)]
pub(crate) struct AlignedBlocks {
    /// Over-allocated by one block; the usable part starts at `start`.
    raw: Vec<u8>,
    start: usize,
    /// Bytes at the front that are the file's last partial block.
    tail_len: usize,
    /// Bytes of data (tail included) the last [`Self::fill`] put in.
    filled: usize,
}

impl AlignedBlocks {
    /// A buffer of `bytes` zeros (rounded up to whole blocks), no tail.
    pub(crate) fn zeroed(bytes: usize) -> AlignedBlocks {
        let mut b = AlignedBlocks::default();
        b.reserve(bytes);
        b
    }

    /// Bytes at the front that are the file's last partial block.
    pub(crate) fn tail_len(&self) -> usize {
        self.tail_len
    }

    /// The first `bytes` (whole blocks) of a [`Self::zeroed`] buffer.
    pub(crate) fn zeros(&self, bytes: usize) -> &[u8] {
        &self.raw[self.start..self.start + bytes]
    }

    /// The first `bytes` (whole blocks), to read into: aligned memory, as a
    /// direct read wants. Clears the tail.
    pub(crate) fn read_buffer(&mut self, bytes: usize) -> &mut [u8] {
        self.reserve(bytes);
        self.tail_len = 0;
        self.filled = 0;
        let start = self.start;
        &mut self.raw[start..start + round_up(bytes as u64) as usize]
    }

    /// Sets the tail to `bytes` (shorter than a block), e.g. a file header.
    pub(crate) fn set_tail(&mut self, bytes: &[u8]) {
        let len = bytes.len().min(BLOCK_BYTES - 1);
        self.reserve(BLOCK_BYTES);
        let start = self.start;
        self.raw[start..start + len].copy_from_slice(&bytes[..len]);
        self.tail_len = len;
        self.filled = len;
    }

    /// The tail followed by `parts`, zero-padded to whole blocks: the bytes
    /// to write at the tail block's start.
    pub(crate) fn fill(&mut self, parts: &[&[u8]]) -> &[u8] {
        let data_len = self.tail_len + parts.iter().map(|p| p.len()).sum::<usize>();
        let total = round_up(data_len as u64) as usize;
        self.reserve(total);
        let start = self.start;
        let mut at = start + self.tail_len;
        for part in parts {
            self.raw[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        self.raw[at..start + total].fill(0);
        self.filled = data_len;
        &self.raw[start..start + total]
    }

    /// After the filled blocks were written: the last partial block of them
    /// becomes the tail (empty if they end on a boundary).
    pub(crate) fn keep_tail(&mut self) {
        let last_block = round_down(self.filled as u64) as usize;
        let start = self.start;
        self.raw
            .copy_within(start + last_block..start + self.filled, start);
        self.tail_len = self.filled - last_block;
        self.filled = self.tail_len;
        if self.raw.len() > KEEP_MAX_BYTES + BLOCK_BYTES {
            let tail = self.raw[start..start + self.tail_len].to_vec();
            *self = AlignedBlocks::default();
            self.set_tail(&tail);
        }
    }

    /// Makes sure the usable part holds at least `bytes` (whole blocks),
    /// keeping the tail.
    fn reserve(&mut self, bytes: usize) {
        let need = (round_up(bytes as u64) as usize).max(BLOCK_BYTES);
        if self.raw.len() >= self.start + need {
            return;
        }
        let mut raw = vec![0u8; need + BLOCK_BYTES];
        // Below the alignment for a byte pointer; were it not, the write
        // would be refused as misaligned and go through the page cache.
        let start = raw.as_ptr().align_offset(BLOCK_BYTES) % BLOCK_BYTES;
        if !self.raw.is_empty() {
            let tail = self.start..self.start + self.tail_len;
            raw[start..start + self.tail_len].copy_from_slice(&self.raw[tail]);
        }
        self.raw = raw;
        self.start = start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_whole_and_carry_the_tail() {
        let mut b = AlignedBlocks::default();
        b.set_tail(b"HEADER");
        let out = b.fill(&[b"abc", b"de"]).to_vec();
        assert_eq!(out.len(), BLOCK_BYTES);
        assert_eq!(&out[..11], b"HEADERabcde");
        assert!(out[11..].iter().all(|&x| x == 0));
        b.keep_tail();
        // A write past the block boundary: two blocks, the tail in front.
        let big = vec![7u8; BLOCK_BYTES];
        let ptr = b.fill(&[&big]).as_ptr() as usize;
        assert_eq!(ptr % BLOCK_BYTES, 0, "memory aligned");
        let out = b.fill(&[&big]).to_vec();
        assert_eq!(out.len(), 2 * BLOCK_BYTES);
        assert_eq!(&out[..11], b"HEADERabcde");
        assert!(out[11..11 + BLOCK_BYTES].iter().all(|&x| x == 7));
        b.keep_tail();
        // The tail is now the 11 bytes that spilled into the second block.
        let out = b.fill(&[b"z"]).to_vec();
        assert_eq!(out.len(), BLOCK_BYTES);
        assert_eq!(
            &out[..12],
            &[7u8; 11].iter().chain(b"z").copied().collect::<Vec<_>>()[..]
        );
    }

    #[test]
    fn a_write_ending_on_a_boundary_leaves_no_tail() {
        let mut b = AlignedBlocks::default();
        b.set_tail(&[1u8; 100]);
        b.fill(&[&vec![2u8; BLOCK_BYTES - 100]]);
        b.keep_tail();
        assert_eq!(b.fill(&[]).len(), 0);
    }

    #[test]
    fn a_burst_is_let_go_but_its_tail_kept() {
        let mut b = AlignedBlocks::default();
        b.fill(&[&vec![3u8; KEEP_MAX_BYTES + 10]]);
        b.keep_tail();
        assert!(b.raw.len() <= 2 * BLOCK_BYTES);
        assert_eq!(&b.fill(&[])[..10], &[3u8; 10]);
    }
}
