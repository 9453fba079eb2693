//! GRPO end to end through a real terminal: a short pretrain is made headless, then the cockpit
//! (in tmux, its own socket) launches `recipes/grpo-arith.toml` from it by `:run`; the run opens
//! on the `rl` layout by itself, and the test waits for the reward chart to have points, the
//! time split to fill and the samples panel to show completions with their rewards.
mod common;

use common::tmux::{self, rank_steps, Tmux};
use common::{recipe, repo, Db};
use std::time::Duration;

/// Everything waited for on screen must happen within this (a loaded 2-core box starts and
/// trains far slower than a laptop; the usual wait is seconds).
const DEADLINE: Duration = Duration::from_secs(240);

/// A chart panel titled `title` with braille points on the line below its title row or later:
/// the `rl` panel's charts sit side by side, so the points are looked for in the title's columns.
fn chart_has_points(screen: &str, title: &str) -> bool {
    let lines: Vec<Vec<char>> = screen.lines().map(|l| l.chars().collect()).collect();
    let Some((row, col)) = lines.iter().enumerate().find_map(|(i, l)| {
        let text: String = l.iter().collect();
        text.find(title).map(|byte| (i, text[..byte].chars().count()))
    }) else {
        return false;
    };
    // The chart's own columns: from its title's start to the next panel border or 40 columns.
    let braille = |c: &char| ('\u{2801}'..='\u{28ff}').contains(c);
    lines[row + 1..].iter().take(12).any(|l| l.iter().skip(col).take(40).any(braille))
}

#[test]
fn grpo_launched_from_the_cockpit_shows_reward_and_samples_on_the_rl_layout() {
    if !tmux::installed() {
        common::skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let db = Db::new();
    let pre = recipe("tiny-gpt.toml");
    let sets = ["train.steps=40", "checkpoint.every=20", "cluster.ranks_per_node=2"];
    let mut args = vec!["run", pre.to_str().expect("utf-8 path"), "--headless"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let out = db.run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    db.wait_server_exit();

    let config = tempfile::tempdir().expect("tempdir");
    let shell = tmux::cockpit_shell(config.path(), db.path());
    let tmux = Tmux::start("e2e-rl", (160, 48), &repo(), &shell, DEADLINE);
    tmux.wait_for("Home with the pretrain", |s| s.contains("runs 1 of 1") && s.contains("succeeded"));
    tmux.type_text(":run recipes/grpo-arith.toml init.from=tiny-gpt train.steps=40 eval.every=10 samples=2");
    // A bad key is refused with what would be valid, and the cockpit stays up.
    tmux.key("Enter");
    tmux.wait_for("the refusal of an unknown key", |s| s.contains("did you mean grpo.samples?"));
    tmux.type_text(":run recipes/grpo-arith.toml init.from=tiny-gpt train.steps=40 eval.every=10 grpo.samples=2");
    tmux.key("Enter");
    let s = tmux.wait_for("the rl layout with a reward chart, a time split and samples", |s| {
        let steps = rank_steps(s);
        steps.len() == 2
            && steps.iter().all(|&(_, step)| step >= 3)
            && chart_has_points(s, "reward")
            && s.contains("generate ")
            && s.contains(" → ")
    });
    assert!(s.contains("layout rl"), "a grpo run opens on the rl layout:\n{s}");
    assert!(s.contains("grpo-arith"), "{s}");
    for title in ["kl", "completions/mean_length", "time split", "samples"] {
        assert!(s.contains(title), "{title} missing:\n{s}");
    }
    // The newest samples carry a step no later than the ranks' and a reward.
    let newest = s.lines().find(|l| l.contains(" → ")).expect("a sample row");
    let cells: Vec<&str> = newest.trim_matches(|c| "│┃ ".contains(c)).split_whitespace().collect();
    let step: u64 = cells[0].parse().unwrap_or_else(|_| panic!("a step first: {newest}"));
    let reward: f64 = cells[1].parse().unwrap_or_else(|_| panic!("a reward second: {newest}"));
    assert!(step >= 1 && (0.0..=1.0).contains(&reward), "{newest}");

    tmux.wait_for("the run's end", |s| s.lines().next().is_some_and(|h| h.contains("succeeded")));
    tmux.key("q");
    tmux.wait_for("Home with both runs", |s| s.contains("runs 2 of 2"));
    tmux.key("q");
    tmux.wait_for("the cockpit's exit", |s| s.contains("COCKPIT-EXIT=0"));
    drop(tmux);

    let runs = db.json(&["runs", "--json"]);
    let list = runs["runs"].as_array().expect("runs");
    let grpo = list.iter().find(|r| r["name"] == "grpo-arith").expect("the grpo run");
    assert_eq!(grpo["status"], "succeeded", "{runs}");
    assert_eq!(grpo["steps"], 40, "{runs}");
    db.finish();
}
