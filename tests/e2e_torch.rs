//! Real PyTorch 2.11 programs under Flightdeck, unchanged: assets/examples/torch_ddp.py on 2
//! gloo ranks, a fault injected by its own flag, named from the flight recorders that the shim
//! dumps (the script imports nothing of Flightdeck).
mod common;
use common::*;
use serde_json::Value;

/// Kills the run when the test ends, passed or not: the faulty ranks never end by themselves.
struct KillOnDrop<'a>(&'a Db, String);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["kill", &self.1]);
    }
}

fn script() -> std::path::PathBuf {
    repo().join("assets/examples/torch_ddp.py")
}

/// The script's line that holds `needle` (the call sites a verdict must name).
fn line_of(needle: &str) -> usize {
    let text = std::fs::read_to_string(script()).unwrap();
    text.lines()
        .position(|l| l.contains(needle))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("{needle:?} not in the script"))
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Starts the DDP example with `fault` on rank 1 at step 5; returns the run's id, its output
/// and the first verdict line.
fn hang(db: &Db, python: &std::path::Path, fault: &str) -> (std::process::Child, Lines, String, String) {
    hang_with(db, python, fault, "")
}

/// `hang` with more `[command]` lines.
fn hang_with(
    db: &Db,
    python: &std::path::Path,
    fault: &str,
    command: &str,
) -> (std::process::Child, Lines, String, String) {
    let recipe = db.path().join("ddp.toml");
    let script = script();
    let argv =
        [python.to_str().unwrap(), script.to_str().unwrap(), "--steps", "100000", "--log-every", "5", "--fault", fault];
    command_recipe_with(&recipe, &format!("ddp-{fault}"), &argv, 2, command);
    let mut child = db.spawn(&["run", recipe.to_str().unwrap(), "--headless"]);
    let mut lines = stdout_lines(&mut child);
    let first = read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.split_whitespace().nth(1).unwrap().trim_end_matches(':').to_string();
    let verdict = read_until(&mut lines, |l| l.starts_with(&format!("{id} verdict ")));
    (child, Box::new(lines), id, verdict)
}

type Lines = Box<dyn Iterator<Item = std::io::Result<String>>>;

fn verdicts(db: &Db, id: &str, kind: &str) -> Vec<Value> {
    let s = db.json(&["show", id, "--json"]);
    s["verdicts"].as_array().unwrap().iter().filter(|v| v["kind"] == kind).cloned().collect()
}

/// When rank 1 says it injected the fault (`... (unix ms N)`).
fn injected_ms(db: &Db, id: &str) -> u64 {
    let log = db.path().join("runs").join(id).join("logs").join("rank-1.log");
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text.lines().find(|l| l.starts_with("injecting fault")).expect("the fault fired");
    line.rsplit("unix ms ").next().and_then(|n| n.trim_end_matches(')').parse().ok()).expect("a stamp")
}

