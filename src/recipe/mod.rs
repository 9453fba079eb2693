//! Recipes: TOML data parsed into raw serde structs, then validated once into typed values.
mod check;
mod error;
mod post;
mod raw;
mod sections;
pub mod sweep;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_invalid;
mod tree;
mod validate;

pub use error::{ErrorKind, RecipeError};
pub use sweep::{load_sweep, SweepPlan};
pub use tree::did_you_mean;
pub use validate::{load_file, parse_str};

use serde::{Deserialize, Serialize};

/// What a run trains: the embedded trainers (`Pretrain`, `Sft`, `Dpo`, `Grpo`) or a program of
/// the user's own (`Command`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Pretrain,
    Sft,
    Dpo,
    Grpo,
    Command,
}

impl Kind {
    /// Why a run of this kind has no checkpoint of Flightdeck's to resume from (`None`: it has):
    /// the one answer of `resume`, the cockpit's `R` and the stop prompt.
    pub fn not_resumable(self) -> Option<&'static str> {
        match self {
            Kind::Command => Some(
                "a command job's checkpoints are its program's own, and Flightdeck keeps none to resume \
                 from: a stop sends its ranks SIGTERM (SIGKILL after the grace); if the program saved on it, \
                 start it again with `flightdeck run` and the program's own resume option",
            ),
            Kind::Pretrain | Kind::Sft | Kind::Dpo | Kind::Grpo => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Fp32,
    Bf16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    Constant,
    Cosine,
    Linear,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectiveBackend {
    Ring,
    Nccl,
}

/// Where training sequences come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DataSource {
    /// A generator shipped in the project, by name (`synthetic:arith`).
    Synthetic { generator: String },
    /// A local text file, read as bytes.
    File { path: std::path::PathBuf },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Model {
    pub n_layer: u32,
    pub n_head: u32,
    pub d_model: u32,
    pub context: u32,
    pub vocab: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Data {
    pub source: DataSource,
    pub seed: u64,
    /// Global batches passed over after a resume, before the first step trained: the window
    /// of data that made a loss non-finite (`recovery.on_nan = "restart"` sets it on the child).
    #[serde(default)]
    pub skip_batches: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Train {
    pub steps: u64,
    pub batch_per_rank: u32,
    pub lr: f64,
    pub min_lr: f64,
    pub warmup: u64,
    pub schedule: Schedule,
    pub grad_clip: f64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub seed: u64,
    pub dtype: Dtype,
    /// Each rank's intra-op threads; 0: the node's cores shared by its ranks. A thread count
    /// changes the order of a matmul's sums, so runs that must agree bit for bit on different
    /// placements (local, SSH, Slurm) name the same count. Stored recipes before it read as 0.
    #[serde(default)]
    pub threads: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Parallel {
    /// Data-parallel world size.
    pub data: u32,
    pub backend: CollectiveBackend,
    /// Gradient bucket size for the all-reduce, in bytes.
    pub bucket_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Save every this many steps; 0 = only on graceful stop.
    pub every: u64,
    pub keep: u32,
    /// Relative paths are under the run's directory.
    pub dir: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// `local` or SSH destinations (`node-a`, `user@node-b:2222`).
    pub hosts: Vec<String>,
    /// SSH destinations that recovery may put in place of a host that failed twice in a
    /// lineage (each with the same ranks as the one it replaces).
    #[serde(default)]
    pub spare_hosts: Vec<String>,
    pub ranks_per_node: u32,
    pub device: Device,
    /// How SSH hosts are reached and laid out (unused by `local`).
    #[serde(default)]
    pub ssh: ClusterSsh,
    /// Who starts the agents: the hosts themselves (this machine, or SSH), or Slurm.
    #[serde(default)]
    pub launcher: ClusterLauncher,
    /// The Slurm side of `[cluster]` (used when `launcher` is Slurm).
    #[serde(default)]
    pub slurm: ClusterSlurm,
}

/// `cluster.launcher`: who starts a run's agents.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterLauncher {
    /// `cluster.hosts` decides: `local` is this machine, anything else an SSH destination.
    #[default]
    Hosts,
    /// Slurm: an allocation (`sbatch`, or an existing job), one agent per node by `srun`.
    Slurm,
}

/// The Slurm side of `[cluster]` (flat keys in the recipe: `cluster.nodes`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterSlurm {
    /// Nodes to allocate; ranks are `nodes × ranks_per_node`.
    pub nodes: u32,
    pub partition: Option<String>,
    /// The allocation's limit as Slurm writes it (`--time`); None: the partition's default.
    pub time_limit: Option<String>,
    /// The same limit in seconds, parsed (None: no limit given).
    pub time_limit_s: Option<u64>,
    pub account: Option<String>,
    /// Anything else for `sbatch`, passed as given (e.g. `["--gres=gpu:8", "--exclusive"]`).
    pub sbatch_args: Vec<String>,
    /// An existing allocation to run in (`$SLURM_JOB_ID` inside `salloc`); None: `sbatch` one.
    pub slurm_job: Option<String>,
    /// The time-limit warning: Slurm signals this long before the limit, and the run stops at a
    /// step boundary with a checkpoint.
    pub grace_s: u64,
}

impl Default for ClusterSlurm {
    fn default() -> Self {
        ClusterSlurm {
            nodes: 1,
            partition: None,
            time_limit: None,
            time_limit_s: None,
            account: None,
            sbatch_args: Vec::new(),
            slurm_job: None,
            grace_s: DEFAULT_GRACE_S,
        }
    }
}

/// Slurm's warning may come up to 60 s early (its man page); 300 s covers a step, a save of a
/// large model and that slack.
pub const DEFAULT_GRACE_S: u64 = 300;

/// The SSH side of `[cluster]` (flat keys in the recipe: `cluster.remote_dir`, ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterSsh {
    /// Flightdeck's directory on each node (binaries, run directories); relative = under the
    /// remote user's home.
    pub remote_dir: String,
    /// libtorch on the nodes: a directory with its libraries, or a Python that has PyTorch.
    /// None: the binary's built-in run path (the same path as on this machine).
    pub libtorch: Option<String>,
    pub connect_timeout_s: u64,
    pub command_timeout_s: u64,
    /// An established link silent this long counts as cut (then the server reconnects).
    pub link_timeout_s: u64,
    /// Trust unknown host keys on first use, like OpenSSH's accept-new.
    pub accept_new_host_keys: bool,
    /// The OpenSSH client config to resolve hosts with (like `ssh -F`); None: ~/.ssh/config.
    #[serde(default)]
    pub ssh_config: Option<String>,
}

impl Default for ClusterSsh {
    fn default() -> Self {
        ClusterSsh {
            remote_dir: ".flightdeck".into(),
            libtorch: None,
            connect_timeout_s: 10,
            command_timeout_s: 60,
            link_timeout_s: 15,
            accept_new_host_keys: false,
            ssh_config: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// Send step metrics every this many steps.
    pub step_interval: u64,
    /// Sample processes (and GPUs) every this many milliseconds.
    pub sample_interval_ms: u64,
    /// Off: no step metrics, phases or flight records leave the worker (overhead benchmark).
    pub enabled: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    None,
    HangBeforeCollective,
    HangInCollective,
    Crash,
    Mismatch,
    Slow,
    /// Test-only: the rank waits to join the ring until the store's `fault/release` key is set,
    /// so a test can knock on the other ranks' listeners while they are open.
    HoldJoin,
    /// Test-only: the rank's loss is multiplied by NaN before backward at `step`, so the
    /// gradients every rank averages are NaN (`recovery.on_nan`).
    Nan,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub rank: u32,
    pub step: u64,
    pub slow_pct: f64,
}

/// For `kind = "command"`: the program each rank runs, with the torchrun environment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Command {
    pub argv: Vec<String>,
    /// Which log adapters read the ranks' output (`docs/adapters.md`); stored recipes from
    /// before it read as `auto`.
    #[serde(default)]
    pub log_format: crate::adapters::Choice,
    /// Set the variables that make PyTorch observable (`docs/real-jobs.md`); `false` sets none.
    #[serde(default = "yes")]
    pub observe: bool,
    /// Put Flightdeck's Python shim first on the ranks' PYTHONPATH (`assets/shim/`): flight
    /// recorder dumps and stacks each second, for the torch verdicts; `false` leaves it out.
    #[serde(default = "yes")]
    pub instrument: bool,
    /// `KEY=VALUE` for every rank, over Flightdeck's own defaults.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// The ranks' working directory: `[command] cwd`, relative to the recipe's directory, which
    /// is the default (so `argv = ["python", "train.py"]` finds the script beside the recipe).
    /// A node where it does not exist runs the ranks in the run directory.
    #[serde(default)]
    pub cwd: Option<std::path::PathBuf>,
    /// Who starts the ranks on a node: the agent itself, one process per rank, or one torchrun
    /// per node that spawns them (`docs/real-jobs.md`); stored recipes from before read as direct.
    #[serde(default)]
    pub launcher: Launcher,
}

/// `[command] launcher`: how a node's ranks are started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// The agent starts `argv` once per rank, with the torchrun environment.
    #[default]
    Direct,
    /// The agent starts one `torchrun` per node (`python -m torch.distributed.run`, or `argv[0]`
    /// when it is torchrun) with the node's ranks; torchrun spawns them.
    Torchrun,
}

/// torchrun's options that Flightdeck sets itself under `launcher = "torchrun"` (`--rdzv-*`
/// too), spelled with dashes.
pub const TORCHRUN_OPTIONS_SET: &[&str] = &[
    "--nnodes",
    "--nproc-per-node",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--standalone",
    "--max-restarts",
    "--log-dir",
    "--redirects",
    "-r",
    "--tee",
    "-t",
    "--local-ranks-filter",
    "--role",
];

/// How many leading words of `argv` start torchrun: 1 for `torchrun`, 3 for `python -m
/// torch.distributed.run` (or the old `.launch`); `None` when it is some other program.
pub fn torchrun_prefix_len(argv: &[String]) -> Option<usize> {
    let name = argv.first().map(|p| std::path::Path::new(p).file_name().unwrap_or_default().to_string_lossy());
    if name.as_deref() == Some("torchrun") {
        return Some(1);
    }
    let module = argv.get(1..3).filter(|a| a[0] == "-m");
    match module.map(|a| a[1].as_str()) {
        Some("torch.distributed.run" | "torch.distributed.launch") => Some(3),
        _ => None,
    }
}

fn yes() -> bool {
    true
}

/// A validated recipe. Every field has been checked; code downstream trusts it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    pub name: String,
    pub kind: Kind,
    pub model: Model,
    pub data: Data,
    pub train: Train,
    pub parallel: Parallel,
    pub checkpoint: Checkpoint,
    pub cluster: Cluster,
    pub telemetry: Telemetry,
    /// `[fault]` or `[[fault]]`: test faults, each firing once per lineage (a recovery attempt
    /// leaves out those its parent already reached). Stored recipes hold one table or a list.
    #[serde(rename = "fault", deserialize_with = "one_or_many", serialize_with = "table_or_list")]
    pub faults: Vec<Fault>,
    pub command: Option<Command>,
    /// Absent in recipes stored before the section existed: the defaults apply.
    #[serde(default)]
    pub analysis: Analysis,
    /// `[init]`: the weights the run starts from, else a fresh initialisation from train.seed.
    #[serde(default)]
    pub init: Option<Init>,
    /// `[eval]`: greedy exact match on held-out prompts (off in recipes stored before it).
    #[serde(default)]
    pub eval: Eval,
    /// `[dpo]`: the preference loss's settings (read by `kind = "dpo"` only).
    #[serde(default)]
    pub dpo: Dpo,
    /// `[grpo]`: sampling, reward and update settings (read by `kind = "grpo"` only).
    #[serde(default)]
    pub grpo: Grpo,
    /// `[recovery]`: restarts without a human (off in recipes stored before it).
    #[serde(default)]
    pub recovery: Recovery,
}

/// Faults as stored: one table when there are none or one (`kind = "none"` for none, as
/// recipes stored before lists have it, so `--set fault.kind=...` on a resume still applies),
/// a list when there are several.
fn table_or_list<S: serde::Serializer>(faults: &[Fault], s: S) -> Result<S::Ok, S::Error> {
    match faults {
        [] => Fault { kind: FaultKind::None, rank: 0, step: 1, slow_pct: 50.0 }.serialize(s),
        [one] => one.serialize(s),
        many => many.serialize(s),
    }
}

/// A stored `fault` as one table (recipes from before lists) or a list; `kind = "none"` entries
/// are dropped.
fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Fault>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(Fault),
        Many(Vec<Fault>),
    }
    let all = match OneOrMany::deserialize(d)? {
        OneOrMany::One(f) => vec![f],
        OneOrMany::Many(v) => v,
    };
    Ok(all.into_iter().filter(|f| f.kind != FaultKind::None).collect())
}

