//! Parquet: `metrics.parquet`, one row per run, metric, rank and step (the columns of
//! `metrics.csv`), Snappy-compressed, a row group every `ROW_GROUP` rows so memory stays
//! bounded; pandas, polars and pyarrow open it as one table. Events and checkpoints are small
//! and irregular: they go beside it as JSON lines.
use super::jsonl::Lines;
use super::{ExportError, Row, RunMeta, Sink, WallClock};
use crate::record::{CheckpointRecord, EventRecord};
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const SCHEMA: &str = "message metrics {
  REQUIRED BYTE_ARRAY run (UTF8);
  REQUIRED BYTE_ARRAY name (UTF8);
  REQUIRED INT32 attempt;
  REQUIRED BYTE_ARRAY metric (UTF8);
  REQUIRED INT32 rank;
  REQUIRED INT64 step;
  REQUIRED DOUBLE wall_time_s;
  REQUIRED DOUBLE value;
}";

/// Rows per row group: about 3 MiB of buffered columns before each is written.
const ROW_GROUP: usize = 1 << 16;

/// The buffered rows of the row group being filled, column by column.
#[derive(Default)]
struct Columns {
    run: Vec<ByteArray>,
    name: Vec<ByteArray>,
    attempt: Vec<i32>,
    metric: Vec<ByteArray>,
    rank: Vec<i32>,
    step: Vec<i64>,
    wall_time_s: Vec<f64>,
    value: Vec<f64>,
}

pub struct Parquet {
    path: PathBuf,
    writer: SerializedFileWriter<File>,
    rows: Columns,
    events: Lines,
    checkpoints: Lines,
}

impl Parquet {
    pub fn create(dir: &Path) -> Result<Parquet, ExportError> {
        let path = dir.join("metrics.parquet");
        let err = |source| ExportError::Parquet { path: path.display().to_string(), source };
        let schema = Arc::new(parse_message_type(SCHEMA).map_err(err)?);
        let props = Arc::new(WriterProperties::builder().set_compression(Compression::SNAPPY).build());
        let file = File::create(&path).map_err(|e| ExportError::io(&path, e))?;
        let writer = SerializedFileWriter::new(file, schema, props).map_err(err)?;
        Ok(Parquet {
            path: path.clone(),
            writer,
            rows: Columns::default(),
            events: Lines::create(dir.join("events.jsonl"))?,
            checkpoints: Lines::create(dir.join("checkpoints.jsonl"))?,
        })
    }

    /// Writes the buffered rows as one row group.
    fn flush(&mut self) -> Result<(), ExportError> {
        if self.rows.step.is_empty() {
            return Ok(());
        }
        let c = std::mem::take(&mut self.rows);
        self.write_group(&c).map_err(|source| ExportError::Parquet { path: self.path.display().to_string(), source })
    }

    fn write_group(&mut self, c: &Columns) -> Result<(), parquet::errors::ParquetError> {
        let mut group = self.writer.next_row_group()?;
        let mut i = 0;
        while let Some(mut col) = group.next_column()? {
            match i {
                0 => col.typed::<ByteArrayType>().write_batch(&c.run, None, None)?,
                1 => col.typed::<ByteArrayType>().write_batch(&c.name, None, None)?,
                2 => col.typed::<Int32Type>().write_batch(&c.attempt, None, None)?,
                3 => col.typed::<ByteArrayType>().write_batch(&c.metric, None, None)?,
                4 => col.typed::<Int32Type>().write_batch(&c.rank, None, None)?,
                5 => col.typed::<Int64Type>().write_batch(&c.step, None, None)?,
                6 => col.typed::<DoubleType>().write_batch(&c.wall_time_s, None, None)?,
                _ => col.typed::<DoubleType>().write_batch(&c.value, None, None)?,
            };
            col.close()?;
            i += 1;
        }
        group.close()?;
        Ok(())
    }
}

impl Sink for Parquet {
    fn series(&mut self, run: &RunMeta, metric: &str, rank: u32, rows: &[Row]) -> Result<(), ExportError> {
        let text = |s: &str| ByteArray::from(s.as_bytes().to_vec());
        for r in rows {
            let c = &mut self.rows;
            c.run.push(text(&run.id));
            c.name.push(text(&run.name));
            c.attempt.push(run.attempt as i32);
            c.metric.push(text(metric));
            c.rank.push(rank as i32);
            c.step.push(r.step as i64);
            c.wall_time_s.push(r.wall_time_s);
            c.value.push(r.value);
            if c.step.len() >= ROW_GROUP {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn events(&mut self, run: &RunMeta, events: &[EventRecord], wall: &WallClock) -> Result<(), ExportError> {
        self.events.events(run, events, wall)
    }

    fn checkpoints(&mut self, run: &RunMeta, ckpts: &[CheckpointRecord], _: &WallClock) -> Result<(), ExportError> {
        self.checkpoints.checkpoints(run, ckpts)
    }

    fn finish(mut self: Box<Self>) -> Result<Vec<PathBuf>, ExportError> {
        self.flush()?;
        let me = *self;
        let path = me.path.clone();
        me.writer.close().map_err(|source| ExportError::Parquet { path: path.display().to_string(), source })?;
        Ok(vec![path, me.events.finish()?, me.checkpoints.finish()?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;

    #[test]
    fn rows_read_back_exactly_across_row_groups() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut sink = Box::new(Parquet::create(dir.path()).expect("create"));
        let run = RunMeta { id: "20261205T000000-abcd".into(), name: "tiny".into(), attempt: 1, created_ms: 0 };
        let n = ROW_GROUP as u64 + 10;
        let rows: Vec<Row> =
            (1..=n).map(|s| Row { step: s, value: 1.0 / s as f64, wall_time_s: s as f64 * 0.1 }).collect();
        sink.series(&run, "loss", 3, &rows).expect("series");
        let files = sink.finish().expect("finish");
        let reader = SerializedFileReader::new(File::open(&files[0]).expect("open")).expect("reader");
        assert_eq!(reader.metadata().num_row_groups(), 2);
        let mut count = 0u64;
        for row in reader.get_row_iter(None).expect("rows") {
            let row = row.expect("row");
            count += 1;
            assert_eq!(row.get_string(0).expect("run"), "20261205T000000-abcd");
            assert_eq!((row.get_int(2).expect("attempt"), row.get_int(4).expect("rank")), (1, 3));
            assert_eq!(row.get_string(3).expect("metric"), "loss");
            let step = row.get_long(5).expect("step");
            assert_eq!(step as u64, count);
            assert_eq!(row.get_double(7).expect("value").to_bits(), (1.0 / count as f64).to_bits());
        }
        assert_eq!(count, n);
    }
}
