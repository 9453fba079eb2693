//! End to end on the embedded local runtime: real binary, real server, agent, ranks and sled.
mod common;
use common::*;
use std::collections::BTreeMap;

const TINY: &str = "tiny-gpt.toml";
/// More steps than any machine trains while a test waits: for runs the test stops or kills.
const ENDLESS: &str = "train.steps=1000000";

fn run_headless(db: &Db, extra: &[&str]) -> std::process::Output {
    let recipe = recipe(TINY);
    let mut args = vec!["run", recipe.to_str().unwrap(), "--headless"];
    args.extend_from_slice(extra);
    db.run(&args)
}

fn losses(db: &Db, run: &str) -> BTreeMap<(u64, u32), f64> {
    let out = db.run(&["metrics", run, "--key", "loss", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v)).collect()
}

fn only_run_id(db: &Db) -> String {
    let runs = db.json(&["runs", "--json"]);
    let list = runs["runs"].as_array().expect("runs array");
    assert_eq!(list.len(), 1, "{runs}");
    list[0]["id"].as_str().unwrap().to_string()
}

#[test]
fn two_ranks_train_and_every_step_lands_in_history() {
    let db = Db::new();
    let out = run_headless(&db, &["--ranks-per-node", "2", "--set", "train.steps=60"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("succeeded"), "{stdout}");

    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["version"], 1);
    let run = &runs["runs"][0];
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(run["world_size"], 2);
    assert_eq!(run["steps"], 60);
    let id = run["id"].as_str().unwrap();

    let rows = losses(&db, id);
    assert_eq!(rows.len(), 120, "a row per rank per step");
    for step in 1..=60 {
        for rank in 0..2 {
            assert!(rows.contains_key(&(step, rank)), "missing step {step} rank {rank}");
        }
    }
    // The run is addressable by unique prefix and by name, too.
    let by_name = db.json(&["show", "tiny-gpt", "--json"]);
    assert_eq!(by_name["run"]["id"], id);
    let by_prefix = db.json(&["show", &id[..12], "--json"]);
    assert_eq!(by_prefix["run"]["id"], id);
    assert_eq!(by_prefix["ranks"].as_array().unwrap().len(), 2);
    for m in ["loss", "lr", "grad_norm", "tokens", "step_time_ms", "comm_ms", "mem_rss_bytes"] {
        assert!(by_prefix["metrics"].as_array().unwrap().iter().any(|x| x == m), "metric {m} missing");
    }
    let jsonl = db.run(&["metrics", id, "--key", "grad_norm", "--rank", "1", "--format", "jsonl"]);
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&jsonl.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 60);
    assert!(lines.iter().all(|l| l["rank"] == 1 && l["key"] == "grad_norm"));
    // A metric the run never reported is bad input: exit 2, nothing on stdout, the valid ones named.
    let nokey = db.run(&["metrics", id, "--key", "nokey"]);
    let err = String::from_utf8_lossy(&nokey.stderr);
    assert_eq!(nokey.status.code(), Some(2), "{err}");
    assert!(nokey.stdout.is_empty(), "no header for a metric that does not exist");
    assert!(err.contains("no metric \"nokey\"") && err.contains("grad_norm"), "{err}");
    db.finish();
}

