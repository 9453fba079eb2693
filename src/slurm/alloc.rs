//! A run's allocation: a job `sbatch` submits for it (whose batch script only holds the nodes
//! and relays the time-limit warning), or one the user already has (`cluster.slurm_job`, or the
//! `salloc` the cockpit runs in).
use super::{JobInfo, Slurm, SlurmError};
use crate::ids::RunId;
use crate::recipe::Recipe;
use std::path::Path;
use std::time::Duration;

/// What the holder script sets the job's comment to when Slurm's warning arrives.
pub const GRACE_COMMENT: &str = "flightdeck:grace";
/// How often a pending job is asked about: once a second keeps a queue of runs cheap for
/// slurmctld and a launch within a second of its start.
const PENDING_POLL: Duration = Duration::from_millis(500);

/// The nodes a run got.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Allocation {
    pub job: String,
    /// Submitted for this run (then cancelled when it ends); false: the user's own.
    pub owned: bool,
    /// The nodes the run uses, in node order, and each one's address.
    pub nodes: Vec<String>,
    pub addrs: Vec<String>,
}

/// The batch script of a run's own job.
pub fn holder_script(run: &RunId) -> String {
    format!(
        r#"#!/bin/bash
# Flightdeck's allocation holder for run {run}, written by the Flightdeck server.
# It holds the nodes while the run's agents (srun --overlap steps the server starts) work, and
# turns Slurm's time-limit warning (USR2, from sbatch --signal=B:USR2@GRACE) into a comment on
# the job, which the server watches: the run then stops at a step boundary with a checkpoint.
warned() {{ scontrol update JobId="$SLURM_JOB_ID" Comment={GRACE_COMMENT}; }}
trap warned USR2
trap 'kill "$child" 2>/dev/null; exit 0' TERM INT
sleep infinity &
child=$!
# A trapped signal ends `wait` early: wait again until the child is really gone.
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
"#
    )
}

/// sbatch's options for a run's own job (the script path last).
pub fn sbatch_args(recipe: &Recipe, run: &RunId, script: &Path) -> Vec<String> {
    let c = &recipe.cluster;
    let s = &c.slurm;
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name=flightdeck-{run}"),
        format!("--nodes={}", s.nodes),
        format!("--ntasks-per-node={}", c.ranks_per_node),
        // Every node up before the job starts: the agents start on all of them at once.
        "--wait-all-nodes=1".into(),
        // A requeue would restart only the holder, not the run: Flightdeck resubmits instead.
        "--no-requeue".into(),
        // The holder prints nothing worth keeping, and the submitting host's paths may not
        // exist on the batch node (where a missing --output directory fails the job).
        "--output=/dev/null".into(),
    ];
    if s.grace_s > 0 {
        args.push(format!("--signal=B:USR2@{}", s.grace_s));
    }
    if let Some(t) = &s.time_limit {
        args.push(format!("--time={t}"));
    }
    if let Some(p) = &s.partition {
        args.push(format!("--partition={p}"));
    }
    if let Some(a) = &s.account {
        args.push(format!("--account={a}"));
    }
    args.extend(s.sbatch_args.iter().cloned());
    args.push(script.display().to_string());
    args
}

/// The job id sbatch's `--parsable` printed (`ID` or `ID;CLUSTER`).
pub fn parse_job_id(out: &str) -> Option<String> {
    let id = out.trim().split(';').next()?.trim();
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_string())
}

