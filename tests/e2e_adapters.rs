//! The log adapters end to end: a command run's framework lines become series and events live,
//! `parse-log` reads every fixture as expected, and `import` brings logs into the history.
mod common;
use common::*;

/// torchrun's failure block, as `ChildFailedError.format_msg` prints it (PyTorch 2.11,
/// torch/distributed/elastic/multiprocessing/errors/__init__.py).
const CHILD_FAILED: &str = r#"E1203 10:00:00.000000 4242 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 1 (pid: 4243) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_10:00:00
  host      : node7
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 4243)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"#;

/// A program that prints HF Trainer's log dicts on every rank; rank 1 then waits for rank 0 to
/// have printed all of its lines (a file rank 0 makes), prints torchrun's failure block and
/// exits 1. Without the wait rank 1's failure could end the run before rank 0 printed.
fn hf_script(dir: &std::path::Path) -> std::path::PathBuf {
    let script = dir.join("hf_like.py");
    let text = format!(
        r#"import os, sys
rank = int(os.environ["RANK"])
for step in range(1, 6):
    loss = 2.0 - 0.125 * step + 0.5 * rank
    print({{'loss': loss, 'grad_norm': 0.5, 'learning_rate': 5e-05, 'epoch': step / 5}}, flush=True)
done = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0.printed")
if rank == 0:
    open(done, "w").close()
if rank == 1:
    import time
    while not os.path.exists(done):
        time.sleep(0.01)
    sys.stderr.write('''{CHILD_FAILED}''')
    sys.stderr.flush()
    sys.exit(1)
"#
    );
    std::fs::write(&script, text).expect("writing the script");
    script
}

#[test]
fn a_command_run_printing_hf_lines_has_both_ranks_losses_and_rank_1s_failure_as_an_event() {
    let db = Db::new();
    let script = hf_script(db.path());
    let recipe = db.path().join("hf.toml");
    command_recipe(&recipe, "hf-like", &["python3", script.to_str().unwrap()], 2);
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    assert!(!out.status.success(), "rank 1 failed, so the run did");
    let run = db.json(&["runs", "--json"])["runs"][0]["id"].as_str().unwrap().to_string();

    let csv = db.run(&["metrics", &run, "--key", "loss", "--format", "csv"]);
    let rows = csv_rows(&String::from_utf8_lossy(&csv.stdout));
    for rank in 0..2u32 {
        let mine: Vec<(u64, f64)> = rows.iter().filter(|r| r.1 == rank).map(|r| (r.0, r.2)).collect();
        let want: Vec<(u64, f64)> = (1..=5).map(|s| (s, 2.0 - 0.125 * s as f64 + 0.5 * rank as f64)).collect();
        assert_eq!(mine, want, "rank {rank}'s loss, one point per logged step: {rows:?}");
    }
    let show = db.json(&["show", &run, "--json"]);
    assert_eq!(show["run"]["status"], "failed", "{show:#}");
    let events = show["events"].as_array().unwrap();
    let failures: Vec<&serde_json::Value> = events.iter().filter(|e| e["kind"] == "failure").collect();
    // torchrun's agent line (`failed (exitcode: 1) local_rank: 1 ...`), then its report's entry.
    let said = |start: &str| failures.iter().find(|e| e["text"].as_str().unwrap_or("").starts_with(start)).copied();
    let elastic = said("rank 1: elastic worker failed").unwrap_or_else(|| panic!("no elastic failure: {failures:#?}"));
    assert!(elastic["text"].as_str().unwrap().contains("exit_code 1"), "{elastic}");
    let failure = said("rank 1: child failed").unwrap_or_else(|| panic!("no child failure: {failures:#?}"));
    assert_eq!(failure["rank"], 1, "{failure}");
    let text = failure["text"].as_str().unwrap();
    assert!(text.contains("exit_code 1") && text.contains("node7"), "{text}");
    let reason = show["run"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("rank 1 (local, pid "), "{reason}");
    assert!(
        reason.contains("ended with exit code 1: torch.distributed.elastic.multiprocessing.errors.ChildFailedError"),
        "{reason}"
    );
    db.finish();
}