#[test]
fn same_seed_twice_gives_identical_losses() {
    let db = Db::new();
    for _ in 0..2 {
        let out = run_headless(&db, &["--ranks-per-node", "2", "--set", "train.steps=20"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let runs = db.json(&["runs", "--json"]);
    let ids: Vec<&str> = runs["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    let (a, b) = (losses(&db, ids[0]), losses(&db, ids[1]));
    assert_eq!(a.len(), 40);
    for (k, va) in &a {
        assert_eq!(va.to_bits(), b[k].to_bits(), "step/rank {k:?}: {va} vs {}", b[k]);
    }
    db.finish();
}

#[test]
fn world_one_and_two_with_the_same_global_batch_train_the_same() {
    let db = Db::new();
    let one = run_headless(
        &db,
        &["--name", "w1", "--ranks-per-node", "1", "--set", "train.steps=24", "--set", "train.batch_per_rank=16"],
    );
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    let two = run_headless(
        &db,
        &["--name", "w2", "--ranks-per-node", "2", "--set", "train.steps=24", "--set", "train.batch_per_rank=8"],
    );
    assert!(two.status.success(), "{}", String::from_utf8_lossy(&two.stderr));
    let w1 = losses(&db, "w1");
    let w2 = losses(&db, "w2");
    for step in 1..=24u64 {
        let single = w1[&(step, 0)];
        let mean = (w2[&(step, 0)] + w2[&(step, 1)]) / 2.0;
        let rel = ((single - mean) / single).abs();
        assert!(rel < 1e-4, "step {step}: world 1 loss {single} vs world 2 mean {mean} (rel {rel:e})");
    }
    db.finish();
}

#[test]
fn runs_json_works_while_a_run_is_in_progress() {
    let db = Db::new();
    let recipe = recipe(TINY);
    let mut child =
        db.spawn(&["run", recipe.to_str().unwrap(), "--headless", "--ranks-per-node", "2", "--set", ENDLESS]);
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 2));
    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["runs"][0]["status"], "running", "{runs}");
    let id = runs["runs"][0]["id"].as_str().unwrap().to_string();
    let out = db.run(&["kill", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let end = read_until(&mut lines, |l| l.contains(" killed: "));
    assert!(end.contains(&id), "{end}");
    assert!(!child.wait().unwrap().success(), "a killed run exits non-zero");
    assert_eq!(db.json(&["show", &id, "--json"])["run"]["status"], "killed");
    db.finish();
}

/// A server with no grace at all exits at its first idle check, so nearly every command meets
/// one that is leaving (its socket in the backlog, its database lock still held): each must
/// still get its answer. Before the retry, about one in twenty failed here.
#[test]
fn commands_meeting_a_server_as_it_exits_idle_still_get_their_answer() {
    let db = Db::new();
    std::thread::scope(|scope| {
        for client in 0..2 {
            let db = &db;
            scope.spawn(move || {
                for i in 0..25 {
                    let out = db.cmd(&["runs", "--json"]).env("FLIGHTDECK_SERVER_IDLE_MS", "0").output().unwrap();
                    assert!(
                        out.status.success(),
                        "client {client}, command {i}: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                    assert!(runs["runs"].is_array(), "{runs}");
                }
            });
        }
    });
    db.finish();
}

#[test]
fn sigkill_of_one_rank_fails_the_run_and_names_the_rank() {
    let db = Db::new();
    let recipe = recipe(TINY);
    let mut child =
        db.spawn(&["run", recipe.to_str().unwrap(), "--headless", "--ranks-per-node", "2", "--set", ENDLESS]);
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 3));
    let id = only_run_id(&db);
    let show = db.json(&["show", &id, "--json"]);
    let rank1 = show["ranks"].as_array().unwrap().iter().find(|r| r["rank"] == 1).expect("rank 1").clone();
    let pid = rank1["pid"].as_i64().expect("rank 1 pid") as i32;
    // SAFETY: signalling a process this test's run started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);

    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("failed"), "{end}");
    assert!(!child.wait().unwrap().success());
    let show = db.json(&["show", &id, "--json"]);
    assert_eq!(show["run"]["status"], "failed");
    let reason = show["run"]["reason"].as_str().unwrap();
    assert!(reason.contains("rank 1") && reason.contains("local") && reason.contains(&pid.to_string()), "{reason}");
    assert!(reason.contains("signal 9") && reason.contains("SIGKILL"), "{reason}");
    let rank1 = show["ranks"].as_array().unwrap().iter().find(|r| r["rank"] == 1).unwrap().clone();
    assert_eq!(rank1["exit"]["signal"], 9);
    db.finish();
}

#[test]
fn server_kill_9_mid_run_keeps_acknowledged_steps_and_the_run_finishes() {
    let db = Db::new();
    let recipe = recipe(TINY);
    let mut child =
        db.spawn(&["run", recipe.to_str().unwrap(), "--headless", "--ranks-per-node", "2", "--set", "train.steps=80"]);
    let mut lines = stdout_lines(&mut child);
    let line = read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 5));
    let seen = progress_step(&line).unwrap();
    let pid: i32 = std::fs::read_to_string(db.path().join("server.lock"))
        .unwrap()
        .trim()
        .parse()
        .expect("server pid in lock file");
    // SAFETY: signalling the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // The following client loses its server, starts it again and follows on to the end.
    let lost = read_until(&mut lines, |l| l.contains("lost the server"));
    assert!(lost.contains("starting it again"), "{lost}");
    read_until(&mut lines, |l| l.contains("reconnected to the server; following on"));
    let end = read_until(&mut lines, |l| l.starts_with("run ") && l.contains(" succeeded"));
    assert!(child.wait().unwrap().success(), "the follower exits with the run's outcome: {end}");

    // The new server reattached to the live agent and kept the acknowledged steps.
    let runs = db.json(&["runs", "--json"]);
    let run = &runs["runs"][0];
    let id = run["id"].as_str().unwrap().to_string();
    assert!(run["steps"].as_u64().unwrap() >= seen, "acknowledged steps survive: {run}");
    db.wait_server_exit();
    let show = db.json(&["show", &id, "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    let rows = losses(&db, &id);
    assert_eq!(rows.len(), 160, "replay from the last ack leaves no gap");
    db.finish();
}

#[test]
fn stop_terminates_every_rank_and_the_run_ends_stopped() {
    let db = Db::new();
    let recipe = recipe(TINY);
    let mut child =
        db.spawn(&["run", recipe.to_str().unwrap(), "--headless", "--ranks-per-node", "2", "--set", ENDLESS]);
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 2));
    let id = only_run_id(&db);
    let out = db.run(&["stop", &id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("stopped"), "{end}");
    assert_eq!(child.wait().unwrap().code(), Some(3), "a run stopped on request exits 3");
    let show = db.json(&["show", &id, "--json"]);
    assert_eq!(show["run"]["status"], "stopped");
    assert!(show["ranks"].as_array().unwrap().iter().all(|r| !r["exit"].is_null()), "every rank exited: {show}");
    // Stopping a run that is over is refused as bad input, not an error of the tool.
    assert_eq!(db.run(&["stop", &id]).status.code(), Some(2));
    db.finish();
}

