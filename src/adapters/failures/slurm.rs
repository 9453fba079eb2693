//! Slurm's failure lines (SchedMD/slurm, 17.11 to 25.11).
//!
//! - srun (`src/srun/launch.c` `_task_finish`): `srun: error: NODE: task 3: Exited with exit code
//!   1`, `srun: error: NODE: tasks 0-3: Killed` (strsignal's words, ` (core dumped)`), `srun: error:
//!   NODE: task 0: Out Of Memory`: `slurm_task_failed` (`host`, `task`: an integer for one task, the
//!   list as printed for several, `exit_code` or `signal`/`signal_name`/`reason`), `oom_kill`.
//!   `srun: error: Node failure on NODE` (`slurm_node_failure`), `srun: Job step aborted: Waiting up
//!   to 32 seconds for job step to finish.` (`slurm_step_aborted`, `wait_s`), `srun: error: Timed out
//!   waiting for job step to complete` (`slurm_step_timeout`), `srun: error: Task launch for
//!   StepId=123.0 failed on node NODE: …`, `Unable to create step for job 123: …`, `Unable to allocate
//!   resources: …`, `Application launch failed: …` (`slurm_launch_failed`).
//! - slurmstepd (`src/slurmd/slurmstepd/req.c`): `*** JOB 123 ON node01 CANCELLED AT
//!   2024-01-01T12:00:00 DUE TO TIME LIMIT ***` (also `STEP 123.0`, `DUE TO PREEMPTION`, `NODE
//!   FAILURE, SEE SLURMCTLD LOG FOR DETAILS`, `JOB REQUEUE`, `TASK FAILURE`, `DUE to SIGNAL
//!   Terminated`, none for scancel; before 17.11 `*** JOB 123 CANCELLED AT … DUE TO TIME LIMIT on
//!   node01 ***`): `slurm_cancelled` (`job_id`, `step_id`, `host`, `reason`); `*** STEP 123.0 ON node01
//!   FAILED (non-zero exit code or other failure mode) ***` (`slurm_step_failed`).
//! - OOM kills (`task_cgroup_memory.c`): 23.02+ `Detected 1 oom_kill event in StepId=123.0. Some of
//!   the step tasks have been OOM Killed.`; 18.08-22.05 `Detected 1 oom-kill event(s) in step 123.0
//!   cgroup. …` / `in StepId=123.0 cgroup.` / `in StepId=123.0.`: `oom_kill` (`oom_kills`, `job_id`, `step_id`).
use super::{after, event, lead_int, signal_from_words, Bytes, Put};
use crate::adapters::value::Scan;
use crate::adapters::Record;

pub(super) fn parse(line: u64, t: &str, b: &Bytes) -> Option<Record> {
    // srun's own lines begin with its name (the reader took off what wrapped them).
    if b.has(b':') && b.upper() && t.starts_with("srun") {
        if let Some(rest) = after(t, "srun: error: ") {
            return srun_error(line, rest.trim());
        }
        if let Some(rest) = after(t, "srun: Job step aborted") {
            let mut r = event(line, "slurm_step_aborted");
            match after(rest, "Waiting up to ").and_then(lead_int) {
                Some((s, _)) => r.metric("wait_s", s as f64),
                None => r.text("reason", "Job step aborted"),
            }
            return Some(r);
        }
    }
    if b.has(b'*') && t.has("*** ") {
        if let Some(r) = stepd(line, t) {
            return Some(r);
        }
    }
    if b.has(b'D') && t.has("oom") {
        return oom_kill(line, t);
    }
    None
}

