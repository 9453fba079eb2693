//! `flightdeck export RUN... --format F --out DIR`: the arguments, then `export::export`.
use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::export::{self, ExportRequest, Format};
use crate::history::Failure;
use crate::paths::DbPaths;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The runs: full id, unique prefix, or name; several export as one set, with a run column.
    #[arg(required = true)]
    pub runs: Vec<String>,
    /// The file format.
    #[arg(long, value_enum)]
    pub format: FormatArg,
    /// The directory to write into: made if missing, refused unless empty.
    #[arg(long)]
    pub out: PathBuf,
    /// Only these metrics, comma-separated (default: every metric of the runs).
    #[arg(long, value_delimiter = ',')]
    pub metrics: Vec<String>,
    /// Only these ranks, comma-separated (default: every rank).
    #[arg(long, value_delimiter = ',')]
    pub ranks: Vec<u32>,
    /// Each run with the runs it resumed from, oldest first, as attempts 0, 1, ... of one set.
    #[arg(long)]
    pub lineage: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum FormatArg {
    /// metrics.csv, events.csv, checkpoints.csv
    Csv,
    /// metrics.jsonl, events.jsonl, checkpoints.jsonl
    Jsonl,
    /// NAME-ID/rank_N/ event files (scalars, events as text) and NAME-ID/run/
    Tensorboard,
    /// metrics.parquet, with events.jsonl and checkpoints.jsonl
    Parquet,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Csv => Format::Csv,
            FormatArg::Jsonl => Format::Jsonl,
            FormatArg::Tensorboard => Format::Tensorboard,
            FormatArg::Parquet => Format::Parquet,
        }
    }
}

pub async fn export(db: &DbPaths, args: ExportArgs) -> anyhow::Result<i32> {
    let req = ExportRequest {
        runs: args.runs,
        format: args.format.into(),
        out: args.out,
        metrics: args.metrics,
        ranks: args.ranks,
        lineage: args.lineage,
    };
    let mut c = Client::connect(db).await?;
    match export::export(&mut c, &req).await {
        Ok(done) => {
            println!("{}", done.summary(&req.out));
            for f in done.files {
                println!("  {}", f.display());
            }
            Ok(0)
        }
        Err(Failure::BadInput(m)) => {
            eprintln!("flightdeck: export: {m}");
            Ok(EXIT_BAD_INPUT)
        }
        Err(Failure::Failed(e)) => Err(e),
    }
}
