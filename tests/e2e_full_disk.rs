//! A full disk: the database on a 12 MiB tmpfs (made and removed by the test; skipped with the
//! reason where it cannot be mounted). A run whose checkpoints cannot all fit is warned at
//! launch, saves that do not fit fail with a message naming the space and leave nothing
//! partial, two failures in a row are a `checkpoint-failing` verdict that stops the run rather
//! than let it train on unprotected, and every step it trained is in the history; a run whose
//! single checkpoint cannot fit is refused.
mod common;

use common::{csv_rows, recipe, Db};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted over a directory for the test's life.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path, size: &str) -> Result<Mount, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!("mount -t tmpfs failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        Ok(Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn saves_that_do_not_fit_fail_naming_the_space_leave_nothing_partial_and_lose_no_step() {
    let db = Db::new();
    let _mount = match Mount::tmpfs(db.path(), "12m") {
        Ok(m) => m,
        Err(why) => return common::skipped(file!(), &why),
    };
    let r = recipe("tiny-gpt.toml");
    // 200 steps: far more than the stop needs to land after the second failed save, so a run that
    // reaches the end was never stopped.
    let sets = ["train.steps=200", "checkpoint.every=10", "checkpoint.keep=3"];
    let mut args = vec!["run", r.to_str().unwrap(), "--headless", "--name", "full"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let out = db.run(&args);
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let show = db.json(&["show", "full", "--json"]);
    let events = common::event_texts(&show);
    // Warned at launch: 4 saves of about 4.7 MiB do not fit in 12 MiB.
    assert!(
        events.iter().any(|e| e.starts_with("checkpoint space is short: checkpoint.keep = 3 needs about")),
        "{events:#?}\n{said}"
    );
    // The saves that did not fit say why, naming the directory and the space.
    let failed: Vec<&String> = events.iter().filter(|e| e.contains("no space for checkpoint step")).collect();
    assert!(!failed.is_empty(), "{events:#?}");
    assert!(failed.iter().all(|e| e.contains("checkpoints") && e.contains("free")), "{failed:#?}");
    // Nothing partial on disk: every step directory left is a committed checkpoint.
    let run = show["run"]["id"].as_str().expect("id").to_string();
    let root = db.path().join("runs").join(&run).join("checkpoints");
    let ckpts = db.json(&["ckpts", &run, "--json"]);
    let committed: Vec<u64> =
        ckpts["checkpoints"].as_array().expect("checkpoints").iter().filter_map(|c| c["step"].as_u64()).collect();
    assert!(!committed.is_empty(), "the first saves fit: {ckpts}");
    for entry in std::fs::read_dir(&root).expect("the checkpoint root").flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(step) = name.strip_prefix("step-").and_then(|s| s.parse::<u64>().ok()) {
            assert!(committed.contains(&step), "{name} is on disk but not a committed checkpoint ({committed:?})");
        }
    }
    // Two failed saves in a row: the verdict names them and the last good checkpoint, and the
    // server stops the run instead of training on with nothing saved.
    let verdict =
        events.iter().find(|e| e.starts_with("checkpoint-failing: ")).unwrap_or_else(|| panic!("{events:#?}"));
    let newest = committed.iter().max().copied().unwrap_or(0);
    assert!(verdict.contains("2 saves in a row failed"), "{verdict}");
    assert!(verdict.contains(&format!("the newest good checkpoint is step {newest}")), "{verdict}");
    assert!(events.iter().any(|e| e == "checkpoints are failing: stopping the run at its next step boundary"));
    let status = show["run"]["status"].as_str().unwrap_or_default().to_string();
    assert!(status == "failed" || status == "stopped", "{status}: {}", show["run"]);
    let reached = show["run"]["step"].as_u64().or_else(|| show["summary"]["steps_done"].as_u64()).unwrap_or(0);
    let loss = db.run(&["metrics", &run, "--key", "loss", "--format", "csv"]);
    let rows = csv_rows(&String::from_utf8_lossy(&loss.stdout));
    let last = rows.iter().map(|(s, _, _)| *s).max().unwrap_or(0);
    assert!(last > newest + 10 && last < 200, "stopped after the second failed save, long before the end: {last}");
    // Every step both ranks trained reached the history.
    assert_eq!(rows.len() as u64, last * 2, "steps 1..={last} × 2 ranks ({reached})");
    db.finish();
}

#[test]
fn a_run_whose_one_checkpoint_cannot_fit_is_refused_at_launch_and_leaves_nothing() {
    let db = Db::new();
    let _mount = match Mount::tmpfs(db.path(), "12m") {
        Ok(m) => m,
        Err(why) => return common::skipped(file!(), &why),
    };
    let r = recipe("tiny-gpt.toml");
    // d_model 512: about 6.4 M parameters, 76 MiB per checkpoint.
    let out = db.run(&[
        "run",
        r.to_str().unwrap(),
        "--headless",
        "--set",
        "model.d_model=512",
        "--set",
        "checkpoint.every=10",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("no room for one checkpoint") && err.contains("free"), "{err}");
    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["runs"], serde_json::json!([]), "nothing recorded");
    let left = std::fs::read_dir(db.path().join("runs")).map(|d| d.flatten().count()).unwrap_or(0);
    assert_eq!(left, 0, "no run directory left");
    db.finish();
}

