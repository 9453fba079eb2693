//! The training loop: data → forward → backward → gradient all-reduce → AdamW, with telemetry.
//!
//! Reads top to bottom as one step. Every phase change is reported before the phase starts, so a
//! rank that hangs is known to be in the last phase it reported.
use super::checkpoint::{self, Checkpointer, CkptError, Flow, Plan};
use super::data::{DataError, Loader, Source};
use super::group::StepCollective;
use super::grpo::{self, Rollouts};
use super::model::Gpt;
use super::optim::{lr_at, AdamW};
use super::telemetry::TelemetryTx;
use crate::collective::{CollectiveError, InjectedFault};
use crate::ids::{unix_ms, Step};
use crate::protocol::message::{Phase, StepMetrics};
use crate::recipe::{Device, Dtype, FaultKind, Kind, OnNan, Recipe};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};
use tch::{TchError, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{0}")]
    Recipe(String),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("libtorch: {0}")]
    Torch(#[from] TchError),
    #[error("gradient all-reduce at step {step}: {source}")]
    Collective { step: u64, source: CollectiveError },
    #[error(transparent)]
    Checkpoint(#[from] CkptError),
    /// The averaged gradients were not finite and `recovery.on_nan` says not to train on.
    #[error(
        "the averaged gradients are not finite at step {step} (loss {loss}): stopped without applying it \
         (recovery.on_nan = {on_nan})"
    )]
    NonFinite { step: u64, loss: f64, on_nan: &'static str },
}

/// What a finished run leaves behind.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOutcome {
    pub steps: u64,
    pub final_loss: f64,
    /// The next global sequence index (what a checkpoint records).
    pub data_position: u64,
    /// Every rank agreed to stop (graceful stop) after `steps`.
    pub stopped: bool,
}

/// What a run brings besides its recipe: where it checkpoints, what it resumes from, and the
/// flag that asks it to stop at the next step boundary.
pub struct Session<'a> {
    pub plan: Option<Plan>,
    pub resume_from: Option<PathBuf>,
    /// `[init] from`, resolved by the server to a checkpoint directory: its weights are the
    /// start (a resume restores its own checkpoint instead).
    pub init_from: Option<PathBuf>,
    pub stop: &'a AtomicBool,
}

/// Never set: for runs that cannot be asked to stop.
static NEVER: AtomicBool = AtomicBool::new(false);

/// Everything the worker refuses before training, with what would be valid. Faults that are not
/// implemented are refused on every rank, so no rank waits at the rendezvous for one that left.
pub fn check(recipe: &Recipe, world_size: u32) -> Result<(), TrainError> {
    let refuse = |msg: String| Err(TrainError::Recipe(msg));
    if recipe.kind == Kind::Command {
        return refuse(format!(
            "kind = {:?}: the worker trains only \"pretrain\", \"sft\", \"dpo\" and \"grpo\" recipes",
            recipe.kind
        ));
    }
    if recipe.cluster.device == Device::Cuda && !super::cuda::device().is_cuda() {
        return refuse(
            "cluster.device = \"cuda\": CUDA is not initialised in this process (the worker does it from LOCAL_RANK)"
                .into(),
        );
    }
    if recipe.world_size() != world_size {
        return refuse(format!(
            "parallel.data = {} but WORLD_SIZE = {world_size}: the launcher and the recipe disagree",
            recipe.world_size()
        ));
    }
    let m = &recipe.model;
    if m.n_head == 0 || !m.d_model.is_multiple_of(m.n_head) {
        return refuse(format!("model.d_model = {} must be a multiple of model.n_head = {}", m.d_model, m.n_head));
    }
    Ok(())
}

/// Trains `recipe` as `group.rank()` of `group.world_size()`, from scratch and without
/// checkpoints. `on_step` sees every step's metrics (the loss is this rank's local mean).
pub fn train(
    recipe: &Recipe,
    group: &mut dyn StepCollective,
    tele: &TelemetryTx,
    on_step: &mut dyn FnMut(&StepMetrics),
) -> Result<TrainOutcome, TrainError> {
    train_session(
        recipe,
        group,
        tele,
        on_step,
        Session { plan: None, resume_from: None, init_from: None, stop: &NEVER },
    )
}

