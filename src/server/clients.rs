//! One client connection: handshake, then requests answered in order. `Follow` streams.
use super::launch::LaunchRequest;
use super::placement::Progress;
use super::{RunView, Shared};
use crate::ids::RunId;
use crate::protocol::{
    read_frame_async, write_frame_async, AgentCommand, Hello, Reply, Request, Role, PROTOCOL_VERSION,
};
use crate::sync::lock;
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
            Request::Open { run } => open(&mut wr, shared, &run).await?,
            req @ (Request::Launch { .. } | Request::Resume { .. }) => launch(&mut wr, shared, req).await?,
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
    answer_with(shared, req, None).await
}

/// Answers a request; a launch or resume reports each host's progress to `progress`.
async fn answer_with(shared: &Shared, req: Request, progress: Progress) -> anyhow::Result<Reply> {
    let store = shared.store.clone();
    Ok(match req {
        Request::Launch { recipe_json, recipe_path, name, ssh } => {
            let req = LaunchRequest { recipe_json, recipe_path, name, lineage: None, ssh };
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
        Request::Stop { run } => command(shared, &run, AgentCommand::Stop).await?,
        Request::Kill { run } => command(shared, &run, AgentCommand::Kill).await?,
        Request::Stacks { run, rank } => stacks(shared, &run, rank).await?,
        Request::Follow { .. } | Request::Watch { .. } | Request::Open { .. } => {
            anyhow::bail!("streamed requests are not answered once")
        }
        Request::Checkpoints { run, verify } => checkpoints(shared, &run, verify).await?,
        Request::Resume { run, step, recipe_json, name, ssh } => {
            super::resume::resume(shared, &run, step, recipe_json, name, ssh, progress).await?
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

/// Points of all metrics and ranks a snapshot carries at most; longer runs send rollups.
const SNAPSHOT_POINTS: u64 = 400_000;
/// Flight-recorder records per rank in a snapshot (the collectives panel shows recent ones).
const SNAPSHOT_COLLECTIVES: usize = 64;
/// Log lines in a snapshot, over all ranks.
const SNAPSHOT_LOG_LINES: usize = 8_000;

/// `Open`: subscribe to the live frames first, then send the stored snapshot, then stream.
async fn open(wr: &mut OwnedWriteHalf, shared: &Shared, query: &str) -> anyhow::Result<()> {
    use tokio::sync::broadcast::error::RecvError;
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

/// Reads a run's snapshot: the detail first (its acked sequence numbers say which live frames
/// the rest already holds), then series, collectives and log tails.
fn snapshot(store: &crate::store::Store, id: &RunId) -> anyhow::Result<crate::protocol::RunSnapshot> {
    use crate::protocol::SeriesSnapshot;
    use crate::store::rollup::{Bucket, LEVELS};
    let detail = store.detail(id)?.ok_or_else(|| anyhow::anyhow!("run {id} vanished"))?;
    let ranks: Vec<u32> = detail.ranks.iter().map(|r| r.rank).collect();
    let per_series = SNAPSHOT_POINTS / (detail.metrics.len().max(1) * ranks.len().max(1)) as u64;
    let mut series = Vec::new();
    for metric in &detail.metrics {
        for info in &detail.ranks {
            let level = LEVELS.iter().position(|w| info.step / w <= per_series);
            let buckets: Vec<Bucket> = if info.step <= per_series {
                let points = store.series(id, metric, Some(info.rank))?;
                let one = |p: crate::store::Point| Bucket {
                    min: p.value,
                    max: p.value,
                    sum: p.value,
                    count: 1,
                    last_step: p.step,
                    last: p.value,
                };
                points.into_iter().map(one).collect()
            } else {
                let level = level.unwrap_or(LEVELS.len() - 1) as u8;
                store.rollups(id, metric, info.rank, level)?.into_iter().map(|(_, b)| b).collect()
            };
            series.push(SeriesSnapshot { metric: metric.clone(), rank: info.rank, buckets });
        }
    }
    let mut collectives = Vec::new();
    let mut logs = Vec::new();
    let lines_per_rank = (SNAPSHOT_LOG_LINES / ranks.len().max(1)).clamp(20, 500);
    for &r in &ranks {
        let mut recs = store.collectives(id, r)?;
        recs.drain(..recs.len().saturating_sub(SNAPSHOT_COLLECTIVES));
        collectives.push((r, recs));
        let mut tail = store.log_tail(id, r)?;
        tail.drain(..tail.len().saturating_sub(lines_per_rank));
        logs.push((r, tail));
    }
    Ok(crate::protocol::RunSnapshot { detail, series, collectives, logs })
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

/// How long a client waits for a live run's stacks: gdb on a large rank can take tens of
/// seconds, and the agent gives each tool at most 30 s.
const STACKS_WAIT: Duration = Duration::from_secs(45);

/// Asks the run's agent for stacks (all ranks or one) and groups identical ones.
async fn stacks(shared: &Shared, run: &str, rank: Option<u32>) -> anyhow::Result<Reply> {
    let id = resolve(shared, run).await?;
    let tx = lock(&shared.registry).get(&id).map(|l| l.stacks.clone());
    let Some(tx) = tx else {
        anyhow::bail!("run {id} is not live: stacks are read from running ranks (`flightdeck show {id}` has its incident reports)")
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    tx.send(super::StackAsk { rank, reply }).await.map_err(|_| anyhow::anyhow!("run {id} ended meanwhile"))?;
    let stacks = match tokio::time::timeout(STACKS_WAIT, answer).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => anyhow::bail!("run {id} ended (or its agent went away) before the stacks came back"),
        Err(_) => anyhow::bail!("the agent of run {id} did not answer within {STACKS_WAIT:?}"),
    };
    if let (Some(r), true) = (rank, stacks.is_empty()) {
        anyhow::bail!("rank {r} is not a live rank of run {id}; `flightdeck show {id}` lists its ranks");
    }
    Ok(Reply::Stacks(Box::new(crate::protocol::StackReport::from_dumps(id, &stacks))))
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
