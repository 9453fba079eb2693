//! Driving an export: which runs (a lineage's ancestors first), which metrics and ranks, then
//! each (metric, rank) series read through the server and handed to the format's sink. The
//! CLI's `export` and the cockpit's `E` both call `export`.
use super::{ExportError, Format, RunMeta, WallClock};
use crate::client::Client;
use crate::history::{checkpoints, detail, fetch, Failure};
use crate::record::RunDetail;
use std::path::PathBuf;

/// What to export, and where.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportRequest {
    pub runs: Vec<String>,
    pub format: Format,
    pub out: PathBuf,
    /// Empty: every metric.
    pub metrics: Vec<String>,
    /// Empty: every rank.
    pub ranks: Vec<u32>,
    pub lineage: bool,
}

/// What an export wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Exported {
    pub points: u64,
    pub series: u64,
    pub runs: usize,
    pub files: Vec<PathBuf>,
}

impl Exported {
    /// `exported N points in S series of R runs to OUT`.
    pub fn summary(&self, out: &std::path::Path) -> String {
        let s = if self.runs == 1 { "" } else { "s" };
        format!(
            "exported {} points in {} series of {} run{s} to {}",
            self.points,
            self.series,
            self.runs,
            out.display()
        )
    }
}

impl From<ExportError> for Failure {
    fn from(e: ExportError) -> Failure {
        match e {
            ExportError::Refused { .. } => Failure::BadInput(e.to_string()),
            other => Failure::Failed(other.into()),
        }
    }
}

pub async fn export(c: &mut Client, req: &ExportRequest) -> Result<Exported, Failure> {
    let runs = resolve(c, req).await?;
    // A metric or rank none of the runs has is a typo, not an empty export.
    for m in &req.metrics {
        if !runs.iter().any(|(_, d)| d.metrics.contains(m)) {
            let mut known: Vec<&str> = runs.iter().flat_map(|(_, d)| d.metrics.iter().map(String::as_str)).collect();
            known.sort_unstable();
            known.dedup();
            let text = format!("--metrics: no run has a metric {m:?}; their metrics: {}", known.join(", "));
            return Err(Failure::BadInput(text));
        }
    }
    let world = runs.iter().map(|(_, d)| d.run.world_size).max().unwrap_or(0);
    if let Some(r) = req.ranks.iter().find(|&&r| r >= world) {
        let text = format!("--ranks: rank {r} is not in any run (ranks 0 to {})", world.saturating_sub(1));
        return Err(Failure::BadInput(text));
    }
    let mut sink = super::sink(req.format, &req.out)?;
    let (mut points, mut series) = (0u64, 0u64);
    for (meta, detail) in &runs {
        let metrics: Vec<&String> =
            detail.metrics.iter().filter(|m| req.metrics.is_empty() || req.metrics.contains(m)).collect();
        let ranks: Vec<u32> =
            (0..detail.run.world_size).filter(|r| req.ranks.is_empty() || req.ranks.contains(r)).collect();
        let timed = detail.metrics.iter().any(|m| m == "step_time_ms");
        let mut run_clock = None;
        for &rank in &ranks {
            let step_times = if timed { fetch(c, &meta.id, "step_time_ms", rank).await? } else { Vec::new() };
            let wall = WallClock::new(meta.created_ms, &step_times);
            for metric in &metrics {
                let p = fetch(c, &meta.id, metric, rank).await?;
                if p.is_empty() {
                    continue;
                }
                sink.series(meta, metric, rank, &wall.rows(&p))?;
                (points, series) = (points + p.len() as u64, series + 1);
            }
            run_clock.get_or_insert(wall);
        }
        // Events and checkpoints sit on the first exported rank's clock (rank 0 by default).
        let wall = run_clock.unwrap_or_else(|| WallClock::new(meta.created_ms, &[]));
        sink.events(meta, &detail.events, &wall)?;
        sink.checkpoints(meta, &checkpoints(c, &meta.id).await?, &wall)?;
    }
    let files = sink.finish()?;
    Ok(Exported { points, series, runs: runs.len(), files })
}

/// The runs, each once, with a lineage's ancestors first (attempt 0 the root).
async fn resolve(c: &mut Client, req: &ExportRequest) -> Result<Vec<(RunMeta, RunDetail)>, Failure> {
    let mut runs: Vec<(RunMeta, RunDetail)> = Vec::new();
    for query in &req.runs {
        let mut chain = Vec::new();
        let mut next = Some(query.clone());
        while let Some(q) = next.take() {
            let d = detail(c, &q).await?.map_err(Failure::BadInput)?;
            if req.lineage && d.run.resumed_from.is_some() {
                next = d.run.parent.as_ref().map(|p| p.to_string());
            }
            chain.push(d);
        }
        for (attempt, d) in chain.into_iter().rev().enumerate() {
            if runs.iter().any(|(m, _)| m.id == d.run.id.as_str()) {
                continue;
            }
            let r = &d.run;
            let attempt = if req.lineage { attempt as u32 } else { 0 };
            runs.push((RunMeta { id: r.id.to_string(), name: r.name.clone(), attempt, created_ms: r.created_ms }, d));
        }
    }
    Ok(runs)
}
