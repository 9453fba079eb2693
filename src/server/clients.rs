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
            req @ Request::Launch { .. } => launch(&mut wr, shared, req).await?,
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
                    let reply = Reply::Frames { run: id.clone(), node: frames.node, frames: frames.frames.clone() };
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

/// A launch, streaming each host's progress (SSH launches) before its one final reply.
async fn launch(wr: &mut OwnedWriteHalf, shared: &Shared, req: Request) -> anyhow::Result<()> {
    // Bounded; the launcher drops notes rather than wait when a client reads slowly.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, String)>(256);
    let answered = super::remote::with_progress(tx, answer(shared, req));
    tokio::pin!(answered);
    let reply = loop {
        tokio::select! {
            Some((host, text)) = rx.recv() => write_frame_async(wr, &Reply::LaunchProgress { host, text }).await?,
            r = &mut answered => break r.unwrap_or_else(|e| Reply::Error { message: format!("{e:#}") }),
        }
    };
    while let Ok((host, text)) = rx.try_recv() {
        write_frame_async(wr, &Reply::LaunchProgress { host, text }).await?;
    }
    Ok(write_frame_async(wr, &reply).await?)
}
