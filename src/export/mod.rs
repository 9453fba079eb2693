//! `flightdeck export`: runs' metrics, events and checkpoints written for the tools people
//! already use (CSV, JSON lines, TensorBoard event files, Parquet), fed one (metric, rank)
//! series at a time so memory stays bounded whatever the run's length.
//!
//! `gather` reads the history through the server and drives a `Sink` (for the CLI and the
//! cockpit alike); a sink only writes. Every format lays out one directory: `metrics.*` (one row per run, metric, rank and
//! step, with the run's `attempt` in its lineage), `events.*` and `checkpoints.*` beside it
//! (JSON lines beside Parquet); TensorBoard gets a directory per run and rank instead.
mod csv;
pub mod gather;
mod jsonl;
mod parquet;
mod tensorboard;

pub use gather::{export, ExportRequest, Exported};

use crate::record::{CheckpointRecord, EventRecord, Point};
use std::path::{Path, PathBuf};

/// The file formats `export` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Jsonl,
    Tensorboard,
    Parquet,
}

impl Format {
    /// As `--format` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
            Format::Tensorboard => "tensorboard",
            Format::Parquet => "parquet",
        }
    }
}

/// One run of the exported set: its id and name, and its place in a lineage (0 for the root,
/// 1 for its first resume, ...; 0 for every run exported without `--lineage`).
#[derive(Clone, Debug, PartialEq)]
pub struct RunMeta {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub created_ms: u64,
}

/// One exported point: a step's value and when it was done (`wall_times`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    pub step: u64,
    pub value: f64,
    pub wall_time_s: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// `reason` says what was refused, naming the path itself.
    #[error("{reason}")]
    Refused { path: String, reason: String },
    #[error("{path}: parquet: {source}")]
    Parquet { path: String, source: ::parquet::errors::ParquetError },
}

impl ExportError {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> ExportError {
        ExportError::Io { path: path.display().to_string(), source }
    }
}

/// What a format does with the rows it is given, in the order the CLI gives them: per run,
/// each rank's series metric by metric, then the run's events and checkpoints.
pub trait Sink: Send {
    fn series(&mut self, run: &RunMeta, metric: &str, rank: u32, rows: &[Row]) -> Result<(), ExportError>;
    fn events(&mut self, run: &RunMeta, events: &[EventRecord], wall: &WallClock) -> Result<(), ExportError>;
    fn checkpoints(&mut self, run: &RunMeta, ckpts: &[CheckpointRecord], wall: &WallClock) -> Result<(), ExportError>;
    /// Flushes and closes; returns the files written.
    fn finish(self: Box<Self>) -> Result<Vec<PathBuf>, ExportError>;
}

/// The sink for `format`, writing under `out` (made if missing; refused if it holds anything,
/// so an export never mixes with or overwrites an earlier one).
pub fn sink(format: Format, out: &Path) -> Result<Box<dyn Sink>, ExportError> {
    prepare(out)?;
    Ok(match format {
        Format::Csv => Box::new(csv::Csv::create(out)?),
        Format::Jsonl => Box::new(jsonl::Jsonl::create(out)?),
        Format::Tensorboard => Box::new(tensorboard::Tensorboard::new(out)),
        Format::Parquet => Box::new(parquet::Parquet::create(out)?),
    })
}

fn prepare(out: &Path) -> Result<(), ExportError> {
    crate::paths::new_or_empty_dir(out).map_err(|e| match e {
        crate::paths::OutDirError::Io { source, .. } => ExportError::io(out, source),
        refused => ExportError::Refused { path: out.display().to_string(), reason: refused.to_string() },
    })
}

/// When each step of one rank ended, in seconds since the epoch: the run's start plus the
/// rank's step times summed, as the cockpit's wall-clock axis counts them (the history keeps
/// step times, not a clock reading per step). Steps without a step time take the time of the
/// step before.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WallClock {
    start_s: f64,
    /// (step, seconds since start at its end), ascending.
    ends: Vec<(u64, f64)>,
}

impl WallClock {
    pub fn new(created_ms: u64, step_times_ms: &[Point]) -> WallClock {
        let mut sorted: Vec<(u64, f64)> = step_times_ms.iter().map(|p| (p.step, p.value)).collect();
        sorted.sort_by_key(|p| p.0);
        sorted.dedup_by_key(|p| p.0);
        let mut t = 0.0;
        let ends = sorted
            .into_iter()
            .map(|(step, ms)| {
                t += if ms.is_finite() && ms > 0.0 { ms / 1000.0 } else { 0.0 };
                (step, t)
            })
            .collect();
        WallClock { start_s: created_ms as f64 / 1000.0, ends }
    }

    /// The end of `step` (of the last step before it that has a time; the start before any).
    pub fn at(&self, step: u64) -> f64 {
        let i = self.ends.partition_point(|e| e.0 <= step);
        self.start_s + if i == 0 { 0.0 } else { self.ends[i - 1].1 }
    }

    /// The last step that had ended by `t_s` (0 before the first): where an event sits.
    pub fn step_at(&self, t_s: f64) -> u64 {
        let since = t_s - self.start_s;
        let i = self.ends.partition_point(|e| e.1 <= since);
        if i == 0 {
            0
        } else {
            self.ends[i - 1].0
        }
    }

    /// `points` with their wall times.
    pub fn rows(&self, points: &[Point]) -> Vec<Row> {
        points.iter().map(|p| Row { step: p.step, value: p.value, wall_time_s: self.at(p.step) }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(step: u64, value: f64) -> Point {
        Point { step, rank: 0, value }
    }

    #[test]
    fn the_wall_clock_sums_step_times_from_the_start() {
        let w = WallClock::new(10_000, &[pt(2, 500.0), pt(1, 250.0), pt(3, f64::NAN), pt(5, 1000.0)]);
        assert_eq!(w.at(0), 10.0);
        assert_eq!(w.at(1), 10.25);
        assert_eq!(w.at(2), 10.75);
        assert_eq!(w.at(3), 10.75, "no time: the step before's");
        assert_eq!(w.at(4), 10.75);
        assert_eq!(w.at(5), 11.75);
        assert_eq!((w.step_at(9.0), w.step_at(10.3), w.step_at(11.0), w.step_at(99.0)), (0, 1, 3, 5));
        let rows = w.rows(&[pt(2, 0.5)]);
        assert_eq!(rows, vec![Row { step: 2, value: 0.5, wall_time_s: 10.75 }]);
    }

    #[test]
    fn an_export_directory_must_be_new_or_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fresh = dir.path().join("a/b");
        prepare(&fresh).expect("made");
        prepare(&fresh).expect("empty is fine");
        std::fs::write(fresh.join("x"), "1").expect("write");
        let e = prepare(&fresh).expect_err("not empty").to_string();
        assert!(
            e.ends_with("is not empty: the output goes into a new or empty directory (choose another --out)"),
            "{e}"
        );
        let e = prepare(&fresh.join("x")).expect_err("a file").to_string();
        assert!(e.ends_with("x: is a file: --out names a directory"), "{e}");
    }
}
