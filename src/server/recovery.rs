//! Recovery without a human (`[recovery]`): when a run of a lineage ends by a crash, a hang
//! (the link kills it once its incident report has the stacks) or a lost node, the server
//! starts a child from the newest verified checkpoint, the same way `resume` does, while the
//! lineage's budgets last; each decision is an event on the run that ended.
//!
//! A decision is registered before the ended run's view is published, so a follower that sees
//! the end also finds the restart and follows the child (`Reply::Restarted`).
use super::Shared;
use crate::ids::{unix_ms, RunId};
use crate::recipe::{Recipe, Recovery};
use crate::record::{Cause, ExitStatus, RankInfo, Restart};
use crate::store::{Batch, EventKind, EventRecord, RunRecord, RunStatus};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// The longest wait between restarts, however many came before.
pub const BACKOFF_CAP_S: f64 = 300.0;

/// What became of a run that recovery took up.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Waiting out the backoff, or launching.
    Pending,
    Restarted {
        child: RunId,
        restart: Restart,
    },
    /// No child: the text says why (budget spent, no checkpoint, the launch failed).
    NotRestarted(String),
}

/// Restarts decided, by the run that ended: followers wait on them.
pub type Restarts = Arc<Mutex<HashMap<RunId, watch::Receiver<Outcome>>>>;

/// Why `record` ended, as recovery counts it; None for an end nobody should undo (success, a
/// stop or kill asked by a person). `time_limited`: the server stopped it on Slurm's warning.
/// A rank that exited with `NON_FINITE_EXIT` makes a failure a `nan`.
pub fn cause(record: &RunRecord, ranks: &[RankInfo], killed_for_hang: bool, time_limited: bool) -> Option<Cause> {
    if killed_for_hang {
        return Some(Cause::Hang);
    }
    let non_finite = ranks.iter().any(|r| r.exit == Some(ExitStatus::Code(crate::record::NON_FINITE_EXIT)));
    match record.status {
        RunStatus::Stopped if time_limited => Some(Cause::TimeLimit),
        RunStatus::Failed if non_finite => Some(Cause::Nan),
        RunStatus::Failed => Some(Cause::Crash),
        RunStatus::Interrupted => Some(Cause::NodeLost),
        _ => None,
    }
}

/// The recipe's recovery settings, or None when it has none (or cannot be read).
pub fn settings(record: &RunRecord) -> Option<Recovery> {
    let recipe: Recipe = serde_json::from_str(&record.recipe_json).ok()?;
    (recipe.recovery.max_restarts > 0).then_some(recipe.recovery)
}

/// The restarts a lineage has taken so far: `record` and its parents while recovery made them.
fn taken(shared: &Shared, record: &RunRecord) -> Vec<Restart> {
    let mut out = Vec::new();
    let mut at = record.clone();
    while let Some(r) = at.restart.clone() {
        out.push(r);
        match at.parent.as_ref().and_then(|p| shared.store.get_run(p).ok().flatten()) {
            Some(parent) => at = parent,
            None => break,
        }
    }
    out
}

/// The next restart of a lineage that has taken `taken`, or why there is none.
pub fn next(recovery: &Recovery, cause: Cause, taken: &[Restart]) -> Result<Restart, String> {
    let all = taken.len() as u32;
    let of_cause = taken.iter().filter(|r| r.cause == cause).count() as u32;
    if all >= recovery.max_restarts {
        return Err(format!("its {} restarts are spent (recovery.max_restarts)", recovery.max_restarts));
    }
    if of_cause >= recovery.budget(cause) {
        return Err(format!(
            "its {} {} restarts are spent (recovery.{})",
            recovery.budget(cause),
            cause.name(),
            cause.name()
        ));
    }
    Ok(Restart { attempt: all + 1, cause })
}

/// The wait before restart number `attempt`: the recipe's backoff, doubled per earlier one.
pub fn backoff(recovery: &Recovery, attempt: u32) -> Duration {
    let s = recovery.backoff_s * 2f64.powi(attempt.saturating_sub(1).min(30) as i32);
    Duration::from_secs_f64(s.min(BACKOFF_CAP_S))
}

