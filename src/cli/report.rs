//! `flightdeck report RUN [RUN...] --out DIR`: reads each run through the server and writes
//! `DIR/report.md` with its charts (`crate::report`).
use super::history::{checkpoints, detail, fetch};
use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::paths::DbPaths;
use crate::record::Point;
use crate::report::{self, RunData, Series, EXTRA_METRICS};
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
    let mut runs = Vec::new();
    for query in &args.runs {
        let d = match detail(&mut c, query).await? {
            Ok(d) => d,
            Err(m) => {
                eprintln!("flightdeck: report: {m}");
                return Ok(EXIT_BAD_INPUT);
            }
        };
        let id = d.run.id.to_string();
        let has = |m: &str| d.metrics.iter().any(|k| k == m);
        let mut data = RunData { checkpoints: checkpoints(&mut c, &id).await?, ..RunData::default() };
        for rank in 0..d.run.world_size {
            for (metric, into) in
                [("loss", &mut data.loss), ("step_time_ms", &mut data.step_time_ms), ("tokens", &mut data.tokens)]
            {
                let points = if has(metric) { fetch(&mut c, &id, metric, rank).await? } else { Vec::new() };
                into.push(series(&points));
            }
        }
        for metric in EXTRA_METRICS.iter().filter(|m| has(m)) {
            let mut per_rank = Vec::new();
            for rank in 0..d.run.world_size {
                per_rank.push(series(&fetch(&mut c, &id, metric, rank).await?));
            }
            let mean = report::across_ranks(&per_rank).into_iter().map(|p| (p.0, p.1)).collect();
            data.extra.push((metric.to_string(), mean));
        }
        data.detail = Some(d);
        runs.push(data);
    }
    let files = match report::write(&args.out, &runs) {
        Ok(f) => f,
        Err(e @ report::ReportError::Refused { .. }) => {
            eprintln!("flightdeck: report: {e}");
            return Ok(EXIT_BAD_INPUT);
        }
        Err(e) => return Err(e.into()),
    };
    println!("report written: {}", files[0].display());
    let charts = files.len() - 1;
    println!("  {charts} chart files beside it (SVG and PNG)");
    Ok(0)
}

fn series(points: &[Point]) -> Series {
    points.iter().map(|p| (p.step, p.value)).collect()
}
