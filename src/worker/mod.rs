//! `flightdeck worker`: one data-parallel rank of the embedded tch runtime (DESIGN.md §5).
//!
//! Map: `env` parses the torchrun environment; `group` joins the ranks (rendezvous, ring,
//! flight recorder); `data` makes the batches, `arith` is its synthetic generator; `model` is
//! the GPT; `optim` is AdamW and its schedule; `train` is the loop; `telemetry` streams to the
//! node agent; `checkpoint` saves, restores and agrees on graceful stops.
pub mod arith;
pub mod checkpoint;
pub mod cuda;
pub mod data;
pub mod dpo;
pub mod env;
pub mod eval;
pub mod group;
pub mod grpo;
pub mod model;
pub mod optim;
pub mod synthetic_tokens;
pub mod telemetry;
pub mod train;

use crate::ids::{Rank, Step};
use crate::protocol::message::Phase;
use crate::recipe::Recipe;
use anyhow::Context;
use env::WorkerEnv;
use std::path::Path;
use telemetry::Telemetry;

/// Every step frees and allocates the same activations and gradients again. glibc's malloc
/// gives large blocks back to the kernel (mmap'd blocks on free, the heap's top past a trim
/// threshold), so each step would fault the same pages in anew; keeping up to 512 MiB of freed
/// memory in the process instead made tiny-gpt's steps about 3 % faster here (24.5 → 23.7 ms,
/// 1 rank × 2 threads, three runs each). Set before libtorch allocates anything.
fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes allocator parameters (under the arena lock); no pointers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 512 << 20);
        libc::mallopt(libc::M_TOP_PAD, 64 << 20);
    }
}

/// The entry for `flightdeck worker`: everything comes from the environment the agent (or
/// torchrun) sets. Ok after `train.steps` steps; an error (to print on stderr, exit non-zero)
/// otherwise.
pub fn main_from_env() -> anyhow::Result<()> {
    // First: a graceful stop (SIGUSR1) that arrives during start-up must not kill the rank.
    checkpoint::stop::install().context("installing the SIGUSR1 (graceful stop) handler")?;
    keep_freed_memory();
    let env = WorkerEnv::from_lookup(|k| std::env::var(k).ok())?;
    // Inter-op parallelism must be fixed before any parallel work (libtorch refuses, and tch
    // panics, on a second call); a model this size gains nothing from it. Intra-op threads
    // share the node's cores between its ranks.
    static INTEROP: std::sync::Once = std::sync::Once::new();
    INTEROP.call_once(|| tch::set_num_interop_threads(1));
    let recipe = load_recipe(&env.recipe_path)?;
    tch::set_num_threads(intra_op_threads(&recipe, &env));
    if recipe.cluster.device == crate::recipe::Device::Cuda {
        // Before any CUDA use: loads libtorch_cuda and picks GPU LOCAL_RANK.
        cuda::init(env.local_rank).with_context(|| format!("rank {}", env.rank))?;
    }
    let recipe_json = std::fs::read(&env.recipe_path)
        .with_context(|| format!("FLIGHTDECK_RECIPE {}: cannot read the recipe", env.recipe_path.display()))?;
    let session = train::Session {
        plan: Some(checkpoint::Plan::from_env(&recipe, recipe_json, &env)),
        resume_from: std::env::var_os("FLIGHTDECK_RESUME_FROM").filter(|v| !v.is_empty()).map(Into::into),
        init_from: std::env::var_os("FLIGHTDECK_INIT_FROM").filter(|v| !v.is_empty()).map(Into::into),
        stop: checkpoint::stop::flag(),
    };
    train::check(&recipe, env.world_size).with_context(|| format!("rank {}", env.rank))?;
    let telemetry = Telemetry::connect(env.telemetry.as_deref(), &env.node, Rank(env.rank), &recipe.telemetry);
    telemetry.tx().phase(Step(0), Phase::Init);

    let result = group::connect(&env, &recipe, telemetry.tx()).map_err(anyhow::Error::from).and_then(|mut group| {
        let mut throughput = cuda::Throughput::new();
        let outcome =
            train::train_session(&recipe, group.as_mut(), telemetry.tx(), &mut |m| throughput.add(m), session)
                .with_context(|| format!("rank {}", env.rank))?;
        let peak = std::env::var("FLIGHTDECK_PEAK_TFLOPS").ok().and_then(|v| v.parse().ok());
        let gpu = cuda::device_name(cuda::device());
        println!("{}", throughput.line(env.rank, &recipe.model, &gpu, peak));
        Ok(outcome)
    });
    let report = telemetry.finish(result.as_ref().ok().map(|o| (o.steps, o.final_loss)));
    if env.telemetry.is_some() {
        eprintln!(
            "rank {}: telemetry sent {}, dropped {} (queue full), lost {} (socket)",
            env.rank, report.sent, report.dropped, report.lost
        );
    }
    result.map(|_| ())
}

