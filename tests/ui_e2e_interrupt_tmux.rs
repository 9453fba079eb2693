//! Interrupting a headless `run` in a real terminal (tmux): the first Ctrl-C stops the run
//! gracefully and the follower waits for it (exit 3); a second detaches (exit 130) and the run
//! still stops; SIGTERM, as `timeout` sends it, stops the run like Ctrl-C (issue 56, item 1).
mod common;

use common::tmux::{self, Tmux};
use common::{progress_step, recipe, Db};
use std::time::Duration;

/// Everything the test waits for on screen must happen within this (a loaded 2-core box
/// builds, starts and trains far slower than a laptop; the usual wait is seconds).
const DEADLINE: Duration = Duration::from_secs(180);

/// A headless run of tiny-gpt that would train for hours, its exit code shown when it ends
/// (then the shell ignores Ctrl-C, so a late one leaves the screen as it was).
fn headless_shell(db: &Db) -> String {
    headless_shell_with(db, "")
}

fn headless_shell_with(db: &Db, sets: &str) -> String {
    format!(
        "{} --db {} run {} --headless --set train.steps=1000000 --set checkpoint.every=0 --ranks-per-node 2{sets}; \
         echo RUN-EXIT=$?; trap '' INT; sleep 600",
        common::bin().display(),
        db.path().display(),
        recipe("tiny-gpt.toml").display()
    )
}

/// Waits until the follower has printed a progress line past step 2: the run trains.
fn training(t: &Tmux) -> String {
    t.wait_for("a progress line past step 2", |s| s.lines().any(|l| progress_step(l).is_some_and(|n| n > 2)))
}

fn run_id(screen: &str) -> String {
    let line = screen.lines().find(|l| l.starts_with("run ")).expect("the run's first line");
    line.split_whitespace().nth(1).expect("its id").trim_end_matches(':').to_string()
}

/// Reads `show --json`'s status until the run has ended (the status changing is the event).
fn ended_status(db: &Db, id: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let status = db.json(&["show", id, "--json"])["run"]["status"].as_str().unwrap_or("").to_string();
        if !matches!(status.as_str(), "starting" | "running" | "hung") {
            return status;
        }
        assert!(start.elapsed() < DEADLINE, "run {id} still {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn ctrl_c_stops_a_headless_run_gracefully_and_a_second_ctrl_c_detaches() {
    if !tmux::installed() {
        common::skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    // One Ctrl-C: a graceful stop, followed to its end.
    let db = Db::new();
    let t = Tmux::start("int1", (160, 100), db.path(), &headless_shell(&db), DEADLINE);
    let id = run_id(&training(&t));
    t.key("C-c");
    let s = t.wait_for("the follower's exit", |s| s.contains("RUN-EXIT="));
    assert!(s.contains(&format!("run {id}: Ctrl-C: stopping the run gracefully")), "{s}");
    assert!(s.contains("RUN-EXIT=3"), "a stopped run exits 3:\n{s}");
    assert!(s.contains(&format!("run {id} stopped")), "{s}");
    drop(t);
    assert_eq!(ended_status(&db, &id), "stopped");
    let ckpts = db.json(&["ckpts", &id, "--json"]);
    assert!(!ckpts["checkpoints"].as_array().expect("checkpoints").is_empty(), "the stop saved one: {ckpts}");
    db.finish();

    // Two: the second detaches, and the run still stops by itself. The second Ctrl-C must
    // reach the follower while the stop is under way: rank 1's steps are made slow (a stop
    // waits for the step to end), and a try whose stop ended first (exit 3) is made again.
    let slow = " --set fault.kind=slow --set fault.rank=1 --set fault.step=1 --set fault.slow_pct=3000";
    for attempt in 1..=5 {
        let db = Db::new();
        let t =
            Tmux::start(&format!("int2-{attempt}"), (160, 100), db.path(), &headless_shell_with(&db, slow), DEADLINE);
        let id = run_id(&training(&t));
        t.key("C-c");
        t.wait_for("the stop's notice", |s| s.contains("stopping the run gracefully"));
        t.key("C-c");
        let s = t.wait_for("the follower's exit", |s| s.contains("RUN-EXIT="));
        drop(t);
        if s.contains("RUN-EXIT=3") && attempt < 5 {
            eprintln!("try {attempt}: the stop ended before the second Ctrl-C; again");
            db.finish();
            continue;
        }
        assert!(s.contains(&format!("run {id}: detached (Ctrl-C again)")), "{s}");
        assert!(s.contains("RUN-EXIT=130"), "{s}");
        assert_eq!(ended_status(&db, &id), "stopped");
        db.finish();
        break;
    }
}

#[test]
fn sigterm_stops_a_headless_run_gracefully() {
    let db = Db::new();
    let mut child = db.spawn(&[
        "run",
        recipe("tiny-gpt.toml").to_str().expect("utf-8"),
        "--headless",
        "--set",
        "train.steps=1000000",
        "--set",
        "checkpoint.every=0",
        "--ranks-per-node",
        "2",
    ]);
    let mut lines = common::stdout_lines(&mut child);
    let first = common::read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.split_whitespace().nth(1).expect("id").trim_end_matches(':').to_string();
    common::read_until(&mut lines, |l| progress_step(l).is_some_and(|n| n > 2));
    // SAFETY: a signal to our own child, alive (its output is still being read).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let notice = common::read_until(&mut lines, |l| l.contains("SIGTERM: stopping the run gracefully"));
    assert!(notice.starts_with(&format!("run {id}:")), "{notice}");
    let _rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(3), "a stopped run exits 3");
    assert_eq!(ended_status(&db, &id), "stopped");
    db.finish();
}
