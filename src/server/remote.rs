//! SSH runs on the server: launch on every node through `ssh::launch` (on a blocking thread),
//! remember each node's agent in the run's `nodes.json`, and attach over SSH. Everything above
//! the transport (link, tracker, ingest) is shared with local runs.
use super::ingest::Ingest;
use super::tracker::Tracker;
use super::transport::Transport;
use super::Registry;
use crate::ids::{unix_ms, RunId};
use crate::paths::DbPaths;
use crate::recipe::Recipe;
use crate::ssh::launch::{self, Plan, RemoteAgent};
use crate::store::{Batch, EventKind, EventRecord, RunMeta, RunRecord, RunStatus};
use anyhow::Context;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::mpsc;

tokio::task_local! {
    /// Where a launch reports each host's progress: set by the client handler that asked for
    /// the launch, so the launch signature stays the same for local and SSH runs.
    static PROGRESS: mpsc::Sender<(String, String)>;
}

/// Runs `f` (a launch) with its per-host progress sent to `tx`.
pub async fn with_progress<F: Future>(tx: mpsc::Sender<(String, String)>, f: F) -> F::Output {
    PROGRESS.scope(tx, f).await
}

/// Where an SSH run keeps its nodes' agents, in the database's run directory.
fn nodes_file(db: &DbPaths, run: &RunId) -> PathBuf {
    db.run_dir(run).join("nodes.json")
}

/// How to reach each node of a recorded run: SSH when it has `nodes.json`, else local sockets.
pub fn transports(db: &DbPaths, record: &RunRecord) -> anyhow::Result<Vec<Transport>> {
    let file = nodes_file(db, &record.id);
    if !file.is_file() {
        return Ok(record.agent_sockets.iter().map(|s| Transport::Local(PathBuf::from(s))).collect());
    }
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let agents: Vec<RemoteAgent> =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
    Ok(agents.into_iter().map(|a| Transport::Ssh(Arc::new(a))).collect())
}

/// Launches a recipe whose hosts are SSH destinations. Nothing is recorded unless every node's
/// agent started; then the run is attached like a local one.
pub async fn launch(
    db: &DbPaths,
    recipe: Recipe,
    recipe_json: &str,
    recipe_path: &str,
    name: Option<String>,
    ingest: &Ingest,
    registry: &Registry,
) -> anyhow::Result<RunId> {
    let run = RunId::new_now();
    let progress = PROGRESS.try_with(Clone::clone).ok();
    let launched = tokio::task::spawn_blocking({
        let (run, recipe, json) = (run.clone(), recipe.clone(), recipe_json.to_string());
        move || -> anyhow::Result<Vec<RemoteAgent>> {
            let plan = Plan::new(&run, &recipe, &json)?;
            let notes = |host: &str, text: &str| {
                tracing::info!("launch {run} {host}: {text}");
                if let Some(tx) = &progress {
                    // Never wait on a slow client: a dropped progress line loses nothing durable.
                    let _ = tx.try_send((host.to_string(), text.to_string()));
                }
            };
            Ok(launch::launch(&plan, &notes)?)
        }
    })
    .await??;

    let dir = db.run_dir(&run);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("recipe.json"), recipe_json)?;
    std::fs::write(nodes_file(db, &run), serde_json::to_vec_pretty(&launched)?)?;
    let hosts: Vec<String> = launched.iter().map(|a| a.target.spec.clone()).collect();
    let world = recipe.world_size();
    let meta = RunMeta {
        name: name.unwrap_or_else(|| recipe.name.clone()),
        recipe_name: recipe.name.clone(),
        recipe_path: recipe_path.to_string(),
        recipe_json: recipe_json.to_string(),
        world_size: world,
        steps_planned: recipe.train.steps,
    };
    let sockets = launched.iter().map(RemoteAgent::address).collect();
    let record = RunRecord::starting(run.clone(), meta, hosts.clone(), sockets, None);
    let mut batch = Batch::default();
    batch.runs.push(record.clone());
    let where_ = launched.iter().map(|a| format!("{} (agent pid {})", a.target.spec, a.pid)).collect::<Vec<_>>();
    let text = format!("launched {} over SSH: {world} ranks on {}", recipe.name, where_.join(", "));
    batch.events.push((run.clone(), EventRecord { t_ms: unix_ms(), kind: EventKind::RunStarted, rank: None, text }));
    ingest.write(batch).await.map_err(anyhow::Error::msg)?;

    let transports = launched.iter().cloned().map(|a| Transport::Ssh(Arc::new(a))).collect();
    let attached = super::link::attach_nodes(
        Tracker::new(record.clone(), Vec::new()),
        transports,
        Some(db.run_dir(&run)),
        ingest.clone(),
        registry.clone(),
    )
    .await;
    if let Err(e) = attached {
        // Started but unreachable right away: stop them, so nothing is left running anywhere.
        let left = tokio::task::spawn_blocking(move || launch::kill(&launched)).await.unwrap_or_default();
        let mut reason = format!("could not attach after the launch: {e:#}");
        if !left.is_empty() {
            reason.push_str(&format!("; cleanup failed, check by hand: {}", left.join("; ")));
        }
        let mut batch = Batch::default();
        Tracker::new(record, Vec::new()).end_without_agent(RunStatus::Failed, reason.clone(), &mut batch);
        ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        anyhow::bail!(reason);
    }
    Ok(run)
}
