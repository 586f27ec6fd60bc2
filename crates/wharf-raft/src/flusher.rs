//! Group commit: one background task per node that makes writes durable.
//!
//! Writers (log appends of every group, votes, snapshots, explicit
//! [`crate::RaftNode::flush`] calls) first apply their write to sled, then hand
//! a completion to the flusher over a bounded channel. The flusher takes
//! everything queued, calls `db.flush_async()` once and then fsyncs sled's
//! files (`sled_files`: sled's flush alone is not an fsync), then completes
//! all of them in FIFO order.
//!
//! Invariants:
//! - A completion is only ever signalled `Ok` after a flush that *started after*
//!   the write was applied (the write happened before the completion was queued,
//!   and the flush starts after it was dequeued). So `Ok` means "on disk".
//! - Completions are signalled in queue order, so per-group order holds.
//! - A failed flush fails every completion of that batch; nothing panics.
//! - On stop, whatever is still queued gets one last flush, then the task ends
//!   and drops its `Db` handle; later submissions fail with an error.
//!
//! Not here: retrying failed flushes (a storage error stops the affected groups).

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::Mutex;

use openraft::storage::IOFlushed;
use tokio::sync::mpsc;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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
}

impl Waiter {
    fn complete(self, res: &Result<(), String>) {
        match self {
            Waiter::Log(cb) => cb.io_completed(res.clone().map_err(io_err)),
            Waiter::Notify(tx) => {
                // The waiter may have given up; nothing to do then.
                let _ = tx.send(res.clone());
            }
        }
    }
}

/// Cheap handle for submitting completions to the node's flusher.
#[derive(Clone)]
pub(crate) struct Flusher {
    tx: mpsc::Sender<Waiter>,
}

/// Owned by the node: stops the flusher task and waits for it.
pub(crate) struct FlusherTask {
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts the flusher task for `db`, opened at `dir`, on the current
    /// tokio runtime.
    pub(crate) fn spawn(db: sled::Db, dir: &Path) -> io::Result<(Flusher, FlusherTask)> {
        let files = Arc::new(Mutex::new(SledFiles::open(dir)?));
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let (stop_tx, stop_rx) = oneshot::channel();
        let join = tokio::spawn(run(db, files, rx, stop_rx));
        Ok((
            Flusher { tx },
            FlusherTask {
                stop: Some(stop_tx),
                join: Some(join),
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
    /// Flushes what is queued, stops the task and waits until it has dropped
    /// its database handle. Idempotent.
    pub(crate) async fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(join) = self.join.take() {
            if let Err(e) = join.await {
                tracing::error!(error = %e, "flusher task failed");
            }
        }
    }
}

async fn run(
    db: sled::Db,
    files: Arc<Mutex<SledFiles>>,
    mut rx: mpsc::Receiver<Waiter>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut batch: Vec<Waiter> = Vec::new();
    loop {
        let first = tokio::select! {
            biased;
            _ = &mut stop => break,
            w = rx.recv() => match w {
                Some(w) => w,
                None => break,
            },
        };
        batch.push(first);
        while let Ok(w) = rx.try_recv() {
            batch.push(w);
        }
        flush_and_complete(&db, &files, &mut batch).await;
    }
    // Stopping: refuse new work, then give what is queued one last flush.
    rx.close();
    while let Ok(w) = rx.try_recv() {
        batch.push(w);
    }
    if !batch.is_empty() {
        flush_and_complete(&db, &files, &mut batch).await;
    }
    tracing::debug!("flusher stopped");
}

async fn flush_and_complete(db: &sled::Db, files: &Arc<Mutex<SledFiles>>, batch: &mut Vec<Waiter>) {
    let res = match db.flush_async().await {
        // sled's flush is not an fsync (see `sled_files`): finish it.
        Ok(_) => {
            let files = files.clone();
            let synced = tokio::task::spawn_blocking(move || match files.lock() {
                Ok(mut f) => f.sync().map_err(|e| format!("fsync: {e}")),
                Err(_) => Err("sled files lock poisoned".to_string()),
            })
            .await;
            synced.unwrap_or_else(|e| Err(format!("fsync task: {e}")))
        }
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
