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
//! (docs/BENCHMARKS.md, "What I would change next", item 3).
//!
//! For the same reason a log store may sync in its own task instead
//! ([`Flusher::try_sync_inline`]): a follower's append, which the follower
//! answers only once it is durable, when the journal is idle: nothing
//! queued or syncing, and no sync ended within the last sync's time (a
//! moving average). That takes two wake-ups (to this thread and back) off
//! the commit of a lone write, as under sync publishing. Where syncs follow
//! each other back to back (pipelined publishes), appends keep going to
//! the thread, which syncs those that arrive together once. Appends a
//! little apart (several workers' acks) can still sync in their own task,
//! and one that arrives meanwhile then waits for that sync instead of
//! sharing the next: about 9% more syncs on the batch-1 queues
//! (docs/benchmarks-changes.md, "A follower's sync in its own task"). A leader's
//! appends always go to the thread: openraft starts replicating an entry
//! only after its append returns.
//!
//! Invariants:
//! - A completion is only ever signalled `Ok` after a sync that *started
//!   after* the write was made (the write and its journal record come before
//!   the completion is queued, and the buffer is taken after it is
//!   dequeued). So `Ok` means "on disk"; for [`Flusher::flush`] it means "in
//!   sled's files", not only in the journal.
//! - Completions are signalled in queue order, so per-group order holds. An
//!   inline sync happens only when every completion submitted before it has
//!   been signalled (none queued or in a batch), so it keeps that order.
//! - A failed write or sync fails every completion of that batch; nothing
//!   panics.
//! - On stop, whatever is still queued gets one last checkpoint, then the
//!   thread ends and drops its `Db` handle; later submissions fail with an
//!   error.
//!
//! Not here: retrying failed syncs (a storage error stops the affected groups).

use std::io;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::MutexGuard;
use std::time::Instant;

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

/// What the flusher thread and inline syncs share.
struct Shared {
    /// The journal and sled files; `None` once the thread has stopped (so
    /// a handle left over never keeps the node's `Db` open).
    io: Mutex<Option<FlushIo>>,
    /// Completions submitted and not yet signalled (queued, or in the
    /// thread's current batch).
    in_flight: AtomicUsize,
    /// When the last sync ended, in microseconds since `epoch`.
    last_sync_end_us: AtomicU64,
    /// Moving average of a sync's duration, in microseconds.
    sync_avg_us: AtomicU64,
    epoch: Instant,
}

impl Shared {
    /// The lock, also after a panic elsewhere (what it guards stays
    /// consistent: a sync either happened or failed).
    fn lock(&self) -> MutexGuard<'_, Option<FlushIo>> {
        self.io
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Records a sync that started at `started_us` and just ended. A
    /// checkpoint (`journal_only` false) takes milliseconds: it marks the
    /// end, but stays out of the average of a journal sync.
    fn sync_ended(&self, started_us: u64, journal_only: bool) {
        let end = self.now_us();
        if journal_only {
            let took = end.saturating_sub(started_us);
            let avg = self.sync_avg_us.load(Ordering::Relaxed);
            // Weight 1/8 for the newest: one odd sync moves it little.
            let avg = if avg == 0 { took } else { (avg * 7 + took) / 8 };
            self.sync_avg_us.store(avg, Ordering::Relaxed);
        }
        self.last_sync_end_us.store(end, Ordering::Release);
    }

    /// No sync ended within the last average sync's time: a write now is
    /// alone, and nothing would share the thread's sync with it.
    fn journal_idle(&self) -> bool {
        let since = self
            .now_us()
            .saturating_sub(self.last_sync_end_us.load(Ordering::Acquire));
        since >= self.sync_avg_us.load(Ordering::Relaxed)
    }
}

