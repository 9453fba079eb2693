//! A hang through a real terminal: a 3-rank run with rank 1 stalled inside its all-reduce runs
//! headless; the cockpit (in tmux) attached to it must show the verdict banner naming rank 1,
//! highlight rank 1's row, dump every rank's stacks on `S` with rank 1 the odd one out, and
//! kill the run on `K` + `y`, after which no process of the run's database remains.
mod common;

use common::tmux::{self, Tmux};
use common::{bin, recipe, repo, stdout_lines, Db};
use std::time::Duration;

/// Starting, reaching the fault and the analysis' threshold take seconds; a loaded 2-core box
/// takes far longer than a laptop.
const DEADLINE: Duration = Duration::from_secs(240);

fn stack_tool() -> bool {
    ["eu-stack", "gdb"].iter().any(|t| std::process::Command::new(t).arg("--version").output().is_ok())
}

#[test]
fn cockpit_shows_the_hang_names_the_stalled_rank_dumps_stacks_and_kills() {
    if !tmux::installed() {
        common::skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let mut args = vec!["run", r.to_str().expect("utf-8 path"), "--headless", "--ranks-per-node", "3"];
    // The e2e_hang suite's small tiny-gpt and its working fault settings.
    for s in [
        "train.steps=400",
        "model.d_model=64",
        "model.context=32",
        "train.batch_per_rank=4",
        "fault.kind=hang-in-collective",
        "fault.rank=1",
        "fault.step=4",
    ] {
        args.extend(["--set", s]);
    }
    let mut child = db.spawn(&args);
    let mut lines = stdout_lines(&mut child);
    let first = common::read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.trim_start_matches("run ").split(':').next().expect("run id").to_string();
    // Keep reading the headless run's output so its pipe never fills; hand back its last line.
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).last());

    let config = tempfile::tempdir().expect("tempdir");
    let shell = format!(
        "env FLIGHTDECK_CONFIG={} FLIGHTDECK_SERVER_IDLE_MS=300 {} --db {} attach {id}; echo COCKPIT-EXIT=$?; sleep 600",
        config.path().display(),
        bin().display(),
        db.path().display()
    );
    let tmux = Tmux::start("hang", (160, 48), &repo(), &shell, DEADLINE);

    // The banner: first "all 3 ranks", then (with a stack tool) rank 1 singled out by its stack.
    let tools = stack_tool();
    let s = tmux.wait_for("the stuck-in-collective banner", |s| {
        let banner = s.lines().nth(1).unwrap_or("");
        banner.contains("HANG stuck-in-collective") && (!tools || banner.contains("rank 1 (local, pid"))
    });
    let banner = s.lines().nth(1).expect("banner line");
    assert!(banner.contains("all_reduce #"), "the collective is named: {banner}");
    if tools {
        // Rank 1's row: marked, red and reversed; the ranks waiting for it marked too.
        assert!(s.contains("│1!"), "{s}");
        assert!(s.contains("│0…") && s.contains("│2…"), "{s}");
        let sgr = tmux::sgr_at(&tmux.screen_escaped(), "1!").expect("rank 1's row");
        // tmux writes red as `31` or as palette colour 1 (`38;5;1`).
        let red = sgr.iter().any(|p| p == "31" || p == "91") || sgr.windows(3).any(|w| w == ["38", "5", "1"]);
        assert!(sgr.iter().any(|p| p == "7") && red, "reverse + red: {sgr:?}");
        tmux.key("S");
        tmux.wait_for("dumping", |s| s.contains("dumping stacks of all ranks") || s.contains("group(s) of"));
        let s = tmux.wait_for("grouped stacks", |s| s.contains("group(s) of 3 rank(s)") || s.contains("no stacks of"));
        assert!(s.contains("── ranks 0,2") && s.contains("── rank 1") && s.contains("odd one out"), "{s}");
        tmux.key("Escape");
        tmux.wait_for("the viewer closed", |s| !s.contains("odd one out"));
    } else {
        common::skipped(file!(), "the stacks: neither eu-stack nor gdb is installed (scripts/install-deps.sh)");
    }

    tmux.key("K");
    tmux.wait_for("the kill question", |s| s.contains("Every rank gets SIGKILL"));
    tmux.key("y");
    tmux.wait_for("the run killed", |s| s.lines().next().is_some_and(|l| l.contains(" killed ")));
    tmux.key("q");
    tmux.wait_for("Home", |s| s.contains("runs 1 of 1"));
    tmux.key("q");
    tmux.wait_for("the cockpit's exit", |s| s.contains("COCKPIT-EXIT=0"));
    drop(tmux);

    let last = drain.join().expect("drain thread").unwrap_or_default();
    assert!(last.contains("killed"), "the headless run ends killed: {last}");
    assert!(!child.wait().expect("headless run").success());
    db.finish();
}
