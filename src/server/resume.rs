//! `Request::Resume`: a child run from a verified checkpoint of its parent, through the one
//! launch path, after checking what a resume may change.
use super::launch::{launch, LaunchRequest};
use super::placement::Progress;
use crate::protocol::spec::ClientEnv;
use crate::recipe::Recipe;
use crate::store::checkpoints::ChooseError;
use crate::store::{Lineage, ResumePoint, RunRecord};
use anyhow::Context;

/// `Request::Resume`: a child of run `query` from its checkpoint at `step` (None: the newest
/// that verifies), with the parent's recipe or `recipe_json` (the parent's plus overrides).
/// `restart`: set when recovery asks, not a person.
#[allow(clippy::too_many_arguments)]
pub async fn resume(
    shared: &super::Shared,
    query: &str,
    step: Option<u64>,
    recipe_json: Option<String>,
    name: Option<String>,
    env: ClientEnv,
    progress: Progress,
    restart: Option<crate::record::Restart>,
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
    if let Some(why) = parent_recipe.kind.not_resumable() {
        anyhow::bail!("run {id}: {why}");
    }
    let child_json = recipe_json.unwrap_or_else(|| parent.recipe_json.clone());
    let child: Recipe =
        serde_json::from_str(&child_json).context("the client sent a recipe this server cannot read")?;
    // A Slurm run's checkpoints are on the filesystem its nodes share with the server; an SSH
    // run's are on its nodes, one copy per node, found and carried by `ssh::carry`.
    let over_ssh = |r: &Recipe| !r.is_local() && !r.is_slurm();
    if over_ssh(&parent_recipe) != over_ssh(&child) {
        anyhow::bail!(
            "run {id} ran {}: a resume keeps its placement (a run over SSH resumes on SSH hosts, one on this \
             machine or under Slurm resumes there); change cluster.hosts to other hosts of the same kind",
            if over_ssh(&parent_recipe) { format!("over SSH on {}", parent.hosts.join(", ")) } else { "here".into() }
        );
    }
    let (chosen, carry) = if over_ssh(&parent_recipe) {
        let (carry, path) = carry_over_ssh(shared, &parent, &parent_recipe, &child, step, &env).await?;
        let chosen = crate::store::checkpoints::Chosen {
            step: carry.step,
            path: path.into(),
            manifest: carry.manifest.clone(),
            skipped: carry.skipped.clone(),
        };
        (chosen, Some(carry))
    } else {
        (choose_here(shared, &parent, &parent_recipe, step).await?, None)
    };
    check_resume(&parent_recipe, &child, chosen.step, chosen.manifest.world_size)
        .map_err(|m| anyhow::anyhow!("run {id}: {m}"))?;
    // A restart after a non-finite loss passes over the data of the steps from the checkpoint
    // to the one that failed, so the window that produced it is not read again.
    let child_json = match &restart {
        Some(r) if r.cause == crate::record::Cause::Nan => {
            let mut skipping = child.clone();
            skipping.data.skip_batches = parent.step.saturating_sub(chosen.step);
            serde_json::to_string(&skipping)?
        }
        _ => child_json,
    };
    let from = ResumePoint { step: chosen.step, path: chosen.path.display().to_string() };
    let lineage = Lineage { parent: id.clone(), from: from.clone(), restart };
    let name = name.or_else(|| Some(parent.name.clone()));
    let req = LaunchRequest {
        recipe_json: child_json,
        recipe_path: parent.recipe_path.clone(),
        name,
        lineage: Some(lineage),
        // The child restores its parent's whole checkpoint; the start it names is what a DPO
        // run's reference is rebuilt from (and the lineage keeps it).
        init: parent.init_from.clone(),
        env,
        // A sweep point's lineage stays that point: the queue follows its newest run.
        sweep: parent.sweep.clone(),
        carry,
    };
    let run = launch(shared, req, progress).await?;
    Ok(crate::protocol::Reply::Resumed { run, parent: id, step: chosen.step, path: from.path, skipped: chosen.skipped })
}

