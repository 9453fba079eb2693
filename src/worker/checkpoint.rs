//! Checkpoints from the worker's side: agree on graceful stops, snapshot on the training thread,
//! write on a background thread of rank 0 (and of each other node's first rank), and restore everything a step depends on for a resume.
//!
//! The format on disk (and its verification) lives in `store::checkpoints::disk`.
pub mod stop;
mod tensors;
pub mod writer;

use super::group::StepCollective;
use super::model::Gpt;
use super::optim::AdamW;
use super::telemetry::TelemetryTx;
use crate::collective::CollectiveError;
use crate::ids::{unix_ms, Step};
use crate::recipe::Recipe;
use crate::store::checkpoints::commit::CommitInfo;
use crate::store::checkpoints::disk::{self, Depth, RankState, State};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use writer::{Job, Writer};

#[derive(Debug, thiserror::Error)]
pub enum CkptError {
    #[error("checkpoint step {step}: libtorch: {source}")]
    Torch { step: u64, source: tch::TchError },
    #[error("checkpoint step {step}: gathering the ranks' state: {source}")]
    Collective { step: u64, source: CollectiveError },
    #[error("checkpoint step {step}: {reason}")]
    Save { step: u64, reason: String },
    #[error("FLIGHTDECK_RESUME_FROM {dir}: {reason}")]
    Resume { dir: String, reason: String },
    #[error("init.from {dir} (FLIGHTDECK_INIT_FROM): {reason}")]
    Init { dir: String, reason: String },
}

/// Where and how often this run saves.
pub struct Plan {
    /// The checkpoint directory: `checkpoint.dir` under the run directory.
    pub root: PathBuf,
    pub every: u64,
    pub keep: u32,
    pub run: String,
    /// The recipe file's exact bytes, saved as `recipe.json` with its sha256.
    pub recipe_json: Vec<u8>,
    /// Whether this rank writes the checkpoint: rank 0 always, and on a run over several nodes
    /// the first rank of every other node too, each into its own node's run directory, so that
    /// every node can resume from its own disk (the weights are the same on every rank).
    pub writes: bool,
    /// This node's name, in each manifest it writes.
    pub node: String,
}

impl Plan {
    /// From the agent's environment: FLIGHTDECK_RUN_DIR (else the working directory) and
    /// FLIGHTDECK_RUN; `env` says which rank this is and where.
    pub fn from_env(recipe: &Recipe, recipe_json: Vec<u8>, env: &super::env::WorkerEnv) -> Plan {
        let run_dir = std::env::var_os("FLIGHTDECK_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        Plan {
            root: crate::store::checkpoints::root_of(&run_dir, &recipe.checkpoint.dir),
            every: recipe.checkpoint.every,
            keep: recipe.checkpoint.keep,
            run: std::env::var("FLIGHTDECK_RUN").unwrap_or_default(),
            recipe_json,
            writes: writes_copy(env.rank, env.local_rank, &recipe.checkpoint.dir),
            node: env.node.clone(),
        }
    }
}

/// Rank 0 writes every checkpoint; the first rank of each other node writes a copy into its
/// node's run directory. An absolute `checkpoint.dir` is one place every node names alike
/// (shared storage, as a rule), so only rank 0 writes there.
pub fn writes_copy(rank: u32, local_rank: u32, checkpoint_dir: &str) -> bool {
    rank == 0 || (local_rank == 0 && !Path::new(checkpoint_dir).is_absolute())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Every rank agreed to stop after this step (and it is saved, when there is a plan).
    Stop,
}

/// Per run: decides when to save, takes the snapshots, owns the writer of a rank that writes.
pub struct Checkpointer<'a> {
    plan: Option<Plan>,
    writer: Option<Writer>,
    stop: &'a AtomicBool,
    tele: TelemetryTx,
    recipe_sha256: String,
    data_seed: u64,
    torch_seed: u64,
    last_saved: u64,
}