/// Gets the run's nodes: submits its job and waits for it to run, or checks the job it is
/// given. `notes` hears progress (the job id, why it pends).
pub fn obtain(
    slurm: &Slurm,
    recipe: &Recipe,
    run: &RunId,
    run_dir: &Path,
    notes: &dyn Fn(&str),
) -> Result<Allocation, SlurmError> {
    let wanted = recipe.cluster.slurm.nodes as usize;
    let given = recipe.cluster.slurm.slurm_job.clone().or_else(|| slurm.client_job.clone());
    let (job, owned) = match given {
        Some(job) => (job, false),
        None => {
            let script = run_dir.join("slurm-holder.sh");
            std::fs::write(&script, holder_script(run))
                .map_err(|e| SlurmError::Refused(format!("writing {}: {e}", script.display())))?;
            let args = sbatch_args(recipe, run, &script);
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = slurm.run("sbatch", &argv)?;
            let job = parse_job_id(&out).ok_or_else(|| SlurmError::Unreadable {
                command: "sbatch --parsable".into(),
                what: "a job id".into(),
                output: out.clone(),
            })?;
            notes(&format!("submitted Slurm job {job}"));
            (job, true)
        }
    };
    match running_nodes(slurm, &job, wanted, notes) {
        Ok((nodes, addrs)) => Ok(Allocation { job, owned, nodes, addrs }),
        Err(e) => {
            // A job submitted for this run goes with its launch.
            if owned {
                cancel(slurm, &job);
            }
            Err(e)
        }
    }
}

/// Once the job runs: its first `wanted` nodes and their addresses.
fn running_nodes(
    slurm: &Slurm,
    job: &str,
    wanted: usize,
    notes: &dyn Fn(&str),
) -> Result<(Vec<String>, Vec<String>), SlurmError> {
    let info = wait_running(slurm, job, notes)?;
    let nodes = slurm.hostnames(&info.nodes)?;
    if nodes.len() < wanted {
        return Err(SlurmError::Refused(format!(
            "Slurm job {job} has {} node(s) ({}), and the recipe asks for {wanted} (cluster.nodes); \
             give a larger allocation, or lower cluster.nodes",
            nodes.len(),
            info.nodes
        )));
    }
    let nodes: Vec<String> = nodes.into_iter().take(wanted).collect();
    let addrs = slurm.node_addrs(&nodes)?;
    Ok((nodes, addrs))
}

/// Waits while the job pends (telling why, each time the reason changes); Err when it ends
/// without running.
fn wait_running(slurm: &Slurm, job: &str, notes: &dyn Fn(&str)) -> Result<JobInfo, SlurmError> {
    let mut told = String::new();
    loop {
        let info = slurm
            .job(job)?
            .ok_or_else(|| SlurmError::Refused(format!("Slurm does not know job {job}: it has ended, or never was")))?;
        if info.running() {
            return Ok(info);
        }
        if !info.pending() {
            return Err(SlurmError::Refused(format!(
                "Slurm job {job} is {} ({}), not running; a run needs a running allocation",
                info.state, info.reason
            )));
        }
        if let Some(why) = never_starts(&info.reason) {
            return Err(SlurmError::Refused(format!(
                "Slurm job {job} is pending for {} and will not start as it is: {why}",
                info.reason
            )));
        }
        if info.reason != told {
            notes(&format!("Slurm job {job} pending ({})", info.reason));
            told = info.reason.clone();
        }
        std::thread::sleep(PENDING_POLL);
    }
}

/// Pending reasons (`squeue -o %r`) that no amount of waiting resolves: the job asks for more
/// than its partition, account or QOS may ever give, or for something the cluster does not
/// have. A launch stops on them at once (and cancels its own job) instead of waiting forever;
/// every other reason (`Resources`, `Priority`, `BeginTime`, ...) is waited out.
fn never_starts(reason: &str) -> Option<&'static str> {
    const NEVER: &[(&str, &str)] = &[
        (
            "PartitionNodeLimit",
            "it asks for more nodes than the partition allows (lower cluster.nodes, or pick another cluster.partition)",
        ),
        ("PartitionTimeLimit", "its time limit is above the partition's (lower cluster.time_limit)"),
        (
            "PartitionConfig",
            "the partition cannot run it as configured (check cluster.partition and cluster.sbatch_args)",
        ),
        ("PartitionDown", "its partition is down"),
        ("PartitionInactive", "its partition is inactive"),
        ("BadConstraints", "no node has the features it asks for (check cluster.sbatch_args)"),
        ("InvalidAccount", "its account is not valid here (check cluster.account)"),
        ("InvalidQOS", "its QOS is not valid here (check cluster.sbatch_args)"),
        ("QOSMaxNodePerJobLimit", "it asks for more nodes than its QOS allows per job (lower cluster.nodes)"),
        ("QOSMaxWallDurationPerJobLimit", "its time limit is above its QOS's (lower cluster.time_limit)"),
        (
            "AssocMaxNodesPerJobLimit",
            "it asks for more nodes than its association allows per job (lower cluster.nodes)",
        ),
        ("AssocMaxWallDurationPerJobLimit", "its time limit is above its association's (lower cluster.time_limit)"),
    ];
    NEVER.iter().find(|(name, _)| reason.split([',', ' ']).any(|r| r == *name)).map(|(_, why)| *why)
}