/// `train` with checkpoints, resume and graceful stop.
pub fn train_session(
    recipe: &Recipe,
    group: &mut dyn StepCollective,
    tele: &TelemetryTx,
    on_step: &mut dyn FnMut(&StepMetrics),
    session: Session<'_>,
) -> Result<TrainOutcome, TrainError> {
    check(recipe, group.world_size())?;
    let (rank, world) = (group.rank().0, group.world_size());
    let context = recipe.model.context as usize;
    let held_out = if recipe.eval.every > 0 { recipe.eval.prompts as usize } else { 0 };
    let (data, seed) = (&recipe.data.source, recipe.data.seed);
    let source = match recipe.kind {
        Kind::Sft | Kind::Grpo => Source::open_pairs(data, seed, context + 1, held_out)?,
        Kind::Dpo => Source::open_preferences(data, seed, context + 1, held_out)?,
        _ => Source::open(data, seed, context + 1)?,
    };
    if source.vocab() > recipe.model.vocab {
        return Err(TrainError::Recipe(format!(
            "model.vocab = {} is smaller than the data's vocabulary ({})",
            recipe.model.vocab,
            source.vocab()
        )));
    }
    let device = super::cuda::device();
    if recipe.train.dtype == Dtype::Bf16 && !device.is_cuda() {
        eprintln!("rank {rank}: train.dtype = \"bf16\" runs as fp32 on CPU (bf16 autocast is for CUDA)");
    }
    let mut loader = Loader::new(source, context, recipe.train.batch_per_rank, rank, world);
    let mut model = Gpt::new_on(&recipe.model, recipe.train.seed, device)?;
    if let (Some(dir), None) = (&session.init_from, &session.resume_from) {
        let step = checkpoint::init_weights(dir, &mut model)?;
        println!("rank {rank} starts from the weights of {} (step {step})", dir.display());
    }
    // DPO's and GRPO's frozen reference: the run's starting weights, rebuilt the same way on a
    // resume (the init's checkpoint, named in the spec, else train.seed's), never copied into
    // checkpoints. GRPO without a KL penalty has none.
    let wants_reference = match recipe.kind {
        Kind::Dpo => true,
        Kind::Grpo => recipe.grpo.beta > 0.0,
        _ => false,
    };
    let reference = match wants_reference {
        true => {
            let mut r = Gpt::new_on(&recipe.model, recipe.train.seed, device)?;
            if let Some(dir) = &session.init_from {
                checkpoint::init_weights(dir, &mut r)?;
            }
            Some(r)
        }
        false => None,
    };
    let mut opt = AdamW::from_recipe(model.params_mut(), &recipe.train)?;
    let on_gpu = device.is_cuda();
    let comm = Buckets::new(&recipe.parallel);
    let mut gpu_comm = super::cuda::DeviceBuckets::new(&recipe.parallel);
    let steps = recipe.train.steps;
    let mut start = 0;
    if let Some(dir) = &session.resume_from {
        let restored = checkpoint::restore(dir, rank, world, &mut model, &mut opt)?;
        if restored.step >= steps {
            return Err(TrainError::Recipe(format!(
                "FLIGHTDECK_RESUME_FROM {}: the checkpoint is at step {} and train.steps = {steps}: nothing remains \
                 to train (raise train.steps above {})",
                dir.display(),
                restored.step,
                restored.step
            )));
        }
        loader.seek(restored.data_position);
        start = restored.step;
        println!("rank {rank} resumed from {} at step {start}", dir.display());
        if recipe.data.skip_batches > 0 {
            loader.skip_batches(recipe.data.skip_batches);
            println!(
                "rank {rank} passes over {} global batches of data (data.skip_batches): step {} trains on what step {} \
                 would have",
                recipe.data.skip_batches,
                start + 1,
                start + 1 + recipe.data.skip_batches
            );
        }
    }
    let mut ckpt = Checkpointer::new(session.plan, session.stop, recipe, tele)?;
    let mut stopped = false;
    // A step whose averaged gradients were not finite, under `recovery.on_nan` stop or restart.
    let mut non_finite = None;
    let mut last = start;
    let faults: Vec<&crate::recipe::Fault> = recipe.faults.iter().filter(|f| f.rank == rank).collect();
    // The fault of `kind` in force at step `s` (from its step on), if any.
    let fault_at = |kind: FaultKind, s: u64| faults.iter().copied().find(|f| f.kind == kind && s >= f.step);
    let faulty = |kind: FaultKind, s: u64| fault_at(kind, s).is_some();
    let mut final_loss = f64::NAN;
    let eval_every = recipe.eval.every;
    if eval_every > 0 && start == 0 {
        // Step 0: what the initial (or `[init]`) weights already answer.
        evaluate(&model, loader.source(), recipe, group, tele, Step(0), device)?;
    }

    for s in start + 1..=steps {
        let step = Step(s);
        let t0 = Instant::now();
        tele.phase(step, Phase::Data);
        if faulty(FaultKind::Crash, s) {
            crash(rank, s, tele);
        }
        if faulty(FaultKind::HangBeforeCollective, s) {
            hang(rank, s, tele);
        }
        let (input, tokens, mut kind_metrics) = match recipe.kind {
            Kind::Grpo => {
                let (rollouts, split) = rollout(recipe, &model, reference.as_ref(), &mut loader, tele, step, device)?;
                let tokens = rollouts.inputs.numel() as u64;
                // Every step: the cockpit's samples panel reads the newest from the logs.
                if rank == 0 {
                    for sample in &rollouts.samples {
                        println!("{}", sample.to_line());
                    }
                }
                let mut m = rollouts.stats.clone();
                m.extend(split);
                (Input::Rollouts(rollouts), tokens, m)
            }
            _ => {
                let batch = loader.next_batch();
                let shape = [batch.rows as i64, batch.cols as i64];
                let x = Tensor::f_from_slice(&batch.inputs)?.f_view(shape)?.f_to_device(device)?;
                let y = Tensor::f_from_slice(&batch.targets)?.f_view(shape)?.f_to_device(device)?;
                (Input::Batch { x, y }, batch.inputs.len() as u64, Vec::new())
            }
        };
        let t_data = Instant::now();

        // One pass, or GRPO's ppo_epochs passes over its rollouts, each an optimizer step.
        let passes = if recipe.kind == Kind::Grpo { recipe.grpo.ppo_epochs } else { 1 };
        let mut spent = [Duration::ZERO; 4];
        let (mut loss_sum, mut grad_norm, mut lr) = (0.0, 0.0, 0.0);
        let mut pass_metrics: Vec<(String, f64)> = Vec::new();
        // Each pass starts where the last ended: the step's parts add up to its time.
        let mut t_opt = t_data;
        for pass in 0..passes {
            let t_pass = t_opt;
            tele.phase(step, Phase::Fwd);
            let (loss, metrics) = super::cuda::autocast(device, recipe.train.dtype, || {
                forward(recipe, &model, reference.as_ref(), &input)
            })?;
            let loss = match pass == 0 && faults.iter().any(|f| f.kind == FaultKind::Nan && f.step == s) {
                true => {
                    eprintln!("rank {rank}: fault injection: a NaN loss at step {s} at unix ms {}", unix_ms());
                    loss.f_mul_scalar(f64::NAN)?
                }
                false => loss,
            };
            let t_fwd = Instant::now();

            tele.phase(step, Phase::Bwd);
            opt.zero_grad(model.params())?;
            loss.f_backward()?;
            opt.gather_grads(model.params())?;
            // Reads the loss back to the host: a synchronisation point on a GPU.
            loss_sum += loss.f_double_value(&[])?;
            if let Some(fault) = fault_at(FaultKind::Slow, s) {
                if s == fault.step && pass == 0 {
                    eprintln!(
                        "rank {rank}: fault injection: {}% slower from step {s} at unix ms {}",
                        fault.slow_pct,
                        unix_ms()
                    );
                }
                // A slow device: its backward takes slow_pct % longer than this pass's compute.
                std::thread::sleep(t_pass.elapsed().mul_f64(fault.slow_pct / 100.0));
            }
            let t_bwd = Instant::now();

            // A lone rank has nothing to average: no phase, no copies, comm_ms exactly 0.
            let t_comm = if world > 1 {
                tele.phase(step, Phase::Comm);
                group.set_step(step);
                // Only the first pass of the first step at or after fault.step plays these (a
                // stalled rank never comes back; a mismatch breaks the ring).
                let first_faulty = |kind| pass == 0 && faults.iter().any(|f| f.kind == kind && f.step == s);
                if first_faulty(FaultKind::HangInCollective) {
                    eprintln!("rank {rank}: fault injection: stalling mid-ring in step {s} at unix ms {}", unix_ms());
                    group.inject(InjectedFault::StallAfterFirstChunk);
                }
                let shrink = first_faulty(FaultKind::Mismatch);
                if shrink {
                    eprintln!("rank {rank}: fault injection: one element short in step {s} at unix ms {}", unix_ms());
                }
                if on_gpu {
                    gpu_comm.all_reduce_mean(opt.grads_mut(), group, step)?;
                } else {
                    comm.all_reduce_mean(opt.grads_mut(), group, shrink).map_err(|e| match e {
                        CommError::Torch(t) => TrainError::Torch(t),
                        CommError::Collective(c) => TrainError::Collective { step: s, source: c },
                    })?;
                }
                Instant::now()
            } else {
                t_bwd
            };

            tele.phase(step, Phase::Opt);
            lr = lr_at(&recipe.train, s);
            grad_norm = opt.clip_grad_norm(recipe.train.grad_clip)?;
            // The norm of the averaged gradients is the same on every rank: all stop together.
            if !grad_norm.is_finite() && recipe.recovery.on_nan != OnNan::Ignore {
                non_finite = Some(s);
                t_opt = Instant::now();
                break;
            }
            opt.step(lr)?;
            t_opt = Instant::now();
            for (i, (a, b)) in
                [(t_pass, t_fwd), (t_fwd, t_bwd), (t_bwd, t_comm), (t_comm, t_opt)].into_iter().enumerate()
            {
                spent[i] += b.duration_since(a);
            }
            add_mean(&mut pass_metrics, metrics, pass, passes);
        }
        let loss_value = loss_sum / f64::from(passes);
        kind_metrics.extend(pass_metrics);
        if recipe.kind == Kind::Grpo {
            kind_metrics.push(("time/update_ms".into(), t_opt.duration_since(t_data).as_secs_f64() * 1e3));
        }

        let ms = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64() * 1e3;
        let metrics = StepMetrics {
            step,
            loss: loss_value,
            lr,
            grad_norm,
            tokens,
            step_time_ms: ms(t0, t_opt),
            data_ms: ms(t0, t_data),
            fwd_ms: spent[0].as_secs_f64() * 1e3,
            bwd_ms: spent[1].as_secs_f64() * 1e3,
            comm_ms: spent[2].as_secs_f64() * 1e3,
            opt_ms: spent[3].as_secs_f64() * 1e3,
            mem_rss_bytes: rss_bytes(),
        };
        // A NaN or infinite loss is reported as is (the server flags it) and training goes on.
        tele.step(&metrics, s == steps);
        if s == steps || s.is_multiple_of(recipe.telemetry.step_interval.max(1)) {
            tele.metrics(step, kind_metrics);
        }
        on_step(&metrics);
        if non_finite.is_some() {
            final_loss = loss_value;
            break;
        }
        if eval_every > 0 && (s.is_multiple_of(eval_every) || s == steps) {
            evaluate(&model, loader.source(), recipe, group, tele, step, device)?;
        }
        if s % 10 == 0 || s == steps {
            println!("rank {rank} step {s}/{steps} loss {loss_value:.4} step {:.1} ms", metrics.step_time_ms);
        }
        final_loss = loss_value;
        last = s;
        let position = loader.position();
        if ckpt.after_step(s, loss_value, &model, &opt, position, group)? == Flow::Stop {
            println!("rank {rank} stopped after step {s} on request");
            stopped = true;
            break;
        }
    }
    ckpt.finish()?;
    tele.phase(Step(last), Phase::Done);
    if let Some(step) = non_finite {
        let on_nan = if recipe.recovery.on_nan == OnNan::Restart { "restart" } else { "stop" };
        return Err(TrainError::NonFinite { step, loss: final_loss, on_nan });
    }
    Ok(TrainOutcome { steps: last, final_loss, data_position: loader.position(), stopped })
}