/// The checkpoint a local or Slurm run's resume restores: `choose` in rank 0's directory.
async fn choose_here(
    shared: &super::Shared,
    parent: &RunRecord,
    parent_recipe: &Recipe,
    step: Option<u64>,
) -> anyhow::Result<crate::store::checkpoints::Chosen> {
    let id = parent.id.clone();
    let root = crate::store::checkpoints::root_of(
        &super::placement::rank0_dir(&shared.db, &id),
        &parent_recipe.checkpoint.dir,
    );
    let (reached, every) = (parent.step, parent_recipe.checkpoint.every);
    tokio::task::spawn_blocking(move || crate::store::checkpoints::choose(&root, step)).await?.map_err(|e| match e {
        ChooseError::NoCheckpoints { dir } => {
            anyhow::anyhow!("run {id}: {}", crate::store::checkpoints::why_none(reached, every, &dir))
        }
        e => anyhow::anyhow!("run {id}: {e}"),
    })
}

/// An SSH run's resume: every node of the parent says which checkpoint it holds (verified on
/// the node), and each node of the child gets one to read, in place or carried from another
/// node (`ssh::carry`). Returns the plan and the lineage's name for the checkpoint.
async fn carry_over_ssh(
    shared: &super::Shared,
    parent: &RunRecord,
    parent_recipe: &Recipe,
    child: &Recipe,
    step: Option<u64>,
    env: &ClientEnv,
) -> anyhow::Result<(crate::ssh::carry::Carry, String)> {
    let id = parent.id.clone();
    let nodes = super::placement::ssh_nodes(&shared.db, &id)?.ok_or_else(|| {
        anyhow::anyhow!("run {id} ran over SSH but its nodes.json is gone: where its checkpoints are is not known")
    })?;
    let (dir, child, env) = (parent_recipe.checkpoint.dir.clone(), child.clone(), env.clone());
    let (reached, every) = (parent.step, parent_recipe.checkpoint.every);
    tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let hosts = crate::ssh::launch::targets(&child, &env).map_err(|e| anyhow::anyhow!("run {id}: {e}"))?;
        let holdings = crate::ssh::carry::survey(&nodes, &dir, step);
        let carry = crate::ssh::carry::assign(&hosts, &holdings, step).map_err(|why| {
            let none = crate::store::checkpoints::why_none(reached, every, &format!("{dir} on its nodes"));
            anyhow::anyhow!("run {id}: {why} ({none})")
        })?;
        let path = carry.describe(&hosts);
        Ok((carry, path))
    })
    .await?
}

/// How `child`'s model differs from the checkpoint's (`parent`'s), key by key; None when equal.
pub(super) fn model_diff(child: &Recipe, parent: &Recipe) -> Option<String> {
    if child.model == parent.model {
        return None;
    }
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
    Some(diff.join("; "))
}

/// What a resume may change: anything but the model's shape and the world size (a checkpoint
/// is not resharded), and it must leave steps to train (never zero steps that exit 0).
pub fn check_resume(parent: &Recipe, child: &Recipe, step: u64, saved_world: u32) -> Result<(), String> {
    use crate::recipe::Kind::{Dpo, Grpo, Pretrain, Sft};
    if !matches!(parent.kind, Pretrain | Sft | Dpo | Grpo) || child.kind != parent.kind {
        return Err(format!(
            "only the embedded trainers' runs (kind = \"pretrain\", \"sft\", \"dpo\", \"grpo\") have checkpoints to \
             resume, as their own kind (the run is {:?}, the resume {:?})",
            parent.kind, child.kind
        ));
    }
    if child.world_size() != saved_world {
        return Err(format!(
            "parallel.data = {} but checkpoint step {step} was saved by {saved_world} ranks: a resume keeps the \
             world size, because this build cannot reshard a checkpoint (use --set parallel.data={saved_world} \
             --set cluster.ranks_per_node={saved_world})",
            child.world_size()
        ));
    }
    if let Some(diff) = model_diff(child, parent) {
        return Err(format!("{diff}: the model's shape must match the checkpoint's"));
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
