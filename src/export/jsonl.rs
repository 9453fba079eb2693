//! JSON lines: `metrics.jsonl`, `events.jsonl` and `checkpoints.jsonl`, one object per line
//! with the same fields as the CSV columns (numbers round-trip exactly). `Lines` also writes the
//! events and checkpoints that sit beside Parquet and TensorBoard exports.
use super::{ExportError, Row, RunMeta, Sink, WallClock};
use crate::record::{CheckpointRecord, EventRecord};
use serde_json::json;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One JSON-lines file being written.
pub struct Lines {
    path: PathBuf,
    out: BufWriter<File>,
}

impl Lines {
    pub fn create(path: PathBuf) -> Result<Lines, ExportError> {
        let file = File::create(&path).map_err(|e| ExportError::io(&path, e))?;
        Ok(Lines { path, out: BufWriter::new(file) })
    }

    fn write(&mut self, v: &serde_json::Value) -> Result<(), ExportError> {
        writeln!(self.out, "{v}").map_err(|e| ExportError::io(&self.path, e))
    }

    pub fn events(&mut self, run: &RunMeta, events: &[EventRecord], wall: &WallClock) -> Result<(), ExportError> {
        for e in events {
            self.write(&json!({
                "run": run.id, "name": run.name, "attempt": run.attempt, "t_ms": e.t_ms,
                "step": wall.step_at(e.t_ms as f64 / 1000.0), "kind": e.kind.name(), "rank": e.rank, "text": e.text,
            }))?;
        }
        Ok(())
    }

    pub fn checkpoints(&mut self, run: &RunMeta, ckpts: &[CheckpointRecord]) -> Result<(), ExportError> {
        for c in ckpts {
            self.write(&json!({
                "run": run.id, "name": run.name, "attempt": run.attempt, "step": c.step, "bytes": c.bytes,
                "loss": c.loss, "saved_ms": c.saved_ms, "blocking_ms": c.blocking_ms, "write_ms": c.write_ms,
                "verified": c.verified, "checked": c.checked, "path": c.path,
            }))?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> Result<PathBuf, ExportError> {
        self.out.flush().map_err(|e| ExportError::io(&self.path, e))?;
        Ok(self.path)
    }
}

pub struct Jsonl {
    metrics: Lines,
    events: Lines,
    checkpoints: Lines,
}

impl Jsonl {
    pub fn create(dir: &Path) -> Result<Jsonl, ExportError> {
        Ok(Jsonl {
            metrics: Lines::create(dir.join("metrics.jsonl"))?,
            events: Lines::create(dir.join("events.jsonl"))?,
            checkpoints: Lines::create(dir.join("checkpoints.jsonl"))?,
        })
    }
}

impl Sink for Jsonl {
    fn series(&mut self, run: &RunMeta, metric: &str, rank: u32, rows: &[Row]) -> Result<(), ExportError> {
        for r in rows {
            // A NaN or infinite value has no JSON number: it is written as null.
            self.metrics.write(&json!({
                "run": run.id, "name": run.name, "attempt": run.attempt, "metric": metric, "rank": rank,
                "step": r.step, "wall_time_s": r.wall_time_s, "value": r.value,
            }))?;
        }
        Ok(())
    }

    fn events(&mut self, run: &RunMeta, events: &[EventRecord], wall: &WallClock) -> Result<(), ExportError> {
        self.events.events(run, events, wall)
    }

    fn checkpoints(&mut self, run: &RunMeta, ckpts: &[CheckpointRecord], _: &WallClock) -> Result<(), ExportError> {
        self.checkpoints.checkpoints(run, ckpts)
    }

    fn finish(self: Box<Self>) -> Result<Vec<PathBuf>, ExportError> {
        let me = *self;
        Ok(vec![me.metrics.finish()?, me.events.finish()?, me.checkpoints.finish()?])
    }
}

#[cfg(test)]
mod tests {
    use crate::record::EventKind;

    #[test]
    fn event_kinds_are_named_as_serde_writes_them() {
        use EventKind::*;
        let all = [
            RunStarted,
            RankStarted,
            RankExited,
            RunEnded,
            Notice,
            BadFrame,
            NanLoss,
            CheckpointSaved,
            CheckpointFailed,
            Verdict,
            Incident,
            Failure,
            Refused,
        ];
        for k in all {
            assert_eq!(serde_json::to_value(k).expect("serialises"), k.name(), "{k:?}");
        }
    }
}
