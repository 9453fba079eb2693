//! Sweeps and the queue: a sweep of 4 points on a 2-rank budget runs 2 at a time and lists 4
//! succeeded runs in one sweep, though its server is killed mid-sweep (the queue continues, no
//! point lost or started twice); cancelling from the queue; bad sweeps refused.
mod common;

use common::{recipe, Db};
use serde_json::Value;
use std::time::{Duration, Instant};

/// Upper bound for a poll of the queue to see a state it must reach (not a timing assertion:
/// a machine slower than this would fail with the states it saw).
const DEADLINE: Duration = Duration::from_secs(600);

fn queue(db: &Db) -> Value {
    db.json(&["queue", "--all", "--json"])
}

/// Polls `queue --all --json` until `pred` holds for the only sweep; returns that sweep.
fn until(db: &Db, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let q = queue(db);
        let sweep = q["sweeps"][0].clone();
        if pred(&sweep) {
            return sweep;
        }
        assert!(start.elapsed() < DEADLINE, "the sweep never reached: {what}; last seen: {sweep:#}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn states(sweep: &Value) -> Vec<String> {
    sweep["points"]
        .as_array()
        .map_or(vec![], |p| p.iter().map(|p| p["state"].as_str().unwrap_or("").to_string()).collect())
}

fn server_pid(db: &Db) -> Option<i32> {
    std::fs::read_to_string(db.path().join("server.lock")).ok()?.trim().parse().ok()
}

#[test]
fn four_points_on_a_two_rank_budget_run_two_at_a_time_and_survive_a_server_kill() {
    let db = Db::new();
    let tiny = recipe("tiny-gpt.toml");
    let waiter = db.spawn(&[
        "sweep",
        tiny.to_str().expect("utf-8"),
        "--set",
        "cluster.ranks_per_node=1",
        "--set",
        "train.steps=30",
        "--set-grid",
        "train.seed=1,2,3,4",
        "--max-ranks",
        "2",
        "--name",
        "seeds",
        "--wait",
    ]);
    // Kill the server once both first points are recorded runs (none mid-launch) and two wait.
    let seen = until(&db, "two points running, two waiting", |s| {
        let st = states(s);
        st.iter().filter(|s| matches!(s.as_str(), "starting" | "running")).count() == 2
            && st.iter().filter(|s| *s == "waiting").count() == 2
    });
    assert_eq!(seen["max_ranks"], 2, "{seen:#}");
    let pid = server_pid(&db).expect("the server's pid in server.lock");
    // SAFETY: a signal to the test's own server process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    db.wait_server_exit();

    // The waiting client (and these polls) start the server again; the queue goes on.
    let out = waiter.wait_with_output().expect("sweep --wait");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("sweep seeds: 4 points: 4 succeeded"), "{stdout}");

    let sweep = until(&db, "every point succeeded", |s| states(s).iter().all(|s| s == "succeeded"));
    let points = sweep["points"].as_array().expect("points");
    assert_eq!(points.len(), 4);
    let seeds: Vec<i64> = points.iter().map(|p| p["values"]["train.seed"].as_i64().expect("seed")).collect();
    assert_eq!(seeds, [1, 2, 3, 4]);
    assert!(points.iter().all(|p| p["attempts"] == 1), "each point ran once: {sweep:#}");

    // The history has exactly one run per point, each the sweep's, each trained with its seed.
    let runs = db.json(&["runs", "--json"]);
    let runs: Vec<&Value> = runs["runs"].as_array().expect("runs").iter().collect();
    assert_eq!(runs.len(), 4, "no point lost or started twice: {runs:#?}");
    let mut by_point: Vec<(i64, u64, u64)> = runs
        .iter()
        .map(|r| {
            assert_eq!(r["sweep"]["sweep"], sweep["id"], "{r:#}");
            assert_eq!(r["status"], "succeeded");
            (
                r["sweep"]["point"].as_i64().expect("point"),
                r["created_ms"].as_u64().unwrap(),
                r["ended_ms"].as_u64().unwrap(),
            )
        })
        .collect();
    by_point.sort();
    assert_eq!(by_point.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    for (point, run) in points.iter().enumerate() {
        let show = db.json(&["show", run["run"].as_str().expect("run id"), "--json"]);
        assert_eq!(show["recipe"]["train"]["seed"], seeds[point], "point {} trained with its own seed", point + 1);
    }
    // Never more than 2 live at once (each run's start against the others' lives), and the
    // first two ran together: both were launched in the queue's first pass.
    for &(p, start, _) in &by_point {
        let live = by_point.iter().filter(|&&(_, s, e)| s <= start && start < e).count();
        assert!(live <= 2, "point {p} started with {live} runs live: {by_point:?}");
    }
    assert!(by_point[1].1 < by_point[0].2 && by_point[0].1 < by_point[1].2, "points 1 and 2 overlap: {by_point:?}");
    db.finish();
}

#[test]
fn points_are_cancelled_from_the_queue_waiting_ones_never_start_and_running_ones_are_killed() {
    let db = Db::new();
    let tiny = recipe("tiny-gpt.toml");
    let out = db.run(&[
        "sweep",
        tiny.to_str().expect("utf-8"),
        "--set",
        "cluster.ranks_per_node=1",
        "--set",
        "train.steps=1000000",
        "--set-grid",
        "train.seed=1,2,3",
        "--max-parallel",
        "1",
        "--name",
        "long",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("sweep long (") && stdout.contains("3 points queued, at most 1 at once"), "{stdout}");
    until(&db, "point 1 running", |s| states(s) == ["running", "waiting", "waiting"]);

    let out = db.run(&["queue", "--cancel", "long:3"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("sweep long: points 3 cancelled; no run killed"), "{out:?}");
    let text = String::from_utf8_lossy(&db.run(&["queue"]).stdout).to_string();
    assert!(text.contains("sweep long (") && text.contains("1 running, 1 waiting, 1 cancelled"), "{text}");

    let out = db.run(&["queue", "--cancel", "long"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("points 2 cancelled; runs ") && said.contains(" killed"), "{said}");
    let sweep = until(&db, "nothing live", |s| states(s) == ["killed", "cancelled", "cancelled"]);
    assert_eq!(sweep["points"][0]["attempts"], 1);
    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["runs"].as_array().map(Vec::len), Some(1), "cancelled points never started: {runs:#}");
    let bad = db.run(&["queue", "--cancel", "long:9"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("sweep long has 3 points; there is no point 9"), "{bad:?}");
    let none = db.run(&["queue", "--cancel", "nosuch"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("no sweep matches \"nosuch\""), "{none:?}");
    db.finish();
}

#[test]
fn bad_sweeps_are_refused_before_anything_is_queued() {
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::read_to_string(recipe("tiny-gpt.toml")).expect("tiny-gpt.toml");
    let write = |name: &str, extra: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, format!("{base}\n{extra}")).expect("write");
        p.display().to_string()
    };
    let big = write("big.toml", "[sweep.grid]\n\"train.seed\" = [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]\n\"train.lr\" = [0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0,1.1,1.2,1.3,1.4,1.5,1.6]\n");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![big.clone()], "[sweep] expands to 272 points, more than sweep.max_points = 256"),
        (
            vec![write("typo.toml", ""), "--set-grid".into(), "train.lrr=1,2".into()],
            "swept key train.lrr: unknown key train.lrr",
        ),
        (vec![write("none.toml", "")], "nothing to sweep"),
        (
            vec![write("neg.toml", "[sweep.grid]\n\"train.lr\" = [0.1, -1.0]\n")],
            "sweep point 2 of 2 (train.lr = -1.0): train.lr = -1 (swept)",
        ),
    ];
    for (args, want) in cases {
        let mut argv = vec!["sweep".to_string()];
        argv.extend(args);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = db.run(&argv);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{argv:?}: {err}");
        assert!(err.contains(want), "{argv:?}: {err}");
    }
    // `run` takes one run: it names the command for a recipe with a sweep.
    let out = db.run(&["run", &big, "--headless"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("start them with `flightdeck sweep {big}`")), "{err}");
    // A dry run prints the points and queues nothing.
    let out = db.run(&["sweep", &tiny_path(), "--set-grid", "train.seed=1,2", "--dry-run"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && stdout.contains("tiny-gpt-sweep.2") && stdout.contains("nothing queued"),
        "{stdout}"
    );
    assert!(!db.path().join("server.sock").exists(), "no server was needed");
}

fn tiny_path() -> String {
    recipe("tiny-gpt.toml").display().to_string()
}