/// `[recovery]`: on a crash, a hang or a lost node the server kills what is left and starts a
/// child from the newest verified checkpoint, while the budgets last (DESIGN §recovery).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// Restarts of one lineage in all; 0 (the default) turns recovery off.
    pub max_restarts: u32,
    /// The wait before the first restart; each further one waits twice the last.
    pub backoff_s: f64,
    /// Restarts allowed per cause (each at most `max_restarts`).
    pub crash: u32,
    pub hang: u32,
    pub node_lost: u32,
    /// Restarts after a non-finite loss (with `on_nan = "restart"`).
    #[serde(default)]
    pub nan: u32,
    /// What a non-finite gradient norm does (absent in recipes stored before it: ignore).
    #[serde(default)]
    pub on_nan: OnNan,
}

/// `recovery.on_nan`: what a step whose averaged gradients are not finite does. The update is
/// never applied under `stop` or `restart`; every rank sees the same norm, so they all agree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNan {
    /// Train on (the server flags the loss): the behaviour before the setting existed.
    #[default]
    Ignore,
    /// The ranks exit without applying the step; the run fails naming the step.
    Stop,
    /// As `stop`, then recovery restarts from the checkpoint before it, past the data window
    /// that produced it (`data.skip_batches`).
    Restart,
}

