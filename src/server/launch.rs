//! Launching a run on the embedded local runtime: the run record, the run directory, and a
//! detached agent. SSH hosts go to `remote.rs`; both share everything above the transport.
use super::ingest::Ingest;
use super::tracker::Tracker;
use super::Registry;
use crate::agent::AgentSpec;
use crate::ids::{unix_ms, Rank, RunId};
use crate::paths::{DbPaths, RunDirPaths};
use crate::recipe::Recipe;
pub use crate::store::Lineage;
use crate::store::{Batch, EventKind, EventRecord, ResumePoint, RunMeta, RunRecord, RunStatus};
use anyhow::Context;
use std::path::PathBuf;
use std::process::Command;

/// SIGTERM-to-SIGKILL grace when stopping ranks.
const STOP_GRACE_MS: u64 = 5000;
/// How long a graceful stop may take (reach a step boundary, snapshot, write the checkpoint)
/// before the agent falls back to SIGTERM: a step and a save of a large model.
pub const SAVE_GRACE_MS: u64 = 120_000;

pub async fn launch(
    db: &DbPaths,
    recipe_json: &str,
    recipe_path: &str,
    name: Option<String>,
    ingest: &Ingest,
    registry: &Registry,
) -> anyhow::Result<RunId> {
    start(db, recipe_json, recipe_path, name, None, ingest, registry).await
}

/// Launches a run; with `lineage`, its ranks restore the parent's checkpoint first.
pub async fn start(
    db: &DbPaths,
    recipe_json: &str,
    recipe_path: &str,
    name: Option<String>,
    lineage: Option<Lineage>,
    ingest: &Ingest,
    registry: &Registry,
) -> anyhow::Result<RunId> {
    let recipe: Recipe =
        serde_json::from_str(recipe_json).context("the client sent a recipe this server cannot read")?;
    if !recipe.is_local() {
        return super::remote::launch(db, recipe, recipe_json, recipe_path, name, ingest, registry).await;
    }
    let run = RunId::new_now();
    let paths = RunDirPaths::new(db.run_dir(&run));
    std::fs::create_dir_all(&paths.root).with_context(|| format!("creating {}", paths.root.display()))?;
    std::fs::write(paths.recipe(), recipe_json)?;
    let world = recipe.world_size();
    let spec = AgentSpec {
        run: run.clone(),
        node: "local".into(),
        ranks: (0..world).map(|r| (Rank(r), r)).collect(),
        world_size: world,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        host_store: true,
        exe: std::env::current_exe().context("locating the flightdeck executable")?,
        recipe: recipe.clone(),
        stop_grace_ms: STOP_GRACE_MS,
        save_grace_ms: SAVE_GRACE_MS,
        resume_from: lineage.as_ref().map(|l| PathBuf::from(&l.from.path)),
    };
    std::fs::write(paths.spec(), serde_json::to_vec_pretty(&spec)?)?;

    let meta = RunMeta {
        name: name.unwrap_or_else(|| recipe.name.clone()),
        recipe_name: recipe.name.clone(),
        recipe_path: recipe_path.to_string(),
        recipe_json: recipe_json.to_string(),
        world_size: world,
        steps_planned: recipe.train.steps,
    };
    let sockets = vec![paths.agent_socket().display().to_string()];
    let record = RunRecord::starting(run.clone(), meta, vec!["local".into()], sockets, lineage.clone());
    let mut batch = Batch::default();
    batch.runs.push(record.clone());
    let text = match &lineage {
        Some(l) => format!(
            "resumed {} from run {} at step {} ({}) on local: {world} ranks",
            recipe.name, l.parent, l.from.step, l.from.path
        ),
        None => format!("launched {} on local: {world} ranks", recipe.name),
    };
    batch.events.push((run.clone(), EventRecord { t_ms: unix_ms(), kind: EventKind::RunStarted, rank: None, text }));
    ingest.write(batch).await.map_err(anyhow::Error::msg)?;

    let started = tokio::task::spawn_blocking({
        let paths = paths.clone();
        move || start_agent(&paths)
    })
    .await?;
    let mut tracker = Tracker::new(record, Vec::new());
    if let Err(e) = started {
        let mut batch = Batch::default();
        tracker.end_without_agent(RunStatus::Failed, format!("agent failed to start: {e:#}"), &mut batch);
        ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        return Err(e);
    }
    super::link::attach(tracker, paths.agent_socket(), ingest.clone(), registry.clone()).await?;
    Ok(run)
}

/// Starts `flightdeck agent` in its own session and waits for its "ready" line.
fn start_agent(paths: &RunDirPaths) -> anyhow::Result<()> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("agent").arg("--run-dir").arg(&paths.root);
    if !crate::detach::spawn_until_ready(cmd, &paths.agent_log()).context("starting the agent")? {
        let log = paths.agent_log();
        anyhow::bail!("the agent exited before it was ready; {}: {}", log.display(), crate::detach::log_tail(&log, 5));
    }
    Ok(())
}