/// Cheap handle for submitting completions to the node's flusher.
#[derive(Clone)]
pub(crate) struct Flusher {
    tx: mpsc::Sender<Waiter>,
    shared: Arc<Shared>,
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
        let shared = Arc::new(Shared {
            io: Mutex::new(Some(io)),
            in_flight: AtomicUsize::new(0),
            last_sync_end_us: AtomicU64::new(0),
            sync_avg_us: AtomicU64::new(0),
            epoch: Instant::now(),
        });
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let (done_tx, done_rx) = oneshot::channel();
        let thread_shared = shared.clone();
        std::thread::Builder::new()
            .name("wharf-flusher".into())
            .spawn(move || {
                run(&thread_shared, rx);
                drop(thread_shared.lock().take());
                let _ = done_tx.send(());
            })?;
        Ok((
            Flusher {
                tx: tx.clone(),
                shared,
            },
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
        match self.send(Waiter::Log(cb)).await {
            Ok(()) => Ok(()),
            Err(w) => {
                let res = Err("flusher stopped".to_string());
                w.complete(&res);
                Err(io_err("flusher stopped"))
            }
        }
    }

    /// Writes and syncs the journal in the calling thread, if the journal
    /// is idle: nothing queued or being synced, no sync ended within the
    /// last average sync's time, no checkpoint due, not stopped. `None`
    /// when it is not (then submit instead). Blocks for one journal sync;
    /// everything recorded before the call is on disk once it returns
    /// `Some(Ok(()))`.
    pub(crate) fn try_sync_inline(&self) -> Option<io::Result<()>> {
        let mut guard = match self.shared.io.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        // Read under the lock: the thread signals a batch and counts it
        // done before it lets go, so 0 here means no earlier completion of
        // any group is still waiting.
        if self.shared.in_flight.load(Ordering::Acquire) != 0 || !self.shared.journal_idle() {
            return None;
        }
        let io = guard.as_mut()?;
        if io.journal.wants_checkpoint() {
            return None;
        }
        crate::timeline::mark("sync_start", 0);
        let started_us = self.shared.now_us();
        let res = io.sync_journal();
        self.shared.sync_ended(started_us, true);
        crate::timeline::mark("sync_end", 0);
        if let Err(e) = &res {
            tracing::error!(error = %e, "inline journal sync failed");
        }
        Some(res.map_err(io_err))
    }

    /// Queues `waiter`, counted in flight until the thread signals it.
    /// Gives it back if the thread is gone.
    async fn send(&self, waiter: Waiter) -> Result<(), Waiter> {
        self.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        match self.tx.send(waiter).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError(w)) => {
                self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
                Err(w)
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
        self.send(waiter(tx))
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

fn run(shared: &Shared, mut rx: mpsc::Receiver<Waiter>) {
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
        sync_and_complete(shared, &mut batch);
    }
    // Stopping: refuse new work, then give what is queued one last checkpoint.
    rx.close();
    while let Ok(w) = rx.try_recv() {
        batch.push(w);
    }
    if !batch.is_empty() {
        batch.push(Waiter::Stop);
        sync_and_complete(shared, &mut batch);
    }
    tracing::debug!("flusher stopped");
}

/// Syncs for `batch` and signals it, all under the lock (an inline sync
/// must not start between the two: see `Flusher::try_sync_inline`).
fn sync_and_complete(shared: &Shared, batch: &mut Vec<Waiter>) {
    let mut guard = shared.lock();
    let wants_db = batch
        .iter()
        .any(|w| matches!(w, Waiter::Db(_) | Waiter::Stop));
    crate::timeline::mark("sync_start", batch.len() as u64);
    let started_us = shared.now_us();
    let checkpoint = wants_db
        || guard
            .as_ref()
            .is_some_and(|io| io.journal.wants_checkpoint());
    let res = match guard.as_mut() {
        Some(io) if checkpoint => io.checkpoint(),
        Some(io) => io.sync_journal(),
        None => Err("flusher stopped".to_string()),
    };
    shared.sync_ended(started_us, !checkpoint);
    if let Err(e) = &res {
        tracing::error!(error = %e, "flush failed");
    }
    crate::timeline::mark("sync_end", batch.len() as u64);
    // Every waiter but Stop came through `Flusher::send`, which counted it.
    let signalled = batch.iter().filter(|w| !matches!(w, Waiter::Stop)).count();
    for w in batch.drain(..) {
        w.complete(&res);
    }
    shared.in_flight.fetch_sub(signalled, Ordering::AcqRel);
    drop(guard);
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

    fn replayed_records(dir: &std::path::Path, journal: &std::path::Path, name: &str) -> u64 {
        let db = sled::Config::new().path(dir.join(name)).open().unwrap();
        crate::journal::replay(journal, &db).unwrap().records
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inline_sync_only_when_nothing_else_waits() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let sled_dir = dir.path().join("sled");
        let db = sled::Config::new().path(&sled_dir).open().unwrap();
        let (flusher, mut task, buffer) = Flusher::spawn_for_tests(db, &sled_dir).unwrap();
        let journal_path = sled_dir.with_extension("journal");

        // Idle: the caller syncs, and the record is in the file at once.
        // (Spawning checkpointed: wait out that sync's time first.)
        while !flusher.shared.journal_idle() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        buffer.push(&Record::DropGroup { group: 7 }).unwrap();
        flusher
            .try_sync_inline()
            .expect("an idle flusher lets the caller sync")
            .expect("synced");
        assert_eq!(replayed_records(dir.path(), &journal_path, "r1"), 1);

        // A completion still waiting (queued or in the thread's batch):
        // the caller must queue behind it, or it would be signalled first.
        flusher.shared.in_flight.fetch_add(1, Ordering::AcqRel);
        assert!(flusher.try_sync_inline().is_none());
        flusher.shared.in_flight.fetch_sub(1, Ordering::AcqRel);

        // The thread (or another caller) syncing: no second sync at once.
        {
            let _busy = flusher.shared.io.lock().unwrap();
            assert!(flusher.try_sync_inline().is_none());
        }

        // A sync that just ended: writes are following each other, and the
        // thread's group commit serves them better.
        flusher
            .shared
            .sync_avg_us
            .store(60_000_000, Ordering::Relaxed);
        flusher.shared.sync_ended(flusher.shared.now_us(), true);
        flusher
            .shared
            .sync_avg_us
            .store(60_000_000, Ordering::Relaxed);
        assert!(!flusher.shared.journal_idle());
        assert!(flusher.try_sync_inline().is_none());
        flusher.shared.sync_avg_us.store(0, Ordering::Relaxed);
        assert!(flusher.shared.journal_idle());

        // A checkpoint, however long, marks the end but not the average.
        flusher.shared.sync_avg_us.store(150, Ordering::Relaxed);
        flusher.shared.sync_ended(0, false);
        assert_eq!(flusher.shared.sync_avg_us.load(Ordering::Relaxed), 150);
        flusher.shared.sync_avg_us.store(0, Ordering::Relaxed);

        // Queued work is counted until the thread has signalled it. The
        // thread signals, then counts, both under the lock: read it there.
        buffer.push(&Record::DropGroup { group: 8 }).unwrap();
        flusher.sync_journal().await.expect("synced by the thread");
        let settled = |f: &Flusher| {
            let _io = f.shared.lock();
            f.shared.in_flight.load(Ordering::Acquire)
        };
        assert_eq!(settled(&flusher), 0);
        assert_eq!(replayed_records(dir.path(), &journal_path, "r2"), 2);

        // Stopped: the journal is gone from the shared state.
        task.stop().await;
        assert!(flusher.try_sync_inline().is_none());
        assert!(flusher.sync_journal().await.is_err());
        assert_eq!(settled(&flusher), 0);
    }
}