/// What a step's passes train on: a batch of rows, or GRPO's scored rollouts.
enum Input {
    Batch { x: Tensor, y: Tensor },
    Rollouts(Rollouts),
}

/// The step's loss and what the kind adds: for sft the token accuracy and the answer tokens
/// counted, for dpo the preference metrics against `reference`, for grpo the policy's entropy,
/// clipping and KL.
fn forward(
    recipe: &Recipe,
    model: &Gpt,
    reference: Option<&Gpt>,
    input: &Input,
) -> Result<(Tensor, Vec<(String, f64)>), TchError> {
    let (x, y) = match input {
        Input::Rollouts(r) => return grpo::loss(model, r, &recipe.grpo),
        Input::Batch { x, y } => (x, y),
    };
    match (recipe.kind, reference) {
        (Kind::Dpo, Some(reference)) => super::dpo::loss(model, reference, x, y, recipe.dpo.beta),
        (Kind::Sft, _) => {
            let (loss, logits) = model.loss_and_logits(x, y)?;
            let accuracy = super::eval::token_accuracy(&logits, y)?;
            let answer_tokens = y.f_ne(super::data::IGNORE)?.f_sum(tch::Kind::Float)?.f_double_value(&[])?;
            Ok((loss, vec![("mean_token_accuracy".into(), accuracy), ("num_tokens".into(), answer_tokens)]))
        }
        _ => Ok((model.loss(x, y)?, Vec::new())),
    }
}

