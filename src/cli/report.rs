//! `flightdeck report RUN [RUN...] --out DIR [--per-rank]` and `flightdeck report RUN --incident
//! [--out DIR]`: the arguments, then `report::report` or `report::incidents`.
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
    /// The directory to write report.md and its charts into: made if missing, refused unless
    /// empty. With --incident it may be left out: the run's directory, beside the originals.
    #[arg(long, required_unless_present = "incident")]
    pub out: Option<PathBuf>,
    /// Each rank's loss as a thin line under the mean and its band.
    #[arg(long)]
    pub per_rank: bool,
    /// The run's incident reports (written at hang verdicts) again, with their pictures drawn
    /// from the history's flight records.
    #[arg(long, conflicts_with = "per_rank")]
    pub incident: bool,
}

pub async fn report(db: &DbPaths, args: ReportArgs) -> anyhow::Result<i32> {
    let mut c = Client::connect(db).await?;
    let done = if args.incident {
        let [run] = args.runs.as_slice() else {
            eprintln!("flightdeck: report --incident: one run at a time ({} given)", args.runs.len());
            return Ok(EXIT_BAD_INPUT);
        };
        crate::report::incidents(&mut c, run, args.out.as_deref()).await.map(|files| {
            for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "md")) {
                println!("incident report written: {}", f.display());
            }
        })
    } else {
        let out = args.out.unwrap_or_default();
        let options = crate::report::Options { per_rank: args.per_rank };
        crate::report::report(&mut c, &args.runs, &out, options).await.map(|files| {
            println!("report written: {}", files[0].display());
            println!("  {} chart files beside it (SVG and PNG)", files.len() - 1);
        })
    };
    match done {
        Ok(()) => Ok(0),
        Err(Failure::BadInput(m)) => {
            eprintln!("flightdeck: report: {m}");
            Ok(EXIT_BAD_INPUT)
        }
        Err(Failure::Failed(e)) => Err(e),
    }
}
