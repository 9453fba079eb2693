//! The ingest thread: the store's one writer. Batches arrive on a channel; each is flushed to
//! disk before its sender hears Ok, and only then does a link acknowledge frames to its agent.
use crate::store::{Batch, Store, StoreError, Writer};
use tokio::sync::{mpsc, oneshot};

enum Job {
    Write(Box<Batch>, oneshot::Sender<Result<(), String>>),
    CloseRun(crate::ids::RunId),
}

/// A handle to the ingest thread; cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<Job>,
}

/// Bounded: when the disk falls behind, links wait here instead of buffering without limit
/// (their agents keep the frames until acknowledged, so waiting loses nothing).
const QUEUE: usize = 64;

impl Ingest {
    pub fn start(store: &Store) -> Ingest {
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE);
        let mut writer: Writer = store.writer();
        std::thread::Builder::new()
            .name("ingest".into())
            .spawn(move || {
                while let Some(job) = rx.blocking_recv() {
                    match job {
                        Job::Write(batch, done) => {
                            let r = writer.write(*batch).map_err(|e: StoreError| e.to_string());
                            if let Err(e) = &r {
                                tracing::error!("ingest write failed: {e}");
                            }
                            let _ = done.send(r);
                        }
                        Job::CloseRun(run) => {
                            if let Err(e) = writer.close_run(&run) {
                                tracing::error!(
                                    "run {run}: compacting its points failed (they stay in the journal): {e}"
                                );
                            }
                        }
                    }
                }
            })
            .map(|_| ())
            .unwrap_or_else(|e| tracing::error!("cannot start the ingest thread: {e}"));
        Ingest { tx }
    }

    /// Writes and flushes a batch; Ok means durable.
    pub async fn write(&self, batch: Batch) -> Result<(), String> {
        let (done, wait) = oneshot::channel();
        self.tx.send(Job::Write(Box::new(batch), done)).await.map_err(|_| "ingest thread is gone".to_string())?;
        wait.await.map_err(|_| "ingest thread is gone".to_string())?
    }

    pub async fn close_run(&self, run: crate::ids::RunId) {
        let _ = self.tx.send(Job::CloseRun(run)).await;
    }
}
