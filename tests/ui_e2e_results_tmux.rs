//! Export and report from the cockpit, through a real terminal: a finished run made headless is
//! opened in the cockpit (tmux, its own socket, its working directory a temporary one); `P`
//! writes its report and `E` then `c` its CSV export, each off the UI task, and the status line
//! names where the files are.
mod common;

use common::tmux::{self, Tmux};
use common::{recipe, Db};
use std::time::Duration;

/// Everything waited for on screen must happen within this (a loaded 2-core box is slow).
const DEADLINE: Duration = Duration::from_secs(180);

#[test]
fn p_writes_the_open_runs_report_and_e_exports_it_and_the_status_line_says_where() {
    if !tmux::installed() {
        common::skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let out = db.run(&["run", r.to_str().unwrap(), "--headless", "--set", "train.steps=20", "--name", "small"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find(|l| l.starts_with("run ") && l.contains(": ")).expect("a `run ID:` line");
    let id = line[4..].split(':').next().expect("id").to_string();
    db.wait_server_exit();

    let cwd = tempfile::tempdir().expect("tempdir");
    let config = tempfile::tempdir().expect("tempdir");
    let shell = tmux::cockpit_shell(config.path(), db.path());
    let tmux = Tmux::start("e2e-results", (160, 40), cwd.path(), &shell, DEADLINE);
    tmux.wait_for("Home with the run", |s| s.contains("runs 1 of 1") && s.contains("succeeded"));
    tmux.key("Enter");
    tmux.wait_for("the run open", |s| s.contains("small succeeded"));

    tmux.key("P");
    let s = tmux.wait_for("the report written", |s| s.contains("report.md"));
    let dir = cwd.path().join(format!("small-{id}-report"));
    assert!(s.contains(&format!("report of {id} written")), "{s}");
    let md = std::fs::read_to_string(dir.join("report.md")).expect("report.md in the cockpit's directory");
    assert!(md.starts_with(&format!("# small ({id})")), "{md}");

    tmux.key("E");
    tmux.wait_for("the format prompt", |s| s.contains("c csv · j jsonl · t tensorboard · p parquet"));
    tmux.key("c");
    let s = tmux.wait_for("the export done", |s| s.contains("exported "));
    assert!(s.contains(&format!("small-{id}-csv")), "{s}");
    let csv = std::fs::read_to_string(cwd.path().join(format!("small-{id}-csv/metrics.csv"))).expect("metrics.csv");
    // 20 steps × 2 ranks of loss among the rows.
    assert_eq!(csv.lines().filter(|l| l.contains(",loss,")).count(), 40, "{csv}");

    // A second P finds its folder taken: refused, said, nothing overwritten.
    tmux.key("P");
    tmux.wait_for("the refusal", |s| s.contains("is not empty"));
    tmux.key("q");
    tmux.key("q");
    tmux.wait_for("the cockpit's exit", |s| s.contains("COCKPIT-EXIT=0"));
    drop(tmux);
    db.finish();
}
