//! `flightdeck export RUN... --format F --out DIR`: reads runs through the server one (metric,
//! rank) series at a time and hands them to the format's `export::Sink`.
use super::history::{checkpoints, detail, fetch};
use super::EXIT_BAD_INPUT;
use crate::client::Client;
use crate::export::{self, Format, RunMeta, WallClock};
use crate::paths::DbPaths;
use crate::record::RunDetail;
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

fn bad(message: &str) -> anyhow::Result<i32> {
    eprintln!("flightdeck: export: {message}");
    Ok(EXIT_BAD_INPUT)
}

pub async fn export(db: &DbPaths, args: ExportArgs) -> anyhow::Result<i32> {
    let mut c = Client::connect(db).await?;
    // The runs, each once, with a lineage's ancestors first.
    let mut runs: Vec<(RunMeta, RunDetail)> = Vec::new();
    for query in &args.runs {
        let mut chain = Vec::new();
        let mut next = Some(query.clone());
        while let Some(q) = next.take() {
            let detail = match detail(&mut c, &q).await? {
                Ok(d) => d,
                Err(m) => return bad(&m),
            };
            if args.lineage && detail.run.resumed_from.is_some() {
                next = detail.run.parent.as_ref().map(|p| p.to_string());
            }
            chain.push(detail);
        }
        for (attempt, detail) in chain.into_iter().rev().enumerate() {
            if runs.iter().any(|(m, _)| m.id == detail.run.id.as_str()) {
                continue;
            }
            let r = &detail.run;
            let attempt = if args.lineage { attempt as u32 } else { 0 };
            let meta = RunMeta { id: r.id.to_string(), name: r.name.clone(), attempt, created_ms: r.created_ms };
            runs.push((meta, detail));
        }
    }
    // A metric or rank none of the runs has is a typo, not an empty export.
    for m in &args.metrics {
        if !runs.iter().any(|(_, d)| d.metrics.contains(m)) {
            let mut known: Vec<&str> = runs.iter().flat_map(|(_, d)| d.metrics.iter().map(String::as_str)).collect();
            known.sort_unstable();
            known.dedup();
            return bad(&format!("--metrics: no run has a metric {m:?}; their metrics: {}", known.join(", ")));
        }
    }
    let world = runs.iter().map(|(_, d)| d.run.world_size).max().unwrap_or(0);
    if let Some(r) = args.ranks.iter().find(|&&r| r >= world) {
        return bad(&format!("--ranks: rank {r} is not in any run (ranks 0 to {})", world.saturating_sub(1)));
    }
    let mut sink = match export::sink(args.format.into(), &args.out) {
        Ok(s) => s,
        Err(e) => return bad(&e.to_string()),
    };

    let (mut points, mut series) = (0u64, 0u64);
    for (meta, detail) in &runs {
        let metrics: Vec<&String> =
            detail.metrics.iter().filter(|m| args.metrics.is_empty() || args.metrics.contains(m)).collect();
        let ranks: Vec<u32> =
            (0..detail.run.world_size).filter(|r| args.ranks.is_empty() || args.ranks.contains(r)).collect();
        let timed = detail.metrics.iter().any(|m| m == "step_time_ms");
        let mut run_clock = None;
        for &rank in &ranks {
            let step_times = if timed { fetch(&mut c, &meta.id, "step_time_ms", rank).await? } else { Vec::new() };
            let wall = WallClock::new(meta.created_ms, &step_times);
            for metric in &metrics {
                let p = fetch(&mut c, &meta.id, metric, rank).await?;
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
        let ckpts = checkpoints(&mut c, &meta.id).await?;
        sink.checkpoints(meta, &ckpts, &wall)?;
    }
    let files = sink.finish()?;
    println!(
        "exported {points} points in {series} series of {} run{} to {}",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        args.out.display()
    );
    for f in files {
        println!("  {}", f.display());
    }
    Ok(0)
}