#[test]
fn garbage_on_the_telemetry_socket_is_counted_and_the_run_goes_on() {
    use flightdeck::protocol::frame::encode;
    use flightdeck::protocol::{Hello, Role};
    use std::io::Write;
    let db = Db::new();
    let recipe = recipe(TINY);
    // Endless, then stopped: 40 steps can be over before the garbage reaches the socket.
    let mut child =
        db.spawn(&["run", recipe.to_str().unwrap(), "--headless", "--ranks-per-node", "2", "--set", ENDLESS]);
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 1));
    let id = only_run_id(&db);
    let sock = db.path().join("runs").join(&id).join("telemetry.sock");
    let hello = encode(&Hello::new(Role::Rank, "test"));
    // Connection 1: an undecodable frame, then a frame cut short by the end of the stream.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).expect("telemetry socket");
    s.write_all(&hello).unwrap();
    s.write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff]).unwrap();
    s.write_all(&[100, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(s);
    // Connection 2: a frame header claiming more than the limit.
    let mut s = std::os::unix::net::UnixStream::connect(&sock).expect("telemetry socket");
    s.write_all(&hello).unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    drop(s);

    // The run goes on past the garbage, then stops when asked.
    let sent = progress_step(&read_until(&mut lines, |l| progress_step(l).is_some())).unwrap();
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= sent + 3));
    assert!(db.run(&["stop", &id]).status.success());
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("stopped"), "{end}");
    assert_eq!(child.wait().unwrap().code(), Some(3), "a run stopped on request exits 3");
    let show = db.json(&["show", &id, "--json"]);
    let bad: Vec<&str> = show["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "bad_frame")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert!(bad.iter().any(|t| t.contains("undecodable")), "{bad:?}");
    assert!(bad.iter().any(|t| t.contains("ended inside a frame")), "{bad:?}");
    assert!(bad.iter().any(|t| t.contains("exceeds")), "{bad:?}");
    let rows = losses(&db, &id);
    let last = rows.keys().map(|(step, _)| *step).max().unwrap_or(0);
    assert!(last > sent, "steps after the garbage: {last}");
    assert_eq!(rows.len() as u64, 2 * last, "the real ranks' data is all there, every step of both ranks");
    db.finish();
}