/// Every fixture under tests/fixtures/logs (subfolders too): `parse-log` prints exactly its expected records.
#[test]
fn parse_log_prints_every_fixtures_expected_records() {
    fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("tests/fixtures/logs") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "log") {
                out.push(path);
            }
        }
    }
    let mut logs = Vec::new();
    walk(&repo().join("tests/fixtures/logs"), &mut logs);
    logs.sort();
    // The binary against the library's own reader: every fixture is checked in-process by
    // src/adapters/tests.rs; here the top-level ones and the first of each folder (each run of
    // the binary costs a process start).
    let mut seen_dirs = std::collections::BTreeSet::new();
    logs.retain(|l| {
        let dir = l.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        dir.ends_with("tests/fixtures/logs") || seen_dirs.insert(dir)
    });
    let mut checked = 0;
    for log in logs {
        let expected_path = log.with_extension("expected.jsonl");
        let expected =
            std::fs::read_to_string(&expected_path).unwrap_or_else(|e| panic!("{}: {e}", expected_path.display()));
        let out = std::process::Command::new(bin()).args(["parse-log", log.to_str().unwrap()]).output().unwrap();
        assert!(out.status.success(), "{}: {}", log.display(), String::from_utf8_lossy(&out.stderr));
        let got: Vec<serde_json::Value> =
            String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let want: Vec<serde_json::Value> =
            expected.lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(got, want, "{}", log.display());
        checked += 1;
    }
    assert!(checked >= 9, "only {checked} fixtures");
}

#[test]
fn parse_log_refuses_a_missing_file_and_an_unknown_format_with_exit_2() {
    let out = std::process::Command::new(bin()).args(["parse-log", "/nonexistent/train.log"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent/train.log"));
    let log = repo().join("tests/fixtures/logs/mixed.log");
    let out = std::process::Command::new(bin())
        .args(["parse-log", log.to_str().unwrap(), "--format", "keras"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown log format \"keras\"") && err.contains("megatron"), "{err}");
}

#[test]
fn an_imported_log_directory_is_a_finished_run_with_each_ranks_series_and_its_failure() {
    let db = Db::new();
    let logs = db.path().join("old-run");
    std::fs::create_dir_all(&logs).unwrap();
    for rank in 0..2u32 {
        let mut text = String::new();
        for step in 1..=4 {
            text.push_str(&format!(
                "{{'loss': {}, 'grad_norm': 0.5, 'learning_rate': 5e-05, 'epoch': {}}}\n",
                3.0 - step as f64 * 0.25 + rank as f64,
                step as f64 / 4.0
            ));
        }
        if rank == 1 {
            text.push_str(CHILD_FAILED);
        }
        std::fs::write(logs.join(format!("rank-{rank}.log")), text).unwrap();
    }
    let out = db.json(&["import", logs.to_str().unwrap(), "--json", "--name", "old-run"]);
    assert_eq!(out["ranks"], 2, "{out}");
    assert_eq!(out["status"], "failed", "rank 1's log ends in torchrun's failure: {out}");
    let run = out["run"].as_str().unwrap().to_string();
    let csv = db.run(&["metrics", &run, "--key", "loss", "--format", "csv"]);
    let rows = csv_rows(&String::from_utf8_lossy(&csv.stdout));
    let want: Vec<(u64, u32, f64)> =
        (0..2u32).flat_map(|r| (1..=4u64).map(move |s| (s, r, 3.0 - s as f64 * 0.25 + r as f64))).collect();
    let mut rows_sorted = rows.clone();
    rows_sorted.sort_by_key(|r| (r.1, r.0));
    assert_eq!(rows_sorted, want, "{rows:?}");
    let show = db.json(&["show", &run, "--json"]);
    assert_eq!(show["run"]["name"], "old-run");
    assert!(show["events"].as_array().unwrap().iter().any(|e| e["kind"] == "failure" && e["rank"] == 1), "{show:#}");
    db.finish();
}