impl Default for Recovery {
    fn default() -> Recovery {
        Recovery { max_restarts: 0, backoff_s: 1.0, crash: 0, hang: 0, node_lost: 0, nan: 0, on_nan: OnNan::Ignore }
    }
}

impl Recovery {
    /// The restarts `cause` may take.
    pub fn budget(&self, cause: crate::record::Cause) -> u32 {
        match cause {
            crate::record::Cause::Crash => self.crash,
            crate::record::Cause::Hang => self.hang,
            crate::record::Cause::NodeLost => self.node_lost,
            crate::record::Cause::Nan if self.on_nan == OnNan::Restart => self.nan,
            crate::record::Cause::Nan => 0,
            // Not a failure of the program: only the lineage's whole budget bounds them (a disk
            // that stays full is refused at the restart's launch, which ends the lineage).
            crate::record::Cause::TimeLimit | crate::record::Cause::Checkpoint => self.max_restarts,
        }
    }
}

/// `[grpo]`: each step samples `group_size` completions for each of a rank's
/// `train.batch_per_rank` prompts and updates `ppo_epochs` times on them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Grpo {
    pub group_size: u32,
    pub temperature: f64,
    pub top_p: f64,
    pub max_new_tokens: u32,
    /// Passes over each step's rollouts (TRL's `num_iterations`); each is an optimizer step.
    pub ppo_epochs: u32,
    /// The policy ratio is clipped to [1 − ε, 1 + ε].
    pub clip_eps: f64,
    /// The KL penalty's coefficient (0: no reference model at all).
    pub beta: f64,
    /// Added to the reward of a completion in an answer's form (0: exact match only).
    pub format_reward: f64,
    /// Completions per step (one per prompt, the first prompts) kept for the cockpit.
    pub samples: u32,
}

