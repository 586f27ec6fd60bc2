//! Group commit: one thread per node that makes writes durable.
//!
//! Log stores write to sled and append a record to the node's journal
//! buffer (`journal`), then hand a completion to the flusher over a bounded
//! channel. The flusher takes everything queued, writes the journal buffer
//! to the journal file and `fdatasync`s it once, then completes all of them
//! in FIFO order. A completion that asks for all of sled to be durable
//! (snapshots, dropped groups, `RaftNode::flush`, shutdown), or a journal
//! grown past its limit, makes it checkpoint as well: flush sled, fsync
//! sled's files if sled's own syncs are not fsyncs (`sled_files`), and empty
//! the journal.
//!
//! It is a dedicated thread, not a task: each hand-off to another thread
//! (a thread pool, `spawn_blocking`) is a wake-up on the path of every
//! commit, and on our 2-core machines a wake-up is tens of microseconds
//! (docs/BENCHMARKS.md, "Fewer hand-offs").
//!
//! Invariants:
//! - A completion is only ever signalled `Ok` after a sync that *started
//!   after* the write was made (the write and its journal record come before
//!   the completion is queued, and the buffer is taken after it is
//!   dequeued). So `Ok` means "on disk"; for [`Flusher::flush`] it means "in
//!   sled's files", not only in the journal.
//! - Completions are signalled in queue order, so per-group order holds.
//! - A failed write or sync fails every completion of that batch; nothing
//!   panics.
//! - On stop, whatever is still queued gets one last checkpoint, then the
//!   thread ends and drops its `Db` handle; later submissions fail with an
//!   error.
//!
//! Not here: retrying failed syncs (a storage error stops the affected groups).

use std::io;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::IOFlushed;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::journal::JournalBuffer;
use crate::journal::JournalFile;
use crate::sled_files::SledFiles;
use crate::types::io_err;
use crate::types::TypeConfig;

/// Capacity of the completion queue; submitters wait when it is full.
const QUEUE_CAPACITY: usize = 4096;
/// A checkpoint this long is logged as a warning (others at debug level).
const SLOW_CHECKPOINT: std::time::Duration = std::time::Duration::from_millis(100);
/// Largest journal buffer kept for reuse between syncs.
const SPARE_BUFFER_MAX_BYTES: usize = 4 * 1024 * 1024;

/// One completion waiting for the next flush.
enum Waiter {
    /// An openraft log append: durable once its journal record is.
    Log(IOFlushed<TypeConfig>),
    /// Anyone awaiting the journal's sync (a vote, a truncation).
    Journal(oneshot::Sender<Result<(), String>>),
    /// Anyone awaiting a checkpoint: all of sled durable.
    Db(oneshot::Sender<Result<(), String>>),
    /// Checkpoint what is queued, then end the thread.
    Stop,
}

impl Waiter {
    fn complete(self, res: &Result<(), String>) {
        match self {
            Waiter::Log(cb) => cb.io_completed(res.clone().map_err(io_err)),
            Waiter::Journal(tx) | Waiter::Db(tx) => {
                // The waiter may have given up; nothing to do then.
                let _ = tx.send(res.clone());
            }
            Waiter::Stop => {}
        }
    }
}

/// Cheap handle for submitting completions to the node's flusher.
#[derive(Clone)]
pub(crate) struct Flusher {
    tx: mpsc::Sender<Waiter>,
}

/// Owned by the node: stops the flusher thread and waits for it.
pub(crate) struct FlusherTask {
    tx: mpsc::Sender<Waiter>,
    /// Answers once the thread has ended and dropped its `Db`.
    done: Option<oneshot::Receiver<()>>,
}