fn kill_and_finish(db: &Db, mut child: std::process::Child, mut lines: Lines, id: &str) {
    let out = db.run(&["kill", id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("killed"), "{end}");
    let _ = child.wait();
    db.finish();
}

#[test]
fn a_ddp_rank_asleep_before_a_collective_is_named_with_group_seq_op_line_and_its_own_stack() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let db = Db::new();
    let (child, lines, id, line) = hang(&db, &python, "sleep");
    let _guard = KillOnDrop(&db, id.clone());
    let backward = format!("called at torch_ddp.py:{} (main)", line_of("loss.backward()"));
    let asleep = format!("rank 1 is at torch_ddp.py:{} (inject)", line_of("time.sleep(3600)"));
    for part in [
        "verdict never-entered",
        "rank 1 (local, pid",
        "never entered all_reduce of",
        "process group 0 (default_pg, ranks 0-1)",
        &backward,
        &asleep,
        "rank 0 waiting",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    let v = &verdicts(&db, &id, "never-entered")[0];
    assert_eq!(v["culprits"][0]["rank"], 1);
    assert_eq!(v["waiting"], serde_json::json!([0]));
    let seq = v["collective"]["seq"].as_u64().expect("the collective's seq");
    assert!(line.contains(&format!(" #{seq} of process group 0")), "{line}");
    assert_eq!(v["collective"]["op"], "all_reduce");
    let ms = v["detected_ms"].as_u64().unwrap().saturating_sub(injected_ms(&db, &id));
    println!("detection latency [torch never-entered]: {ms} ms from the injected fault to the verdict");

    // Each rank's shim keeps its own account beside its dumps: the first full dump at least.
    for rank in 0..2 {
        let path = db.path().join("runs").join(&id).join(format!("fr/shim_rank_{rank}.cost.json"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let cost: Value = serde_json::from_str(&text).unwrap();
        assert!(cost["full_dumps"].as_u64().unwrap() >= 1, "rank {rank}: {cost}");
        assert!(cost["full_cpu_ms"].as_f64().unwrap() > 0.0, "rank {rank}: {cost}");
        assert!(
            cost["thread_cpu_ms"].as_f64().unwrap() >= cost["full_cpu_ms"].as_f64().unwrap(),
            "rank {rank}: {cost}"
        );
        assert!(cost["wall_ms"].as_f64().unwrap() > 0.0, "rank {rank}: {cost}");
    }

    // The incident report carries the recorders' summary.
    let md = std::fs::read_to_string(v["report_path"].as_str().expect("a report")).unwrap();
    assert!(md.contains("## Flight recorders (PyTorch)"), "{md}");
    assert!(md.contains(&format!("| 0 | 0 (default_pg) | {seq} | {} | #{seq} all_reduce of", seq - 1)), "{md}");
    assert!(md.contains(&format!("| 1 | 0 (default_pg) | {0} | {0} | - |", seq - 1)), "{md}");

    if on_path("py-spy") {
        let report = db.json(&["stacks", &id, "--json"]);
        let groups = report["groups"].as_array().unwrap();
        assert_eq!(groups.len(), 2, "the waiting rank and the sleeping one apart: {report:#}");
        let text = String::from_utf8_lossy(&db.run(&["stacks", &id]).stdout).to_string();
        assert!(text.contains("inject") && text.contains("backward"), "Python frames of both ranks:\n{text}");
        // --native interleaves the C frames: the sleeping rank waits in libc under its Python frame.
        let native = String::from_utf8_lossy(&db.run(&["stacks", &id, "--rank", "1", "--native"]).stdout).to_string();
        assert!(native.contains("inject") && native.contains("at libc.so"), "native and Python frames:\n{native}");
        assert!(!text.contains("at libc.so"), "Python frames only without --native:\n{text}");
    } else {
        skipped(file!(), "the stacks part: py-spy is not on PATH (scripts/setup-pyspy.sh)");
    }
    kill_and_finish(&db, child, lines, &id);
}

#[test]
fn a_ddp_rank_calling_another_collective_is_a_mismatch_named_with_its_line() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let db = Db::new();
    let (child, lines, id, line) = hang(&db, &python, "op");
    let _guard = KillOnDrop(&db, id.clone());
    let at = format!("at torch_ddp.py:{} (inject)", line_of("dist.broadcast(torch.zeros(7)"));
    for part in [
        "verdict mismatch",
        "of process group 0 (default_pg, ranks 0-1)",
        "rank 1 (local, pid",
        "entered it as broadcast of 7 Float elements ([[7]])",
        "rank 0 as all_reduce of",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    let v = &verdicts(&db, &id, "mismatch")[0];
    assert_eq!(v["culprits"][0]["rank"], 1);
    let detail = v["culprits"][0]["detail"].as_str().unwrap();
    assert!(detail.contains(&at), "{at:?} not in {detail}");
    let ms = v["detected_ms"].as_u64().unwrap().saturating_sub(injected_ms(&db, &id));
    println!("detection latency [torch mismatch]: {ms} ms from the injected fault to the verdict");
    kill_and_finish(&db, child, lines, &id);
}

/// The processes whose environment names this run (ranks, torchrun, anything they started).
fn processes_of(id: &str) -> Vec<(u32, String)> {
    let want = format!("FLIGHTDECK_RUN={id}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if environ.split(|b| *b == 0).any(|kv| kv == want.as_bytes()) {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            found.push((pid, comm.trim().to_string()));
        }
    }
    found
}

/// `RANK` in a live process's environment.
fn rank_in_env(pid: u64) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let rank = environ.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(b"RANK="))?;
    Some(String::from_utf8_lossy(rank).to_string())
}

#[test]
fn under_torchrun_a_sleeping_rank_is_named_by_its_own_pid_and_kill_leaves_no_process_of_the_job() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let db = Db::new();
    let (child, lines, id, line) = hang_with(&db, &python, "sleep", "launcher = \"torchrun\"\n");
    let _guard = KillOnDrop(&db, id.clone());
    assert!(line.contains("verdict never-entered") && line.contains("rank 1 (local, pid"), "{line}");
    let asleep = format!("rank 1 is at torch_ddp.py:{} (inject)", line_of("time.sleep(3600)"));
    assert!(line.contains(&asleep), "the dump of torchrun's child: {line}");
    // Each rank's pid is torchrun's child with that RANK, not torchrun.
    let show = db.json(&["show", &id, "--json"]);
    for r in show["ranks"].as_array().unwrap() {
        let pid = r["pid"].as_u64().expect("a pid");
        assert_eq!(rank_in_env(pid), Some(r["rank"].to_string()), "rank {}'s pid {pid}", r["rank"]);
    }
    let v = &verdicts(&db, &id, "never-entered")[0];
    assert_eq!(v["culprits"][0]["rank"], 1);
    let job = processes_of(&id);
    assert!(job.iter().any(|(_, comm)| comm == "pt_elastic"), "torchrun is one of the job's: {job:?}");
    kill_and_finish(&db, child, lines, &id);
    assert_eq!(processes_of(&id), Vec::new(), "the run ended killed with a process of its job left");
}

