//! The streamed requests: `Follow` (progress until the end), `Watch` (durable frame batches),
//! `Open` (the stored snapshot, then the frames), each ending with the run's final status.
use super::resolve;
use super::snapshot::snapshot;
use crate::ids::RunId;
use crate::protocol::{write_frame_async, Reply};
use crate::server::{RunView, Shared};
use crate::sync::lock;
use std::time::Duration;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::broadcast;

/// A follower hears at most one progress line this often (the final line always).
const PROGRESS_EVERY: Duration = Duration::from_millis(1000);

/// Streams progress of a run until it ends, then its final status; through a recovery's
/// restarts (`Reply::Restarted`) to the lineage's last run.
pub async fn follow(wr: &mut OwnedWriteHalf, shared: &Shared, query: &str) -> anyhow::Result<()> {
    let mut id = match resolve(shared, query).await {
        Ok(id) => id,
        Err(e) => return Ok(write_frame_async(wr, &Reply::Error { message: format!("{e:#}") }).await?),
    };
    loop {
        let end = progress_until_end(wr, shared, &id).await?;
        if let Some(failure) = shared.ingest.failed() {
            // The run's link stopped with the store: the run goes on, unseen until a reopen.
            return Ok(write_frame_async(wr, &Reply::Error { message: failure.message }).await?);
        }
        let Some((status, reason)) = end else {
            let message = format!("run {id} vanished");
            return Ok(write_frame_async(wr, &Reply::Error { message }).await?);
        };
        match restarted(shared, &id).await {
            Some((child, restart)) => {
                let reply = Reply::Restarted { run: id, status, reason, child: child.clone(), restart };
                write_frame_async(wr, &reply).await?;
                id = child;
            }
            None => return Ok(write_frame_async(wr, &Reply::Ended { run: id, status, reason }).await?),
        }
    }
}

/// Sends a live run's progress until it ends; returns its final status (from the store when
/// it is not live), None when the store has no such run.
async fn progress_until_end(
    wr: &mut OwnedWriteHalf,
    shared: &Shared,
    id: &RunId,
) -> anyhow::Result<Option<(crate::store::RunStatus, String)>> {
    let view = lock(&shared.registry).get(id).map(|l| l.view.clone());
    if let Some(mut view) = view {
        let mut last_sent: Option<tokio::time::Instant> = None;
        loop {
            let current: RunView = view.borrow_and_update().clone();
            if let Some(ended) = current.ended {
                write_frame_async(wr, &Reply::Progress(current.progress)).await?;
                return Ok(Some(ended));
            }
            if last_sent.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
                write_frame_async(wr, &Reply::Progress(current.progress)).await?;
                last_sent = Some(tokio::time::Instant::now());
            }
            if view.changed().await.is_err() {
                break;
            }
        }
    }
    // Not live (or its link just finished): the stored record has the final word.
    stored_end(shared, id).await
}

/// The child recovery started in `id`'s place, waiting out a decision still pending.
async fn restarted(shared: &Shared, id: &RunId) -> Option<(RunId, crate::record::Restart)> {
    let mut rx = lock(&shared.restarts).get(id).cloned()?;
    let decided = rx.wait_for(|o| *o != crate::server::recovery::Outcome::Pending).await.ok()?.clone();
    match decided {
        crate::server::recovery::Outcome::Restarted { child, restart } => Some((child, restart)),
        _ => None,
    }
}

/// Ends a streamed request with the run's stored final status.
async fn send_final(wr: &mut OwnedWriteHalf, shared: &Shared, id: RunId) -> anyhow::Result<()> {
    let reply = match stored_end(shared, &id).await? {
        Some((status, reason)) => Reply::Ended { run: id, status, reason },
        None => Reply::Error { message: format!("run {id} vanished") },
    };
    Ok(write_frame_async(wr, &reply).await?)
}

/// The run's final status and reason as the store has them; None for no such run.
async fn stored_end(shared: &Shared, id: &RunId) -> anyhow::Result<Option<(crate::store::RunStatus, String)>> {
    let store = shared.store.clone();
    let id = id.clone();
    let record = tokio::task::spawn_blocking(move || store.get_run(&id)).await??;
    Ok(record.map(|r| (r.status, r.reason)))
}

/// Streams a live run's durable frame batches until it ends.
pub async fn watch(wr: &mut OwnedWriteHalf, shared: &Shared, query: &str) -> anyhow::Result<()> {
    let id = match resolve(shared, query).await {
        Ok(id) => id,
        Err(e) => return Ok(write_frame_async(wr, &Reply::Error { message: format!("{e:#}") }).await?),
    };
    let rx = lock(&shared.registry).get(&id).map(|l| l.frames.subscribe());
    if let Some(rx) = rx {
        forward(wr, rx, &id).await?;
    }
    send_final(wr, shared, id).await
}

/// `Open`: subscribe to the live frames first, then send the stored snapshot, then stream.
pub async fn open(wr: &mut OwnedWriteHalf, shared: &Shared, query: &str) -> anyhow::Result<()> {
    let id = match resolve(shared, query).await {
        Ok(id) => id,
        Err(e) => return Ok(write_frame_async(wr, &Reply::Error { message: format!("{e:#}") }).await?),
    };
    let rx = lock(&shared.registry).get(&id).map(|l| l.frames.subscribe());
    let store = shared.store.clone();
    let id2 = id.clone();
    let read_at = std::time::Instant::now();
    let snap = tokio::task::spawn_blocking(move || snapshot(&store, &id2)).await?;
    match snap {
        Ok(s) => {
            // Said, because a cockpit that keeps falling behind reopens, and each reopen reads
            // the snapshot again: the log shows how often and at what cost.
            let read_ms = read_at.elapsed().as_millis();
            tracing::info!("run {id}: snapshot for a client read in {read_ms} ms");
            write_frame_async(wr, &Reply::Snapshot(Box::new(s))).await?
        }
        Err(e) => return Ok(write_frame_async(wr, &Reply::Error { message: format!("{e:#}") }).await?),
    }
    if let Some(rx) = rx {
        forward(wr, rx, &id).await?;
    }
    send_final(wr, shared, id).await
}

/// Passes a live run's durable frame batches on until its link closes; a subscriber that fell
/// behind is told how many batches it missed (the cockpit then reloads).
async fn forward(
    wr: &mut OwnedWriteHalf,
    mut rx: broadcast::Receiver<std::sync::Arc<crate::server::NodeFrames>>,
    id: &RunId,
) -> anyhow::Result<()> {
    use broadcast::error::RecvError;
    loop {
        match rx.recv().await {
            Ok(frames) => {
                let reply = Reply::Frames { run: id.clone(), node: frames.node, frames: frames.frames.clone() };
                write_frame_async(wr, &reply).await?;
            }
            Err(RecvError::Lagged(skipped)) => {
                write_frame_async(wr, &Reply::Lagged { run: id.clone(), skipped }).await?
            }
            Err(RecvError::Closed) => return Ok(()),
        }
    }
}