impl Flusher {
    /// Starts the flusher thread for `db`, opened at `dir`, with `journal`
    /// (already replayed into `db`): first, synchronously, a checkpoint, so
    /// what was replayed is in sled's files and the journal starts empty.
    pub(crate) fn spawn(
        db: sled::Db,
        dir: &Path,
        buffer: Arc<JournalBuffer>,
        journal: JournalFile,
    ) -> io::Result<(Flusher, FlusherTask)> {
        let files = SledFiles::open(dir)?;
        let mut io = FlushIo {
            db,
            files,
            buffer,
            journal,
            spare: Vec::new(),
        };
        io.checkpoint().map_err(io_err)?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let (done_tx, done_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("wharf-flusher".into())
            .spawn(move || {
                run(&mut io, rx);
                drop(io);
                let _ = done_tx.send(());
            })?;
        Ok((
            Flusher { tx: tx.clone() },
            FlusherTask {
                tx,
                done: Some(done_rx),
            },
        ))
    }

    /// For tests: a flusher for `db` at `dir` with a fresh journal beside it.
    #[cfg(test)]
    pub(crate) fn spawn_for_tests(
        db: sled::Db,
        dir: &Path,
    ) -> io::Result<(Flusher, FlusherTask, Arc<JournalBuffer>)> {
        let buffer = Arc::new(JournalBuffer::default());
        let journal = JournalFile::open(&dir.with_extension("journal"))?;
        let (flusher, task) = Flusher::spawn(db, dir, buffer.clone(), journal)?;
        Ok((flusher, task, buffer))
    }

    /// Queues an append's callback; it is completed after the next flush.
    /// If the flusher is gone, the callback is failed and an error returned.
    pub(crate) async fn submit_log(&self, cb: IOFlushed<TypeConfig>) -> io::Result<()> {
        match self.tx.send(Waiter::Log(cb)).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError(w)) => {
                let res = Err("flusher stopped".to_string());
                w.complete(&res);
                Err(io_err("flusher stopped"))
            }
        }
    }

    /// Waits until every journal record written before this call is on
    /// disk (a vote, a truncation).
    pub(crate) async fn sync_journal(&self) -> io::Result<()> {
        self.wait(Waiter::Journal).await
    }

    /// Waits until everything written to sled before this call is in sled's
    /// own files (a checkpoint), whatever tree it went to.
    pub(crate) async fn flush(&self) -> io::Result<()> {
        self.wait(Waiter::Db).await
    }

    async fn wait(
        &self,
        waiter: fn(oneshot::Sender<Result<(), String>>) -> Waiter,
    ) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(waiter(tx))
            .await
            .map_err(|_| io_err("flusher stopped"))?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(io_err(e)),
            Err(_) => Err(io_err("flusher stopped before completing")),
        }
    }
}

impl FlusherTask {
    /// Flushes what is queued, stops the thread and waits until it has
    /// dropped its database handle. Idempotent.
    pub(crate) async fn stop(&mut self) {
        let Some(done) = self.done.take() else {
            return;
        };
        // A send error means the thread is already gone.
        let _ = self.tx.send(Waiter::Stop).await;
        if done.await.is_err() {
            tracing::error!("flusher thread ended without reporting");
        }
    }
}

/// What the flusher thread owns.
struct FlushIo {
    db: sled::Db,
    files: SledFiles,
    buffer: Arc<JournalBuffer>,
    journal: JournalFile,
    /// The buffer handed back to `buffer` at the next take (no reallocation).
    spare: Vec<u8>,
}

impl FlushIo {
    /// Writes and syncs what the journal buffer holds.
    fn sync_journal(&mut self) -> Result<(), String> {
        let spare = std::mem::take(&mut self.spare);
        let bytes = self
            .buffer
            .take(spare)
            .map_err(|e| format!("journal: {e}"))?;
        let res = self
            .journal
            .write_and_sync(&bytes)
            .map_err(|e| format!("journal {}: {e}", self.journal.path().display()));
        // Keep the buffer for the next take, unless a burst made it large.
        self.spare = if bytes.capacity() > SPARE_BUFFER_MAX_BYTES {
            Vec::new()
        } else {
            bytes
        };
        res
    }

