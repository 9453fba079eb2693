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
pub fn cause(record: &RunRecord, ranks: &[RankInfo], stopped_by: Option<Cause>, time_limited: bool) -> Option<Cause> {
    // The server's own stop or kill: for a hang, or for checkpoints that kept failing (its
    // graceful stop's save may fail too: the cause is still the checkpoints).
    if let Some(cause) =
        stopped_by.filter(|_| matches!(record.status, RunStatus::Stopped | RunStatus::Failed | RunStatus::Killed))
    {
        return Some(cause);
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

/// The hosts a failure of `cause` is laid on: for a crash or a non-finite loss, the host of the
/// rank whose failure came first (by the agents' clocks: an exit is the last thing heard of a
/// rank); the ranks that failed after it lost a peer or were ended by their agents. For a lost
/// node, the hosts whose ranks never reported an end. A hang, a stop on Slurm's time limit:
/// none (the host is not known to be at fault).
pub fn blamed(ranks: &[RankInfo], cause: Cause) -> Vec<String> {
    let failed: Vec<&RankInfo> = match cause {
        Cause::Crash | Cause::Nan => {
            let failed: Vec<&RankInfo> =
                ranks.iter().filter(|r| r.exit.as_ref().is_some_and(|e| !e.success())).collect();
            let first = failed.iter().filter_map(|r| r.last_seen_ms).min();
            failed.into_iter().filter(|r| first.is_none() || r.last_seen_ms == first).collect()
        }
        Cause::NodeLost => ranks.iter().filter(|r| r.exit.is_none()).collect(),
        Cause::Hang | Cause::TimeLimit | Cause::Checkpoint => Vec::new(),
    };
    let mut hosts: Vec<String> = failed.iter().map(|r| r.host.clone()).collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// A host that failed twice in a lineage makes way for a spare: `hosts` with each such host
/// replaced by the first unused spare (one that has not failed twice itself), and the swaps
/// made as (failed host, spare). A host with no spare left stays, and is said in `kept`.
pub struct Swapped {
    pub hosts: Vec<String>,
    pub spares: Vec<String>,
    pub swaps: Vec<(String, String)>,
    pub kept: Vec<String>,
}

pub fn swap_spares(hosts: &[String], spares: &[String], failures: &HashMap<String, u32>) -> Swapped {
    let failed_twice = |h: &String| failures.get(h).copied().unwrap_or(0) >= 2;
    let mut free: Vec<String> = spares.iter().filter(|s| !failed_twice(s) && !hosts.contains(s)).cloned().collect();
    let mut out = Swapped { hosts: Vec::new(), spares: Vec::new(), swaps: Vec::new(), kept: Vec::new() };
    for h in hosts {
        if !failed_twice(h) {
            out.hosts.push(h.clone());
        } else if free.is_empty() {
            out.kept.push(h.clone());
            out.hosts.push(h.clone());
        } else {
            let spare = free.remove(0);
            out.swaps.push((h.clone(), spare.clone()));
            out.hosts.push(spare);
        }
    }
    out.spares = spares.iter().filter(|s| !out.hosts.contains(s)).cloned().collect();
    out
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
pub fn take_up(shared: &Shared, record: RunRecord, ranks: Vec<RankInfo>, cause: Cause, recovery: Recovery) {
    let (tx, rx) = watch::channel(Outcome::Pending);
    lock(&shared.restarts).insert(record.id.clone(), rx);
    shared.recovering.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let shared = shared.clone();
    tokio::spawn(async move {
        let outcome = restart(&shared, &record, ranks, cause, &recovery).await;
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

async fn restart(
    shared: &Shared,
    record: &RunRecord,
    ranks: Vec<RankInfo>,
    cause: Cause,
    recovery: &Recovery,
) -> Outcome {
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
    let (s2, r2) = (shared.clone(), record.clone());
    let spared = tokio::task::spawn_blocking(move || with_spares(&s2, &r2, &ranks, cause, recipe_json)).await;
    let Ok((recipe_json, swaps)) = spared else {
        return Outcome::NotRestarted("choosing the hosts for the restart failed".into());
    };
    if let Some(text) = swaps {
        note(shared, &record.id, format!("recovery: {text}")).await;
    }
    // The child launches in the environment its parent did: an SSH parent's client's SSH config
    // and agent, a Slurm parent's `slurm.conf` (and allocation, when it ran in the user's).
    let mut env = super::placement::ssh_env(&shared.db, &record.id).unwrap_or_default();
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

/// The child's recipe with every host that failed twice in the lineage (this run's end
/// included) swapped for a spare, when the recipe lists spares; and what was swapped, said.
fn with_spares(
    shared: &Shared,
    record: &RunRecord,
    ranks: &[RankInfo],
    cause: Cause,
    recipe_json: String,
) -> (String, Option<String>) {
    let Ok(mut recipe) = serde_json::from_str::<Recipe>(&recipe_json) else { return (recipe_json, None) };
    if recipe.cluster.spare_hosts.is_empty() {
        return (recipe_json, None);
    }
    let mut failures: HashMap<String, u32> = HashMap::new();
    let mut count = |hosts: Vec<String>| hosts.into_iter().for_each(|h| *failures.entry(h).or_default() += 1);
    count(blamed(ranks, cause));
    let mut at = record.clone();
    while let Some(r) = at.restart.clone() {
        let Some(parent) = at.parent.as_ref().and_then(|p| shared.store.get_run(p).ok().flatten()) else { break };
        count(blamed(&shared.store.ranks(&parent.id).unwrap_or_default(), r.cause));
        at = parent;
    }
    let swapped = swap_spares(&recipe.cluster.hosts, &recipe.cluster.spare_hosts, &failures);
    let times = |h: &String| failures.get(h).copied().unwrap_or(0);
    let mut said: Vec<String> = swapped
        .swaps
        .iter()
        .map(|(bad, spare)| {
            format!("{bad} failed {} times in this lineage: the restart runs on spare {spare} in its place", times(bad))
        })
        .collect();
    said.extend(swapped.kept.iter().map(|bad| {
        format!(
            "{bad} failed {} times in this lineage, but no spare host is left (cluster.spare_hosts): the restart runs \
             on it again",
            times(bad)
        )
    }));
    recipe.cluster.hosts = swapped.hosts;
    recipe.cluster.spare_hosts = swapped.spares;
    let json = serde_json::to_string(&recipe).unwrap_or(recipe_json);
    (json, (!said.is_empty()).then(|| said.join("; ")))
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
        let of = |r: &RunRecord, by: Option<Cause>| cause(r, &[], by, false);
        for (status, want) in [
            (RunStatus::Failed, Some(Cause::Crash)),
            (RunStatus::Interrupted, Some(Cause::NodeLost)),
            (RunStatus::Succeeded, None),
            (RunStatus::Stopped, None),
            (RunStatus::Killed, None),
        ] {
            r.status = status;
            assert_eq!(of(&r, None), want, "{status:?}");
        }
        r.status = RunStatus::Killed;
        assert_eq!(of(&r, Some(Cause::Hang)), Some(Cause::Hang), "killed by recovery for a hang");
        // Stopped for failing checkpoints: its stop's own save may fail too, either way it is theirs.
        for status in [RunStatus::Stopped, RunStatus::Failed] {
            r.status = status;
            assert_eq!(of(&r, Some(Cause::Checkpoint)), Some(Cause::Checkpoint), "{status:?}");
        }
        r.status = RunStatus::Succeeded;
        assert_eq!(of(&r, Some(Cause::Checkpoint)), None, "a run that finished anyway needs no restart");
        r.status = RunStatus::Stopped;
        assert_eq!(cause(&r, &[], None, true), Some(Cause::TimeLimit), "stopped on Slurm's time-limit warning");
        r.status = RunStatus::Killed;
        assert_eq!(cause(&r, &[], None, true), None, "killed by a person after the warning");
        // A rank that stopped on a non-finite gradient norm makes the failure a nan.
        r.status = RunStatus::Failed;
        let mut rank = RankInfo::new(1);
        rank.exit = Some(ExitStatus::Code(crate::record::NON_FINITE_EXIT));
        assert_eq!(cause(&r, &[rank.clone()], None, false), Some(Cause::Nan));
        rank.exit = Some(ExitStatus::Code(1));
        assert_eq!(cause(&r, &[rank], None, false), Some(Cause::Crash));
    }

    fn rank(rank: u32, host: &str, exit: Option<ExitStatus>, at_ms: u64) -> RankInfo {
        RankInfo { host: host.into(), exit, last_seen_ms: Some(at_ms), ..RankInfo::new(rank) }
    }

    #[test]
    fn a_crash_is_laid_on_the_host_of_the_rank_that_failed_first_not_on_the_peers_it_took_down() {
        let ranks = [
            rank(0, "node0", Some(ExitStatus::Code(1)), 1_050), // lost its ring peer
            rank(1, "node0", Some(ExitStatus::Signal(libc::SIGKILL)), 1_060), // ended by its agent
            rank(2, "node1", Some(ExitStatus::Signal(libc::SIGKILL)), 1_000), // the crash (an OOM kill)
            rank(3, "node1", Some(ExitStatus::Signal(libc::SIGTERM)), 1_070),
        ];
        assert_eq!(blamed(&ranks, Cause::Crash), vec!["node1".to_string()]);
        assert_eq!(blamed(&ranks, Cause::Nan), vec!["node1".to_string()]);
        // A clean exit is no failure; a hang or a time limit blames no host.
        let one = [rank(0, "node0", Some(ExitStatus::Code(0)), 5), rank(1, "node1", Some(ExitStatus::Code(3)), 9)];
        assert_eq!(blamed(&one, Cause::Crash), vec!["node1".to_string()]);
        assert!(blamed(&ranks, Cause::Hang).is_empty() && blamed(&ranks, Cause::TimeLimit).is_empty());
        // A lost node: the hosts whose ranks never reported an end.
        let lost = [rank(0, "node0", Some(ExitStatus::Signal(libc::SIGKILL)), 9), rank(1, "node1", None, 3)];
        assert_eq!(blamed(&lost, Cause::NodeLost), vec!["node1".to_string()]);
    }

    #[test]
    fn a_host_that_failed_twice_makes_way_for_the_first_unused_spare_once_spares_run_out_it_stays() {
        let hosts: Vec<String> = ["node0", "node1"].map(String::from).to_vec();
        let spares: Vec<String> = ["node2", "node3"].map(String::from).to_vec();
        let once: HashMap<String, u32> = [("node1".to_string(), 1)].into();
        let s = swap_spares(&hosts, &spares, &once);
        assert_eq!((s.hosts.clone(), s.swaps.len(), s.spares.clone()), (hosts.clone(), 0, spares.clone()));

        let twice: HashMap<String, u32> = [("node1".to_string(), 2)].into();
        let s = swap_spares(&hosts, &spares, &twice);
        assert_eq!(s.hosts, vec!["node0".to_string(), "node2".to_string()]);
        assert_eq!(s.swaps, vec![("node1".to_string(), "node2".to_string())]);
        assert_eq!(s.spares, vec!["node3".to_string()], "a spare in use is a spare no more");

        // node2 (swapped in) failed twice too, node3 has as well: nothing is left, node2 stays.
        let hosts2 = s.hosts;
        let all: HashMap<String, u32> =
            [("node1", 2), ("node2", 2), ("node3", 2)].map(|(h, n)| (h.to_string(), n)).into();
        let s = swap_spares(&hosts2, &["node3".to_string()], &all);
        assert_eq!((s.hosts, s.kept), (hosts2, vec!["node2".to_string()]));
    }
}
