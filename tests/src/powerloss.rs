//! Simulated power loss: what a node's disk holds after a power cut.
//!
//! Nodes of a cluster started with [`crate::Cluster::start_simulating_power_loss`]
//! run with the LD_PRELOAD library built from `tests/powerloss/powerloss.c`:
//! it keeps, beside the node's data dir, a shadow copy of every file as it
//! would be after a power cut (only what was fsynced or fdatasynced). [`cut`]
//! applies that to the real files after the process was killed: each file
//! becomes its shadow, and a file never synced disappears.
//!
//! Limits of the model: it follows one process's own writes and syncs (the
//! server's); renames and unlinks count as durable at once; the disk's
//! write cache is assumed honest about fsync.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The shim, built by `tests/build.rs`.
pub fn library() -> &'static str {
    env!("WHARF_POWERLOSS_SO")
}

/// Where the durable image of `data` is kept.
pub fn shadow_dir(data: &Path) -> PathBuf {
    data.with_extension("durable")
}

/// Environment for a process whose files under `data` are to be followed.
pub fn env_for(data: &Path) -> Vec<(&'static str, OsString)> {
    vec![
        ("LD_PRELOAD", OsString::from(library())),
        ("WHARF_POWERLOSS_DIR", data.as_os_str().to_owned()),
        ("WHARF_POWERLOSS_SHADOW", shadow_dir(data).into_os_string()),
    ]
}

/// What a power cut changed on one node's disk (paths relative to it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Cut {
    /// Files whose content went back to what was last synced.
    pub rolled_back: Vec<PathBuf>,
    /// Files never synced, now gone.
    pub dropped: Vec<PathBuf>,
    /// How many files were fully synced.
    pub intact: usize,
}

/// Replace every file under `data` by its durable image. The process
/// writing them must be dead.
pub fn cut(data: &Path) -> Result<Cut> {
    let shadow = shadow_dir(data);
    let mut out = Cut::default();
    let mut dirs = vec![data.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let path = entry?.path();
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                dirs.push(path);
                continue;
            }
            if !meta.is_file() {
                continue;
            }
            let rel = path.strip_prefix(data)?;
            let durable = shadow.join(rel);
            if !durable.exists() {
                std::fs::remove_file(&path)?;
                out.dropped.push(rel.to_path_buf());
                continue;
            }
            let (now, then) = (std::fs::read(&path)?, std::fs::read(&durable)?);
            if now == then {
                out.intact += 1;
            } else {
                std::fs::write(&path, &then)?;
                out.rolled_back.push(rel.to_path_buf());
            }
        }
    }
    Ok(out)
}
