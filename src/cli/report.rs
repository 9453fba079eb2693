//! `flightdeck report RUN [RUN...] --out DIR`: the arguments, then `report::report`.
use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::history::Failure;
use crate::paths::DbPaths;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// The runs: full id, unique prefix, or name; several make a comparison.
    #[arg(required = true)]
    pub runs: Vec<String>,
    /// The directory to write report.md and its charts into: made if missing, refused unless empty.
    #[arg(long)]
    pub out: PathBuf,
}

pub async fn report(db: &DbPaths, args: ReportArgs) -> anyhow::Result<i32> {
    let mut c = Client::connect(db).await?;
    match crate::report::report(&mut c, &args.runs, &args.out).await {
        Ok(files) => {
            println!("report written: {}", files[0].display());
            println!("  {} chart files beside it (SVG and PNG)", files.len() - 1);
            Ok(0)
        }
        Err(Failure::BadInput(m)) => {
            eprintln!("flightdeck: report: {m}");
            Ok(EXIT_BAD_INPUT)
        }
        Err(Failure::Failed(e)) => Err(e),
    }
}