/// Folds pass `pass` of `passes` into the running means of each metric, by name.
fn add_mean(means: &mut Vec<(String, f64)>, metrics: Vec<(String, f64)>, pass: u32, passes: u32) {
    for (name, v) in metrics {
        let share = v / f64::from(passes);
        match means.iter_mut().find(|(n, _)| *n == name) {
            Some((_, m)) => *m += share,
            None if pass == 0 => means.push((name, share)),
            None => {}
        }
    }
}

/// GRPO's rollout for `step`: this rank's prompts, a group of completions sampled for each
/// (phase generate), their rewards and advantages (score), and the log-probabilities the update
/// compares against (reference). Returns the rollouts and the three phases' times.
fn rollout(
    recipe: &Recipe,
    model: &Gpt,
    reference: Option<&Gpt>,
    loader: &mut Loader,
    tele: &TelemetryTx,
    step: Step,
    device: tch::Device,
) -> Result<(Rollouts, Vec<(String, f64)>), TrainError> {
    let cfg = &recipe.grpo;
    let prompts = loader.next_prompts(recipe.model.context as usize - cfg.max_new_tokens as usize);
    let source = loader.source();
    tele.phase(step, Phase::Generate);
    let t0 = Instant::now();
    let mut groups = grpo::generate(model, source, &prompts, cfg, recipe.train.seed, device)?;
    let t1 = Instant::now();
    tele.phase(step, Phase::Score);
    grpo::score(source, &mut groups, cfg.format_reward);
    let mut rollouts = grpo::rollouts(source, &groups, cfg.samples as usize, step.0, device)?;
    let t2 = Instant::now();
    tele.phase(step, Phase::Reference);
    {
        let _no_grad = tch::no_grad_guard();
        if let Some(reference) = reference {
            rollouts.ref_logps =
                Some(grpo::token_logps(reference, &rollouts.inputs, &rollouts.targets, cfg.temperature)?.0);
        }
        // One pass is on-policy: its ratio is 1 by construction, against its own detached copy.
        if cfg.ppo_epochs > 1 {
            rollouts.old_logps =
                Some(grpo::token_logps(model, &rollouts.inputs, &rollouts.targets, cfg.temperature)?.0);
        }
    }
    let t3 = Instant::now();
    let ms = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64() * 1e3;
    let split = vec![
        ("time/generate_ms".to_string(), ms(t0, t1)),
        ("time/score_ms".to_string(), ms(t1, t2)),
        ("time/reference_ms".to_string(), ms(t2, t3)),
    ];
    Ok((rollouts, split))
}