/// Cancels a job; a failure is only logged (the job may be gone already).
pub fn cancel(slurm: &Slurm, job: &str) {
    if let Err(e) = slurm.run("scancel", &[job]) {
        tracing::warn!("scancel {job}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(extra: &str) -> Recipe {
        let text = format!(
            "name = \"t\"\nkind = \"command\"\n[command]\nargv = [\"true\"]\n[cluster]\nlauncher = \"slurm\"\nnodes = 2\nranks_per_node = 4\n{extra}"
        );
        crate::recipe::parse_str(&text, "t.toml", &[]).expect("recipe")
    }

    #[test]
    fn sbatch_gets_the_recipes_resources_and_the_warning_signal() {
        let r = recipe("partition = \"gpu\"\ntime_limit = \"1:00:00\"\naccount = \"proj\"\ngrace_s = 120\nsbatch_args = [\"--gres=gpu:8\"]");
        let run = RunId("r1".into());
        let args = sbatch_args(&r, &run, Path::new("/d/slurm-holder.sh"));
        for want in [
            "--parsable",
            "--job-name=flightdeck-r1",
            "--nodes=2",
            "--ntasks-per-node=4",
            "--signal=B:USR2@120",
            "--time=1:00:00",
            "--partition=gpu",
            "--account=proj",
            "--gres=gpu:8",
            "--no-requeue",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
        }
        assert_eq!(args.last().map(String::as_str), Some("/d/slurm-holder.sh"));
        let plain = sbatch_args(&recipe(""), &run, Path::new("s"));
        assert!(!plain.iter().any(|a| a.starts_with("--time") || a.starts_with("--partition")));
        assert!(plain.iter().any(|a| a == "--signal=B:USR2@300"), "the default grace: {plain:?}");
    }

    #[test]
    fn the_holder_relays_the_warning_and_outlives_trapped_signals() {
        let s = holder_script(&RunId("r1".into()));
        assert!(s.starts_with("#!/bin/bash\n"));
        assert!(s.contains("trap warned USR2") && s.contains("Comment=flightdeck:grace"));
        assert!(s.contains("while kill -0"), "bash's wait returns on a trapped signal: {s}");
    }

    #[test]
    fn a_reason_no_wait_resolves_ends_the_wait_and_any_other_is_waited_out() {
        assert!(never_starts("PartitionNodeLimit").is_some_and(|w| w.contains("cluster.nodes")));
        assert!(never_starts("ReqNodeNotAvail, PartitionTimeLimit").is_some_and(|w| w.contains("time_limit")));
        for waited in ["Resources", "Priority", "BeginTime", "None", "", "ReqNodeNotAvail, UnavailableNodes:n1"] {
            assert_eq!(never_starts(waited), None, "{waited}");
        }
    }

    #[test]
    fn job_ids_from_parsable_output() {
        assert_eq!(parse_job_id("42\n").as_deref(), Some("42"));
        assert_eq!(parse_job_id("42;cluster\n").as_deref(), Some("42"));
        assert_eq!(parse_job_id("Submitted batch job 42"), None);
        assert_eq!(parse_job_id(""), None);
    }
}
