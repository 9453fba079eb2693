//! Goodput: where a lineage's wall time went (pure arithmetic, for `show`, `report` and the
//! cockpit). A lineage is a run and the runs that resumed it, oldest first; its wall time runs
//! from the first launch to the last end, and splits into:
//! - productive: the steps that count (the rank mean of each step's `step_time_ms`);
//! - failed: steps computed again later, because the next attempt resumed from an earlier
//!   checkpoint (the work lost to a failure);
//! - checkpoints: the time saves blocked training;
//! - stalled: a hang, from its last progress to the attempt's end;
//! - restart waits: from an attempt's end to the next one's launch (backoff, a person's delay);
//! - other: the rest (start-up to the first step, teardown, evaluation, waits between steps).
//!
//! Goodput = productive ÷ wall. The parts measured inside the ranks can overlap the blocking
//! time; when an attempt's parts add to more than its own wall time they are scaled down
//! together, so the parts always add up to the wall time.
pub use crate::record::Goodput;

/// One attempt of a lineage, as the history has it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttemptTimes {
    pub created_ms: u64,
    /// None while it runs.
    pub ended_ms: Option<u64>,
    /// Rank-mean step time by step, steps ascending.
    pub step_ms: Vec<(u64, f64)>,
    pub checkpoint_ms: f64,
    /// Hangs: (last progress, detection) in unix ms.
    pub hangs: Vec<(u64, u64)>,
    /// The checkpoint step the next attempt resumed from: this attempt's later steps were
    /// done again. None for the last attempt.
    pub redone_after: Option<u64>,
}

/// An attempt's hangs from its verdicts: (last progress, detection) of each hang verdict (a slow
/// rank or a failing checkpoint is not a stall).
pub fn hangs<'a>(verdicts: impl IntoIterator<Item = &'a crate::record::VerdictRecord>) -> Vec<(u64, u64)> {
    verdicts.into_iter().map(|v| &v.verdict).filter(|v| v.kind.is_hang()).map(|v| (v.since_ms, v.detected_ms)).collect()
}

/// The split of a finished lineage (None while its last attempt runs, or with nothing in it).
pub fn of_lineage(attempts: &[AttemptTimes]) -> Option<Goodput> {
    let first = attempts.first()?;
    let end = attempts.last()?.ended_ms?;
    let mut g = Goodput { wall_ms: end.saturating_sub(first.created_ms) as f64, ..Goodput::default() };
    for (i, a) in attempts.iter().enumerate() {
        let own_end = a.ended_ms.unwrap_or(end);
        let own_wall = own_end.saturating_sub(a.created_ms) as f64;
        let (mut productive, mut failed) = (0.0, 0.0);
        for &(step, ms) in a.step_ms.iter().filter(|p| p.1.is_finite()) {
            match a.redone_after {
                Some(s) if step > s => failed += ms,
                _ => productive += ms,
            }
        }
        // A hang lasts from its last progress to the attempt's end (it is killed or ends hung).
        let stalled = a.hangs.iter().map(|&(since, _)| own_end.saturating_sub(since) as f64).fold(0.0, f64::max);
        let sum = productive + failed + a.checkpoint_ms + stalled;
        let scale = if sum > own_wall && sum > 0.0 { own_wall / sum } else { 1.0 };
        g.productive_ms += productive * scale;
        g.failed_ms += failed * scale;
        g.checkpoint_ms += a.checkpoint_ms * scale;
        g.stalled_ms += stalled * scale;
        if let Some(next) = attempts.get(i + 1) {
            g.restart_wait_ms += next.created_ms.saturating_sub(own_end) as f64;
        }
    }
    let parts = g.productive_ms + g.failed_ms + g.checkpoint_ms + g.stalled_ms + g.restart_wait_ms;
    g.other_ms = (g.wall_ms - parts).max(0.0);
    g.ratio = if g.wall_ms > 0.0 { g.productive_ms / g.wall_ms } else { 0.0 };
    Some(g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(created_ms: u64, ended_ms: u64, steps: std::ops::RangeInclusive<u64>, ms: f64) -> AttemptTimes {
        AttemptTimes {
            created_ms,
            ended_ms: Some(ended_ms),
            step_ms: steps.map(|s| (s, ms)).collect(),
            ..AttemptTimes::default()
        }
    }

    #[test]
    fn a_crash_and_a_hang_split_into_failed_work_stalls_and_restart_waits_that_add_up() {
        // Attempt 1: steps 1-14 of 100 ms, crashed at 2.0 s; the next resumed from step 10.
        let mut a = attempt(0, 2_000, 1..=14, 100.0);
        a.redone_after = Some(10);
        a.checkpoint_ms = 50.0;
        // Attempt 2 launched 500 ms later: steps 11-29, hung from 5.0 s, killed at 12.0 s; the
        // next resumed from step 20.
        let mut b = attempt(2_500, 12_000, 11..=29, 100.0);
        b.hangs = vec![(5_000, 10_000)];
        b.redone_after = Some(20);
        // Attempt 3: steps 21-40, ended at 15.0 s.
        let c = attempt(12_500, 15_000, 21..=40, 100.0);
        let g = of_lineage(&[a, b, c]).expect("finished");
        assert_eq!(g.wall_ms, 15_000.0);
        assert_eq!(g.failed_ms, 400.0 + 900.0, "steps 11-14 of the first, 21-29 of the second");
        assert_eq!(g.productive_ms, 1_000.0 + 1_000.0 + 2_000.0, "steps 1-10, 11-20 and 21-40");
        assert_eq!((g.stalled_ms, g.restart_wait_ms, g.checkpoint_ms), (7_000.0, 1_000.0, 50.0));
        let parts = g.productive_ms + g.failed_ms + g.checkpoint_ms + g.stalled_ms + g.restart_wait_ms + g.other_ms;
        assert_eq!(parts, g.wall_ms, "the parts add up to the wall time");
        assert!((g.ratio - 4_000.0 / 15_000.0).abs() < 1e-12);
    }

    #[test]
    fn parts_measured_in_the_ranks_never_exceed_their_attempt_s_wall_time() {
        // 10 steps of 200 ms in a 1 s attempt: scaled to the 1 s.
        let g = of_lineage(&[attempt(0, 1_000, 1..=10, 200.0)]).expect("finished");
        assert_eq!((g.productive_ms, g.other_ms, g.ratio), (1_000.0, 0.0, 1.0));
        let mut live = attempt(0, 1_000, 1..=2, 1.0);
        live.ended_ms = None;
        assert_eq!(of_lineage(&[live]), None, "a live lineage has no wall time yet");
        assert_eq!(of_lineage(&[]), None);
    }
}
