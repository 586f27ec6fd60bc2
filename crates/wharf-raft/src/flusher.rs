//! Group commit: one thread per node that makes writes durable.
//!
//! Writers (log appends of every group, votes, snapshots, explicit
//! [`crate::RaftNode::flush`] calls) first apply their write to sled, then hand
//! a completion to the flusher over a bounded channel. The flusher takes
//! everything queued, calls `db.flush()` once and then fsyncs sled's files
//! if sled's own syncs are not fsyncs (`sled_files`), then completes all of
//! them in FIFO order.
//!
//! It is a dedicated thread, not a task: `flush_async` hands each flush to
//! sled's thread pool and back through a future, and the fsync of
//! `sled_files` went through `spawn_blocking`; each of those hand-offs is a
//! thread wake-up on the path of every commit, and on our 2-core machines a
//! wake-up is tens of microseconds (docs/BENCHMARKS.md, "Fewer hand-offs").
//!
//! Invariants:
//! - A completion is only ever signalled `Ok` after a flush that *started after*
//!   the write was applied (the write happened before the completion was queued,
//!   and the flush starts after it was dequeued). So `Ok` means "on disk".
//! - Completions are signalled in queue order, so per-group order holds.
//! - A failed flush fails every completion of that batch; nothing panics.
//! - On stop, whatever is still queued gets one last flush, then the thread
//!   ends and drops its `Db` handle; later submissions fail with an error.
//!
//! Not here: retrying failed flushes (a storage error stops the affected groups).

use std::io;
use std::path::Path;

use openraft::storage::IOFlushed;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::sled_files::SledFiles;
use crate::types::io_err;
use crate::types::TypeConfig;

/// Capacity of the completion queue; submitters wait when it is full.
const QUEUE_CAPACITY: usize = 4096;

/// One completion waiting for the next flush.
enum Waiter {
    /// An openraft log append.
    Log(IOFlushed<TypeConfig>),
    /// Anyone awaiting a flush (vote, snapshot, `RaftNode::flush`).
    Notify(oneshot::Sender<Result<(), String>>),
    /// Flush what is queued, then end the thread.
    Stop,
}

impl Waiter {
    fn complete(self, res: &Result<(), String>) {
        match self {
            Waiter::Log(cb) => cb.io_completed(res.clone().map_err(io_err)),
            Waiter::Notify(tx) => {
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
    /// Starts the flusher thread for `db`, opened at `dir`.
    pub(crate) fn spawn(db: sled::Db, dir: &Path) -> io::Result<(Flusher, FlusherTask)> {
        let files = SledFiles::open(dir)?;
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let (done_tx, done_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("wharf-flusher".into())
            .spawn(move || {
                run(&db, files, rx);
                drop(db);
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

    /// Waits until everything written before this call is on disk.
    pub(crate) async fn flush(&self) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Waiter::Notify(tx))
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

fn run(db: &sled::Db, mut files: SledFiles, mut rx: mpsc::Receiver<Waiter>) {
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
        flush_and_complete(db, &mut files, &mut batch);
    }
    // Stopping: refuse new work, then give what is queued one last flush.
    rx.close();
    while let Ok(w) = rx.try_recv() {
        batch.push(w);
    }
    if !batch.is_empty() {
        flush_and_complete(db, &mut files, &mut batch);
    }
    tracing::debug!("flusher stopped");
}

fn flush_and_complete(db: &sled::Db, files: &mut SledFiles, batch: &mut Vec<Waiter>) {
    let res = match db.flush() {
        // sled's flush is not an fsync (see `sled_files`): finish it.
        Ok(_) => files.sync().map_err(|e| format!("fsync: {e}")),
        Err(e) => Err(format!("flush: {e}")),
    };
    if let Err(e) = &res {
        tracing::error!(error = %e, "sled flush failed");
    }
    for w in batch.drain(..) {
        w.complete(&res);
    }
}

#[cfg(test)]
mod tests {
    use super::Flusher;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_waiters_all_complete_and_stop_refuses_more() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new()
            .path(dir.path().join("sled"))
            .open()
            .unwrap();
        let (flusher, mut task) = Flusher::spawn(db.clone(), &dir.path().join("sled")).unwrap();
        let tree = db.open_tree("t").unwrap();
        let waits = (0..200u32).map(|i| {
            let f = flusher.clone();
            let t = tree.clone();
            async move {
                t.insert(i.to_be_bytes(), &[1u8][..]).unwrap();
                f.flush().await
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
    }
}
