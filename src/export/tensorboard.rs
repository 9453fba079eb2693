//! TensorBoard: a directory per run (`NAME-ID/`) holding one event-file directory per rank
//! (`rank_N/`, scalars tagged by metric, the rank's events as text) and `run/` for what belongs
//! to the whole run (its events, and each checkpoint as text with its size and blocking time as
//! scalars). TensorBoard shows each directory as a run, so ranks overlay on one chart.
use super::{ExportError, Row, RunMeta, Sink, WallClock};
use crate::record::{CheckpointRecord, EventRecord};
use crate::tensorboard::write;
use crate::units;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The directory of one run, or of one of its ranks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Rank(u32),
    Run,
}

struct EventFile {
    path: PathBuf,
    out: BufWriter<File>,
}

impl EventFile {
    fn create(dir: &Path, run: &RunMeta, part: &str) -> Result<EventFile, ExportError> {
        std::fs::create_dir_all(dir).map_err(|e| ExportError::io(dir, e))?;
        let start_s = run.created_ms / 1000;
        let path = dir.join(format!("events.out.tfevents.{start_s}.flightdeck.{part}"));
        let file = File::create(&path).map_err(|e| ExportError::io(&path, e))?;
        let mut f = EventFile { path, out: BufWriter::new(file) };
        f.put(&write::file_version(run.created_ms as f64 / 1000.0))?;
        Ok(f)
    }

    fn put(&mut self, record: &[u8]) -> Result<(), ExportError> {
        self.out.write_all(record).map_err(|e| ExportError::io(&self.path, e))
    }
}

pub struct Tensorboard {
    out: PathBuf,
    /// The open files of the run being written: a run's rows all come before the next run's.
    open: BTreeMap<Part, EventFile>,
    open_run: Option<String>,
    written: Vec<PathBuf>,
}

impl Tensorboard {
    pub fn new(out: &Path) -> Tensorboard {
        Tensorboard { out: out.to_path_buf(), open: BTreeMap::new(), open_run: None, written: Vec::new() }
    }

    fn file(&mut self, run: &RunMeta, part: Part) -> Result<&mut EventFile, ExportError> {
        if self.open_run.as_deref() != Some(run.id.as_str()) {
            self.close_all()?;
            self.open_run = Some(run.id.clone());
        }
        if !self.open.contains_key(&part) {
            let base = self.out.join(format!("{}-{}", run.name, run.id));
            let (dir, label) = match &part {
                Part::Rank(r) => (base.join(format!("rank_{r}")), format!("rank_{r}")),
                Part::Run => (base.join("run"), "run".to_string()),
            };
            let f = EventFile::create(&dir, run, &label)?;
            self.open.insert(part.clone(), f);
        }
        let out = self.out.display().to_string();
        self.open.get_mut(&part).ok_or_else(|| ExportError::Refused {
            reason: format!("{out}: an event file vanished while open"),
            path: out,
        })
    }

    fn close_all(&mut self) -> Result<(), ExportError> {
        for (_, mut f) in std::mem::take(&mut self.open) {
            f.out.flush().map_err(|e| ExportError::io(&f.path, e))?;
            self.written.push(f.path);
        }
        Ok(())
    }
}

impl Sink for Tensorboard {
    fn series(&mut self, run: &RunMeta, metric: &str, rank: u32, rows: &[Row]) -> Result<(), ExportError> {
        let f = self.file(run, Part::Rank(rank))?;
        for r in rows {
            f.put(&write::scalar(r.wall_time_s, r.step, metric, r.value as f32))?;
        }
        Ok(())
    }

    fn events(&mut self, run: &RunMeta, events: &[EventRecord], wall: &WallClock) -> Result<(), ExportError> {
        for e in events {
            let t_s = e.t_ms as f64 / 1000.0;
            let part = e.rank.map_or(Part::Run, Part::Rank);
            let body = format!("**{}** {}", e.kind.name(), e.text);
            self.file(run, part)?.put(&write::text(t_s, wall.step_at(t_s), "events", &body))?;
        }
        Ok(())
    }

    fn checkpoints(&mut self, run: &RunMeta, ckpts: &[CheckpointRecord], wall: &WallClock) -> Result<(), ExportError> {
        for c in ckpts {
            let t_s = wall.at(c.step);
            let state = if c.verified { format!("verified ({})", c.checked) } else { "not verified".into() };
            let body = format!(
                "step {}: {}, {state}, blocking {:.1} ms, written in {:.1} ms: {}",
                c.step,
                units::bytes(c.bytes),
                c.blocking_ms,
                c.write_ms,
                c.path
            );
            let f = self.file(run, Part::Run)?;
            f.put(&write::text(t_s, c.step, "checkpoints", &body))?;
            f.put(&write::scalar(t_s, c.step, "checkpoint/bytes", c.bytes as f32))?;
            f.put(&write::scalar(t_s, c.step, "checkpoint/blocking_ms", c.blocking_ms as f32))?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<PathBuf>, ExportError> {
        self.close_all()?;
        Ok(self.written)
    }
}