impl Default for Grpo {
    /// TRL's defaults where it has them (8 generations, ε 0.2, β 0.04, one iteration).
    fn default() -> Grpo {
        Grpo {
            group_size: 8,
            temperature: 1.0,
            top_p: 1.0,
            max_new_tokens: 4,
            ppo_epochs: 1,
            clip_eps: 0.2,
            beta: 0.04,
            format_reward: 0.0,
            samples: 2,
        }
    }
}

/// `[dpo]`: β scales the policy's log-ratio against the frozen reference (the run's starting
/// weights) in the loss −log σ(β·((π_c − ref_c) − (π_r − ref_r))).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dpo {
    pub beta: f64,
}

impl Default for Dpo {
    /// TRL's default β.
    fn default() -> Dpo {
        Dpo { beta: 0.1 }
    }
}

/// `[init] from`: another run's verified checkpoint weights, with a fresh optimizer. The server
/// resolves it at launch (`server::init`); the model's shape must match the checkpoint's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Init {
    pub from: InitFrom,
}

/// What `[init] from` names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum InitFrom {
    /// `"RUN"` (its newest checkpoint that verifies) or `"RUN@STEP"`: a run id, a unique id
    /// prefix or a run name, as `flightdeck show` takes.
    Run { run: String, step: Option<u64> },
    /// A checkpoint step directory (`.../ckpt/step-00000200`), or a run's checkpoint
    /// directory (its newest step that verifies).
    Path(std::path::PathBuf),
}