#[test]
fn a_python_command_rank_reports_over_json_lines() {
    let db = Db::new();
    let recipe = db.path().join("python.toml");
    let script = repo().join("tests/fixtures/python_rank.py");
    let assets = repo().join("assets");
    std::fs::write(
        &recipe,
        format!(
            "name = \"py\"\nkind = \"command\"\n[command]\nargv = [\"python3\", {:?}, {:?}]\n[cluster]\nranks_per_node = 2\n",
            script.display().to_string(),
            assets.display().to_string()
        ),
    )
    .unwrap();
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let rows = losses(&db, "py");
    assert_eq!(rows.len(), 10, "5 steps × 2 ranks: {rows:?}");
    assert_eq!(rows[&(5, 1)], 3.0, "rank 1's loss at step 5 is 10/5 + 1");
    let show = db.json(&["show", "py", "--json"]);
    assert!(show["events"].as_array().unwrap().iter().all(|e| e["kind"] != "bad_frame"), "{show}");
    // A command job has no checkpoint of Flightdeck's: resume says so, not that a stop was missed.
    for args in [&["resume", "py", "--headless"][..], &["resume", "py", "--headless", "--set", "train.steps=9"]] {
        let o = db.run(args);
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && e.contains("a command job's checkpoints are its program's own"),
            "{args:?}: {e}"
        );
        assert!(!e.contains("did not get"), "{args:?}: {e}");
    }
    db.finish();
}

#[test]
fn an_unmodified_torch_distributed_program_rendezvous_on_the_master_port_it_is_given() {
    let Some(python) = venv_python() else {
        common::skipped(file!(), "the torch.distributed rank: FD_VENV is not set (run through make test)");
        return;
    };
    let db = Db::new();
    let recipe = db.path().join("ddp.toml");
    let script = repo().join("tests/fixtures/torch_ddp.py");
    command_recipe(&recipe, "ddp", &[python.to_str().unwrap(), script.to_str().unwrap()], 2);
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let id = db.json(&["runs", "--json"])["runs"][0]["id"].as_str().unwrap().to_string();
    let logs: Vec<String> = (0..2)
        .map(|r| std::fs::read_to_string(db.path().join(format!("runs/{id}/logs/rank-{r}.log"))).unwrap_or_default())
        .collect();
    assert!(out.status.success(), "{text}\nrank logs: {logs:#?}");
    for (r, log) in logs.iter().enumerate() {
        assert!(log.contains(&format!("rank {r} of 2: sum 3 via 127.0.0.1:")), "rank {r}: {log}");
    }
    db.finish();
}