/// The child's recipe: the parent's without the faults it already reached (a fault fires once
/// per lineage: the step the parent ended in, and any before it).
pub fn child_recipe(record: &RunRecord) -> Option<String> {
    let mut recipe: Recipe = serde_json::from_str(&record.recipe_json).ok()?;
    let reached = record.step + 1;
    recipe.faults.retain(|f| f.step > reached);
    serde_json::to_string(&recipe).ok()
}

/// Takes up a run that ended by `cause`: registers the pending decision (before the end is
/// published), then decides and restarts on a task of its own.
pub fn take_up(shared: &Shared, record: RunRecord, cause: Cause, recovery: Recovery) {
    let (tx, rx) = watch::channel(Outcome::Pending);
    lock(&shared.restarts).insert(record.id.clone(), rx);
    shared.recovering.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let shared = shared.clone();
    tokio::spawn(async move {
        let outcome = restart(&shared, &record, cause, &recovery).await;
        let text = match &outcome {
            Outcome::Restarted { child, restart } => format!(
                "recovery: restarted after a {} as run {child} (restart {} of at most {})",
                cause.name(),
                restart.attempt,
                recovery.max_restarts
            ),
            Outcome::NotRestarted(why) => format!("recovery: not restarting after a {}: {why}", cause.name()),
            Outcome::Pending => String::new(),
        };
        note(&shared, &record.id, text).await;
        let _ = tx.send(outcome);
        shared.recovering.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    });
}

async fn restart(shared: &Shared, record: &RunRecord, cause: Cause, recovery: &Recovery) -> Outcome {
    let s2 = shared.clone();
    let r2 = record.clone();
    let taken = match tokio::task::spawn_blocking(move || taken(&s2, &r2)).await {
        Ok(t) => t,
        Err(e) => return Outcome::NotRestarted(format!("reading the lineage: {e}")),
    };
    let restart = match next(recovery, cause, &taken) {
        Ok(r) => r,
        Err(why) => return Outcome::NotRestarted(why),
    };
    let wait = backoff(recovery, restart.attempt);
    note(
        shared,
        &record.id,
        format!("recovery: {} of the run; restarting in {:.1} s", cause.name(), wait.as_secs_f64()),
    )
    .await;
    tokio::time::sleep(wait).await;
    let Some(recipe_json) = child_recipe(record) else {
        return Outcome::NotRestarted("its stored recipe cannot be read by this flightdeck".into());
    };
    // The child launches in the environment its parent did: a Slurm parent's `slurm.conf` (and
    // allocation, when it ran in the user's). SSH runs are not restarted (resume refuses them).
    let mut env = crate::protocol::spec::ClientEnv::default();
    if let Ok(Some(nodes)) = super::placement::slurm_nodes(&shared.db, &record.id) {
        env.slurm_conf = nodes.slurm.conf.clone();
        env.slurm_job = (!nodes.allocation.owned).then(|| nodes.allocation.job.clone());
    }
    let id = record.id.to_string();
    match super::resume::resume(shared, &id, None, Some(recipe_json), None, env, None, Some(restart.clone())).await {
        Ok(crate::protocol::Reply::Resumed { run, .. }) => Outcome::Restarted { child: run, restart },
        Ok(other) => Outcome::NotRestarted(format!("unexpected reply from the resume: {other:?}")),
        Err(e) => Outcome::NotRestarted(format!("{e:#}")),
    }
}

