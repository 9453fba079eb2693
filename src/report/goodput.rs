//! Goodput in the report: each run as its own lineage of one attempt (`crate::goodput`), its
//! steps after the checkpoint a later run of the same report resumed from counted as failed
//! work (done again there).
use super::{across_ranks, RunData};
use crate::goodput::{of_lineage, AttemptTimes, Goodput};

/// The split of a finished run (None while it runs, or with no step times). `redone_after`:
/// the step a child in the same report resumed from.
pub fn of_run(run: &RunData, redone_after: Option<u64>) -> Option<Goodput> {
    let d = run.detail.as_ref()?;
    let step_ms: Vec<(u64, f64)> = across_ranks(&run.step_time_ms).into_iter().map(|p| (p.0, p.1)).collect();
    if step_ms.is_empty() {
        return None;
    }
    let hangs = crate::goodput::hangs(&d.verdicts);
    of_lineage(&[AttemptTimes {
        created_ms: d.run.created_ms,
        ended_ms: d.run.ended_ms,
        step_ms,
        checkpoint_ms: run.checkpoints.iter().map(|c| c.blocking_ms).sum(),
        hangs,
        redone_after,
    }])
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
                attempts: Vec::new(),
                goodput: None,
            }),
            step_time_ms: vec![series(1.0), series(3.0)],
            ..RunData::default()
        }
    }

    #[test]
    fn steps_after_a_resume_point_are_recomputed_and_the_rest_is_other() {
        // 4 steps of mean 200 ms (rank 0 100, rank 1 300) in a 2 s run; a child resumed at 3.
        let g = of_run(&run(1_000, Some(3_000), &[100.0; 4]), Some(3)).expect("finished");
        assert_eq!((g.wall_ms, g.productive_ms, g.failed_ms), (2_000.0, 600.0, 200.0));
        assert_eq!(g.other_ms, 1_200.0);
        assert!((g.ratio - 0.3).abs() < 1e-12);
        assert_eq!(of_run(&run(1_000, None, &[100.0]), None), None, "a live run has no wall time yet");
    }
}
