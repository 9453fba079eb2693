//! `flightdeck report`: a markdown report with charts (SVG and PNG, drawn by `plotters`) of one
//! run or a comparison of several, from data the caller read out of the history.
//!
//! `gather` reads each run's `RunData` through the server (for the CLI and the cockpit alike);
//! `write`, pure of the server, draws the charts (`charts`) and the markdown (`markdown`) into
//! one directory. `bandwidth` and `goodput` are the arithmetic the report adds to the history;
//! `incident` draws a hang's picture (for the server at the verdict, and for `--incident`).
pub mod bandwidth;
mod charts;
pub mod gather;
pub mod goodput;
pub mod incident;
mod markdown;

pub use charts::{font, progress};
pub use gather::{incidents, report};

use crate::record::{CheckpointRecord, RunDetail};
use std::path::{Path, PathBuf};

/// The metrics post-training runs add, charted (rank mean) when a run has them.
pub const EXTRA_METRICS: [&str; 9] = [
    "reward",
    "kl",
    "completions/mean_length",
    "eval/exact_match",
    "mean_token_accuracy",
    "rewards/margins",
    "rewards/accuracies",
    "grad_norm",
    "mfu",
];

/// A series as (step, value), steps ascending.
pub type Series = Vec<(u64, f64)>;

/// A series over ranks as (step, mean, min, max), steps ascending.
pub type Spread = Vec<(u64, f64, f64, f64)>;

/// What the caller asks of a report beyond its runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Each rank's loss as a thin line under the mean.
    pub per_rank: bool,
}

/// One node's GPUs over the run, on the step axis.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeGpu {
    pub host: String,
    /// Utilisation, the mean over the node's GPUs (%).
    pub util_pct: Series,
    /// Memory used on the node's fullest GPU (bytes): the one that runs out first.
    pub mem_bytes: Series,
}

/// What the report draws of one run.
#[derive(Clone, Debug, Default)]
pub struct RunData {
    pub detail: Option<RunDetail>,
    /// Per rank (index = rank).
    pub loss: Vec<Series>,
    pub step_time_ms: Vec<Series>,
    pub tokens: Vec<Series>,
    /// (metric, rank mean) for each of `EXTRA_METRICS` the run has.
    pub extra: Vec<(String, Series)>,
    pub checkpoints: Vec<CheckpointRecord>,
    /// Per (op, size), from the flight records; empty when the run has none.
    pub bandwidth: Vec<bandwidth::Bandwidth>,
    /// Per node, when the run has GPU samples.
    pub gpu: Vec<NodeGpu>,
}

impl RunData {
    pub fn id(&self) -> String {
        self.detail.as_ref().map(|d| d.run.id.to_string()).unwrap_or_default()
    }

    pub fn name(&self) -> String {
        self.detail.as_ref().map(|d| d.run.name.clone()).unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// `reason` says what was refused, naming the path itself.
    #[error("{reason}")]
    Refused { path: String, reason: String },
    #[error("drawing {path}: {reason}")]
    Draw { path: String, reason: String },
}

/// Writes `report.md` and its charts into `out` (made if missing; refused unless empty);
/// returns the files written, the markdown first.
pub fn write(out: &Path, runs: &[RunData], options: Options) -> Result<Vec<PathBuf>, ReportError> {
    prepare(out)?;
    let drawn = charts::draw_all(out, runs, options)?;
    let md = markdown::report(runs, &drawn);
    let path = out.join("report.md");
    std::fs::write(&path, md).map_err(|source| ReportError::Io { path: path.display().to_string(), source })?;
    let mut files = vec![path];
    files.extend(drawn.files());
    Ok(files)
}

pub(crate) fn prepare(out: &Path) -> Result<(), ReportError> {
    crate::paths::new_or_empty_dir(out).map_err(|e| match e {
        crate::paths::OutDirError::Io { source, .. } => ReportError::Io { path: out.display().to_string(), source },
        refused => ReportError::Refused { path: out.display().to_string(), reason: refused.to_string() },
    })
}

/// Per step: the mean, min and max over the ranks that have it.
pub fn across_ranks(per_rank: &[Series]) -> Spread {
    let mut by_step: std::collections::BTreeMap<u64, (f64, f64, f64, u32)> = Default::default();
    for s in per_rank {
        for &(step, v) in s.iter().filter(|p| p.1.is_finite()) {
            let e = by_step.entry(step).or_insert((0.0, f64::INFINITY, f64::NEG_INFINITY, 0));
            e.0 += v;
            e.1 = e.1.min(v);
            e.2 = e.2.max(v);
            e.3 += 1;
        }
    }
    by_step.into_iter().map(|(s, (sum, lo, hi, n))| (s, sum / f64::from(n), lo, hi)).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn across_ranks_gives_mean_min_and_max_per_step_and_skips_nan() {
        let a = vec![(1, 1.0), (2, 3.0)];
        let b = vec![(1, 3.0), (2, f64::NAN), (3, 5.0)];
        assert_eq!(super::across_ranks(&[a, b]), vec![(1, 2.0, 1.0, 3.0), (2, 3.0, 3.0, 3.0), (3, 5.0, 5.0, 5.0)]);
    }
}