impl<'a> Checkpointer<'a> {
    /// `plan` None never saves (in-process tests); `stop` is the flag SIGUSR1 sets.
    pub fn new(
        plan: Option<Plan>,
        stop: &'a AtomicBool,
        recipe: &Recipe,
        tele: &TelemetryTx,
    ) -> Result<Checkpointer<'a>, CkptError> {
        let writer = match &plan {
            Some(p) if p.writes => Some(
                Writer::start(p.root.clone(), p.keep, tele.clone())
                    .map_err(|e| CkptError::Save { step: 0, reason: format!("cannot start the writer thread: {e}") })?,
            ),
            _ => None,
        };
        let recipe_sha256 = plan.as_ref().map(|p| disk::sha256_hex(&p.recipe_json)).unwrap_or_default();
        Ok(Checkpointer {
            plan,
            writer,
            stop,
            tele: tele.clone(),
            recipe_sha256,
            data_seed: recipe.data.seed,
            torch_seed: recipe.train.seed,
            last_saved: 0,
        })
    }

    /// At the boundary after `step`'s update, on every rank: agree on stopping, save when due
    /// (every `checkpoint.every` steps, and on a stop), and say whether to go on.
    pub fn after_step(
        &mut self,
        step: u64,
        loss: f64,
        model: &Gpt,
        opt: &AdamW,
        data_position: u64,
        group: &mut dyn StepCollective,
    ) -> Result<Flow, CkptError> {
        let asked = self.stop.load(Ordering::SeqCst);
        let stop = stop::agree(group, asked).map_err(|source| CkptError::Collective { step, source })?;
        let every = self.plan.as_ref().map(|p| p.every).unwrap_or(0);
        let due = (every > 0 && step.is_multiple_of(every)) || stop;
        if due && self.plan.is_some() && self.last_saved != step {
            self.save(step, loss, model, opt, data_position, group)?;
        }
        if !stop {
            return Ok(Flow::Continue);
        }
        // A stop is only graceful if its checkpoint is down: wait for the write.
        if let Some(Some(Err(reason))) = self.writer.as_ref().map(Writer::wait_idle) {
            return Err(CkptError::Save { step, reason });
        }
        Ok(Flow::Stop)
    }

    fn save(
        &mut self,
        step: u64,
        loss: f64,
        model: &Gpt,
        opt: &AdamW,
        data_position: u64,
        group: &mut dyn StepCollective,
    ) -> Result<(), CkptError> {
        let t0 = Instant::now();
        self.tele.phase(Step(step), crate::protocol::message::Phase::Ckpt);
        let (rank, world) = (group.rank().0, group.world_size());
        let mine =
            RankState { rank, step, data_position, data_seed: self.data_seed, torch_seed: self.torch_seed, loss };
        let mine = serde_json::to_vec_pretty(&mine).unwrap_or_default();
        group.set_step(Step(step));
        let all = gather(group, &mine).map_err(|source| CkptError::Collective { step, source })?;
        self.last_saved = step;
        let (Some(writer), Some(plan)) = (&self.writer, &self.plan) else {
            return Ok(());
        };
        // A previous save still writing holds this step: that wait is part of the blocking time.
        writer.wait_idle();
        let (model_buf, optim_buf) = writer.take_spare();
        let torch = |source| CkptError::Torch { step, source };
        let n = model.num_params();
        let model_buf = tensors::copy_all(model.params().iter().map(|p| &p.tensor), n, model_buf).map_err(torch)?;
        let optim_buf =
            tensors::copy_all(opt.exp_avg.iter().chain(&opt.exp_avg_sq), 2 * n, optim_buf).map_err(torch)?;
        let losses: Vec<f64> =
            all.iter().map(|b| serde_json::from_slice::<RankState>(b).map(|s| s.loss).unwrap_or(f64::NAN)).collect();
        let state = State {
            format: disk::FORMAT_VERSION,
            run: plan.run.clone(),
            step,
            world_size: world,
            recipe_sha256: self.recipe_sha256.clone(),
            optimizer_steps: opt.steps,
            tensors: tensors::index(model.params()),
        };
        let mut small = vec![
            (disk::STATE.to_string(), serde_json::to_vec_pretty(&state).unwrap_or_default()),
            (disk::RECIPE.to_string(), plan.recipe_json.clone()),
        ];
        small.extend(all.into_iter().enumerate().map(|(r, b)| (disk::rank_file(r as u32), b)));
        let info = CommitInfo {
            run: plan.run.clone(),
            step,
            world_size: world,
            loss: losses.iter().sum::<f64>() / losses.len().max(1) as f64,
            saved_ms: unix_ms(),
            node: plan.node.clone(),
        };
        let blocking_ms = t0.elapsed().as_secs_f64() * 1e3;
        let job = Job { info, model: model_buf, optim: optim_buf, small, blocking_ms };
        writer.submit(job).map_err(|reason| CkptError::Save { step, reason })
    }

    /// Waits until no save is in flight (the benchmark times writes with it).
    pub fn flush(&self) {
        if let Some(w) = &self.writer {
            w.wait_idle();
        }
    }

    /// Waits for the last save; an error if it failed.
    pub fn finish(mut self) -> Result<(), CkptError> {
        match self.writer.take().and_then(Writer::finish) {
            Some(Err(reason)) => Err(CkptError::Save { step: self.last_saved, reason }),
            _ => Ok(()),
        }
    }
}

