//! The recipe as written: serde structs with every field optional, and the schema that names them.
//!
//! Integers are read as `i64` and enums as strings on purpose: a negative size or a misspelt
//! schedule must reach validation, which can say what would be valid, instead of failing inside
//! serde with "invalid value: integer `-5`, expected u64".
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecipe {
    pub name: Option<String>,
    pub kind: Option<String>,
    pub model: Option<RawModel>,
    pub data: Option<RawData>,
    pub train: Option<RawTrain>,
    pub parallel: Option<RawParallel>,
    pub checkpoint: Option<RawCheckpoint>,
    pub cluster: Option<RawCluster>,
    pub telemetry: Option<RawTelemetry>,
    pub fault: Option<OneOrMany<RawFault>>,
    pub command: Option<RawCommand>,
    pub analysis: Option<RawAnalysis>,
    pub init: Option<RawInit>,
    pub eval: Option<RawEval>,
    pub dpo: Option<RawDpo>,
    pub grpo: Option<RawGrpo>,
    pub recovery: Option<RawRecovery>,
}

/// A table written once (`[fault]`) or as a list (`[[fault]]`).
#[derive(Debug, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(untagged)]
pub(super) enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecovery {
    pub max_restarts: Option<i64>,
    pub backoff_s: Option<f64>,
    pub crash: Option<i64>,
    pub hang: Option<i64>,
    pub node_lost: Option<i64>,
    pub nan: Option<i64>,
    pub on_nan: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawGrpo {
    pub group_size: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_new_tokens: Option<i64>,
    pub ppo_epochs: Option<i64>,
    pub clip_eps: Option<f64>,
    pub beta: Option<f64>,
    pub format_reward: Option<f64>,
    pub samples: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawDpo {
    pub beta: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawInit {
    pub from: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawEval {
    pub every: Option<i64>,
    pub prompts: Option<i64>,
    pub max_new_tokens: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub n_layer: Option<i64>,
    pub n_head: Option<i64>,
    pub d_model: Option<i64>,
    pub context: Option<i64>,
    pub vocab: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawData {
    pub source: Option<String>,
    pub seed: Option<i64>,
    pub skip_batches: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawTrain {
    pub steps: Option<i64>,
    pub batch_per_rank: Option<i64>,
    pub lr: Option<f64>,
    pub min_lr: Option<f64>,
    pub warmup: Option<i64>,
    pub schedule: Option<String>,
    pub grad_clip: Option<f64>,
    pub weight_decay: Option<f64>,
    pub beta1: Option<f64>,
    pub beta2: Option<f64>,
    pub seed: Option<i64>,
    pub dtype: Option<String>,
    pub threads: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawParallel {
    pub data: Option<i64>,
    /// Named now so recipes can spell the full layout; only 1 is accepted until it exists.
    pub tensor: Option<i64>,
    /// As `tensor`.
    pub pipeline: Option<i64>,
    pub backend: Option<String>,
    pub bucket_bytes: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawCheckpoint {
    pub every: Option<i64>,
    pub keep: Option<i64>,
    pub dir: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub hosts: Option<Vec<String>>,
    pub spare_hosts: Option<Vec<String>>,
    pub ranks_per_node: Option<i64>,
    pub device: Option<String>,
    pub remote_dir: Option<String>,
    pub libtorch: Option<String>,
    pub connect_timeout_s: Option<i64>,
    pub command_timeout_s: Option<i64>,
    pub link_timeout_s: Option<i64>,
    pub accept_new_host_keys: Option<bool>,
    pub ssh_config: Option<String>,
    pub launcher: Option<String>,
    pub nodes: Option<i64>,
    pub partition: Option<String>,
    pub time_limit: Option<String>,
    pub account: Option<String>,
    pub sbatch_args: Option<Vec<String>>,
    pub slurm_job: Option<String>,
    pub grace_s: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub step_interval: Option<i64>,
    pub sample_interval_ms: Option<i64>,
    pub enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawFault {
    pub kind: Option<String>,
    pub rank: Option<i64>,
    pub step: Option<i64>,
    pub slow_pct: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawCommand {
    pub argv: Option<Vec<String>>,
    pub log_format: Option<String>,
    pub observe: Option<bool>,
    pub instrument: Option<bool>,
    pub env: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub launcher: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnalysis {
    pub hang_floor_s: Option<f64>,
    pub hang_k: Option<f64>,
    pub straggler_margin_pct: Option<f64>,
    pub straggler_window_steps: Option<i64>,
}

/// The TOML type a key holds. The schema check uses it to name expected types in messages;
/// serde then only ever sees values of the right type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ty {
    Str,
    Int,
    /// A float; an integer is accepted and widened (`lr = 1`).
    Float,
    Bool,
    StrList,
}

impl Ty {
    /// How messages name the expected type.
    pub fn expected(self) -> &'static str {
        match self {
            Ty::Str => "a string",
            Ty::Int => "an integer",
            Ty::Float => "a number",
            Ty::Bool => "a boolean (true or false)",
            Ty::StrList => "a list of strings",
        }
    }

    /// A `--set` example of this type, for hints.
    pub fn example(self) -> &'static str {
        match self {
            Ty::Str => "text",
            Ty::Int => "60",
            Ty::Float => "3e-4",
            Ty::Bool => "true",
            Ty::StrList => r#"'["node-a", "node-b"]'"#,
        }
    }
}

/// Keys allowed at the top level, outside any table.
pub(super) const TOP_KEYS: &[(&str, Ty)] = &[("name", Ty::Str), ("kind", Ty::Str)];

/// Every table and its keys, in the order the docs and messages list them.
pub(super) const TABLES: &[(&str, &[(&str, Ty)])] = &[
    (
        "model",
        &[("n_layer", Ty::Int), ("n_head", Ty::Int), ("d_model", Ty::Int), ("context", Ty::Int), ("vocab", Ty::Int)],
    ),
    ("data", &[("source", Ty::Str), ("seed", Ty::Int), ("skip_batches", Ty::Int)]),
    (
        "train",
        &[
            ("steps", Ty::Int),
            ("batch_per_rank", Ty::Int),
            ("lr", Ty::Float),
            ("min_lr", Ty::Float),
            ("warmup", Ty::Int),
            ("schedule", Ty::Str),
            ("grad_clip", Ty::Float),
            ("weight_decay", Ty::Float),
            ("beta1", Ty::Float),
            ("beta2", Ty::Float),
            ("seed", Ty::Int),
            ("dtype", Ty::Str),
            ("threads", Ty::Int),
        ],
    ),
    (
        "parallel",
        &[
            ("data", Ty::Int),
            ("tensor", Ty::Int),
            ("pipeline", Ty::Int),
            ("backend", Ty::Str),
            ("bucket_bytes", Ty::Int),
        ],
    ),
    ("checkpoint", &[("every", Ty::Int), ("keep", Ty::Int), ("dir", Ty::Str)]),
    (
        "cluster",
        &[
            ("hosts", Ty::StrList),
            ("spare_hosts", Ty::StrList),
            ("ranks_per_node", Ty::Int),
            ("device", Ty::Str),
            ("remote_dir", Ty::Str),
            ("libtorch", Ty::Str),
            ("connect_timeout_s", Ty::Int),
            ("command_timeout_s", Ty::Int),
            ("link_timeout_s", Ty::Int),
            ("accept_new_host_keys", Ty::Bool),
            ("ssh_config", Ty::Str),
            ("launcher", Ty::Str),
            ("nodes", Ty::Int),
            ("partition", Ty::Str),
            ("time_limit", Ty::Str),
            ("account", Ty::Str),
            ("sbatch_args", Ty::StrList),
            ("slurm_job", Ty::Str),
            ("grace_s", Ty::Int),
        ],
    ),
    ("telemetry", &[("step_interval", Ty::Int), ("sample_interval_ms", Ty::Int), ("enabled", Ty::Bool)]),
    ("fault", &[("kind", Ty::Str), ("rank", Ty::Int), ("step", Ty::Int), ("slow_pct", Ty::Float)]),
    (
        "command",
        &[
            ("argv", Ty::StrList),
            ("log_format", Ty::Str),
            ("observe", Ty::Bool),
            ("instrument", Ty::Bool),
            ("env", Ty::StrList),
            ("cwd", Ty::Str),
            ("launcher", Ty::Str),
        ],
    ),
    (
        "analysis",
        &[
            ("hang_floor_s", Ty::Float),
            ("hang_k", Ty::Float),
            ("straggler_margin_pct", Ty::Float),
            ("straggler_window_steps", Ty::Int),
        ],
    ),
    ("init", &[("from", Ty::Str)]),
    ("eval", &[("every", Ty::Int), ("prompts", Ty::Int), ("max_new_tokens", Ty::Int)]),
    ("dpo", &[("beta", Ty::Float)]),
    (
        "recovery",
        &[
            ("max_restarts", Ty::Int),
            ("backoff_s", Ty::Float),
            ("crash", Ty::Int),
            ("hang", Ty::Int),
            ("node_lost", Ty::Int),
            ("nan", Ty::Int),
            ("on_nan", Ty::Str),
        ],
    ),
    (
        "grpo",
        &[
            ("group_size", Ty::Int),
            ("temperature", Ty::Float),
            ("top_p", Ty::Float),
            ("max_new_tokens", Ty::Int),
            ("ppo_epochs", Ty::Int),
            ("clip_eps", Ty::Float),
            ("beta", Ty::Float),
            ("format_reward", Ty::Float),
            ("samples", Ty::Int),
        ],
    ),
];

/// Tables that may also be written as a list (`[[fault]]`), each element checked alike.
pub(super) const LISTS: [&str; 1] = ["fault"];

/// The keys of a table, if it is one the schema knows.
pub(super) fn table_keys(table: &str) -> Option<&'static [(&'static str, Ty)]> {
    TABLES.iter().find(|(t, _)| *t == table).map(|(_, keys)| *keys)
}

/// `a, b, c`: a table's key names for "valid keys" lists.
pub(super) fn key_names(keys: &[(&str, Ty)]) -> String {
    keys.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
}

pub(super) fn table_names() -> String {
    TABLES.iter().map(|(t, _)| *t).collect::<Vec<_>>().join(", ")
}
