//! Builds `RunDetail` (what `show` prints) from the stored trees.
use super::{RunDetail, RunRecord, Store, StoreError, Summary};
use crate::ids::RunId;
use std::collections::BTreeMap;

impl Store {
    pub fn detail(&self, run: &RunId) -> Result<Option<RunDetail>, StoreError> {
        let Some(record) = self.get_run(run)? else {
            return Ok(None);
        };
        let lineage = self.lineage(&record)?;
        Ok(Some(RunDetail {
            ranks: self.ranks(run)?,
            events: self.events(run)?,
            metrics: self.metric_names(run)?,
            summary: self.summary(run)?,
            verdicts: self.verdicts(run)?,
            attempts: if lineage.len() > 1 { lineage.iter().map(attempt).collect() } else { Vec::new() },
            goodput: self.goodput(&lineage)?,
            run: record,
        }))
    }

    /// `record` and the runs recovery restarted into it, oldest first.
    fn lineage(&self, record: &RunRecord) -> Result<Vec<RunRecord>, StoreError> {
        let mut chain = vec![record.clone()];
        while let Some(parent) = chain.last().filter(|r| r.restart.is_some()).and_then(|r| r.parent.clone()) {
            match self.get_run(&parent)? {
                // A lineage is finite; a cycle in a damaged store is not followed round.
                Some(p) if !chain.iter().any(|r| r.id == p.id) => chain.push(p),
                _ => break,
            }
        }
        chain.reverse();
        Ok(chain)
    }

    /// The lineage's goodput from its attempts' step times, checkpoints and hangs.
    fn goodput(&self, lineage: &[RunRecord]) -> Result<Option<crate::record::Goodput>, StoreError> {
        let mut times = Vec::new();
        for (i, r) in lineage.iter().enumerate() {
            let blocking = self.checkpoints(&r.id)?.iter().map(|c| c.blocking_ms).sum();
            let hangs = crate::goodput::hangs(&self.verdicts(&r.id)?);
            times.push(crate::goodput::AttemptTimes {
                created_ms: r.created_ms,
                ended_ms: r.ended_ms,
                step_ms: self.rank_mean(&r.id, "step_time_ms")?,
                checkpoint_ms: blocking,
                hangs,
                redone_after: lineage.get(i + 1).and_then(|next| next.resumed_from.as_ref()).map(|f| f.step),
            });
        }
        Ok(crate::goodput::of_lineage(&times).filter(|_| times.iter().any(|t| !t.step_ms.is_empty())))
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

fn attempt(r: &RunRecord) -> crate::record::Attempt {
    crate::record::Attempt {
        run: r.id.clone(),
        status: r.status,
        reason: r.reason.clone(),
        step: r.step,
        resumed_from: r.resumed_from.as_ref().map(|f| f.step),
        restart: r.restart.clone(),
    }
}
