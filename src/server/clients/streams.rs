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

/// Streams progress of a run until it ends, then its final status.
pub async fn follow(wr: &mut OwnedWriteHalf, shared: &Shared, query: &str) -> anyhow::Result<()> {
    let id = match resolve(shared, query).await {
        Ok(id) => id,
        Err(e) => return Ok(write_frame_async(wr, &Reply::Error { message: format!("{e:#}") }).await?),
    };
    let view = lock(&shared.registry).get(&id).map(|l| l.view.clone());
    if let Some(mut view) = view {
        let mut last_sent: Option<tokio::time::Instant> = None;
        loop {
            let current: RunView = view.borrow_and_update().clone();
            if let Some((status, reason)) = current.ended {
                write_frame_async(wr, &Reply::Progress(current.progress)).await?;
                return Ok(write_frame_async(wr, &Reply::Ended { run: id, status, reason }).await?);
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
    send_final(wr, shared, id).await
}

/// Ends a streamed request with the run's stored final status.
async fn send_final(wr: &mut OwnedWriteHalf, shared: &Shared, id: RunId) -> anyhow::Result<()> {
    let store = shared.store.clone();
    let id2 = id.clone();
    let record = tokio::task::spawn_blocking(move || store.get_run(&id2)).await??;
    match record {
        Some(r) => write_frame_async(wr, &Reply::Ended { run: id, status: r.status, reason: r.reason }).await?,
        None => write_frame_async(wr, &Reply::Error { message: format!("run {id} vanished") }).await?,
    }
    Ok(())
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
    let snap = tokio::task::spawn_blocking(move || snapshot(&store, &id2)).await?;
    match snap {
        Ok(s) => write_frame_async(wr, &Reply::Snapshot(Box::new(s))).await?,
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
