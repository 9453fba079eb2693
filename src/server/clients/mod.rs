//! One client connection: handshake, then requests dispatched in order; the streamed ones,
//! snapshots, checkpoints and stacks have files of their own beside this one.
use super::launch::LaunchRequest;
use super::placement::Progress;
use super::Shared;
use crate::ids::RunId;
use crate::protocol::{
    read_frame_async, write_frame_async, AgentCommand, Hello, Reply, Request, Role, PROTOCOL_VERSION,
};
use crate::sync::lock;
use anyhow::Context;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;

mod checkpoints;
mod snapshot;
mod stacks;
mod streams;

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
        if let Some(failure) = shared.ingest.failed() {
            // A store that cannot be written answers nothing it could get wrong: every client
            // hears why, and the runs' frames wait on their nodes.
            write_frame_async(&mut wr, &Reply::Error { message: failure.message }).await?;
            continue;
        }
        match req {
            Request::Follow { run } => streams::follow(&mut wr, shared, &run).await?,
            Request::Watch { run } => streams::watch(&mut wr, shared, &run).await?,
            Request::Open { run } => streams::open(&mut wr, shared, &run).await?,
            req @ (Request::Launch { .. } | Request::Resume { .. }) => launch(&mut wr, shared, req).await?,
            other => {
                let reply = answer(shared, other).await.unwrap_or_else(|e| Reply::Error { message: format!("{e:#}") });
                write_frame_async(&mut wr, &reply).await?;
            }
        }
    }
    Ok(())
}

pub(super) async fn resolve(shared: &Shared, query: &str) -> anyhow::Result<RunId> {
    resolve_as(shared, query, crate::store::db::Pick::Newest).await
}

async fn resolve_as(shared: &Shared, query: &str, how: crate::store::db::Pick) -> anyhow::Result<RunId> {
    let store = shared.store.clone();
    let q = query.to_string();
    Ok(tokio::task::spawn_blocking(move || store.resolve_as(&q, how)).await??)
}

async fn answer(shared: &Shared, req: Request) -> anyhow::Result<Reply> {
    answer_with(shared, req, None).await
}

/// Answers a request; a launch or resume reports each host's progress to `progress`.
async fn answer_with(shared: &Shared, req: Request, progress: Progress) -> anyhow::Result<Reply> {
    let store = shared.store.clone();
    Ok(match req {
        Request::Launch { recipe_json, recipe_path, name, env } => {
            let recipe: crate::recipe::Recipe =
                serde_json::from_str(&recipe_json).context("the client sent a recipe this server cannot read")?;
            let init = super::init::resolve(shared, &recipe).await?;
            let req =
                LaunchRequest { recipe_json, recipe_path, name, lineage: None, init, env, sweep: None, carry: None };
            Reply::Launched { run: super::launch::launch(shared, req, progress).await? }
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
        Request::Collectives { run, rank } => {
            let id = resolve(shared, &run).await?;
            Reply::Collectives { records: tokio::task::spawn_blocking(move || store.collectives(&id, rank)).await?? }
        }
        Request::Stop { run } => command(shared, &run, AgentCommand::Stop).await?,
        Request::Kill { run } => command(shared, &run, AgentCommand::Kill).await?,
        Request::Stacks { run, rank, native } => stacks::stacks(shared, &run, rank, native).await?,
        Request::Follow { .. } | Request::Watch { .. } | Request::Open { .. } => {
            anyhow::bail!("streamed requests are not answered once")
        }
        Request::Checkpoints { run, verify } => checkpoints::checkpoints(shared, &run, verify).await?,
        Request::Resume { run, step, recipe_json, name, env } => {
            super::resume::resume(shared, &run, step, recipe_json, name, env, progress, None).await?
        }
        Request::Sweep { sweep, env } => super::queue::submit(shared, sweep, env).await?,
        Request::Queue { all } => super::queue::list(shared, all).await?,
        Request::Cancel { target } => super::queue::cancel(shared, &target).await?,
        Request::Import { path, format, name } => {
            let req = super::import::ImportRequest { path: path.into(), format, name };
            let done = super::import::import(shared, req).await?;
            Reply::Imported { run: done.run, ranks: done.ranks, records: done.records, status: done.status }
        }
    })
}

async fn command(shared: &Shared, run: &str, cmd: AgentCommand) -> anyhow::Result<Reply> {
    let id = resolve_as(shared, run, crate::store::db::Pick::Live).await?;
    let tx = lock(&shared.registry).get(&id).map(|l| l.commands.clone());
    match tx {
        Some(tx) => {
            tx.send(cmd).await.map_err(|_| anyhow::anyhow!("run {id} ended meanwhile"))?;
            Ok(Reply::Ok)
        }
        None => anyhow::bail!("run {id} is not live"),
    }
}

/// A launch or resume, streaming each host's progress (SSH launches) before its one final reply.
async fn launch(wr: &mut OwnedWriteHalf, shared: &Shared, req: Request) -> anyhow::Result<()> {
    // Bounded; the launcher drops notes rather than wait when a client reads slowly.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, String)>(256);
    let answered = answer_with(shared, req, Some(tx));
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
