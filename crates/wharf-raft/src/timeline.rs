//! Timestamps of a write's way through a node, for finding where a sync
//! publish spends its time (docs/benchmarks-changes.md, "Where one sync
//! publish's time goes").
//!
//! Built only with the `timeline` cargo feature; without it [`mark`] is an
//! empty inline function and costs nothing. With it, and `WHARF_TIMELINE`
//! set to a path prefix, every call appends one line `<unix ns> <point>
//! <key>` to the file `<prefix>.<pid>` (one per process, so three nodes on
//! one machine write three files whose clocks agree). `bench/timeline/`
//! starts a cluster with it and merges the files.
//!
//! The points, in the order a publish passes them: `svc_recv` and
//! `svc_reply` (the `PublishStream` handler took a publish, sent its ack),
//! `write_start` and `write_done` (around the group's `client_write`),
//! `append_start` and `append_submit` (the log store inserting entries
//! into sled, then queueing their journal record; key: last index),
//! `send` (an append request encoded for a follower; key: its last index,
//! 0 when it carries no entries), `f_recv` and `f_answer` (a follower
//! decoded an append request, encoded its answer), `answer` (the leader
//! read a follower's answer), `sync_start` and `sync_end` (the flusher's
//! `fdatasync`; key: waiters covered), `apply` (the state machine took an
//! entry; key: its index).
//!
//! Invariants: never fails or blocks the caller on anything but the file's
//! mutex and a buffered write; an unwritable file turns marking off.
//!
//! Left out: rotation and bounds on the file's size (it is for runs of
//! seconds); the last buffered lines of a killed process are lost.

/// Record that this process reached `point` for `key` now.
#[cfg(not(feature = "timeline"))]
#[inline(always)]
pub fn mark(_point: &'static str, _key: u64) {}

/// Record that this process reached `point` for `key` now.
#[cfg(feature = "timeline")]
pub fn mark(point: &'static str, key: u64) {
    use std::io::Write;
    let Some(out) = recorder::get() else { return };
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    if let Ok(mut file) = out.lock() {
        // A failed write loses this line only; the run's numbers show gaps.
        let _ = writeln!(file, "{now_ns} {point} {key}");
    }
}

#[cfg(feature = "timeline")]
mod recorder {
    use std::fs::File;
    use std::io::BufWriter;
    use std::sync::{Mutex, OnceLock};

    /// The buffer before the file: a line is about 30 bytes, so the file is
    /// written every ~2,000 marks.
    const BUFFER_BYTES: usize = 64 * 1024;

    static OUT: OnceLock<Option<Mutex<BufWriter<File>>>> = OnceLock::new();

    /// The process's file, opened on first use; `None` when
    /// `WHARF_TIMELINE` is unset or the file cannot be created.
    pub(super) fn get() -> Option<&'static Mutex<BufWriter<File>>> {
        OUT.get_or_init(|| {
            let prefix = std::env::var("WHARF_TIMELINE").ok()?;
            let path = format!("{prefix}.{}", std::process::id());
            let file = File::create(path).ok()?;
            Some(Mutex::new(BufWriter::with_capacity(BUFFER_BYTES, file)))
        })
        .as_ref()
    }
}

#[cfg(all(test, feature = "timeline"))]
mod tests {
    #[test]
    fn marks_land_in_the_process_file() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("t");
        // Set before the first mark: the file is chosen once per process.
        std::env::set_var("WHARF_TIMELINE", &prefix);
        super::mark("svc_recv", 7);
        super::mark("apply", 8);
        let out = super::recorder::get().unwrap();
        std::io::Write::flush(&mut *out.lock().unwrap()).unwrap();
        let path = format!("{}.{}", prefix.display(), std::process::id());
        let text = std::fs::read_to_string(path).unwrap();
        let points: Vec<(&str, &str)> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                assert!(f[0].parse::<u128>().unwrap() > 0);
                (f[1], f[2])
            })
            .collect();
        assert_eq!(points, [("svc_recv", "7"), ("apply", "8")]);
    }
}