/// The exit code a failed rank reports, when its failure has one of its own: a non-finite
/// gradient norm under `recovery.on_nan` (`record::NON_FINITE_EXIT`), which recovery reads
/// as cause `nan` rather than a crash.
pub fn exit_code(e: &anyhow::Error) -> Option<i32> {
    match e.downcast_ref::<train::TrainError>() {
        Some(train::TrainError::NonFinite { .. }) => Some(crate::record::NON_FINITE_EXIT),
        _ => None,
    }
}

/// The rank's intra-op threads: `train.threads`, else `FLIGHTDECK_TORCH_THREADS` (a test's or a
/// benchmark's pin), else the node's cores shared by its ranks. A thread count changes the order
/// of a matmul's sums: the same count gives the same losses on any placement.
fn intra_op_threads(recipe: &Recipe, env: &WorkerEnv) -> i32 {
    let pinned = std::env::var("FLIGHTDECK_TORCH_THREADS").ok().and_then(|v| v.trim().parse::<i32>().ok());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    match recipe.train.threads {
        0 => pinned.filter(|n| *n > 0).unwrap_or_else(|| env.torch_threads(cores)),
        n => i32::try_from(n).unwrap_or(i32::MAX),
    }
}

fn load_recipe(path: &Path) -> anyhow::Result<Recipe> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("FLIGHTDECK_RECIPE {}: cannot read the recipe", path.display()))?;
    serde_json::from_str(&text).with_context(|| {
        format!("FLIGHTDECK_RECIPE {}: not a validated recipe as JSON (the agent writes it)", path.display())
    })
}

/// For `doctor`: libtorch loads and computes a 2×2 matmul; says which threads it will use.
pub fn libtorch_probe() -> anyhow::Result<String> {
    let a = tch::Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).reshape([2, 2]);
    let got = a.matmul(&a).sum(tch::Kind::Float).double_value(&[]);
    if got != 54.0 {
        anyhow::bail!("a 2x2 matmul gave {got}, expected 54");
    }
    Ok(format!(
        "PyTorch {} libraries load; {} intra-op threads; CUDA loaded: {}",
        TORCH_VERSION,
        tch::get_num_threads(),
        tch::Cuda::is_available()
    ))
}

/// The PyTorch release the build links (tch =0.24.0 checks it at build time).
pub const TORCH_VERSION: &str = "2.11.0";

/// Recipes for the worker's tests: a GPT small enough to train in milliseconds per step.
#[cfg(test)]
pub(crate) mod testing {
    use crate::recipe::*;

    pub fn recipe(world: u32, batch_per_rank: u32, steps: u64) -> Recipe {
        Recipe {
            name: "worker-test".into(),
            kind: Kind::Pretrain,
            model: Model { n_layer: 2, n_head: 2, d_model: 32, context: 32, vocab: 16 },
            data: Data { source: DataSource::Synthetic { generator: "arith".into() }, seed: 1, skip_batches: 0 },
            train: Train {
                steps,
                batch_per_rank,
                lr: 3e-3,
                min_lr: 3e-4,
                warmup: 5,
                schedule: Schedule::Cosine,
                grad_clip: 1.0,
                weight_decay: 0.1,
                beta1: 0.9,
                beta2: 0.95,
                seed: 1337,
                dtype: Dtype::Fp32,
                threads: 0,
            },
            parallel: Parallel { data: world, backend: CollectiveBackend::Ring, bucket_bytes: 25 << 20 },
            checkpoint: Checkpoint { every: 0, keep: 1, dir: "ckpt".into() },
            cluster: Cluster {
                hosts: vec!["local".into()],
                spare_hosts: Vec::new(),
                ranks_per_node: world,
                device: Device::Cpu,
                ssh: Default::default(),
                launcher: Default::default(),
                slurm: Default::default(),
            },
            telemetry: Telemetry { step_interval: 1, sample_interval_ms: 1000, enabled: true },
            faults: Vec::new(),
            command: None,
            analysis: Analysis::default(),
            init: None,
            eval: Eval::default(),
            dpo: Dpo::default(),
            grpo: Grpo::default(),
            recovery: Recovery::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn recipe_json_round_trips_and_bad_files_name_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.json");
        let r = super::testing::recipe(2, 4, 10);
        std::fs::write(&path, serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(super::load_recipe(&path).unwrap(), r);
        std::fs::write(&path, "{").unwrap();
        let err = format!("{:#}", super::load_recipe(&path).unwrap_err());
        assert!(err.contains("FLIGHTDECK_RECIPE") && err.contains("r.json"), "{err}");
    }
}
