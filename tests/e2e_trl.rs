//! TRL's GRPOTrainer for real under Flightdeck (`recipes/trl-grpo.toml`,
//! `assets/examples/trl_grpo.py`, TRL from the package index): 2 CPU ranks under torchrun.
//! Every rank's `Trainer.log` values (reward, per-function rewards, KL, completion lengths...)
//! land in the history exactly, at TRL's steps, once each; and the cockpit's `rl` layout charts
//! them for the run.
mod common;

use common::tmux::{self, Tmux};
use common::{command_recipe_with, rank_series, recipe, repo, skipped, venv_python, Db};
use std::path::PathBuf;
use std::time::Duration;

/// What TRL logs that the `rl` layout charts (`src/ui/panels/rl.rs` `NAMES`), for reward
/// functions `correct` and `short`.
const TRL_KEYS: [&str; 9] = [
    "reward",
    "kl",
    "completions/mean_length",
    "rewards/correct/mean",
    "rewards/short/mean",
    "reward_std",
    "entropy",
    "clip_ratio/region_mean",
    "completions/clipped_ratio",
];

/// The venv's python when it has TRL, else `None` with the reason reported as a skip.
fn trl_python() -> Option<PathBuf> {
    let Some(python) = venv_python() else {
        skipped(file!(), "FD_VENV is not set (make test sets it)");
        return None;
    };
    let has = std::process::Command::new(&python).args(["-c", "import trl"]).output();
    if !has.is_ok_and(|o| o.status.success()) {
        skipped(file!(), "trl is not importable in FD_VENV (make python-deps installs it)");
        return None;
    }
    Some(python)
}

fn script() -> String {
    repo().join("assets/examples/trl_grpo.py").display().to_string()
}

/// The shipped recipe, its argv pointed at the venv's python: each rank's history holds TRL's
/// logged values exactly (full precision: the shim's `Trainer.log` report, not rank 0's printed
/// 4-digit copy), at TRL's global steps, one point per step.
#[test]
fn trl_grpo_on_two_ranks_has_each_ranks_reward_kl_and_completion_length_in_history() {
    let Some(python) = trl_python() else { return };
    let db = Db::new();
    let steps = 6;
    let history = db.path().join("history-{rank}.json");
    let argv = serde_json::json!([
        python.display().to_string(),
        script(),
        "--steps",
        steps.to_string(),
        "--history",
        history.display().to_string()
    ]);
    let set = format!("command.argv={argv}");
    let shipped = recipe("trl-grpo.toml");
    let out = db.run(&["run", shipped.to_str().expect("utf-8 path"), "--headless", "--set", &set]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}{}", common::run_logs(&db));
    for rank in 0..2u32 {
        let path = db.path().join(format!("history-{rank}.json"));
        let logged: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("the rank's log_history")).expect("JSON");
        let logs: Vec<&serde_json::Value> =
            logged.as_array().expect("a list").iter().filter(|e| e.get("reward").is_some()).collect();
        assert_eq!(logs.len(), steps, "a log per step: {logged}");
        for key in TRL_KEYS {
            let want: Vec<(u64, f64)> = logs
                .iter()
                .map(|e| (e["step"].as_u64().expect("a step"), e[key].as_f64().unwrap_or_else(|| panic!("{key}: {e}"))))
                .collect();
            assert_eq!(want.iter().map(|p| p.0).collect::<Vec<_>>(), (1..=steps as u64).collect::<Vec<_>>());
            assert_eq!(rank_series(&db, "trl-grpo", key, rank), want, "{key} of rank {rank}");
        }
        // The step time TRL logs (s) is the standard series too, in ms.
        assert_eq!(rank_series(&db, "trl-grpo", "step_time_ms", rank).len(), steps, "rank {rank}");
    }
    db.finish();
}

/// A chart titled `title` (its title row starts with it, after the border) with braille points
/// in its own columns on the rows below the title.
fn chart_has_points(screen: &str, title: &str, width: usize, height: usize) -> bool {
    let lines: Vec<Vec<char>> = screen.lines().map(|l| l.chars().collect()).collect();
    let braille = |c: &char| ('\u{2801}'..='\u{28ff}').contains(c);
    lines.iter().enumerate().any(|(row, l)| {
        let text: String = l.iter().collect();
        let Some(byte) = text.find(&format!("┏ {title} ")).or_else(|| text.find(&format!("┌ {title} "))) else {
            return false;
        };
        let col = text[..byte].chars().count();
        lines[row + 1..].iter().take(height).any(|l| l.iter().skip(col + 1).take(width).any(braille))
    })
}

/// The cockpit (in tmux) with the `rl` layout pinned launches a TRL job by `:run`: the panel
/// charts its reward, KL and completion length, and its per-function rewards, from the ranks'
/// own `Trainer.log` values.
#[test]
fn the_rl_layout_charts_a_trl_runs_reward_kl_and_completion_length() {
    if !tmux::installed() {
        skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let Some(python) = trl_python() else { return };
    let db = Db::new();
    let job = db.path().join("trl.toml");
    let py = python.display().to_string();
    let command = "launcher = \"torchrun\"\nlog_format = \"hf\"\n";
    command_recipe_with(&job, "trl-grpo", &[&py, &script(), "--steps", "30"], 2, command);

    let config = tempfile::tempdir().expect("tempdir");
    let shell = tmux::cockpit_shell(config.path(), db.path());
    // Everything waited for must happen within this (a loaded 2-core box starts torchrun, imports
    // TRL and trains far slower than a laptop; the usual wait is seconds).
    let tmux = Tmux::start("e2e-trl", (160, 48), &repo(), &shell, Duration::from_secs(300));
    tmux.wait_for("the Home screen", |s| s.contains("no runs yet"));
    tmux.type_text(":layout rl");
    tmux.key("Enter");
    tmux.wait_for("the rl layout pinned", |s| s.contains("layout rl pinned"));
    tmux.type_text(&format!(":run {}", job.display()));
    tmux.key("Enter");
    // The rl panel at 160×48 is three columns of 32 by three rows of 6 or 7: nine charts.
    let charted = ["reward", "kl", "completions/mean_length", "rewards/correct/mean", "rewards/short/mean"];
    let s = tmux.wait_for("the rl charts of the TRL run with points", |s| {
        s.contains("layout rl") && charted.iter().all(|t| chart_has_points(s, t, 30, 4))
    });
    for title in ["reward_std", "entropy", "clip_ratio/region_mean", "completions/clipped_ratio"] {
        assert!(s.contains(title), "{title} missing:\n{s}");
    }
    assert!(!s.contains("eval/exact_match"), "TRL logs no exact match; its chart is not kept waiting:\n{s}");

    tmux.wait_for("the run's end", |s| s.lines().next().is_some_and(|h| h.contains("succeeded")));
    tmux.key("q");
    tmux.wait_for("Home with the run", |s| s.contains("runs 1 of 1"));
    tmux.key("q");
    tmux.wait_for("the cockpit's exit", |s| s.contains("COCKPIT-EXIT=0"));
    drop(tmux);
    let runs = db.json(&["runs", "--json"]);
    let run = runs["runs"].as_array().expect("runs").iter().find(|r| r["name"] == "trl-grpo").cloned();
    assert_eq!(run.map(|r| r["status"].clone()), Some(serde_json::json!("succeeded")), "{runs}");
    db.finish();
}
