//! End to end through a real terminal: the cockpit binary in tmux (its own socket), driven by
//! keys and read with capture-pane. Launches the default recipe on 2 ranks by `:run`, waits for
//! both ranks past step 5 and a drawn loss chart, opens help, quits; the run then finishes on
//! its own.
mod common;

use common::tmux::{self, rank_steps, Tmux};
use common::{repo, Db};
use flightdeck::client::Client;
use flightdeck::paths::DbPaths;
use flightdeck::protocol::{Reply, Request};
use std::time::Duration;

/// Everything the test waits for on screen must happen within this (a loaded 2-core box
/// builds, starts and trains far slower than a laptop; the usual wait is seconds).
const DEADLINE: Duration = Duration::from_secs(180);

fn has_chart_points(screen: &str) -> bool {
    screen.contains("loss mean") && screen.chars().any(|c| ('\u{2801}'..='\u{28ff}').contains(&c))
}

#[test]
fn cockpit_launches_a_run_by_keys_and_quitting_leaves_it_running() {
    if !tmux::installed() {
        common::skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let db = Db::new();
    let config = tempfile::tempdir().expect("tempdir");
    let shell = tmux::cockpit_shell(config.path(), db.path());
    let tmux = Tmux::start("e2e", (80, 24), &repo(), &shell, DEADLINE);
    tmux.wait_for("the Home screen", |s| s.contains("no runs yet"));

    tmux.type_text(":run recipes/tiny-gpt.toml train.steps=30 cluster.ranks_per_node=2");
    tmux.key("Enter");
    let s = tmux.wait_for("both ranks at step >= 5 and a loss chart with points", |s| {
        let steps = rank_steps(s);
        steps.len() == 2 && steps.iter().all(|&(_, step)| step >= 5) && has_chart_points(s)
    });
    assert!(s.contains("tiny-gpt"), "{s}");

    tmux.key("?");
    tmux.wait_for("help", |s| s.contains("help · keys from the keymap"));
    tmux.key("Escape");
    tmux.wait_for("help closed", |s| !s.contains("keys from the keymap"));
    tmux.key("q");
    tmux.wait_for("Home with the run", |s| s.contains("runs 1 of 1"));
    tmux.key("q");
    let s = tmux.wait_for("the cockpit's exit", |s| s.contains("COCKPIT-EXIT=0"));
    // Unless the run already ended, quitting says that it goes on and how to reach it.
    let id = db.json(&["runs", "--json"])["runs"][0]["id"].as_str().expect("the launched run").to_string();
    let live = db.json(&["show", &id, "--json"])["run"]["status"] == "running";
    // The pane is narrower than the line, so tmux wraps it: compare without any blanks.
    let squeeze = |text: &str| text.split_whitespace().collect::<String>();
    let said = squeeze(&format!("run {id} keeps training: `flightdeck attach {id}`"));
    assert!(!live || squeeze(&s).contains(&said), "{s}");
    drop(tmux);

    // Quitting the cockpit did not stop the run: follow it to its end through the server.
    let runs = db.json(&["runs", "--json"]);
    let id = runs["runs"][0]["id"].as_str().expect("the launched run").to_string();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut c = Client::connect(&DbPaths::new(db.path().to_path_buf())).await.expect("connect");
        c.send(&Request::Follow { run: id.clone() }).await.expect("follow");
        while let Some(reply) = c.next().await.expect("reply") {
            if let Reply::Ended { .. } = reply {
                break;
            }
        }
    });
    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["runs"][0]["status"], "succeeded", "{runs}");
    assert_eq!(runs["runs"][0]["steps"], 30, "{runs}");
    db.finish();
}

#[test]
fn the_cockpit_starts_a_killed_server_again_and_follows_the_run_to_its_end() {
    if !tmux::installed() {
        common::skipped(file!(), "tmux is not installed (scripts/install-deps.sh installs it)");
        return;
    }
    let db = Db::new();
    let config = tempfile::tempdir().expect("tempdir");
    let shell = tmux::cockpit_shell(config.path(), db.path());
    let tmux = Tmux::start("e2e-re", (100, 30), &repo(), &shell, DEADLINE);
    tmux.wait_for("the Home screen", |s| s.contains("no runs yet"));
    tmux.type_text(":run recipes/tiny-gpt.toml train.steps=60 cluster.ranks_per_node=2");
    tmux.key("Enter");
    tmux.wait_for("both ranks at step >= 3", |s| {
        let steps = rank_steps(s);
        steps.len() == 2 && steps.iter().all(|&(_, step)| step >= 3)
    });
    let pid: i32 = std::fs::read_to_string(db.path().join("server.lock"))
        .expect("the server's lock file")
        .trim()
        .parse()
        .expect("server pid in lock file");
    // SAFETY: signalling the server this test's cockpit started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    tmux.wait_for("the cockpit to reconnect", |s| s.contains("reconnected to the server"));
    let s = tmux.wait_for("the run's end, followed through the new server", |s| {
        s.lines().next().is_some_and(|h| h.contains("succeeded"))
    });
    assert!(s.lines().next().is_some_and(|h| h.contains("step 60/60")), "{s}");
    tmux.key("q");
    tmux.key("q");
    tmux.wait_for("the cockpit's exit", |s| s.contains("COCKPIT-EXIT=0"));
    drop(tmux);
    db.finish();
}
