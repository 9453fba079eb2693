//! Resume end to end through a real terminal: a finished run with checkpoints is made headless,
//! then the cockpit (in tmux, its own socket) opens its Checkpoints screen; `R` on the last
//! checkpoint shows the server's refusal (nothing left to train), `R` on step 20 starts a child
//! that trains on in the Run screen and is linked to its parent in `runs --json`.
mod common;

use common::tmux::{self, rank_steps, Tmux};
use common::{recipe, repo, Db};
use std::time::Duration;

/// Everything waited for on screen must happen within this (a loaded 2-core box starts and
/// trains far slower than a laptop; the usual wait is seconds).
const DEADLINE: Duration = Duration::from_secs(180);

/// The highlighted checkpoint row's step is not readable from plain capture-pane text, so the
/// test moves by known offsets: rows are newest first and the cursor starts on the newest
/// verified checkpoint.
#[test]
fn cockpit_resumes_a_finished_run_from_a_picked_checkpoint() {
    if !tmux::installed() {
        common::skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let sets = ["train.steps=40", "checkpoint.every=10", "checkpoint.keep=4", "cluster.ranks_per_node=2"];
    let mut args = vec!["run", r.to_str().expect("utf-8 path"), "--headless", "--name", "parent"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let out = db.run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("run ") && l.contains(": ")).expect("a `run ID:` line");
    let parent = line[4..].split(':').next().expect("id").to_string();
    db.wait_server_exit();

    let config = tempfile::tempdir().expect("tempdir");
    let shell = tmux::cockpit_shell(config.path(), db.path());
    let repo = repo();
    let tmux = Tmux::start("e2e-ckpt", (100, 30), &repo, &shell, DEADLINE);
    tmux.wait_for("Home with the parent run", |s| s.contains("runs 1 of 1") && s.contains("succeeded"));

    tmux.key("C");
    let s = tmux.wait_for("four checkpoints, 40 the LATEST", |s| {
        s.contains("LATEST") && ["10 ", "20 ", "30 ", "40 "].iter().all(|st| s.contains(st)) && s.contains("yes (")
    });
    assert!(s.contains(&parent), "the header names the run: {s}");

    // The newest checkpoint is the last step: the overlay says it cannot resume and why, and
    // `y` closes it with the refusal in the status line, sending nothing.
    tmux.key("R");
    tmux.wait_for("the confirmation for step 40", |s| {
        s.contains("40 (selected)") && s.contains("remains") && s.contains("esc close")
    });
    tmux.key("y");
    tmux.wait_for("the refusal", |s| {
        s.contains("refused: checkpoint step 40 is the run's last") && !s.contains("esc close")
    });

    // Two rows down is step 20.
    tmux.key("j");
    tmux.key("j");
    tmux.key("R");
    let s = tmux.wait_for("the confirmation for step 20", |s| s.contains("20 (selected)"));
    assert!(s.contains("step-00000020") && s.contains("tiny-gpt") && s.contains("2 ranks"), "{s}");
    assert!(s.contains("steps 21–40"), "{s}");
    tmux.key("y");
    // The child's Run screen: ranks past the resume step and training on, to the end.
    let first = tmux.wait_for("the child's ranks between steps 20 and 40", |s| {
        let steps = rank_steps(s);
        s.contains("↳") && steps.len() == 2 && steps.iter().all(|&(_, st)| st > 20 && st < 40)
    });
    assert!(first.contains("resumed run"), "the status line says what started: {first}");
    tmux.wait_for("the child at step 40", |s| {
        let steps = rank_steps(s);
        steps.len() == 2 && steps.iter().all(|&(_, st)| st == 40) && s.contains("succeeded")
    });
    tmux.key("q");
    tmux.wait_for("Home with both runs", |s| s.contains("runs 2 of 2") && s.contains("↳ parent"));
    tmux.key("q");
    tmux.wait_for("the cockpit's exit", |s| s.contains("COCKPIT-EXIT=0"));
    drop(tmux);

    let runs = db.json(&["runs", "--json"]);
    let list = runs["runs"].as_array().expect("runs");
    let child = list.iter().find(|r| r["id"] != parent.as_str()).expect("the child run");
    assert_eq!(child["parent"], parent.as_str(), "{runs}");
    assert_eq!(child["resumed_from"]["step"], 20, "{runs}");
    assert_eq!(child["status"], "succeeded", "{runs}");
    db.finish();
}
