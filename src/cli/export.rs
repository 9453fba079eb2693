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
    /// The directory to write into: made if missing, refused unless empty. Without it, one
    /// run goes to NAME-ID-FORMAT in the current directory, as the cockpit's `E` names it.
    #[arg(long)]
    pub out: Option<PathBuf>,
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
    let format: Format = args.format.into();
    let mut c = Client::connect(db).await?;
    let out = match args.out {
        Some(out) => out,
        None => match default_out(&mut c, &args.runs, format).await? {
            Ok(out) => out,
            Err(why) => {
                eprintln!("flightdeck: export: {why}");
                return Ok(EXIT_BAD_INPUT);
            }
        },
    };
    let req =
        ExportRequest { runs: args.runs, format, out, metrics: args.metrics, ranks: args.ranks, lineage: args.lineage };
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

/// Where one run exports without `--out`: the cockpit's `NAME-ID-FORMAT`, the run named as
/// every reading command names it (the newest of a name). Several runs need `--out`.
async fn default_out(c: &mut Client, runs: &[String], format: Format) -> anyhow::Result<Result<PathBuf, String>> {
    let [query] = runs else {
        return Ok(Err(format!("--out DIR is needed to export {} runs as one set", runs.len())));
    };
    let list = match c.request(&crate::protocol::Request::ListRuns).await? {
        crate::protocol::Reply::Runs { runs } => runs,
        crate::protocol::Reply::Error { message } => return Ok(Err(message)),
        other => anyhow::bail!("unexpected reply to a list of runs: {other:?}"),
    };
    let id = match crate::store::db::pick(&list, query, crate::store::db::Pick::Newest) {
        Ok(id) => id,
        Err(e) => return Ok(Err(e.to_string())),
    };
    Ok(list
        .iter()
        .find(|r| r.id == id)
        .map(|run| crate::ui::out_dir(run, format.name()))
        .ok_or_else(|| format!("no run matches {query:?}")))
}