/// Every rank's bytes, on every rank, through the one collective the group has: each rank
/// writes its bytes into its own slot of a zeroed buffer and the buffers are summed. Each slot
/// has one non-zero contributor, so the sum is exact. Lengths go first, so slots fit.
fn gather(group: &mut dyn StepCollective, mine: &[u8]) -> Result<Vec<Vec<u8>>, CollectiveError> {
    let (rank, world) = (group.rank().0 as usize, group.world_size() as usize);
    if world == 1 {
        return Ok(vec![mine.to_vec()]);
    }
    // f32 holds integers exactly up to 2^24: far above a rank's few hundred bytes of state.
    let mut lens = vec![0f32; world];
    lens[rank] = mine.len() as f32;
    group.all_reduce_sum(&mut lens)?;
    let slot = lens.iter().fold(0usize, |m, &l| m.max(l as usize));
    let mut buf = vec![0f32; world * slot];
    for (i, b) in mine.iter().enumerate() {
        buf[rank * slot + i] = f32::from(*b);
    }
    group.all_reduce_sum(&mut buf)?;
    Ok((0..world).map(|r| buf[r * slot..r * slot + lens[r] as usize].iter().map(|&x| x as u8).collect()).collect())
}

/// What a restore leaves for the loop: the step the checkpoint holds and the data position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    pub step: u64,
    pub data_position: u64,
}

/// Loads checkpoint `dir` into `model` and `opt` for `rank` of `world`. Every file is hashed as
/// it is read and compared with the manifest, so what is loaded is what was saved.
pub fn restore(dir: &Path, rank: u32, world: u32, model: &mut Gpt, opt: &mut AdamW) -> Result<Restored, CkptError> {
    let fail = |reason: String| CkptError::Resume { dir: dir.display().to_string(), reason };
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let step = disk::parse_step_dir(name)
        .ok_or_else(|| fail(format!("{name:?} is not a checkpoint step directory (step-NNNNNNNN)")))?;
    let manifest = disk::verify(dir, step, Depth::Sizes).map_err(|e| fail(e.to_string()))?;
    let read = |file: &str| disk::read_verified(dir, &manifest, file).map_err(|e| fail(e.to_string()));
    let state: State = serde_json::from_slice(&read(disk::STATE)?).map_err(|e| fail(format!("state.json: {e}")))?;
    if state.world_size != world {
        return Err(fail(format!(
            "saved by {} ranks, this run has {world}: resuming on another world size is not supported",
            state.world_size
        )));
    }
    tensors::check_index(&state.tensors, model.params()).map_err(fail)?;
    let weights = read(disk::MODEL)?;
    let moments = read(disk::OPTIM)?;
    let half = weights.len() as u64;
    if moments.len() as u64 != 2 * half {
        return Err(fail(format!("optim.bin is {} bytes, expected twice model.bin ({half})", moments.len())));
    }
    for (p, e) in model.params_mut().iter_mut().zip(&state.tensors) {
        tensors::load_into(&mut p.tensor, &weights, 0, e).map_err(fail)?;
    }
    for (i, e) in state.tensors.iter().enumerate() {
        tensors::load_into(&mut opt.exp_avg[i], &moments, 0, e).map_err(fail)?;
        tensors::load_into(&mut opt.exp_avg_sq[i], &moments, half, e).map_err(fail)?;
    }
    opt.steps = state.optimizer_steps;
    let mine: RankState = serde_json::from_slice(&read(&disk::rank_file(rank))?)
        .map_err(|e| fail(format!("{}: {e}", disk::rank_file(rank))))?;
    if mine.rank != rank || mine.step != step {
        return Err(fail(format!("{} holds rank {} at step {}", disk::rank_file(rank), mine.rank, mine.step)));
    }
    Ok(Restored { step, data_position: mine.data_position })
}

/// Loads only the weights of checkpoint `dir` into `model` (a fresh optimizer trains on): what
/// `[init] from` starts a run from. Any world size's checkpoint will do (every rank holds the
/// same weights); the files are hashed as they are read. Returns the checkpoint's step.
pub fn init_weights(dir: &Path, model: &mut Gpt) -> Result<u64, CkptError> {
    let fail = |reason: String| CkptError::Init { dir: dir.display().to_string(), reason };
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let step = disk::parse_step_dir(name)
        .ok_or_else(|| fail(format!("{name:?} is not a checkpoint step directory (step-NNNNNNNN)")))?;
    let manifest = disk::verify(dir, step, Depth::Sizes).map_err(|e| fail(e.to_string()))?;
    let read = |file: &str| disk::read_verified(dir, &manifest, file).map_err(|e| fail(e.to_string()));
    let state: State = serde_json::from_slice(&read(disk::STATE)?).map_err(|e| fail(format!("state.json: {e}")))?;
    tensors::check_index(&state.tensors, model.params()).map_err(fail)?;
    let weights = read(disk::MODEL)?;
    for (p, e) in model.params_mut().iter_mut().zip(&state.tensors) {
        tensors::load_into(&mut p.tensor, &weights, 0, e).map_err(fail)?;
    }
    Ok(step)
}

#[cfg(test)]
#[path = "checkpoint/tests.rs"]
mod tests;
