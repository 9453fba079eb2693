//! Builds `RunDetail` (what `show` prints) from the stored trees.
use super::{RunDetail, Store, StoreError, Summary};
use crate::ids::RunId;
use std::collections::BTreeMap;

impl Store {
    pub fn detail(&self, run: &RunId) -> Result<Option<RunDetail>, StoreError> {
        let Some(record) = self.get_run(run)? else {
            return Ok(None);
        };
        Ok(Some(RunDetail {
            ranks: self.ranks(run)?,
            events: self.events(run)?,
            metrics: self.metric_names(run)?,
            summary: self.summary(run)?,
            verdicts: self.verdicts(run)?,
            run: record,
        }))
    }

    /// Per-step means over ranks of one metric, in step order.
    pub fn rank_mean(&self, run: &RunId, metric: &str) -> Result<Vec<(u64, f64)>, StoreError> {
        let mut by_step: BTreeMap<u64, (f64, u32)> = BTreeMap::new();
        for p in self.series(run, metric, None)? {
            let e = by_step.entry(p.step).or_insert((0.0, 0));
            e.0 += p.value;
            e.1 += 1;
        }
        Ok(by_step.into_iter().map(|(s, (sum, n))| (s, sum / f64::from(n))).collect())
    }

    fn summary(&self, run: &RunId) -> Result<Summary, StoreError> {
        let loss = self.rank_mean(run, "loss")?;
        let mean = |xs: &[(u64, f64)]| (!xs.is_empty()).then(|| xs.iter().map(|x| x.1).sum::<f64>() / xs.len() as f64);
        let first = &loss[..loss.len().min(10)];
        let last = &loss[loss.len().saturating_sub(10)..];
        let mut step_ms: Vec<f64> = self.rank_mean(run, "step_time_ms")?.into_iter().map(|x| x.1).collect();
        step_ms.sort_by(f64::total_cmp);
        let median = (!step_ms.is_empty()).then(|| step_ms[step_ms.len() / 2]);
        // Tokens per second of the whole group: every rank's tokens over the median step time.
        let tokens: Vec<(u64, f64)> = self.rank_mean(run, "tokens")?;
        let ranks = self.ranks(run)?.len().max(1) as f64;
        let tokens_per_s = match (tokens.last(), median) {
            (Some((_, t)), Some(ms)) if ms > 0.0 => Some(t * ranks / (ms / 1000.0)),
            _ => None,
        };
        Ok(Summary {
            steps_done: loss.last().map(|x| x.0).unwrap_or(0),
            loss_first10_mean: mean(first),
            loss_last10_mean: mean(last),
            step_time_ms_median: median,
            tokens_per_s,
        })
    }
}
