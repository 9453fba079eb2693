//! CSV (RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled):
//! `metrics.csv`, `events.csv` and `checkpoints.csv`, each with a header row.
use super::{ExportError, Row, RunMeta, Sink, WallClock};
use crate::record::{CheckpointRecord, EventRecord};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub const METRICS_HEADER: &str = "run,name,attempt,metric,rank,step,wall_time_s,value";
pub const EVENTS_HEADER: &str = "run,name,attempt,t_ms,step,kind,rank,text";
pub const CHECKPOINTS_HEADER: &str =
    "run,name,attempt,step,bytes,loss,saved_ms,blocking_ms,write_ms,verified,checked,path";

/// One CSV file being written.
struct Table {
    path: PathBuf,
    out: BufWriter<File>,
}

impl Table {
    fn create(path: PathBuf, header: &str) -> Result<Table, ExportError> {
        let file = File::create(&path).map_err(|e| ExportError::io(&path, e))?;
        let mut t = Table { path, out: BufWriter::new(file) };
        t.line(header)?;
        Ok(t)
    }

    fn line(&mut self, line: &str) -> Result<(), ExportError> {
        writeln!(self.out, "{line}").map_err(|e| ExportError::io(&self.path, e))
    }

    fn finish(mut self) -> Result<PathBuf, ExportError> {
        self.out.flush().map_err(|e| ExportError::io(&self.path, e))?;
        Ok(self.path)
    }
}

pub struct Csv {
    metrics: Table,
    events: Table,
    checkpoints: Table,
}

impl Csv {
    pub fn create(dir: &Path) -> Result<Csv, ExportError> {
        Ok(Csv {
            metrics: Table::create(dir.join("metrics.csv"), METRICS_HEADER)?,
            events: Table::create(dir.join("events.csv"), EVENTS_HEADER)?,
            checkpoints: Table::create(dir.join("checkpoints.csv"), CHECKPOINTS_HEADER)?,
        })
    }
}

/// `s` as one CSV field.
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A number as Rust prints it: the shortest text that reads back as the same f64.
fn num(v: f64) -> String {
    format!("{v}")
}

impl Sink for Csv {
    fn series(&mut self, run: &RunMeta, metric: &str, rank: u32, rows: &[Row]) -> Result<(), ExportError> {
        let head = format!("{},{},{},{},{rank}", field(&run.id), field(&run.name), run.attempt, field(metric));
        for r in rows {
            self.metrics.line(&format!("{head},{},{},{}", r.step, num(r.wall_time_s), num(r.value)))?;
        }
        Ok(())
    }

    fn events(&mut self, run: &RunMeta, events: &[EventRecord], wall: &WallClock) -> Result<(), ExportError> {
        for e in events {
            let step = wall.step_at(e.t_ms as f64 / 1000.0);
            let rank = e.rank.map(|r| r.to_string()).unwrap_or_default();
            self.events.line(&format!(
                "{},{},{},{},{step},{},{rank},{}",
                field(&run.id),
                field(&run.name),
                run.attempt,
                e.t_ms,
                e.kind.name(),
                field(&e.text)
            ))?;
        }
        Ok(())
    }

    fn checkpoints(&mut self, run: &RunMeta, ckpts: &[CheckpointRecord], _: &WallClock) -> Result<(), ExportError> {
        for c in ckpts {
            let loss = c.loss.map(num).unwrap_or_default();
            self.checkpoints.line(&format!(
                "{},{},{},{},{},{loss},{},{},{},{},{},{}",
                field(&run.id),
                field(&run.name),
                run.attempt,
                c.step,
                c.bytes,
                c.saved_ms,
                num(c.blocking_ms),
                num(c.write_ms),
                c.verified,
                field(&c.checked),
                field(&c.path)
            ))?;
        }
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<Vec<PathBuf>, ExportError> {
        let me = *self;
        Ok(vec![me.metrics.finish()?, me.events.finish()?, me.checkpoints.finish()?])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields_are_quoted_only_when_they_must_be() {
        assert_eq!(super::field("loss"), "loss");
        assert_eq!(super::field("a,b"), "\"a,b\"");
        assert_eq!(super::field("say \"hi\"\nthen"), "\"say \"\"hi\"\"\nthen\"");
    }
}
