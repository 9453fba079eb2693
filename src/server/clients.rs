//! One client connection: handshake, then requests answered in order. `Follow` streams.
use super::{RunView, Shared};
use crate::agent::lock;
use crate::ids::RunId;
use crate::protocol::{
    read_frame_async, write_frame_async, AgentCommand, Hello, Reply, Request, Role, PROTOCOL_VERSION,
};
use std::time::Duration;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;

/// A follower hears at most one progress line this often (the final line always).
const PROGRESS_EVERY: Duration = Duration::from_millis(1000);

pub async fn serve(stream: UnixStream, shared: &Shared) -> anyhow::Result<()> {
    let (mut rd, mut wr) = stream.into_split();
    let hello: Hello = read_frame_async(&mut rd).await?.ok_or_else(|| anyhow::anyhow!("closed before hello"))?;
    write_frame_async(&mut wr, &Hello::new(Role::Server, "local")).await?;
    if hello.protocol_version != PROTOCOL_VERSION {
        let message = format!(
            "this server speaks protocol {PROTOCOL_VERSION}, the client {}: use one flightdeck version",
            hello.protocol_version
        );
        write_frame_async(&mut wr, &Reply::Error { message }).await?;
        return Ok(());
    }
    while let Some(req) = read_frame_async::<Request, _>(&mut rd).await? {
        match req {
            Request::Follow { run } => follow(&mut wr, shared, &run).await?,
            Request::Watch { run } => watch(&mut wr, shared, &run).await?,
            other => {
                let reply = answer(shared, other).await.unwrap_or_else(|e| Reply::Error { message: format!("{e:#}") });
                write_frame_async(&mut wr, &reply).await?;
            }
        }
    }
    Ok(())
}

async fn resolve(shared: &Shared, query: &str) -> anyhow::Result<RunId> {
    let store = shared.store.clone();
    let q = query.to_string();
    Ok(tokio::task::spawn_blocking(move || store.resolve(&q)).await??)
}

async fn answer(shared: &Shared, req: Request) -> anyhow::Result<Reply> {
    let store = shared.store.clone();
    Ok(match req {
        Request::Launch { recipe_json, recipe_path, name } => {
            let run =
                super::launch::launch(&shared.db, &recipe_json, &recipe_path, name, &shared.ingest, &shared.registry)
                    .await?;
            Reply::Launched { run }
        }
        Request::ListRuns => Reply::Runs { runs: tokio::task::spawn_blocking(move || store.list_runs()).await?? },
        Request::ShowRun { run } => {
            let id = resolve(shared, &run).await?;
            let detail = tokio::task::spawn_blocking(move || store.detail(&id)).await??;
            let detail = detail.ok_or_else(|| anyhow::anyhow!("run {run} vanished"))?;
            Reply::Run { detail: Box::new(detail) }
        }
        Request::Metrics { run, key, rank } => {
            let id = resolve(shared, &run).await?;
            let key = key.unwrap_or_else(|| "loss".into());
            let points = tokio::task::spawn_blocking(move || store.series(&id, &key, rank)).await??;
            Reply::Metrics { points }
        }
        Request::Stop { run } => command(shared, &run, AgentCommand::Stop).await?,
        Request::Kill { run } => command(shared, &run, AgentCommand::Kill).await?,
        Request::Follow { .. } | Request::Watch { .. } => {
            anyhow::bail!("streamed requests are not answered once")
        }
        Request::Checkpoints { run, verify } => checkpoints(shared, &run, verify).await?,
        Request::Resume { run, step, recipe_json, name } => {
            super::launch::resume(shared, &run, step, recipe_json, name).await?
        }
    })
}

async fn command(shared: &Shared, run: &str, cmd: AgentCommand) -> anyhow::Result<Reply> {
    let id = resolve(shared, run).await?;
    let tx = lock(&shared.registry).get(&id).map(|l| l.commands.clone());
    match tx {
        Some(tx) => {
            tx.send(cmd).await.map_err(|_| anyhow::anyhow!("run {id} ended meanwhile"))?;
            Ok(Reply::Ok)
        }
        None => anyhow::bail!("run {id} is not live"),
    }
}

/// Streams progress of a run until it ends, then its final status.
async fn follow(wr: &mut OwnedWriteHalf, shared: &Shared, query: &str) -> anyhow::Result<()> {
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
async fn watch(wr: &mut OwnedWriteHalf, shared: &Shared, query: &str) -> anyhow::Result<()> {
    use tokio::sync::broadcast::error::RecvError;
    let id = match resolve(shared, query).await {
        Ok(id) => id,
        Err(e) => return Ok(write_frame_async(wr, &Reply::Error { message: format!("{e:#}") }).await?),
    };
    let rx = lock(&shared.registry).get(&id).map(|l| l.frames.subscribe());
    if let Some(mut rx) = rx {
        loop {
            match rx.recv().await {
                Ok(frames) => {
                    let reply = Reply::Frames { run: id.clone(), node: 0, frames: frames.as_ref().clone() };
                    write_frame_async(wr, &reply).await?;
                }
                Err(RecvError::Lagged(skipped)) => {
                    write_frame_async(wr, &Reply::Lagged { run: id.clone(), skipped }).await?;
                }
                Err(RecvError::Closed) => break,
            }
        }
    }
    send_final(wr, shared, id).await
}

/// A run's checkpoints as the disk has them now (sizes, or every byte's sha256 when `verify`),
/// merged with what the store recorded. A full verification's verdicts are stored.
async fn checkpoints(shared: &Shared, query: &str, verify: bool) -> anyhow::Result<Reply> {
    use crate::store::checkpoints::{disk, inspect, root_of};
    let id = resolve(shared, query).await?;
    let store = shared.store.clone();
    let run_dir = shared.db.run_dir(&id);
    let id2 = id.clone();
    let (root, records) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let record = store.get_run(&id2)?.ok_or_else(|| anyhow::anyhow!("run {id2} vanished"))?;
        let dir = serde_json::from_str::<crate::recipe::Recipe>(&record.recipe_json)
            .map(|r| r.checkpoint.dir)
            .unwrap_or_else(|_| "checkpoints".into());
        let root = root_of(&run_dir, &dir);
        let known = store.checkpoints(&id2)?;
        let depth = if verify { disk::Depth::Sha256 } else { disk::Depth::Sizes };
        Ok((root.clone(), inspect(&id2, &root, known, depth)))
    })
    .await??;
    if verify {
        // Only checkpoints the store already indexes: a save still being written shows as
        // torn right now, and its own record arrives when it commits.
        let known = shared.store.checkpoints(&id)?;
        let checkpoints = records.iter().filter(|r| known.iter().any(|k| k.step == r.step)).cloned().collect();
        let batch = crate::store::Batch { checkpoints, ..Default::default() };
        shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
    }
    let latest = disk::latest(&root);
    Ok(Reply::Checkpoints { run: id, dir: root.display().to_string(), latest, checkpoints: records })
}
