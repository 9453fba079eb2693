//! Python ranks like users run them: their stacks through py-spy, grouped, the odd one apart.
mod common;
use common::*;

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Rank 1 sleeps in `stall()`; the others wait in a loop in `work()` (always on the same line,
/// so their stacks are identical whenever they are read). Each prints `ready` once there.
const SCRIPT: &str = r#"import os, time
rank = int(os.environ["RANK"])

def stall():
    print("ready", flush=True)
    time.sleep(3600)

def work():
    print("ready", flush=True)
    while True:
        time.sleep(0.01)

stall() if rank == 1 else work()
"#;

/// Kills the run when the test ends, passed or not: a failed assertion must not leave its
/// endless ranks running.
struct KillOnDrop<'a>(&'a Db, String);

impl Drop for KillOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["kill", &self.1]);
    }
}

#[test]
fn stacks_of_python_ranks_come_from_py_spy_with_the_sleeping_rank_apart() {
    if !on_path("py-spy") {
        skipped(file!(), "py-spy is not on PATH (make links it into the cache's bin: scripts/setup-pyspy.sh)");
        return;
    }
    let db = Db::new();
    let script = db.path().join("ranks.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let recipe = db.path().join("py.toml");
    command_recipe(&recipe, "py-stacks", &["python3", script.to_str().unwrap()], 3);
    let mut child = db.spawn(&["run", recipe.to_str().unwrap(), "--headless"]);
    let mut lines = stdout_lines(&mut child);
    let first = read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.split_whitespace().nth(1).unwrap().trim_end_matches(':').to_string();
    let _guard = KillOnDrop(&db, id.clone());
    // Every rank has printed `ready`: each is where its stack should show it.
    let logs = db.path().join("runs").join(&id).join("logs");
    let ready = |r: u32| std::fs::read_to_string(logs.join(format!("rank-{r}.log"))).is_ok_and(|t| t.contains("ready"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !(0..3).all(ready) {
        assert!(std::time::Instant::now() < deadline, "the ranks never printed ready");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let report = db.json(&["stacks", &id, "--json"]);
    let groups = report["groups"].as_array().unwrap();
    let tools: Vec<&str> = report["timings"].as_array().unwrap().iter().map(|t| t[2].as_str().unwrap_or("-")).collect();
    assert!(tools == ["py-spy"; 3], "py-spy for every rank: {report}");
    let ranks_of =
        |g: &serde_json::Value| g["ranks"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!(groups.len(), 2, "the spinning ranks together, the sleeping one apart: {report:#}");
    assert_eq!(ranks_of(&groups[0]), vec![0, 2], "{report:#}");
    assert_eq!(ranks_of(&groups[1]), vec![1], "{report:#}");
    let text = db.run(&["stacks", &id]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("stall") && text.contains("work"), "Python function names in the stacks:\n{text}");
    assert!(db.run(&["kill", &id]).status.success());
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("killed"), "{end}");
    let _ = child.wait();
    db.finish();
}

#[test]
fn a_real_ddp_job_has_each_ranks_loss_and_step_time_from_its_printed_dicts() {
    if let Some(db) = ddp_job_metrics("") {
        db.finish();
    }
}

#[test]
fn a_ddp_job_under_torchrun_has_each_ranks_loss_and_step_time_too() {
    let Some(db) = ddp_job_metrics("launcher = \"torchrun\"\n") else { return };
    let id = db.json(&["runs", "--json"])["runs"][0]["id"].as_str().unwrap().to_string();
    let logs = db.path().join("runs").join(id).join("logs");
    let torchrun =
        std::fs::read_to_string(logs.join("torchrun.log")).expect("torchrun's own output has a log of its own");
    assert!(torchrun.contains("OMP_NUM_THREADS"), "{torchrun}");
    let rank_log = std::fs::read_to_string(logs.join("rank-1.log")).unwrap();
    assert!(rank_log.contains("'step': 30"), "rank 1's file, tailed to its end: {rank_log}");
    assert!(!rank_log.contains("OMP_NUM_THREADS"), "torchrun's lines are not rank 1's");
    db.finish();
}

/// Runs torch_ddp.py on 2 ranks (`command`: more `[command]` lines) and checks each rank's
/// series; `None` where the venv is missing (reported skipped).
fn ddp_job_metrics(command: &str) -> Option<Db> {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return None;
    };
    let db = Db::new();
    let script = repo().join("assets/examples/torch_ddp.py");
    let recipe = db.path().join("ddp.toml");
    let argv = [python.to_str().unwrap(), script.to_str().unwrap(), "--steps", "30", "--log-every", "5"];
    command_recipe_with(&recipe, "ddp-logs", &argv, 2, command);
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for key in ["loss", "step_time_ms", "grad_norm", "lr"] {
        let csv = db.run(&["metrics", "ddp-logs", "--key", key, "--format", "csv"]);
        let rows = csv_rows(&String::from_utf8_lossy(&csv.stdout));
        for rank in 0..2u32 {
            let steps: Vec<u64> = rows.iter().filter(|r| r.1 == rank).map(|r| r.0).collect();
            assert_eq!(
                steps,
                vec![5, 10, 15, 20, 25, 30],
                "{key} of rank {rank}: the steps the script printed: {rows:?}"
            );
        }
        assert!(rows.iter().all(|r| r.2.is_finite() && (key != "step_time_ms" || r.2 > 0.0)), "{key}: {rows:?}");
    }
    Some(db)
}

/// Writes only through `SummaryWriter` (no line printed): each rank's scalars land in the
/// history at the steps it gave, with their full precision, and `add_scalars` under its tag.
const SUMMARY_WRITER: &str = r#"import os
from torch.utils.tensorboard import SummaryWriter
rank = int(os.environ["RANK"])
w = SummaryWriter(os.environ.get("TENSORBOARD_LOGGING_DIR", "tb"))
for step in (3, 6, 9):
    w.add_scalar("train/loss", (rank + 1) / (7.0 * step), step)
    w.add_scalars("perf", {"tps": 1000.0 * step + rank}, step)
w.close()
"#;

#[test]
fn a_script_writing_summarywriter_scalars_has_them_in_history_at_its_own_steps() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let db = Db::new();
    let script = db.path().join("writer.py");
    std::fs::write(&script, SUMMARY_WRITER).unwrap();
    let recipe = db.path().join("writer.toml");
    command_recipe(&recipe, "tb-writer", &[python.to_str().unwrap(), script.to_str().unwrap()], 2);
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for (key, value) in [
        ("loss", (|rank: u32, step: u64| (rank + 1) as f64 / (7.0 * step as f64)) as fn(u32, u64) -> f64),
        ("train/loss", |rank, step| (rank + 1) as f64 / (7.0 * step as f64)),
        ("perf/tps", |rank, step| 1000.0 * step as f64 + rank as f64),
    ] {
        for rank in 0..2u32 {
            let want: Vec<(u64, f64)> = [3, 6, 9].iter().map(|s| (*s, value(rank, *s))).collect();
            assert_eq!(rank_series(&db, "tb-writer", key, rank), want, "{key} of rank {rank}");
        }
    }
    db.finish();
}

/// A real HF Trainer job under torchrun: every rank's `Trainer.log` calls land at the
/// Trainer's global steps with the exact values of its `log_history`, and rank 0's printed
/// copies of the same dicts (4 digits, no step) add no points of their own.
#[test]
fn an_hf_trainer_job_has_each_ranks_logged_values_exactly_at_its_global_steps() {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return;
    };
    let has = std::process::Command::new(&python).args(["-c", "import transformers, accelerate"]).output();
    if !has.is_ok_and(|o| o.status.success()) {
        skipped(file!(), "transformers or accelerate is not in the venv (make python-deps installs them)");
        return;
    }
    let db = Db::new();
    let script = repo().join("assets/examples/hf_trainer.py");
    let history = db.path().join("history-{rank}.json");
    let out_dir = db.path().join("hf-out");
    let argv = [
        python.to_str().unwrap(),
        script.to_str().unwrap(),
        "--steps",
        "6",
        "--log-every",
        "2",
        "--out",
        out_dir.to_str().unwrap(),
        "--history",
        history.to_str().unwrap(),
    ];
    let recipe = db.path().join("hf.toml");
    command_recipe_with(&recipe, "hf-trainer", &argv, 2, "launcher = \"torchrun\"\n");
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}{}", common::run_logs(&db));
    for rank in 0..2u32 {
        let path = db.path().join(format!("history-{rank}.json"));
        let logged: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let steps: Vec<&serde_json::Value> =
            logged.as_array().unwrap().iter().filter(|e| e.get("loss").is_some()).collect();
        assert_eq!(steps.len(), 3, "{logged}");
        for key in ["loss", "grad_norm", "learning_rate"] {
            let want: Vec<(u64, f64)> =
                steps.iter().map(|e| (e["step"].as_u64().unwrap(), e[key].as_f64().unwrap())).collect();
            assert_eq!(rank_series(&db, "hf-trainer", key, rank), want, "{key} of rank {rank}");
        }
        let summary = rank_series(&db, "hf-trainer", "train_runtime", rank);
        assert_eq!(summary.len(), 1, "rank {rank}'s final summary once: {summary:?}");
    }
    db.finish();
}
