//! Recovery without a human: a 2-rank run with a crash injected at step 15 and a hang at step 30
//! (each firing only in the attempt that first reaches it) and `max_restarts = 3` finishes all
//! its steps by itself, its losses equal to an uninterrupted run's bit for bit, `show --json`
//! lists the restarts with their causes and a goodput whose parts add up to the wall time; a
//! budget that runs out ends the lineage with the reason.
mod common;

use common::{csv_rows, recipe, Db};
use std::collections::BTreeMap;

const STEPS: u64 = 40;

/// tiny-gpt with checkpoints every 10 steps, 40 steps, and `extra` appended.
fn write_recipe(dir: &std::path::Path, name: &str, extra: &str) -> std::path::PathBuf {
    let base = std::fs::read_to_string(recipe("tiny-gpt.toml")).expect("tiny-gpt.toml");
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("{base}\n{extra}")).expect("write recipe");
    path
}

fn run_headless(db: &Db, path: &std::path::Path, name: &str) -> std::process::Output {
    let steps = format!("train.steps={STEPS}");
    let path = path.to_str().expect("utf-8 path");
    db.run(&["run", path, "--headless", "--name", name, "--set", &steps, "--set", "checkpoint.every=10"])
}

/// (step, rank) → loss bits of one run.
fn losses(db: &Db, run: &str) -> BTreeMap<(u64, u32), u64> {
    let out = db.run(&["metrics", run, "--key", "loss", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v.to_bits())).collect()
}

const FAULTS: &str = r#"
[[fault]]
kind = "crash"
rank = 1
step = 15

[[fault]]
kind = "hang-before-collective"
rank = 1
step = 30
"#;