#[test]
fn under_torchrun_a_rank_that_raises_fails_the_run_with_its_own_error_and_exit_code() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let db = Db::new();
    let recipe = db.path().join("ddp.toml");
    let script = script();
    let argv = [python.to_str().unwrap(), script.to_str().unwrap(), "--steps", "50", "--fault", "raise"];
    command_recipe_with(&recipe, "ddp-raise", &argv, 2, "launcher = \"torchrun\"\n");
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    assert!(!out.status.success(), "a failed run exits non-zero");
    let show = db.json(&["show", "ddp-raise", "--json"]);
    assert_eq!(show["run"]["status"], "failed", "{show:#}");
    let reason = show["run"]["reason"].as_str().unwrap();
    for part in ["rank 1 (local, pid", "exit code 1", "RuntimeError: injected failure at step 5"] {
        assert!(reason.contains(part), "{part:?} not in {reason}");
    }
    let ranks = show["ranks"].as_array().unwrap();
    assert_eq!(ranks[1]["exit"], serde_json::json!({"code": 1}), "torchrun's report of rank 1");
    assert_eq!(ranks[0]["exit"]["signal"], 15, "rank 0 was stopped by torchrun: {:#}", ranks[0]);
    let failures: Vec<&Value> = show["events"].as_array().unwrap().iter().filter(|e| e["kind"] == "failure").collect();
    assert!(
        failures.iter().any(|e| e["rank"] == 1 && e["text"].as_str().unwrap().contains("exit_code 1")),
        "{failures:?}"
    );
    db.finish();
}

/// Runs the DDP example to its end with `fault` on rank `rank` at step 5, and returns the run's
/// `show --json` and its headless output.
fn failed_run(db: &Db, python: &std::path::Path, fault: &str, rank: u32) -> (Value, String) {
    let recipe = db.path().join("ddp.toml");
    let script = script();
    let rank = rank.to_string();
    let argv =
        [python.to_str().unwrap(), script.to_str().unwrap(), "--steps", "50", "--fault", fault, "--fault-rank", &rank];
    command_recipe_with(&recipe, &format!("ddp-{fault}"), &argv, 2, "");
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    assert!(!out.status.success(), "a failed run exits non-zero");
    let show = db.json(&["show", &format!("ddp-{fault}"), "--json"]);
    (show, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_ranks_dist_backend_error_is_a_failure_verdict_that_names_it_first() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let db = Db::new();
    let (show, out) = failed_run(&db, &python, "backend-error", 1);
    let v = verdicts_in(&show, "failure");
    let v = v.first().unwrap_or_else(|| panic!("no failure verdict: {show:#}"));
    assert_eq!(v["culprits"][0]["rank"], 1, "the root cause first: {v:#}");
    let summary = v["summary"].as_str().unwrap();
    // The communicator's abort and its original reason (rank 0's gloo failure may follow it, or
    // the agent's stop may come first: either way rank 1 is first).
    for part in ["rank 1 (local, pid", "failed first: nccl comm aborted", "injected at step 5", "DistBackendError"] {
        assert!(summary.contains(part), "{part:?} not in {summary}");
    }
    assert!(out.contains("verdict failure"), "the headless run printed it: {out}");
    db.finish();
}

#[test]
fn a_printed_nccl_watchdog_timeout_is_a_failure_verdict_naming_its_rank_group_and_work() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let db = Db::new();
    let (show, out) = failed_run(&db, &python, "nccl-timeout", 0);
    let v = verdicts_in(&show, "failure");
    let v = v.first().unwrap_or_else(|| panic!("no failure verdict: {show:#}"));
    assert_eq!(v["culprits"][0]["rank"], 0, "the root cause first: {v:#}");
    let summary = v["summary"].as_str().unwrap();
    // DDP's all-reduce of step 5 (the script numbers it 2 × step), in the default group.
    for part in ["rank 0 (local, pid", "nccl timeout", "ALLREDUCE work 10", "timeout 600 s"] {
        assert!(summary.contains(part), "{part:?} not in {summary}");
    }
    assert!(out.contains("verdict failure"), "the headless run printed it: {out}");
    db.finish();
}

fn verdicts_in(show: &Value, kind: &str) -> Vec<Value> {
    show["verdicts"].as_array().unwrap().iter().filter(|v| v["kind"] == kind).cloned().collect()
}
