//! `[init] from`: the verified checkpoint a new run starts from, resolved at launch. The run
//! gets only its weights (a fresh optimizer and step 0); the model's shape must match.
use super::Shared;
use crate::recipe::{InitFrom, Recipe};
use crate::store::checkpoints::{self, disk, ChooseError, Chosen};
use crate::store::InitPoint;
use anyhow::Context;
use std::path::Path;

/// The checkpoint `recipe`'s `[init] from` names, verified (sha256 of every file), and whose
/// model is the recipe's; None without `[init]`.
pub async fn resolve(shared: &Shared, recipe: &Recipe) -> anyhow::Result<Option<InitPoint>> {
    let Some(init) = &recipe.init else { return Ok(None) };
    if !recipe.is_local() {
        anyhow::bail!(
            "init.from: starting SSH ranks from a checkpoint is not supported yet (the checkpoint is on this \
             machine, the nodes would not find it); init is for local runs"
        );
    }
    let (run, chosen) = match &init.from {
        InitFrom::Run { run, step } => {
            let store = shared.store.clone();
            let q = run.clone();
            let parent = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                let id = store.resolve(&q)?;
                store.get_run(&id)?.ok_or_else(|| anyhow::anyhow!("run {id} vanished"))
            })
            .await?
            .with_context(|| format!("init.from = {run:?}"))?;
            let parent_recipe: Recipe = serde_json::from_str(&parent.recipe_json).with_context(|| {
                format!("init.from: run {}'s stored recipe cannot be read by this flightdeck", parent.id)
            })?;
            let root = checkpoints::root_of(
                &super::placement::rank0_dir(&shared.db, &parent.id),
                &parent_recipe.checkpoint.dir,
            );
            let step = *step;
            let chosen =
                tokio::task::spawn_blocking(move || checkpoints::choose(&root, step)).await?.map_err(|e| match e {
                    ChooseError::NoCheckpoints { dir } => anyhow::anyhow!(
                        "init.from: run {}: {}",
                        parent.id,
                        checkpoints::why_none(parent.step, parent_recipe.checkpoint.every, &dir)
                    ),
                    e => anyhow::anyhow!("init.from: run {}: {e}", parent.id),
                })?;
            (Some(parent.id), chosen)
        }
        InitFrom::Path(path) => {
            let path = path.clone();
            let chosen = tokio::task::spawn_blocking(move || at_path(&path)).await??;
            (None, chosen)
        }
    };
    let saved = disk::read_verified(&chosen.path, &chosen.manifest, disk::RECIPE)
        .map_err(|e| anyhow::anyhow!("init.from {}: {e}", chosen.path.display()))?;
    let saved: Recipe = serde_json::from_slice(&saved).with_context(|| {
        format!("init.from {}: its recipe.json cannot be read by this flightdeck", chosen.path.display())
    })?;
    if let Some(diff) = super::resume::model_diff(recipe, &saved) {
        anyhow::bail!(
            "init.from {}: {diff}: a run starts only from weights of its own shape (set the model.* keys to the checkpoint's)",
            chosen.path.display()
        );
    }
    Ok(Some(InitPoint { run, step: chosen.step, path: chosen.path.display().to_string() }))
}

/// A checkpoint step directory, or the newest verified step of a checkpoint directory.
fn at_path(path: &Path) -> anyhow::Result<Chosen> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let chosen = match disk::parse_step_dir(name) {
        Some(step) => {
            let parent = path.parent().unwrap_or(Path::new("."));
            checkpoints::choose(parent, Some(step))
        }
        None => checkpoints::choose(path, None),
    };
    chosen.map_err(|e| match e {
        ChooseError::NoCheckpoints { dir } => anyhow::anyhow!(
            "init.from {dir}: no checkpoints there; give a checkpoint directory (a run's ckpt/) or one of its step-NNNNNNNN directories"
        ),
        e => anyhow::anyhow!("init.from {}: {e}", path.display()),
    })
}
