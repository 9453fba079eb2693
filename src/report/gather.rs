//! Driving a report: each run's detail, series and checkpoints read through the server, then
//! `write`. The CLI's `report` and the cockpit's `P` both call `report`.
use super::{across_ranks, RunData, Series, EXTRA_METRICS};
use crate::client::Client;
use crate::history::{checkpoints, detail, fetch, Failure};
use crate::record::Point;
use std::path::{Path, PathBuf};

impl From<super::ReportError> for Failure {
    fn from(e: super::ReportError) -> Failure {
        match e {
            super::ReportError::Refused { .. } => Failure::BadInput(e.to_string()),
            other => Failure::Failed(other.into()),
        }
    }
}

/// Writes the report of `runs` into `out`; returns the files, `report.md` first.
pub async fn report(c: &mut Client, runs: &[String], out: &Path) -> Result<Vec<PathBuf>, Failure> {
    let mut data = Vec::new();
    for query in runs {
        data.push(run_data(c, query).await?);
    }
    let out = out.to_path_buf();
    // Drawing is CPU work (a PNG per chart): off the async threads.
    let files = tokio::task::spawn_blocking(move || super::write(&out, &data))
        .await
        .map_err(|e| Failure::Failed(e.into()))??;
    Ok(files)
}

async fn run_data(c: &mut Client, query: &str) -> Result<RunData, Failure> {
    let d = detail(c, query).await?.map_err(Failure::BadInput)?;
    let id = d.run.id.to_string();
    let has = |m: &str| d.metrics.iter().any(|k| k == m);
    let mut data = RunData { checkpoints: checkpoints(c, &id).await?, ..RunData::default() };
    for rank in 0..d.run.world_size {
        for (metric, into) in
            [("loss", &mut data.loss), ("step_time_ms", &mut data.step_time_ms), ("tokens", &mut data.tokens)]
        {
            let points = if has(metric) { fetch(c, &id, metric, rank).await? } else { Vec::new() };
            into.push(series(&points));
        }
    }
    for metric in EXTRA_METRICS.iter().filter(|m| has(m)) {
        let mut per_rank = Vec::new();
        for rank in 0..d.run.world_size {
            per_rank.push(series(&fetch(c, &id, metric, rank).await?));
        }
        data.extra.push((metric.to_string(), across_ranks(&per_rank).into_iter().map(|p| (p.0, p.1)).collect()));
    }
    data.detail = Some(d);
    Ok(data)
}

fn series(points: &[Point]) -> Series {
    points.iter().map(|p| (p.step, p.value)).collect()
}
