//! A run's snapshot for `Open`: what the store holds, bounded, so a reopened cockpit starts
//! where the live frames take over.
use crate::ids::RunId;

/// Points of all metrics and ranks a snapshot carries at most; longer runs send rollups.
const SNAPSHOT_POINTS: u64 = 400_000;
/// Flight-recorder records per rank in a snapshot (the collectives panel shows recent ones).
const SNAPSHOT_COLLECTIVES: usize = 64;
/// Log lines in a snapshot, over all ranks.
const SNAPSHOT_LOG_LINES: usize = 8_000;

/// Reads a run's snapshot: the detail first (its acked sequence numbers say which live frames
/// the rest already holds), then series, collectives and log tails.
pub fn snapshot(store: &crate::store::Store, id: &RunId) -> anyhow::Result<crate::protocol::RunSnapshot> {
    use crate::protocol::SeriesSnapshot;
    use crate::store::rollup::{Bucket, LEVELS};
    let detail = store.detail(id)?.ok_or_else(|| anyhow::anyhow!("run {id} vanished"))?;
    let ranks: Vec<u32> = detail.ranks.iter().map(|r| r.rank).collect();
    let per_series = SNAPSHOT_POINTS / (detail.metrics.len().max(1) * ranks.len().max(1)) as u64;
    let mut series = Vec::new();
    // One reader for every series: the run's journal is decoded once, not once a series.
    let mut points = store.run_points(id)?;
    for metric in &detail.metrics {
        for info in &detail.ranks {
            let level = LEVELS.iter().position(|w| info.step / w <= per_series);
            let buckets: Vec<Bucket> = if info.step <= per_series {
                let points = points.series(metric, Some(info.rank))?;
                let one = |p: crate::store::Point| Bucket {
                    min: p.value,
                    max: p.value,
                    sum: p.value,
                    count: 1,
                    last_step: p.step,
                    last: p.value,
                };
                points.into_iter().map(one).collect()
            } else {
                let level = level.unwrap_or(LEVELS.len() - 1) as u8;
                points.rollups(metric, info.rank, level)?.into_iter().map(|(_, b)| b).collect()
            };
            series.push(SeriesSnapshot { metric: metric.clone(), rank: info.rank, buckets });
        }
    }
    let mut collectives = Vec::new();
    for &r in &ranks {
        let mut recs = store.collectives(id, r)?;
        recs.drain(..recs.len().saturating_sub(SNAPSHOT_COLLECTIVES));
        collectives.push((r, recs));
    }
    let lines_per_rank = (SNAPSHOT_LOG_LINES / ranks.len().max(1)).clamp(20, 500);
    let mut tails = store.log_tails(id, &ranks, lines_per_rank)?;
    let logs = ranks.iter().map(|r| (*r, tails.remove(r).unwrap_or_default())).collect();
    Ok(crate::protocol::RunSnapshot { detail, series, collectives, logs })
}