/// Runs a one-rank command recipe that prints its environment (with `extra` lines added under
/// `[command]`) and returns the rank's log and its run directory.
fn env_of_a_command_rank(db: &Db, name: &str, extra: &str) -> (String, std::path::PathBuf) {
    let recipe = db.path().join(format!("{name}.toml"));
    let text = format!(
        "name = {name:?}\nkind = \"command\"\n[command]\nargv = [\"env\"]\n{extra}\n[cluster]\nranks_per_node = 1\n"
    );
    std::fs::write(&recipe, text).unwrap();
    let out = db.run(&["run", recipe.to_str().unwrap(), "--headless"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let runs = db.json(&["runs", "--json"]);
    let id = runs["runs"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = db.path().join("runs").join(&id);
    (std::fs::read_to_string(dir.join("logs/rank-0.log")).unwrap(), dir)
}

#[test]
fn a_command_rank_gets_the_flight_recorder_and_faulthandler_env_unless_the_recipe_says_otherwise() {
    let db = Db::new();
    let (env, dir) = env_of_a_command_rank(&db, "observed", "");
    let fr = format!("TORCH_FR_DUMP_TEMP_FILE={}/fr/rank_", dir.display());
    for want in [fr.as_str(), "TORCH_FR_BUFFER_SIZE=2000", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3", "PYTHONFAULTHANDLER=1"]
    {
        assert!(env.lines().any(|l| l == want), "missing {want} in:\n{env}");
    }
    let old_name = format!("TORCH_NCCL_DEBUG_INFO_TEMP_FILE={}/fr/rank_", dir.display());
    assert!(env.lines().any(|l| l == old_name), "the old name too:\n{env}");
    assert!(env.lines().any(|l| l == format!("TENSORBOARD_LOGGING_DIR={}/tb/rank0", dir.display())), "{env}");
    assert!(dir.join("fr").is_dir(), "the dump directory exists before the rank starts");
    assert!(!env.contains("NCCL_RAS_ADDR="), "a CPU recipe has no NCCL RAS port:\n{env}");

    let (env, _) = env_of_a_command_rank(&db, "overridden", "env = [\"PYTHONFAULTHANDLER=0\", \"MY_FLAG=a=b\"]");
    assert!(env.lines().any(|l| l == "PYTHONFAULTHANDLER=0"), "the recipe's value wins:\n{env}");
    assert!(env.lines().any(|l| l == "MY_FLAG=a=b"), "{env}");
    let (env, _) = env_of_a_command_rank(&db, "plain", "observe = false");
    assert!(!env.contains("TORCH_FR_") && !env.contains("PYTHONFAULTHANDLER"), "observe = false sets none:\n{env}");
    db.finish();
}

#[test]
fn everything_a_run_writes_is_owner_only_whatever_the_umask() {
    for umask in ["022", "000"] {
        let db = Db::new();
        // The database directory is made by flightdeck itself, under the user's umask.
        let root = db.path().join("db");
        let recipe = recipe(TINY);
        let line = format!(
            "umask {umask}; exec {} --db {} run {} --headless --ranks-per-node 2 --set train.steps=4 --set train.warmup=1 --set checkpoint.every=2",
            bin().display(),
            root.display(),
            recipe.display()
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &line])
            .env("FLIGHTDECK_SERVER_IDLE_MS", "300")
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The server exits soon after its last client: then every file is final.
        let lock = std::fs::OpenOptions::new().write(true).open(root.join("server.lock")).expect("server.lock");
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own; blocks until the server has exited.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the database directory under umask {umask}");
        let runs = root.join("runs");
        assert!(std::fs::read_dir(&runs).is_ok_and(|mut d| d.next().is_some()), "a run directory exists");
        let open = open_to_others(&root);
        assert!(open.is_empty(), "under umask {umask}, open to others: {open:#?}");
        // doctor says so when an existing database directory is open to others.
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let doctor = std::process::Command::new(bin()).arg("--db").arg(&root).arg("doctor").output().expect("doctor");
        let text = String::from_utf8_lossy(&doctor.stdout);
        assert!(text.contains("open to other users (mode 755)") && text.contains("chmod 700"), "{text}");
    }
}

#[test]
fn a_client_of_another_user_is_refused_even_through_a_socket_left_open() {
    let Some(other) = ThrowawayUser::make(file!()) else { return };
    let db = Db::new();
    let log = db.path().join("server-stderr.log");
    let mut server = db
        .cmd(&["server", "--foreground"])
        .env("FLIGHTDECK_SERVER_IDLE_MS", "600000")
        .stderr(std::fs::File::create(&log).unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("server");
    // Serving before any client looks (a client that found no server would start its own,
    // and this one would then exit: "a server already owns ...").
    let mut lines = stdout_lines(&mut server);
    read_until(&mut lines, |l| l == "ready");
    // Our own client gets in.
    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["runs"], serde_json::json!([]));
    // The database left open to everyone, as on a badly set up shared filesystem.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(db.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = db.path().join("server.sock");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The other user reaches the socket; the server reads its uid and closes on it at once.
    assert_eq!(other.probe_socket(&socket), "closed");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("refused a client: uid ") && said.contains("is another user"), "{said}");
    // And our own client still gets in.
    assert_eq!(db.json(&["runs", "--json"])["runs"], serde_json::json!([]));
    server.kill().unwrap();
    server.wait().unwrap();
}