fn srun_error(line: u64, rest: &str) -> Option<Record> {
    if let Some(host) = rest.strip_prefix("Node failure on ") {
        let mut r = event(line, "slurm_node_failure");
        r.text("host", host.trim());
        return Some(r);
    }
    if rest.starts_with("Timed out waiting for job step to complete") {
        let mut r = event(line, "slurm_step_timeout");
        r.text("reason", "Timed out waiting for job step to complete");
        return Some(r);
    }
    if let Some(step) = rest.strip_prefix("Task launch for ") {
        // `Task launch for StepId=123.0 failed on node node01: Invalid node name specified`
        let (step, tail) = step.cut(" failed on node ")?;
        let mut r = event(line, "slurm_launch_failed");
        step_id(&mut r, step.trim_start_matches("StepId="));
        let (host, reason) = tail.cut(": ").unwrap_or((tail, ""));
        r.text("host", host);
        r.text("reason", reason.trim());
        return Some(r);
    }
    if let Some(job) = rest.strip_prefix("Unable to create step for job ") {
        let (job, reason) = job.cut(": ").unwrap_or((job, ""));
        let mut r = event(line, "slurm_launch_failed");
        r.int_of("job_id", job);
        r.text("reason", reason.trim());
        return Some(r);
    }
    for head in ["Unable to allocate resources: ", "Application launch failed: "] {
        if let Some(reason) = rest.strip_prefix(head) {
            let mut r = event(line, "slurm_launch_failed");
            r.text("reason", reason.trim());
            return Some(r);
        }
    }
    // `NODE: task 3: Exited with exit code 1`, `NODE: tasks 0-3: Killed`
    let (host, tasks) = match rest.cut(": tasks ") {
        Some(split) => split,
        None => rest.cut(": task ")?,
    };
    let (list, what) = tasks.cut(": ")?;
    if host.is_empty() || host.contains(' ') || list.is_empty() {
        return None;
    }
    let what = what.trim();
    let mut r = if what == "Out Of Memory" { event(line, "oom_kill") } else { event(line, "slurm_task_failed") };
    r.text("host", host);
    match super::whole(list) {
        Some(task) => r.int("task", task),
        None => r.text("task", list),
    }
    if let Some(code) = what.strip_prefix("Exited with exit code ") {
        r.int_of("exit_code", code);
    } else if what != "Out Of Memory" {
        let words = what.strip_suffix(" (core dumped)").unwrap_or(what);
        if let Some((name, number)) = signal_from_words(words) {
            r.int("signal", number);
            r.text("signal_name", name);
        }
        r.text("reason", what);
    }
    Some(r)
}

/// `123.0` → `step_id` `123.0`, `job_id` 123.
fn step_id(r: &mut Record, step: &str) {
    let step = step.trim().trim_end_matches('.');
    if let Some((job, _)) = lead_int(step) {
        r.int("job_id", job);
    }
    r.text("step_id", step);
}

fn stepd(line: u64, t: &str) -> Option<Record> {
    let body = after(t, "*** ")?;
    let body = body.split(" ***").next()?;
    let (kind, rest) = body.split_once(' ')?;
    let (id, rest) = rest.split_once(' ')?;
    let mut r;
    let mut rest = rest;
    let mut host = None;
    if let Some(tail) = rest.strip_prefix("ON ") {
        let (h, tail) = tail.split_once(' ')?;
        host = Some(h);
        rest = tail;
    }
    if rest.starts_with("CANCELLED AT ") {
        r = event(line, "slurm_cancelled");
        let reason = after(rest, " DUE TO ").or_else(|| after(rest, " DUE to "));
        if let Some(reason) = reason {
            // Before 17.11: `DUE TO TIME LIMIT on node01`
            let (reason, old_host) = match reason.rsplit_once(" on ") {
                Some((reason, h)) if host.is_none() => (reason, Some(h)),
                _ => (reason, None),
            };
            host = host.or(old_host);
            let reason = reason.split(", SEE ").next().unwrap_or(reason);
            r.text("reason", reason.trim());
        }
    } else if let Some(why) = rest.strip_prefix("FAILED (") {
        r = event(line, "slurm_step_failed");
        r.text("reason", why.trim_end_matches(')'));
    } else if let Some(tail) = rest.strip_prefix("STEPD TERMINATED ON ") {
        r = event(line, "slurm_cancelled");
        host = tail.split(' ').next();
        if let Some(reason) = after(tail, " DUE TO ") {
            r.text("reason", reason.trim());
        }
    } else {
        return None;
    }
    match kind {
        "JOB" => r.int_of("job_id", id),
        "STEP" => step_id(&mut r, id),
        _ => return None,
    }
    if let Some(h) = host {
        r.text("host", h);
    }
    Some(r)
}

fn oom_kill(line: u64, t: &str) -> Option<Record> {
    let rest = after(t, "Detected ")?;
    let (count, tail) = lead_int(rest)?;
    if !(tail.starts_with(" oom_kill event") || tail.starts_with(" oom-kill event")) {
        return None;
    }
    let mut r = event(line, "oom_kill");
    r.int("oom_kills", count);
    if let Some(place) = after(tail, " in ") {
        let place = place.strip_prefix("StepId=").or_else(|| place.strip_prefix("step ")).unwrap_or(place);
        let id = place.split(' ').next().unwrap_or("");
        if id.starts_with(|c: char| c.is_ascii_digit()) {
            step_id(&mut r, id);
        }
    }
    Some(r)
}