/// Runs `args` until `done` says yes about its output, trying again after each answer that is
/// not it yet (each try is a whole command: the server's state is the event waited for).
fn until(db: &Db, args: &[&str], done: impl Fn(&std::process::Output) -> bool) -> std::process::Output {
    for _ in 0..600 {
        let out = db.run(args);
        if done(&out) {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!("{args:?} never gave the expected answer");
}

#[test]
fn a_database_that_fills_mid_run_tells_every_client_and_keeps_every_frame_until_there_is_room() {
    let db = Db::new();
    let _mount = match Mount::tmpfs(db.path(), "40m") {
        Ok(m) => m,
        Err(why) => return common::skipped(file!(), &why),
    };
    let r = recipe("tiny-gpt.toml");
    // No checkpoints (the disk that fills is the database's), slowed so it trains on meanwhile.
    let sets = ["train.steps=40", "checkpoint.every=0", "fault.kind=slow", "fault.rank=1", "fault.slow_pct=300"];
    let mut args = vec!["run", r.to_str().unwrap(), "--headless", "--name", "dbfull"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let mut follower = db.spawn(&args);
    let mut lines = common::stdout_lines(&mut follower);
    let first = common::read_until(&mut lines, |l| l.starts_with("run "));
    let run = first["run ".len()..].split(':').next().unwrap().to_string();
    let step = |l: &str| l.split(" step ").nth(1).and_then(|t| t.split('/').next()).and_then(|s| s.parse::<u64>().ok());
    common::read_until(&mut lines, |l| step(l).is_some_and(|s| (3..30).contains(&s)));

    // Fill the database's filesystem to the last block.
    let fill = db.path().join("fill");
    let _ = Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", fill.display())).arg("bs=1M").output();
    // The server's next write fails: every client is told what is full, and where.
    let said = until(&db, &["runs"], |o| String::from_utf8_lossy(&o.stderr).contains("no space left on device: DB"));
    let said = String::from_utf8_lossy(&said.stderr).to_string();
    assert!(said.contains(&db.path().display().to_string()) && said.contains("free"), "{said}");
    assert!(!said.contains("did not start"), "{said}");
    // The follower hears it too, and ends saying so (the run goes on without it).
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let out = follower.wait_with_output().expect("follower");
    let heard = format!("{}{}", rest.join("\n"), String::from_utf8_lossy(&out.stderr));
    assert!(heard.contains("no space left on device: DB"), "{heard}");

    // Room again: the server reopens the history by itself and takes the frames the agents kept.
    std::fs::remove_file(&fill).expect("removing the filler");
    until(&db, &["show", &run, "--json"], |o| o.status.success());
    let follow = db.run(&["attach", &run, "--headless"]);
    let text = String::from_utf8_lossy(&follow.stdout).to_string();
    assert_eq!(follow.status.code(), Some(0), "{text}\n{}", String::from_utf8_lossy(&follow.stderr));
    let loss = db.run(&["metrics", &run, "--key", "loss", "--format", "csv"]);
    let rows = csv_rows(&String::from_utf8_lossy(&loss.stdout));
    let have: std::collections::BTreeSet<(u64, u32)> = rows.iter().map(|(s, r, _)| (*s, *r)).collect();
    let missing: Vec<(u64, u32)> = (1..=40).flat_map(|s| [(s, 0), (s, 1)]).filter(|k| !have.contains(k)).collect();
    let log = std::fs::read_to_string(db.path().join("server.log")).unwrap_or_default();
    assert!(missing.is_empty(), "every step of both ranks, none lost; missing {missing:?}\n{log}");
    assert_eq!(rows.len(), 80, "no step twice");
    db.finish();
}

#[test]
fn a_server_that_cannot_open_its_full_database_says_what_is_full_and_opens_it_once_there_is_room() {
    let db = Db::new();
    let _mount = match Mount::tmpfs(db.path(), "4m") {
        Ok(m) => m,
        Err(why) => return common::skipped(file!(), &why),
    };
    common::ok(&db.run(&["runs"]));
    db.wait_server_exit();
    let fill = db.path().join("fill");
    let _ = Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", fill.display())).arg("bs=1M").output();
    let out = db.run(&["runs"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{err}");
    // Said by the server on its way out, through the pipe its client reads (its log file is on
    // the full disk): not "(no output)".
    let want = format!("did not start: no space left on device: DB {} (", db.path().display());
    assert!(err.contains(&want) && err.contains("run the command again"), "{err}");
    std::fs::remove_file(&fill).expect("removing the filler");
    common::ok(&db.run(&["runs"]));
    db.finish();
}
