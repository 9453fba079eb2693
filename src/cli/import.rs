//! `flightdeck import PATH [--format auto|NAME] [--name N] [--json]`: a finished run's logs or TensorBoard events into the history.
use super::EXIT_BAD_INPUT;
use crate::adapters::Choice;
use crate::client::Client;
use crate::paths::DbPaths;
use crate::protocol::{Reply, Request};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// A log file (rank 0), a directory of per-rank logs (`rank-N.log`, or torchrun's
    /// `--log-dir`), or a TensorBoard directory (`events.out.tfevents.*`, a `rankN` subdirectory
    /// per rank).
    pub path: PathBuf,
    /// The log adapters to read it with: `auto`, or one format (see `parse-log --help`).
    #[arg(long, default_value = "auto")]
    pub format: Choice,
    /// The run's name in the history (default: the file or directory's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Print what was imported as JSON (the run id, its ranks and record counts).
    #[arg(long)]
    pub json: bool,
}

pub async fn import(db: &DbPaths, args: ImportArgs) -> anyhow::Result<i32> {
    // The server reads the path: it may run in another directory.
    let path = match std::fs::canonicalize(&args.path) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("flightdeck: import: cannot read {}: {e}", args.path.display());
            return Ok(EXIT_BAD_INPUT);
        }
    };
    let mut client = Client::connect(db).await?;
    let req = Request::Import { path: path.display().to_string(), format: args.format, name: args.name };
    match client.request(&req).await? {
        Reply::Imported { run, ranks, records, status } => {
            if args.json {
                let out = serde_json::json!({"run": run, "ranks": ranks, "records": records, "status": status});
                println!("{out}");
            } else {
                println!(
                    "imported run {run} from {}: {ranks} ranks, {records} records, {}",
                    path.display(),
                    status.name()
                );
            }
            Ok(0)
        }
        Reply::Error { message } => {
            eprintln!("flightdeck: import: {message}");
            Ok(EXIT_BAD_INPUT)
        }
        other => anyhow::bail!("unexpected reply: {other:?}"),
    }
}