#[test]
fn a_crash_and_a_hang_are_recovered_by_themselves_bit_exact_with_the_causes_and_goodput_in_show() {
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let straight = write_recipe(dir.path(), "straight", "");
    let out = run_headless(&db, &straight, "straight");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let faulty =
        write_recipe(dir.path(), "faulty", &format!("{FAULTS}\n[recovery]\nmax_restarts = 3\nbackoff_s = 0\n"));
    let out = run_headless(&db, &faulty, "recovered");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "the lineage succeeds:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("recovery restarted it after a crash as run "), "{stdout}");
    assert!(stdout.contains("recovery restarted it after a hang as run "), "{stdout}");
    assert!(stdout.contains(&format!("step {STEPS}/{STEPS}")), "{stdout}");

    let show = db.json(&["show", "recovered", "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    let attempts = show["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    let causes: Vec<&str> = attempts[1..].iter().map(|a| a["restart"]["cause"].as_str().unwrap_or("?")).collect();
    assert_eq!(causes, ["crash", "hang"]);
    assert_eq!(attempts[0]["status"], "failed", "{}", attempts[0]);
    assert_eq!(attempts[1]["status"], "killed", "recovery killed the hung attempt: {}", attempts[1]);
    // Each restart resumed from the newest checkpoint before its parent's failure.
    let from: Vec<u64> = attempts[1..].iter().map(|a| a["resumed_from"].as_u64().unwrap_or(0)).collect();
    assert_eq!(from, [10, 20]);

    let g = &show["goodput"];
    let part = |k: &str| g[k].as_f64().unwrap_or_else(|| panic!("goodput.{k}: {g}"));
    let ratio = part("ratio");
    assert!(ratio > 0.0 && ratio < 1.0, "{g}");
    let parts: f64 = ["productive_ms", "failed_ms", "checkpoint_ms", "stalled_ms", "restart_wait_ms", "other_ms"]
        .iter()
        .map(|k| part(k))
        .sum();
    assert!((parts - part("wall_ms")).abs() < 1e-6 * part("wall_ms"), "parts {parts} ≠ wall: {g}");
    assert!(part("failed_ms") > 0.0 && part("stalled_ms") > 0.0, "a crash loses steps and a hang stalls: {g}");

    // The cockpit's chart of the last attempt: the lineage's loss before it (each attempt's own
    // steps up to where its child resumed) and both resume steps marked.
    let ids: Vec<String> = attempts.iter().map(|a| a["run"].as_str().expect("run id").to_string()).collect();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let before = rt.block_on(async {
        use flightdeck::ui::effects::{Command, DataEvent};
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let mut link = flightdeck::ui::io::ServerLink::new(flightdeck::paths::DbPaths::new(db.path().into()), tx);
        let (child, parent) = (flightdeck::ids::RunId(ids[2].clone()), flightdeck::ids::RunId(ids[1].clone()));
        link.handle(Command::LoadParentLoss { child, parent, step: 20 });
        loop {
            match rx.recv().await {
                Some(DataEvent::ParentLoss { loss, .. }) => break loss,
                Some(DataEvent::Error(e)) => panic!("lineage loss: {e}"),
                Some(_) => continue,
                None => panic!("the link closed"),
            }
        }
    });
    assert_eq!(before.marks, vec![10, 20], "both resume steps");
    assert_eq!(before.points.iter().map(|p| p.0).collect::<Vec<_>>(), (1..=20).collect::<Vec<u64>>());

    // The final lineage's loss at each step is the attempt that last computed it.
    let mut lineage: BTreeMap<(u64, u32), u64> = BTreeMap::new();
    for a in attempts {
        lineage.extend(losses(&db, a["run"].as_str().expect("run id")));
    }
    let want = losses(&db, "straight");
    assert_eq!(want.len() as u64, STEPS * 2, "every step of both ranks");
    for (k, bits) in &want {
        assert_eq!(lineage.get(k), Some(bits), "step/rank {k:?} differs from the uninterrupted run");
    }
    for (s, mean) in &before.points {
        let (a, b) = (f64::from_bits(want[&(*s, 0)]), f64::from_bits(want[&(*s, 1)]));
        assert_eq!(*mean, (a + b) / 2.0, "the chart's mean loss at step {s} is the lineage's");
    }
    db.finish();
}

#[test]
fn a_spent_budget_ends_the_lineage_failed_with_the_reason() {
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    // Crash budget 1, but two crashes: the second attempt's crash (step 25) is not restarted.
    let faults =
        "[[fault]]\nkind = \"crash\"\nrank = 1\nstep = 15\n\n[[fault]]\nkind = \"crash\"\nrank = 0\nstep = 25\n";
    let path = write_recipe(
        dir.path(),
        "budget",
        &format!("{faults}\n[recovery]\nmax_restarts = 3\ncrash = 1\nbackoff_s = 0\n"),
    );
    let out = run_headless(&db, &path, "budget");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("recovery restarted it after a crash"), "{stdout}");
    let show = db.json(&["show", "budget", "--json"]);
    assert_eq!(show["run"]["status"], "failed");
    assert_eq!(show["attempts"].as_array().map(Vec::len), Some(2), "{}", show["attempts"]);
    let events = common::event_texts(&show);
    assert!(
        events.iter().any(|e| e.contains("recovery: not restarting after a crash: its 1 crash restarts are spent")),
        "{events:?}"
    );
    db.finish();
}

#[test]
fn a_failure_before_the_first_checkpoint_is_not_restarted_and_says_why() {
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let extra = "[[fault]]\nkind = \"crash\"\nrank = 1\nstep = 4\n\n[recovery]\nmax_restarts = 3\nbackoff_s = 0\n";
    let path = write_recipe(dir.path(), "early", extra);
    let out = run_headless(&db, &path, "early");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(!stdout.contains("recovery restarted it"), "nothing to resume from: {stdout}");
    let show = db.json(&["show", "early", "--json"]);
    assert_eq!(show["attempts"], serde_json::json!([]), "one run, no restarts");
    let events = common::event_texts(&show);
    let said = events.iter().find(|e| e.starts_with("recovery: not restarting after a crash: "));
    assert!(said.is_some_and(|e| e.contains("checkpoint")), "{events:?}");
    db.finish();
}

#[test]
fn a_nan_rolls_back_to_the_checkpoint_before_it_past_its_data_and_on_nan_stop_ends_the_run() {
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let straight = write_recipe(dir.path(), "straight", "");
    assert!(run_headless(&db, &straight, "straight").status.success());

    let nan = "[[fault]]\nkind = \"nan\"\nrank = 1\nstep = 15\n";
    let extra = format!("{nan}\n[recovery]\nmax_restarts = 2\nbackoff_s = 0\non_nan = \"restart\"\n");
    let path = write_recipe(dir.path(), "nan", &extra);
    let out = run_headless(&db, &path, "nan");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("recovery restarted it after a nan as run "), "{stdout}");
    let show = db.json(&["show", "nan", "--json"]);
    let attempts = show["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[1]["restart"]["cause"], "nan");
    assert_eq!(attempts[1]["resumed_from"], 10, "the checkpoint before step 15");
    let (parent, child) = (attempts[0]["run"].as_str().unwrap(), attempts[1]["run"].as_str().unwrap());
    let parent_show = db.json(&["show", parent, "--json"]);
    assert!(
        parent_show["run"]["reason"].as_str().is_some_and(|r| r.contains("not finite at step 15")),
        "{}",
        parent_show["run"]
    );
    // The child passes over steps 11–15's batches: its step 11 trains on what step 16 would
    // have, so its loss there differs from the uninterrupted run's (a plain resume is equal).
    let logs = std::fs::read_to_string(db.path().join("runs").join(child).join("logs").join("rank-0.log"))
        .expect("the child's rank-0 log");
    assert!(
        logs.contains("passes over 5 global batches of data (data.skip_batches): step 11 trains on what step 16"),
        "{logs}"
    );
    let want = losses(&db, "straight");
    let (before, after) = (losses(&db, parent), losses(&db, child));
    for s in 1..=10 {
        assert_eq!(before.get(&(s, 0)), want.get(&(s, 0)), "step {s} before the fault is the uninterrupted run's");
    }
    assert_ne!(after.get(&(11, 0)), want.get(&(11, 0)), "the child's step 11 read other data");
    assert_eq!(after.keys().filter(|(_, r)| *r == 0).max(), Some(&(STEPS, 0)), "the child trains to the end");

    // on_nan = "stop": the run fails naming the step, with no restart.
    let extra = format!("{nan}\n[recovery]\non_nan = \"stop\"\n");
    let path = write_recipe(dir.path(), "nanstop", &extra);
    let out = run_headless(&db, &path, "nanstop");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stdout));
    let show = db.json(&["show", "nanstop", "--json"]);
    assert_eq!(show["run"]["status"], "failed");
    assert!(show["run"]["reason"].as_str().is_some_and(|r| r.contains("recovery.on_nan = stop")), "{}", show["run"]);
    assert_eq!(show["run"]["steps"], 15, "it stopped at the step whose gradients were not finite");
    db.finish();
}