/// One eval at `step` on every rank (a collective: every rank calls it at the same steps); rank
/// 0 prints it, every rank reports it.
fn evaluate(
    model: &Gpt,
    source: &Source,
    recipe: &Recipe,
    group: &mut dyn StepCollective,
    tele: &TelemetryTx,
    step: Step,
    device: tch::Device,
) -> Result<(), TrainError> {
    tele.phase(step, Phase::Eval);
    group.set_step(step);
    let scored = super::eval::exact_match(model, source, &recipe.eval, group, device).map_err(|e| match e {
        super::eval::EvalError::Torch(t) => TrainError::Torch(t),
        super::eval::EvalError::Collective(c) => TrainError::Collective { step: step.0, source: c },
    })?;
    if group.rank().0 == 0 {
        println!(
            "eval step {}: exact match {}/{} = {:.3}",
            step.0,
            scored.correct,
            scored.prompts,
            scored.exact_match()
        );
    }
    tele.metrics(step, vec![("eval/exact_match".into(), scored.exact_match())]);
    Ok(())
}

enum CommError {
    Torch(TchError),
    Collective(CollectiveError),
}

/// Gradient averaging on the optimizer's flat gradient (parameter order, identical on every
/// rank; autograd accumulates into it), all-reduced in place `bucket_bytes` at a time (one
/// collective, one flight record per bucket), then divided by the world size.
struct Buckets {
    bucket_elems: usize,
}

