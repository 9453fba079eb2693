//! Driving a report: each run's detail, series, checkpoints and flight records read through the
//! server, then `write`. The CLI's `report` and the cockpit's `P` both call `report`; `report
//! --incident` calls `incidents`.
use super::{across_ranks, bandwidth, incident, NodeGpu, Options, RunData, Series, EXTRA_METRICS};
use crate::client::Client;
use crate::history::{checkpoints, collectives, detail, fetch, Failure};
use crate::record::Point;
use std::collections::BTreeMap;
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
pub async fn report(c: &mut Client, runs: &[String], out: &Path, options: Options) -> Result<Vec<PathBuf>, Failure> {
    let mut data = Vec::new();
    for query in runs {
        data.push(run_data(c, query).await?);
    }
    let out = out.to_path_buf();
    // Drawing is CPU work (a PNG per chart): off the async threads.
    let files = tokio::task::spawn_blocking(move || super::write(&out, &data, options))
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
    let mut fold = bandwidth::Fold::default();
    for rank in 0..d.run.world_size {
        fold.add(&collectives(c, &id, rank).await?);
    }
    data.bandwidth = fold.finish(d.run.world_size);
    if has("gpu_util_pct") {
        data.gpu = gpu(c, &d).await?;
    }
    data.detail = Some(d);
    Ok(data)
}

/// Each node's GPU utilisation (mean over its ranks' GPUs) and memory (its fullest GPU).
async fn gpu(c: &mut Client, d: &crate::record::RunDetail) -> Result<Vec<NodeGpu>, Failure> {
    let id = d.run.id.to_string();
    let mut nodes: BTreeMap<String, (Vec<Series>, Vec<Series>)> = BTreeMap::new();
    for r in &d.ranks {
        let util = series(&fetch(c, &id, "gpu_util_pct", r.rank).await?);
        let mem = series(&fetch(c, &id, "gpu_mem_used_bytes", r.rank).await?);
        let node = nodes.entry(r.host.clone()).or_default();
        node.0.push(util);
        node.1.push(mem);
    }
    Ok(nodes
        .into_iter()
        .map(|(host, (util, mem))| NodeGpu {
            host,
            util_pct: across_ranks(&util).into_iter().map(|p| (p.0, p.1)).collect(),
            mem_bytes: across_ranks(&mem).into_iter().map(|p| (p.0, p.3)).collect(),
        })
        .collect())
}

fn series(points: &[Point]) -> Series {
    points.iter().map(|p| (p.step, p.value)).collect()
}

/// `report RUN --incident`: the run's incident reports as the history kept them, each with its
/// picture drawn again from the stored flight records, into `out` (None: the run's directory,
/// beside the originals). Returns the files written.
pub async fn incidents(c: &mut Client, run: &str, out: Option<&Path>) -> Result<Vec<PathBuf>, Failure> {
    let d = detail(c, run).await?.map_err(Failure::BadInput)?;
    let reports: Vec<&crate::record::VerdictRecord> = d.verdicts.iter().filter(|v| v.report_md.is_some()).collect();
    if reports.is_empty() {
        let kinds: Vec<&str> = d.verdicts.iter().map(|v| v.verdict.kind.name()).collect();
        let had = if kinds.is_empty() { "no verdicts".to_string() } else { format!("verdicts {}", kinds.join(", ")) };
        return Err(Failure::BadInput(format!(
            "run {} has no incident report ({had}; a report is written at a hang verdict)",
            d.run.id
        )));
    }
    let dir = match out {
        Some(dir) => {
            super::prepare(dir)?;
            dir.to_path_buf()
        }
        None => {
            let original = reports.iter().find_map(|v| v.report_path.as_deref().map(PathBuf::from));
            match original.as_deref().and_then(Path::parent).filter(|p| p.is_dir()) {
                Some(dir) => dir.to_path_buf(),
                None => {
                    return Err(Failure::BadInput(format!(
                        "run {}'s directory is gone ({}): give --out DIR to write its incident reports there",
                        d.run.id,
                        original.map_or("never written".into(), |p| p.display().to_string())
                    )))
                }
            }
        }
    };
    // Each rank's records are read once; only the last ones before each verdict are kept.
    let mut pictures: Vec<Vec<incident::RankLine>> = vec![Vec::new(); reports.len()];
    for rank in 0..d.run.world_size {
        let records = collectives(c, &d.run.id.to_string(), rank).await?;
        for (i, v) in reports.iter().enumerate() {
            pictures[i].push((rank, incident::before_verdict(&v.verdict, &records)));
        }
    }
    let reports: Vec<crate::record::VerdictRecord> = reports.into_iter().cloned().collect();
    let name = d.run.name.clone();
    let written = tokio::task::spawn_blocking(move || -> Result<Vec<PathBuf>, super::ReportError> {
        let mut files = Vec::new();
        for (record, ranks) in reports.iter().zip(&pictures) {
            files.extend(incident::rewrite(&dir, record, &name, ranks)?);
        }
        Ok(files)
    });
    Ok(written.await.map_err(|e| Failure::Failed(e.into()))??)
}
