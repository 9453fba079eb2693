//! The one launch path, for every placement: parse the recipe, make the run directory, start
//! the agents (`placement.rs`), record the run and its first event, and attach its link. A
//! launch whose agents do not all start records nothing and leaves nothing behind.
use super::placement::{Placement, Progress, StartFrom};
use super::tracker::Tracker;
use super::Shared;
use crate::ids::{unix_ms, RunId};
use crate::protocol::spec::ClientEnv;
use crate::recipe::Recipe;
use crate::record::SweepPoint;
use crate::store::{Batch, EventKind, EventRecord, InitPoint, Lineage, RunMeta, RunRecord, RunStatus};
use anyhow::Context;
use std::path::PathBuf;

/// What a client asks to launch: a validated recipe (as JSON: the server trusts nothing it
/// has not parsed itself), and, for a resume, the checkpoint it starts from.
pub struct LaunchRequest {
    pub recipe_json: String,
    pub recipe_path: String,
    pub name: Option<String>,
    pub lineage: Option<Lineage>,
    /// `[init] from`, resolved (`server::init`): the weights the run starts from.
    pub init: Option<InitPoint>,
    /// The asking client's SSH environment, for SSH placements.
    pub env: ClientEnv,
    /// The sweep point this run is (the queue's launches; a resume's child keeps its parent's).
    pub sweep: Option<SweepPoint>,
    /// A resume over SSH: where each node's copy of the checkpoint comes from.
    pub carry: Option<crate::ssh::carry::Carry>,
}

pub async fn launch(shared: &Shared, req: LaunchRequest, progress: Progress) -> anyhow::Result<RunId> {
    let recipe: Recipe =
        serde_json::from_str(&req.recipe_json).context("the client sent a recipe this server cannot read")?;
    let run = RunId::new_now();
    // The first event is stamped when the launch began: before the agents' own first frames.
    let began_ms = unix_ms();
    let dir = shared.db.run_dir(&run);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let space = match checkpoint_room(&recipe, &dir) {
        Ok(warning) => warning,
        Err(why) => {
            let _ = std::fs::remove_dir_all(&dir);
            anyhow::bail!(why);
        }
    };
    std::fs::write(dir.join("recipe.json"), &req.recipe_json)?;
    let placement = Placement::of(&recipe, req.env.clone());
    let from = StartFrom {
        resume: req.lineage.as_ref().map(|l| PathBuf::from(&l.from.path)),
        init: req.init.as_ref().map(|i| PathBuf::from(&i.path)),
        carry: req.carry.clone(),
    };
    let started = match placement.start(&shared.db, &run, &recipe, &req.recipe_json, from, progress).await {
        Ok(s) => s,
        Err(e) => {
            // Nothing was recorded: the run directory goes too, so a failed launch leaves no trace.
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };

    let world = recipe.world_size();
    let meta = RunMeta {
        name: req.name.unwrap_or_else(|| recipe.name.clone()),
        recipe_name: recipe.name.clone(),
        recipe_path: req.recipe_path,
        recipe_json: req.recipe_json,
        world_size: world,
        steps_planned: recipe.train.steps,
    };
    let mut record = RunRecord::starting(
        run.clone(),
        meta,
        started.hosts.clone(),
        started.agent_sockets.clone(),
        req.lineage.clone(),
    );
    // The run began when its launch did (the Events panel counts from here).
    record.created_ms = began_ms;
    // Recorded with the run itself: a point is started exactly when its run is in the store.
    record.sweep = req.sweep.clone();
    if let Some(init) = &req.init {
        // A resume's parent is the run it resumes; a fresh run's is the one whose weights it took.
        if req.lineage.is_none() {
            record.parent = init.run.clone();
        }
        record.init_from = Some(init.clone());
    }
    let what = format!("run {} (recipe {})", record.name, recipe.name);
    let head = match &req.lineage {
        Some(l) => format!("resumed {what} from run {} at step {} ({})", l.parent, l.from.step, l.from.path),
        None => match &req.init {
            Some(InitPoint { run: Some(p), step, path }) => {
                format!("launched {what} from the weights of run {p} at step {step} ({path})")
            }
            Some(InitPoint { run: None, path, .. }) => format!("launched {what} from the weights of {path}"),
            None => format!("launched {what}"),
        },
    };
    let text = format!("{head} {}: {world} ranks{}", started.place, started.nodes_text);
    let mut batch = Batch::default();
    batch.runs.push(record.clone());
    batch.events.push((run.clone(), EventRecord { t_ms: began_ms, kind: EventKind::RunStarted, rank: None, text }));
    if let Some(text) = space {
        batch.events.push((run.clone(), EventRecord { t_ms: began_ms, kind: EventKind::Notice, rank: None, text }));
    }
    if let Some(text) = req.carry.as_ref().map(|c| c.said(&started.hosts)) {
        batch.events.push((run.clone(), EventRecord { t_ms: began_ms, kind: EventKind::Notice, rank: None, text }));
    }
    shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;

    let transports = started.transports.clone();
    let attached =
        super::link::attach_nodes(Tracker::new(record.clone(), Vec::new()), transports, Some(dir), shared).await;
    if let Err(e) = attached {
        // Started but unreachable right away: take them down, so nothing is left running anywhere.
        let left = placement.abandon(&run, started).await;
        let mut reason = format!("could not attach after the launch: {e:#}");
        if !left.is_empty() {
            reason.push_str(&format!("; cleanup failed, check by hand: {}", left.join("; ")));
        }
        let mut batch = Batch::default();
        Tracker::new(record, Vec::new()).end_without_agent(RunStatus::Failed, reason.clone(), &mut batch);
        shared.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        anyhow::bail!(reason);
    }
    Ok(run)
}

/// Whether this machine's disk holds the run's checkpoints: Err refuses a run that saves
/// (`checkpoint.every > 0`) when not even one fits; Ok(Some) warns when fewer than `keep + 1`
/// do. Only for checkpoints written here (the embedded trainers on local ranks).
fn checkpoint_room(recipe: &Recipe, run_dir: &std::path::Path) -> Result<Option<String>, String> {
    use crate::store::checkpoints::{estimated_bytes, free_bytes, room, root_of};
    if recipe.kind == crate::recipe::Kind::Command || !recipe.is_local() {
        return Ok(None);
    }
    let root = root_of(run_dir, &recipe.checkpoint.dir);
    let Ok(free) = free_bytes(&root) else { return Ok(None) };
    match room(free, estimated_bytes(&recipe.model), recipe.checkpoint.keep, &root) {
        Err(why) if recipe.checkpoint.every == 0 => Ok(Some(format!("{why} (a graceful stop's save will fail)"))),
        other => other,
    }
}