async fn note(shared: &Shared, run: &RunId, text: String) {
    tracing::info!("run {run}: {text}");
    let mut batch = Batch::default();
    batch.events.push((run.clone(), EventRecord { t_ms: unix_ms(), kind: EventKind::Notice, rank: None, text }));
    if let Err(e) = shared.ingest.write(batch).await {
        tracing::warn!("run {run}: recording a recovery event: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recovery(max: u32, crash: u32, hang: u32) -> Recovery {
        Recovery {
            max_restarts: max,
            backoff_s: 2.0,
            crash,
            hang,
            node_lost: max,
            nan: max,
            on_nan: crate::recipe::OnNan::Restart,
        }
    }

    fn restart(attempt: u32, cause: Cause) -> Restart {
        Restart { attempt, cause }
    }

    #[test]
    fn the_budget_counts_every_restart_and_each_cause_apart() {
        let r = recovery(3, 3, 1);
        assert_eq!(next(&r, Cause::Crash, &[]), Ok(restart(1, Cause::Crash)));
        let one = [restart(1, Cause::Crash)];
        assert_eq!(next(&r, Cause::Hang, &one), Ok(restart(2, Cause::Hang)));
        let two = [restart(2, Cause::Hang), restart(1, Cause::Crash)];
        let hang = next(&r, Cause::Hang, &two).unwrap_err();
        assert!(hang.contains("1 hang restarts are spent (recovery.hang)"), "{hang}");
        assert_eq!(next(&r, Cause::Crash, &two), Ok(restart(3, Cause::Crash)));
        let three = [restart(3, Cause::Crash), restart(2, Cause::Hang), restart(1, Cause::Crash)];
        let all = next(&r, Cause::Crash, &three).unwrap_err();
        assert!(all.contains("3 restarts are spent (recovery.max_restarts)"), "{all}");
        assert!(next(&recovery(0, 0, 0), Cause::Crash, &[]).is_err(), "off: never");
        // A nan restarts only under on_nan = "restart".
        assert_eq!(next(&r, Cause::Nan, &[]), Ok(restart(1, Cause::Nan)));
        let stop = Recovery { on_nan: crate::recipe::OnNan::Stop, ..r.clone() };
        assert!(next(&stop, Cause::Nan, &[]).unwrap_err().contains("0 nan restarts are spent (recovery.nan)"));
    }

    #[test]
    fn the_backoff_doubles_from_the_recipe_s_and_stops_at_the_cap() {
        let r = recovery(100, 100, 100);
        let s: Vec<f64> = [1, 2, 3, 40].iter().map(|&a| backoff(&r, a).as_secs_f64()).collect();
        assert_eq!(s, [2.0, 4.0, 8.0, BACKOFF_CAP_S]);
    }

    #[test]
    fn only_a_failure_nobody_asked_for_is_a_cause() {
        let meta = crate::record::RunMeta {
            name: "r".into(),
            recipe_name: "r".into(),
            recipe_path: "r.toml".into(),
            recipe_json: "{}".into(),
            world_size: 2,
            steps_planned: 10,
        };
        let mut r = RunRecord::starting(RunId::new_now(), meta, vec!["local".into()], vec![], None);
        let of = |r: &RunRecord, hang| cause(r, &[], hang, false);
        for (status, want) in [
            (RunStatus::Failed, Some(Cause::Crash)),
            (RunStatus::Interrupted, Some(Cause::NodeLost)),
            (RunStatus::Succeeded, None),
            (RunStatus::Stopped, None),
            (RunStatus::Killed, None),
        ] {
            r.status = status;
            assert_eq!(of(&r, false), want, "{status:?}");
        }
        r.status = RunStatus::Killed;
        assert_eq!(of(&r, true), Some(Cause::Hang), "killed by recovery for a hang");
        r.status = RunStatus::Stopped;
        assert_eq!(cause(&r, &[], false, true), Some(Cause::TimeLimit), "stopped on Slurm's time-limit warning");
        r.status = RunStatus::Killed;
        assert_eq!(cause(&r, &[], false, true), None, "killed by a person after the warning");
        // A rank that stopped on a non-finite gradient norm makes the failure a nan.
        r.status = RunStatus::Failed;
        let mut rank = RankInfo::new(1);
        rank.exit = Some(ExitStatus::Code(crate::record::NON_FINITE_EXIT));
        assert_eq!(cause(&r, &[rank.clone()], false, false), Some(Cause::Nan));
        rank.exit = Some(ExitStatus::Code(1));
        assert_eq!(cause(&r, &[rank], false, false), Some(Cause::Crash));
    }
}
