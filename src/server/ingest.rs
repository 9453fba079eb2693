//! The ingest thread: the store's one writer. Batches arrive on a channel; each is flushed to
//! disk before its sender hears Ok, and only then does a link acknowledge frames to its agent.
//!
//! A write that fails leaves sled failed for good (it refuses every later write), so the first
//! failure is kept (`failed`): every client hears it, and when it was a full disk the server
//! reopens the database once there is room again (`server::reopen_when_room`). Nothing is
//! acknowledged meanwhile: the agents keep the frames and replay them to the reopened server.
use crate::store::{Batch, Store, StoreError, Writer};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};

enum Job {
    Write(Box<Batch>, oneshot::Sender<Result<(), String>>),
    CloseRun(crate::ids::RunId),
}

/// A handle to the ingest thread; cheap to clone.
#[derive(Clone)]
pub struct Ingest {
    tx: mpsc::Sender<Job>,
    failed: Arc<Mutex<Option<Failure>>>,
}

/// The store's first failed write: what every client is told, and whether room would cure it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub message: String,
    pub no_space: bool,
}

/// Bounded: when the disk falls behind, links wait here instead of buffering without limit
/// (their agents keep the frames until acknowledged, so waiting loses nothing).
const QUEUE: usize = 64;

impl Ingest {
    /// Starts the writer of `store`, the database under `root`.
    pub fn start(store: &Store, root: std::path::PathBuf) -> Ingest {
        let (tx, mut rx) = mpsc::channel::<Job>(QUEUE);
        let mut writer: Writer = store.writer();
        let failed: Arc<Mutex<Option<Failure>>> = Arc::new(Mutex::new(None));
        let failure = failed.clone();
        std::thread::Builder::new()
            .name("ingest".into())
            .spawn(move || {
                while let Some(job) = rx.blocking_recv() {
                    match job {
                        Job::Write(batch, done) => {
                            if let Some(f) = crate::sync::lock(&failure).as_ref() {
                                let _ = done.send(Err(f.message.clone()));
                                continue;
                            }
                            let r = writer.write(*batch).map_err(|e: StoreError| {
                                let no_space = e.is_no_space();
                                let message = if no_space {
                                    crate::store::db::no_space_text(&root, true)
                                } else {
                                    format!("the server cannot write its history in {}: {e}", root.display())
                                };
                                tracing::error!("ingest write failed: {e}; {message}");
                                *crate::sync::lock(&failure) = Some(Failure { message: message.clone(), no_space });
                                message
                            });
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
        Ingest { tx, failed }
    }

    /// The store's first failed write, if one failed.
    pub fn failed(&self) -> Option<Failure> {
        crate::sync::lock(&self.failed).clone()
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
