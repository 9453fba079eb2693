//! Goodput as far as the history knows it: where a finished run's wall time went. Productive
//! training is the steps' own time (the rank mean of each step's `step_time_ms`) of steps that
//! count; steps after the checkpoint a later run of the report resumed from were computed again
//! there (recomputed); checkpoints' blocking time and a hang's time from its last progress to
//! the run's end are their own parts; the rest is start-up, teardown and waits between steps.
use super::{across_ranks, RunData};
use crate::record::VerdictKind;

/// One run's wall time split, in ms; the parts never add up to more than `wall_ms`.
#[derive(Clone, Debug, PartialEq)]
pub struct Goodput {
    pub wall_ms: f64,
    pub productive_ms: f64,
    pub recomputed_ms: f64,
    pub checkpoint_ms: f64,
    pub stalled_ms: f64,
}

impl Goodput {
    /// Productive ÷ wall: 1.0 is every millisecond spent on steps that count.
    pub fn ratio(&self) -> f64 {
        if self.wall_ms > 0.0 {
            self.productive_ms / self.wall_ms
        } else {
            0.0
        }
    }

    /// Start-up, teardown, evaluation and waits between steps: what the other parts leave.
    pub fn other_ms(&self) -> f64 {
        (self.wall_ms - self.productive_ms - self.recomputed_ms - self.checkpoint_ms - self.stalled_ms).max(0.0)
    }
}

/// The split of a finished run (None while it runs, or with no step times). `recomputed_after`:
/// the step a child in the same report resumed from, so this run's later steps were redone.
pub fn of_run(run: &RunData, recomputed_after: Option<u64>) -> Option<Goodput> {
    let d = run.detail.as_ref()?;
    let wall_ms = d.run.ended_ms?.saturating_sub(d.run.created_ms) as f64;
    let steps = across_ranks(&run.step_time_ms);
    if steps.is_empty() {
        return None;
    }
    let (mut productive_ms, mut recomputed_ms) = (0.0, 0.0);
    for (step, mean_ms, _, _) in steps {
        match recomputed_after {
            Some(s) if step > s => recomputed_ms += mean_ms,
            _ => productive_ms += mean_ms,
        }
    }
    let checkpoint_ms: f64 = run.checkpoints.iter().map(|c| c.blocking_ms).sum();
    // A hang lasts from its last progress to the end of the run (nothing recovers it yet).
    let stalled_ms = d
        .verdicts
        .iter()
        .map(|v| &v.verdict)
        .filter(|v| v.kind != VerdictKind::Straggler)
        .map(|v| d.run.ended_ms.unwrap_or(v.detected_ms).saturating_sub(v.since_ms) as f64)
        .fold(0.0, f64::max);
    // Step times are measured inside the ranks and can overlap a checkpoint's blocking: scale
    // the parts down together rather than report more than the wall time.
    let sum = productive_ms + recomputed_ms + checkpoint_ms + stalled_ms;
    let scale = if sum > wall_ms && sum > 0.0 { wall_ms / sum } else { 1.0 };
    Some(Goodput {
        wall_ms,
        productive_ms: productive_ms * scale,
        recomputed_ms: recomputed_ms * scale,
        checkpoint_ms: checkpoint_ms * scale,
        stalled_ms: stalled_ms * scale,
    })
}

/// For each run, the earliest step another run of the same report resumed it from.
pub fn resumed_after(runs: &[RunData]) -> Vec<Option<u64>> {
    runs.iter()
        .map(|parent| {
            let id = parent.detail.as_ref().map(|d| &d.run.id)?;
            runs.iter()
                .filter_map(|child| {
                    let r = &child.detail.as_ref()?.run;
                    (r.parent.as_ref() == Some(id)).then_some(r.resumed_from.as_ref()?.step)
                })
                .min()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{RunDetail, RunMeta, RunRecord};

    fn run(created_ms: u64, ended_ms: Option<u64>, step_ms: &[f64]) -> RunData {
        let meta = RunMeta {
            name: "a".into(),
            recipe_name: "a".into(),
            recipe_path: "a.toml".into(),
            recipe_json: "{}".into(),
            world_size: 2,
            steps_planned: step_ms.len() as u64,
        };
        let mut record = RunRecord::starting(crate::ids::RunId::new_now(), meta, vec!["local".into()], vec![], None);
        (record.created_ms, record.ended_ms) = (created_ms, ended_ms);
        let series = |k: f64| step_ms.iter().enumerate().map(|(i, ms)| (i as u64 + 1, ms * k)).collect();
        RunData {
            detail: Some(RunDetail {
                run: record,
                ranks: vec![],
                events: vec![],
                metrics: vec![],
                summary: Default::default(),
                verdicts: vec![],
            }),
            step_time_ms: vec![series(1.0), series(3.0)],
            ..RunData::default()
        }
    }

    #[test]
    fn steps_after_a_resume_point_are_recomputed_and_the_rest_is_other() {
        // 4 steps of mean 200 ms (rank 0 100, rank 1 300) in a 2 s run; a child resumed at 3.
        let g = of_run(&run(1_000, Some(3_000), &[100.0; 4]), Some(3)).expect("finished");
        assert_eq!((g.wall_ms, g.productive_ms, g.recomputed_ms), (2_000.0, 600.0, 200.0));
        assert_eq!(g.other_ms(), 1_200.0);
        assert!((g.ratio() - 0.3).abs() < 1e-12);
        assert_eq!(of_run(&run(1_000, None, &[100.0]), None), None, "a live run has no wall time yet");
    }

    #[test]
    fn parts_that_overlap_are_scaled_into_the_wall_time() {
        // 10 steps of 200 ms in a 1 s run: the parts say 2 s, the wall 1 s.
        let g = of_run(&run(0, Some(1_000), &[100.0; 10]), None).expect("finished");
        assert_eq!((g.productive_ms, g.other_ms(), g.ratio()), (1_000.0, 0.0, 1.0));
    }
}