    /// Syncs the journal, then makes all of sled durable and empties the
    /// journal (everything in it is then in sled's files).
    fn checkpoint(&mut self) -> Result<(), String> {
        let started = std::time::Instant::now();
        self.sync_journal()?;
        let journal_bytes = self.journal.len_bytes();
        let synced = started.elapsed();
        let flushed_bytes = self.db.flush().map_err(|e| format!("flush: {e}"))?;
        let flushed = started.elapsed();
        // sled's flush is not an fsync (see `sled_files`): finish it.
        self.files.sync().map_err(|e| format!("fsync: {e}"))?;
        let res = self
            .journal
            .clear()
            .map_err(|e| format!("journal {}: {e}", self.journal.path().display()));
        let total = started.elapsed();
        tracing::debug!(
            journal_bytes,
            flushed_bytes,
            journal_sync_us = synced.as_micros() as u64,
            sled_flush_us = (flushed - synced).as_micros() as u64,
            total_us = total.as_micros() as u64,
            "checkpoint"
        );
        if total >= SLOW_CHECKPOINT {
            // Every commit of the node waited behind it.
            tracing::warn!(
                total_ms = total.as_millis() as u64,
                journal_bytes,
                "slow checkpoint: this node's commits waited for it"
            );
        }
        res
    }
}

fn run(io: &mut FlushIo, mut rx: mpsc::Receiver<Waiter>) {
    let mut batch: Vec<Waiter> = Vec::new();
    let mut stopping = false;
    while !stopping {
        let Some(first) = rx.blocking_recv() else {
            break;
        };
        stopping = matches!(first, Waiter::Stop);
        batch.push(first);
        while let Ok(w) = rx.try_recv() {
            stopping |= matches!(w, Waiter::Stop);
            batch.push(w);
        }
        sync_and_complete(io, &mut batch);
    }
    // Stopping: refuse new work, then give what is queued one last checkpoint.
    rx.close();
    while let Ok(w) = rx.try_recv() {
        batch.push(w);
    }
    if !batch.is_empty() {
        batch.push(Waiter::Stop);
        sync_and_complete(io, &mut batch);
    }
    tracing::debug!("flusher stopped");
}

fn sync_and_complete(io: &mut FlushIo, batch: &mut Vec<Waiter>) {
    let wants_db = batch
        .iter()
        .any(|w| matches!(w, Waiter::Db(_) | Waiter::Stop));
    crate::timeline::mark("sync_start", batch.len() as u64);
    let res = if wants_db || io.journal.wants_checkpoint() {
        io.checkpoint()
    } else {
        io.sync_journal()
    };
    if let Err(e) = &res {
        tracing::error!(error = %e, "flush failed");
    }
    crate::timeline::mark("sync_end", batch.len() as u64);
    for w in batch.drain(..) {
        w.complete(&res);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::Flusher;
    use crate::journal::JournalBuffer;
    use crate::journal::JournalFile;
    use crate::journal::Record;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_waiters_all_complete_and_stop_refuses_more() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new()
            .path(dir.path().join("sled"))
            .open()
            .unwrap();
        let buffer = Arc::new(JournalBuffer::default());
        let journal_path = dir.path().join("journal");
        let journal = JournalFile::open(&journal_path).unwrap();
        let (flusher, mut task) = Flusher::spawn(
            db.clone(),
            &dir.path().join("sled"),
            buffer.clone(),
            journal,
        )
        .unwrap();
        let tree = db.open_tree("t").unwrap();
        let waits = (0..200u32).map(|i| {
            let f = flusher.clone();
            let t = tree.clone();
            let b = buffer.clone();
            async move {
                t.insert(i.to_be_bytes(), &[1u8][..]).unwrap();
                b.push(&Record::DropGroup { group: i.into() }).unwrap();
                if i % 2 == 0 {
                    f.sync_journal().await
                } else {
                    f.flush().await
                }
            }
        });
        for r in futures::future::join_all(waits).await {
            r.expect("flushed");
        }
        task.stop().await;
        assert!(
            flusher.flush().await.is_err(),
            "a stopped flusher refuses work"
        );
        task.stop().await; // idempotent
        let replay_db = sled::Config::new()
            .path(dir.path().join("replay"))
            .open()
            .unwrap();
        assert_eq!(
            crate::journal::replay(&journal_path, &replay_db)
                .unwrap()
                .records,
            0,
            "the last checkpoint emptied the journal"
        );
    }
}