impl Buckets {
    fn new(parallel: &crate::recipe::Parallel) -> Buckets {
        Buckets { bucket_elems: (parallel.bucket_bytes as usize / std::mem::size_of::<f32>()).max(1) }
    }

    /// `shrink` (fault injection) sends the first bucket one element short, so this rank's
    /// collective differs in size from its peers' at the same sequence number.
    fn all_reduce_mean(
        &self,
        grads: &mut Tensor,
        group: &mut dyn StepCollective,
        shrink: bool,
    ) -> Result<(), CommError> {
        let flat = host_floats(grads).map_err(CommError::Torch)?;
        for (i, bucket) in flat.chunks_mut(self.bucket_elems).enumerate() {
            let len = if shrink && i == 0 { bucket.len().saturating_sub(1) } else { bucket.len() };
            group.all_reduce_sum(&mut bucket[..len]).map_err(CommError::Collective)?;
        }
        let _ = grads.f_div_scalar_(f64::from(group.world_size())).map_err(CommError::Torch)?;
        Ok(())
    }
}

/// A contiguous f32 tensor in host memory as the slice the collectives take.
fn host_floats(t: &mut Tensor) -> Result<&mut [f32], TchError> {
    if t.device() != tch::Device::Cpu || t.kind() != tch::Kind::Float || !t.is_contiguous() {
        return Err(TchError::Kind(format!(
            "the gradient buffer must be a contiguous f32 tensor in host memory, got {:?} {:?}",
            t.kind(),
            t.device()
        )));
    }
    let n = t.numel();
    if n == 0 {
        return Ok(&mut []);
    }
    // SAFETY: a contiguous CPU f32 tensor of n elements owns n·4 bytes at data_ptr, aligned
    // for f32; the exclusive borrow of the tensor handle keeps this code its only user while
    // the slice lives (the optimizer, its owner, is not called meanwhile).
    Ok(unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<f32>(), n) })
}

/// `fault.kind = "crash"`: dies by SIGKILL, as an OOM-killed or segfaulted rank would, after
/// giving the telemetry a moment so the agent knows the step it died in.
fn crash(rank: u32, step: u64, tele: &TelemetryTx) -> ! {
    eprintln!("rank {rank}: fault injection: SIGKILL at step {step} at unix ms {}", unix_ms());
    tele.flush(Duration::from_secs(1));
    // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    loop {
        std::thread::park();
    }
}

/// `fault.kind = "hang-before-collective"`: stays in phase `data` forever, never entering the
/// step's all-reduce, so its peers wait in it.
fn hang(rank: u32, step: u64, tele: &TelemetryTx) -> ! {
    eprintln!("rank {rank}: fault injection: hanging before the collective of step {step} at unix ms {}", unix_ms());
    tele.flush(Duration::from_secs(1));
    loop {
        std::thread::park();
    }
}

/// Resident set size from /proc/self/statm (0 where unavailable).
fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

#[cfg(test)]
#[path = "train_tests.rs"]
mod tests;