impl InitFrom {
    /// As the recipe spells it: `RUN`, `RUN@STEP` or the path.
    pub fn text(&self) -> String {
        match self {
            InitFrom::Run { run, step: Some(s) } => format!("{run}@{s}"),
            InitFrom::Run { run, step: None } => run.clone(),
            InitFrom::Path(p) => p.display().to_string(),
        }
    }
}

/// `[eval]`: every `every` steps (and before the first, and after the last), each rank answers
/// its share of `prompts` held-out prompts greedily, at most `max_new_tokens` tokens each; the
/// share answered exactly is `eval/exact_match`. `every = 0` turns it off.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Eval {
    pub every: u64,
    pub prompts: u32,
    pub max_new_tokens: u32,
}

impl Default for Eval {
    fn default() -> Eval {
        Eval { every: 0, prompts: 64, max_new_tokens: 4 }
    }
}

/// The server's hang and straggler analysis (DESIGN §9).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// A hang is no progress on any rank for max(hang_floor_s, hang_k × p50 step time).
    pub hang_floor_s: f64,
    pub hang_k: f64,
    /// A straggler computes slower than the median of the other ranks by more than half this,
    /// and arrives after them by more than this share of their compute...
    pub straggler_margin_pct: f64,
    /// ...in 9 of 10 of this many reported steps (`analysis::straggler::judge`).
    pub straggler_window_steps: u64,
}

impl Default for Analysis {
    /// Flags a hang within max(5 s, 5 × the median step) of the last progress, inside the
    /// issue's target of max(10 s, 5 × p50); a straggler arrives a quarter of its peers'
    /// compute late in nine of ten steps, which scheduling noise on a busy box does not give.
    fn default() -> Analysis {
        Analysis { hang_floor_s: 5.0, hang_k: 5.0, straggler_margin_pct: 25.0, straggler_window_steps: 10 }
    }
}

impl Recipe {
    pub fn world_size(&self) -> u32 {
        self.parallel.data
    }

    /// True when every host is the embedded local runtime.
    pub fn is_local(&self) -> bool {
        self.cluster.launcher == ClusterLauncher::Hosts && self.cluster.hosts.iter().all(|h| h == "local")
    }

    pub fn is_slurm(&self) -> bool {
        self.cluster.launcher == ClusterLauncher::Slurm
    }
}

impl Cluster {
    /// How many nodes the run may use: its hosts, or the Slurm nodes it allocates.
    pub fn node_count(&self) -> u32 {
        match self.launcher {
            ClusterLauncher::Hosts => self.hosts.len() as u32,
            ClusterLauncher::Slurm => self.slurm.nodes,
        }
    }
}

/// The synthetic generators shipped in the project, with the vocabulary each needs.
pub const SYNTHETIC_GENERATORS: &[(&str, u32)] = &[("arith", 16), ("arith-qa", 16), ("tokens", 50257)];

/// The generators whose items are (prompt, response) pairs, for `kind = "sft"`.
pub const PAIR_GENERATORS: &[&str] = &["arith-qa"];

/// `file:` sources are read as bytes, so the model needs the whole byte vocabulary.
pub const FILE_VOCAB: u32 = 256;
