//! The history benchmark's Flightdeck side: one big run written through the store's writer,
//! then reopened, one metric read for every rank, and the full-run chart drawn from rollups.
//!
//! Batches are shaped as the server's tracker makes them (`src/server/tracker.rs`): up to
//! `BATCH_FRAMES` step frames in agent order (step by step, rank by rank), each batch carrying
//! the run record and the ranks it touched, written and flushed before the next, as the ingest
//! thread does before each ack. The agent link and the socket are not part of this timing.
use flightdeck::ids::RunId;
use flightdeck::store::rollup::LEVELS;
use flightdeck::store::{Batch, Point, RankInfo, RunMeta, RunRecord, RunStatus, Store};
use std::path::Path;
use std::time::Instant;

/// `src/server/link.rs`'s BATCH_FRAMES: the most frames one ingest batch holds.
const BATCH_FRAMES: u64 = 2048;
/// The four metrics each step frame contributes here (a real step frame has eleven).
pub const METRICS: [&str; 4] = ["loss", "lr", "grad_norm", "step_time_ms"];

/// The value written for (metric, rank, step); `benches/reference/history_tb.py` uses the same.
pub fn value(metric: usize, rank: u32, step: u64) -> f64 {
    let noise = ((u64::from(rank) * 7919 + step * 104_729 + metric as u64 * 31) % 1000) as f64 / 1000.0;
    match metric {
        0 => 0.5 + 2.5 * (-(step as f64) / 2000.0).exp() + 0.05 * noise,
        1 => 3e-3 * (1.0 - step as f64 / 20_000.0),
        2 => 0.3 + noise,
        _ => 90.0 + 20.0 * noise,
    }
}

fn record(ranks: u32, steps: u64) -> RunRecord {
    let meta = RunMeta {
        name: "bench-history".into(),
        recipe_name: "bench-history".into(),
        recipe_path: String::new(),
        recipe_json: "{}".into(),
        world_size: ranks,
        steps_planned: steps,
    };
    let mut run = RunRecord::starting(RunId::new_now(), meta, vec!["local".into()], Vec::new(), None);
    run.status = RunStatus::Running;
    run
}

fn rank_info(rank: u32, step: u64, loss: f64) -> RankInfo {
    RankInfo { host: "local".into(), pid: Some(1000 + rank), step, last_loss: Some(loss), ..RankInfo::new(rank) }
}

pub fn write(dir: &Path, ranks: u32, steps: u64) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let store = Store::open(dir)?;
    let mut writer = store.writer();
    let mut run = record(ranks, steps);
    let (mut batch, mut in_batch, mut batches, mut points) = (Batch::default(), 0u64, 0u64, 0u64);
    let mut touched = vec![false; ranks as usize];
    let frames = steps * u64::from(ranks);
    for frame in 0..frames {
        let (step, rank) = (frame / u64::from(ranks) + 1, (frame % u64::from(ranks)) as u32);
        for (m, name) in METRICS.iter().enumerate() {
            batch.points.push((run.id.clone(), (*name).into(), Point { step, rank, value: value(m, rank, step) }));
        }
        touched[rank as usize] = true;
        in_batch += 1;
        points += METRICS.len() as u64;
        if in_batch == BATCH_FRAMES || frame + 1 == frames {
            // The tracker's run record: lowest step every rank has reached, the agent's seq.
            run.step = (frame + 1) / u64::from(ranks);
            run.acked_seq = vec![frame + 1];
            if frame + 1 == frames {
                run.status = RunStatus::Succeeded;
            }
            batch.runs.push(run.clone());
            for (r, t) in touched.iter_mut().enumerate() {
                if std::mem::take(t) {
                    batch.ranks.push((run.id.clone(), rank_info(r as u32, step, value(0, r as u32, step))));
                }
            }
            writer.write(std::mem::take(&mut batch))?;
            batches += 1;
            in_batch = 0;
        }
    }
    writer.close_run(&run.id)?;
    drop(writer);
    drop(store);
    let seconds = t0.elapsed().as_secs_f64();
    println!("{{\"points\": {points}, \"batches\": {batches}, \"seconds\": {seconds}}}");
    Ok(())
}

pub fn load(dir: &Path, columns: usize) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let store = Store::open(dir)?;
    let runs = store.list_runs()?;
    let Some(run) = runs.last() else { anyhow::bail!("{}: no run in this store", dir.display()) };
    let series = store.series(&run.id, "loss", None)?;
    let series_s = t0.elapsed().as_secs_f64();
    let sum: f64 = series.iter().map(|p| p.value).sum();

    // The full-run chart: per column min, max and mean over every rank, from the finest rollup
    // level that still gives at most a few buckets per column, or from the points when even
    // that is coarser than a column (as here: 50 steps a column, rollups of 256 and up).
    let t1 = Instant::now();
    let steps = run.steps_planned.max(1);
    let per_column = steps.div_ceil(columns.max(1) as u64);
    let column = |step: u64| ((step.saturating_sub(1) * columns as u64) / steps).min(columns as u64 - 1) as usize;
    let mut cols = vec![(f64::INFINITY, f64::NEG_INFINITY, 0.0f64, 0u64); columns.max(1)];
    let mut read = 0usize;
    let level = LEVELS.iter().rposition(|&w| w <= per_column);
    match level {
        Some(level) => {
            for rank in 0..run.world_size {
                for (no, b) in store.rollups(&run.id, "loss", rank, level as u8)? {
                    let c = &mut cols[column(no * LEVELS[level] + 1)];
                    (c.0, c.1, c.2, c.3) = (c.0.min(b.min), c.1.max(b.max), c.2 + b.sum, c.3 + b.count);
                    read += 1;
                }
            }
        }
        None => {
            for p in store.series(&run.id, "loss", None)? {
                let c = &mut cols[column(p.step)];
                (c.0, c.1, c.2, c.3) = (c.0.min(p.value), c.1.max(p.value), c.2 + p.value, c.3 + 1);
                read += 1;
            }
        }
    }
    let drawn = cols.iter().filter(|c| c.3 > 0).count();
    let chart_s = t1.elapsed().as_secs_f64();
    println!(
        "{{\"points\": {}, \"sum\": {sum}, \"series_s\": {series_s}, \"chart_s\": {chart_s}, \
         \"read\": {read}, \"level_steps\": {}, \"columns_drawn\": {drawn}}}",
        series.len(),
        level.map_or(1, |l| LEVELS[l])
    );
    Ok(())
}
