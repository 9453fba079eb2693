//! Checkpoints end to end: graceful stop and resume bit for bit on two ranks, corrupt
//! checkpoints skipped and named, and SIGKILL at random moments of saving never leaving a torn
//! checkpoint that is listed as verified or chosen.
mod common;
use common::*;
use std::collections::BTreeMap;

/// A small model so 60 steps take about a second on two CPU ranks.
const SMALL: [&str; 8] = [
    "--set",
    "model.d_model=64",
    "--set",
    "model.context=32",
    "--set",
    "train.batch_per_rank=4",
    "--set",
    "train.steps=60",
];

fn args<'a>(head: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = head.to_vec();
    v.extend_from_slice(&SMALL);
    v.extend_from_slice(extra);
    v
}

/// (step, rank) → loss bits.
fn loss_bits(db: &Db, run: &str) -> BTreeMap<(u64, u32), u64> {
    let out = db.run(&["metrics", run, "--key", "loss", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v.to_bits())).collect()
}

fn ok(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    stdout
}

fn refused(out: &std::process::Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(2),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// The id of the run a `run`/`resume` printed (`run ID: ...`).
fn run_id(stdout: &str) -> String {
    let line = stdout.lines().find(|l| l.starts_with("run ") && l.contains(": ")).expect("a `run ID:` line");
    line[4..].split(':').next().unwrap().to_string()
}

/// Every per-rank loss of `child` at steps > `from` equals `straight`'s, by bits.
fn assert_same_tail(straight: &BTreeMap<(u64, u32), u64>, child: &BTreeMap<(u64, u32), u64>, from: u64) {
    let want: BTreeMap<_, _> = straight.iter().filter(|((s, _), _)| *s > from).map(|(k, v)| (*k, *v)).collect();
    assert_eq!(want.len() as u64, (60 - from) * 2, "straight run rows after step {from}");
    let got: BTreeMap<_, _> = child.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(got, want, "losses after step {from} differ (bits)");
}

#[test]
fn stop_then_resume_gives_the_straight_runs_losses_bit_for_bit() {
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let recipe = r.to_str().unwrap();
    let straight =
        ok(&db.run(&args(&["run", recipe, "--headless", "--name", "straight"], &["--set", "checkpoint.every=0"])));
    let straight = loss_bits(&db, &run_id(&straight));

    // The same recipe, slowed (a sleep in rank 1's backward: timing only, no arithmetic) so the
    // stop lands long before step 60, with a checkpoint every 30 steps.
    let slow = [
        "--set",
        "checkpoint.every=30",
        "--set",
        "fault.kind=slow",
        "--set",
        "fault.rank=1",
        "--set",
        "fault.slow_pct=1000",
    ];
    let mut child = db.spawn(&args(&["run", recipe, "--headless", "--name", "stopped"], &slow));
    let mut lines = stdout_lines(&mut child);
    let parent = run_id(&read_until(&mut lines, |l| l.starts_with("run ")));
    assert!(db.run(&["stop", &parent]).status.success());
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {parent} ")));
    assert!(end.contains("stopped on request after step"), "{end}");
    assert_eq!(child.wait().unwrap().code(), Some(3), "a run stopped on request exits 3");
    let ckpts = db.json(&["ckpts", &parent, "--verify", "--json"]);
    let list = ckpts["checkpoints"].as_array().unwrap();
    let stop_step = list.last().expect("the stop saved a checkpoint")["step"].as_u64().unwrap();
    assert!(list.iter().all(|c| c["verified"] == true), "{ckpts}");
    assert_eq!(ckpts["latest"], stop_step);
    // The table lists newest first, as the cockpit does (the JSON keeps oldest first).
    let table = String::from_utf8_lossy(&db.run(&["ckpts", &parent]).stdout).to_string();
    let steps: Vec<u64> =
        table.lines().skip(2).filter_map(|l| l.split_whitespace().next().and_then(|s| s.parse().ok())).collect();
    let mut newest_first: Vec<u64> = list.iter().map(|c| c["step"].as_u64().unwrap()).collect();
    newest_first.reverse();
    assert_eq!(steps, newest_first, "{table}");
    let stopped = loss_bits(&db, &parent);
    assert_eq!(stopped.len() as u64, stop_step * 2);
    assert!(stopped.iter().all(|(k, v)| straight[k] == *v), "the stopped run's own steps match the straight run");

    // Resume (the newest verified checkpoint: the stop's), without the slow fault.
    let out = ok(&db.run(&["resume", &parent, "--headless", "--set", "fault.kind=none"]));
    assert!(out.contains(&format!("from checkpoint step {stop_step} ")), "{out}");
    let first = run_id(&out);
    assert_same_tail(&straight, &loss_bits(&db, &first), stop_step);
    let show = db.json(&["show", &first, "--json"]);
    assert_eq!(show["run"]["parent"], parent.as_str());
    assert_eq!(show["run"]["resumed_from"]["step"], stop_step);
    // `runs` names each child's parent and the step it took over from.
    let runs = ok(&db.run(&["runs"]));
    assert!(runs.lines().next().is_some_and(|h| h.trim_end().ends_with("PARENT")), "{runs}");
    let row = runs.lines().find(|l| l.starts_with(&first)).expect("the child's row");
    assert!(row.trim_end().ends_with(&format!("{parent}@{stop_step}")), "{row}");

    // And from exactly step 30 (saved by whichever run passed it), to 60.
    let owner = if stop_step >= 30 { parent.clone() } else { first.clone() };
    let out = ok(&db.run(&["resume", &owner, "--step", "30", "--headless"]));
    let second = run_id(&out);
    assert_same_tail(&straight, &loss_bits(&db, &second), 30);
    assert_eq!(db.json(&["show", &second, "--json"])["run"]["parent"], owner.as_str());
    db.finish();
}

fn flip_byte(path: &std::path::Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn corrupt_checkpoints_are_never_loaded_and_resume_says_what_it_skipped() {
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let every = ["--set", "checkpoint.every=15", "--set", "checkpoint.keep=4", "--name", "parent"];
    let parent = run_id(&ok(&db.run(&args(&["run", r.to_str().unwrap(), "--headless"], &every))));
    let ckpts = db.json(&["ckpts", &parent, "--json"]);
    let steps: Vec<u64> =
        ckpts["checkpoints"].as_array().unwrap().iter().map(|c| c["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, vec![15, 30, 45, 60]);
    // The newest is the last step: nothing remains, and a resume says so instead of exiting 0.
    let err = refused(&db.run(&["resume", &parent, "--headless"]));
    assert!(err.contains("checkpoint step 60 is the run's last") && err.contains("nothing remains"), "{err}");

    let dir = std::path::PathBuf::from(ckpts["dir"].as_str().unwrap());
    flip_byte(&dir.join("step-00000060/model.bin"), 1234);
    std::fs::remove_file(dir.join("step-00000045/optim.bin")).unwrap();
    std::fs::remove_file(dir.join("step-00000030/MANIFEST.json")).unwrap();

    let verified = db.json(&["ckpts", &parent, "--verify", "--json"]);
    let by_step: BTreeMap<u64, (bool, String)> = verified["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["step"].as_u64().unwrap(), (c["verified"] == true, c["problem"].as_str().unwrap_or("").into())))
        .collect();
    assert_eq!(by_step[&15], (true, String::new()));
    assert!(!by_step[&30].0 && by_step[&30].1.contains("no MANIFEST.json"), "{by_step:?}");
    assert!(!by_step[&45].0 && by_step[&45].1 == "optim.bin is missing", "{by_step:?}");
    assert!(!by_step[&60].0 && by_step[&60].1.contains("model.bin: sha256"), "{by_step:?}");
    // A plain listing checks sizes only, which cannot see the flipped byte: the verdict of the
    // last --verify stands.
    let listed = db.json(&["ckpts", &parent, "--json"]);
    let ok_steps: Vec<u64> = listed["checkpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["verified"] == true)
        .map(|c| c["step"].as_u64().unwrap())
        .collect();
    assert_eq!(ok_steps, vec![15], "{listed}");

    for (step, why) in
        [("60", "sha256"), ("45", "optim.bin is missing"), ("30", "no MANIFEST.json"), ("7", "15, 30, 45, 60")]
    {
        let err = refused(&db.run(&["resume", &parent, "--step", step, "--headless"]));
        assert!(err.contains(why), "--step {step}: {err}");
    }

    let out = ok(&db.run(&["resume", &parent, "--headless"]));
    for (step, why) in [(60, "model.bin: sha256"), (45, "optim.bin is missing"), (30, "no MANIFEST.json")] {
        let line = format!("skipped checkpoint step {step} of run {parent}: ");
        assert!(out.lines().any(|l| l.starts_with(&line) && l.contains(why)), "step {step} not reported: {out}");
    }
    assert!(out.contains("from checkpoint step 15 "), "{out}");
    let child = run_id(&out);
    let straight = loss_bits(&db, &parent);
    assert_same_tail(&straight, &loss_bits(&db, &child), 15);
    db.finish();
}

/// What the writer child saves at `step`: every value is the step, so any mix of two saves
/// shows.
fn payload(step: u64, len: usize) -> Vec<f32> {
    vec![step as f32; len]
}

const MODEL_FLOATS: usize = 256 << 10; // 1 MiB of weights, 2 MiB of moments per save

/// The forked child: rank 0's real background writer saving back to back until killed.
fn writer_child(root: &std::path::Path) -> ! {
    use flightdeck::store::checkpoints::commit::CommitInfo;
    use flightdeck::store::checkpoints::disk;
    use flightdeck::worker::checkpoint::writer::{Job, Writer};
    let tele = flightdeck::worker::telemetry::Telemetry::disabled();
    let Ok(writer) = Writer::start(root.to_path_buf(), 2, tele.tx().clone()) else { unsafe { libc::_exit(3) } };
    for step in 1..=1000u64 {
        writer.wait_idle();
        let small = std::iter::once((disk::STATE.to_string(), format!("{{\"step\":{step}}}").into_bytes()))
            .chain([(disk::RECIPE.to_string(), b"{}".to_vec())])
            .chain((0..2).map(|r| (disk::rank_file(r), format!("{{\"rank\":{r},\"step\":{step}}}").into_bytes())))
            .collect();
        let info =
            CommitInfo { run: "kill-test".into(), step, world_size: 2, loss: 1.0, saved_ms: 1, node: "local".into() };
        let job = Job {
            info,
            model: payload(step, MODEL_FLOATS),
            optim: payload(step, 2 * MODEL_FLOATS),
            small,
            blocking_ms: 0.0,
        };
        if writer.submit(job).is_err() {
            unsafe { libc::_exit(4) }
        }
    }
    unsafe { libc::_exit(0) }
}

/// A checkpoint's files hold exactly what the writer was given for its step.
fn intact(dir: &std::path::Path, step: u64) -> bool {
    let floats = |name: &str| -> Option<Vec<f32>> {
        let b = std::fs::read(dir.join(name)).ok()?;
        Some(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    };
    floats("model.bin") == Some(payload(step, MODEL_FLOATS))
        && floats("optim.bin") == Some(payload(step, 2 * MODEL_FLOATS))
        && std::fs::read(dir.join("state.json")).ok() == Some(format!("{{\"step\":{step}}}").into_bytes())
}

#[test]
fn sigkill_at_random_moments_of_saving_never_leaves_a_torn_checkpoint_verified_or_chosen() {
    use flightdeck::store::checkpoints::{choose, disk};
    const TRIALS: u32 = 60;
    // A seed from the clock, printed, so a failure can be replayed.
    let mut seed = flightdeck::ids::unix_us() | 1;
    println!("kill trials seed {seed}");
    let mut rand_us = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let (mut torn_seen, mut verified_seen, mut chosen) = (0u32, 0u32, 0u32);
    for trial in 0..TRIALS {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ckpt");
        // SAFETY: the child only writes files (malloc is fork-safe in glibc) and never returns.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            writer_child(&root);
        }
        std::thread::sleep(std::time::Duration::from_micros(rand_us(250_000)));
        // SAFETY: signalling and reaping our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
        }
        let mut newest_ok = None;
        for (step, dir) in disk::scan(&root).unwrap() {
            match disk::verify(&dir, step, disk::Depth::Sha256) {
                Ok(_) => {
                    assert!(intact(&dir, step), "trial {trial}: step {step} verified but its files are not the save");
                    verified_seen += 1;
                    newest_ok = Some(step);
                }
                Err(_) => torn_seen += 1,
            }
        }
        if let Some(latest) = disk::latest(&root) {
            assert!(newest_ok.is_some_and(|n| n >= latest), "trial {trial}: LATEST names step {latest}, not verified");
        }
        match choose(&root, None) {
            Ok(c) => {
                assert_eq!(Some(c.step), newest_ok, "trial {trial}: resume must take the newest verified");
                assert!(intact(&c.path, c.step), "trial {trial}: resume chose a torn checkpoint");
                chosen += 1;
            }
            Err(e) => assert!(newest_ok.is_none(), "trial {trial}: {e}"),
        }
    }
    println!(
        "{TRIALS} kills: {torn_seen} torn directories seen (never verified), {verified_seen} verified, {chosen} chosen"
    );
    // The kills must really land mid-save, and saves must really complete, or this proves nothing.
    assert!(torn_seen >= TRIALS / 4, "only {torn_seen} torn directories in {TRIALS} kills");
    assert!(chosen >= TRIALS / 4, "only {chosen} trials had a verified checkpoint");
}

#[test]
fn a_resume_of_a_run_without_checkpoints_says_why_it_has_none() {
    let db = Db::new();
    let r = recipe("tiny-gpt.toml");
    let head = ["run", r.to_str().unwrap(), "--headless"];
    let early = ["--set", "train.steps=30", "--set", "checkpoint.every=100", "--name", "early"];
    let early = run_id(&ok(&db.run(&args(&head, &early))));
    let show = db.json(&["show", &early, "--json"]);
    let first = show["events"][0]["text"].as_str().unwrap_or_default().to_string();
    assert!(
        first.starts_with("launched run early (recipe tiny-gpt) on local: "),
        "the start names run and recipe: {first}"
    );
    let err = refused(&db.run(&["resume", &early, "--headless"]));
    assert!(err.contains("stopped at step 30, before its first save at step 100 (checkpoint.every = 100)"), "{err}");

    let never = ["--set", "train.steps=30", "--set", "checkpoint.every=0", "--name", "never"];
    let never = run_id(&ok(&db.run(&args(&head, &never))));
    let err = refused(&db.run(&["resume", &never, "--headless"]));
    assert!(
        err.contains("stopped at step 30 without a checkpoint: checkpoint.every = 0 saves only on a graceful stop"),
        "{err}"
    );
    db.finish();
}