/// `Request::Resume`: a child of run `query` from its checkpoint at `step` (None: the newest
/// that verifies), with the parent's recipe or `recipe_json` (the parent's plus overrides).
pub async fn resume(
    shared: &super::Shared,
    query: &str,
    step: Option<u64>,
    recipe_json: Option<String>,
    name: Option<String>,
) -> anyhow::Result<crate::protocol::Reply> {
    let store = shared.store.clone();
    let q = query.to_string();
    let parent = tokio::task::spawn_blocking(move || -> anyhow::Result<RunRecord> {
        let id = store.resolve(&q)?;
        store.get_run(&id)?.ok_or_else(|| anyhow::anyhow!("run {id} vanished"))
    })
    .await??;
    let id = parent.id.clone();
    if parent.status.is_live() {
        anyhow::bail!(
            "run {id} is still {}: stop it first (`flightdeck stop {id}` saves a checkpoint), then resume",
            parent.status.name()
        );
    }
    let parent_recipe: Recipe = serde_json::from_str(&parent.recipe_json)
        .with_context(|| format!("run {id}: its stored recipe cannot be read by this flightdeck"))?;
    let child_json = recipe_json.unwrap_or_else(|| parent.recipe_json.clone());
    let child: Recipe =
        serde_json::from_str(&child_json).context("the client sent a recipe this server cannot read")?;
    let remote = |hosts: &[String]| hosts.iter().any(|h| h != "local");
    if remote(&parent.hosts) || remote(&child.cluster.hosts) {
        anyhow::bail!(
            "run {id} ran on {}: resuming runs over SSH is not supported yet (the checkpoints stay on the first \
             node, under cluster.remote_dir's runs/{id}/node-0); resume is for local runs",
            parent.hosts.join(", ")
        );
    }
    let root = crate::store::checkpoints::root_of(&shared.db.run_dir(&id), &parent_recipe.checkpoint.dir);
    let chosen = tokio::task::spawn_blocking(move || crate::store::checkpoints::choose(&root, step))
        .await?
        .map_err(|e| anyhow::anyhow!("run {id}: {e}"))?;
    check_resume(&parent_recipe, &child, chosen.step, chosen.manifest.world_size)
        .map_err(|m| anyhow::anyhow!("run {id}: {m}"))?;
    let from = ResumePoint { step: chosen.step, path: chosen.path.display().to_string() };
    let lineage = Lineage { parent: id.clone(), from: from.clone() };
    let name = name.or_else(|| Some(parent.name.clone()));
    let run =
        start(&shared.db, &child_json, &parent.recipe_path, name, Some(lineage), &shared.ingest, &shared.registry)
            .await?;
    Ok(crate::protocol::Reply::Resumed { run, parent: id, step: chosen.step, path: from.path, skipped: chosen.skipped })
}

/// What a resume may change: anything but the model's shape and the world size (a checkpoint
/// is not resharded), and it must leave steps to train (never zero steps that exit 0).
pub fn check_resume(parent: &Recipe, child: &Recipe, step: u64, saved_world: u32) -> Result<(), String> {
    if parent.kind != crate::recipe::Kind::Pretrain || child.kind != crate::recipe::Kind::Pretrain {
        return Err("only kind = \"pretrain\" runs have checkpoints to resume".into());
    }
    if child.world_size() != saved_world {
        return Err(format!(
            "parallel.data = {} but checkpoint step {step} was saved by {saved_world} ranks: a resume keeps the \
             world size, because this build cannot reshard a checkpoint (use --set parallel.data={saved_world} \
             --set cluster.ranks_per_node={saved_world})",
            child.world_size()
        ));
    }
    if child.model != parent.model {
        let (a, b) = (serde_json::to_value(&child.model), serde_json::to_value(&parent.model));
        let diff: Vec<String> = match (a, b) {
            (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) => a
                .iter()
                .filter(|(k, v)| b.get(*k) != Some(*v))
                .map(|(k, v)| {
                    format!("model.{k} = {v}, the checkpoint's is {}", b.get(k).unwrap_or(&serde_json::Value::Null))
                })
                .collect(),
            _ => vec!["the model differs".into()],
        };
        return Err(format!("{}: the model's shape must match the checkpoint's", diff.join("; ")));
    }
    if child.train.steps <= step {
        return Err(format!(
            "checkpoint step {step} is the run's last (train.steps = {}): nothing remains to train; \
             to train on, raise train.steps (--set train.steps=N with N > {step})",
            child.train.steps
        ));
    }
    Ok(())
}
