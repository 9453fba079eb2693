//! Fault injection through the real binary: every hang class gets the right verdict and culprit,
//! a slow rank is a straggler, a clean run gets nothing, stacks come back grouped, and a kill
//! leaves no process behind. Each case prints its detection latency (injected moment → verdict).
mod common;
use common::*;
use serde_json::Value;
use std::process::Child;

type Lines = Box<dyn Iterator<Item = std::io::Result<String>>>;

/// More steps than any machine trains while a test waits: runs the test stops or kills itself.
const ENDLESS: u64 = 1_000_000;

/// Launches tiny-gpt headless on `world` local ranks; returns the child, its stdout and the run id.
fn launch(db: &Db, world: u32, steps: u64, sets: &[&str]) -> (Child, Lines, String) {
    let recipe = recipe("tiny-gpt.toml");
    let (world, steps) = (world.to_string(), format!("train.steps={steps}"));
    let mut args = vec!["run", recipe.to_str().unwrap(), "--headless", "--ranks-per-node", &world, "--set", &steps];
    // A smaller tiny-gpt: the suite's time goes into waiting for verdicts, not into training.
    args.extend(["--set", "model.d_model=64", "--set", "model.context=32", "--set", "train.batch_per_rank=4"]);
    for s in sets {
        args.extend(["--set", s]);
    }
    let mut child = db.spawn(&args);
    let mut lines: Lines = Box::new(stdout_lines(&mut child));
    let first = read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.trim_start_matches("run ").split(':').next().unwrap().to_string();
    (child, lines, id)
}

fn fault(kind: &str, step: u64) -> Vec<String> {
    vec![format!("fault.kind={kind}"), "fault.rank=1".into(), format!("fault.step={step}")]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn show(db: &Db, id: &str) -> Value {
    db.json(&["show", id, "--json"])
}

/// When the faulty rank says it fired (its log line ends `at unix ms N`).
fn injected_ms(db: &Db, id: &str, rank: u32) -> u64 {
    let log = db.path().join("runs").join(id).join("logs").join(format!("rank-{rank}.log"));
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let line = text.lines().find(|l| l.contains("fault injection")).expect("the fault fired");
    line.rsplit("unix ms ").next().and_then(|n| n.trim().parse().ok()).expect("a unix ms stamp")
}

fn latency(class: &str, verdict: &Value, injected: u64) -> u64 {
    let detected = verdict["detected_ms"].as_u64().unwrap();
    let ms = detected.saturating_sub(injected);
    println!("detection latency [{class}]: {ms} ms from the injected fault to the verdict: {}", verdict["summary"]);
    ms
}

fn rank_pid(show: &Value, rank: u64) -> u64 {
    let r = show["ranks"].as_array().unwrap().iter().find(|r| r["rank"] == rank).expect("rank in show");
    r["pid"].as_u64().expect("pid")
}

/// The verdicts of one kind (a busy machine may add a straggler to any run; the hang cases
/// check their own class).
fn of_kind(show: &Value, kind: &str) -> Vec<Value> {
    show["verdicts"].as_array().unwrap().iter().filter(|v| v["kind"] == kind).cloned().collect()
}

fn culprit_ranks(v: &Value) -> Vec<u64> {
    v["culprits"].as_array().unwrap().iter().map(|c| c["rank"].as_u64().unwrap()).collect()
}

/// Kills the run and checks that it ends killed and nothing of it survives.
fn kill_and_finish(db: &Db, child: Child, lines: Lines, id: &str) {
    kill(db, child, lines, id);
    db.finish();
}

/// Kills the run; returns the line its follower ended with.
fn kill(db: &Db, mut child: Child, mut lines: Lines, id: &str) -> String {
    let out = db.run(&["kill", id]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("killed"), "{end}");
    assert_eq!(child.wait().unwrap().code(), Some(1), "a killed run exits 1");
    end
}

fn stack_tool() -> bool {
    ["eu-stack", "gdb"].iter().any(|t| std::process::Command::new(t).arg("--version").output().is_ok())
}

#[test]
fn a_rank_hung_before_its_collective_is_named_and_kill_leaves_nothing() {
    let db = Db::new();
    let (child, mut lines, id) = launch(&db, 2, ENDLESS, &strs(&fault("hang-before-collective", 5)));
    let line = read_until(&mut lines, |l| l.starts_with(&format!("{id} verdict ")));
    assert!(line.contains("verdict never-entered"), "{line}");
    let s = show(&db, &id);
    assert_eq!(s["run"]["status"], "hung", "a live hang verdict makes the run hung: {}", s["run"]);
    let v = &of_kind(&s, "never-entered")[0];
    assert_eq!(culprit_ranks(v), [1]);
    let c = &v["culprits"][0];
    assert_eq!((c["host"].as_str(), c["phase"].as_str()), (Some("local"), Some("data")), "{c}");
    assert_eq!(c["pid"].as_u64(), Some(rank_pid(&s, 1)));
    let coll = &v["collective"];
    assert_eq!((coll["op"].as_str(), coll["step"].as_u64()), (Some("all_reduce"), Some(5)), "{coll}");
    assert_eq!(coll["seq"].as_u64(), c["last_seq"].as_u64().map(|s| s + 1), "the one collective it missed");
    assert!(coll["bytes"].as_u64().unwrap() > 0);
    assert_eq!(v["waiting"], serde_json::json!([0]));
    let ms = latency("never-entered", v, injected_ms(&db, &id, 1));
    assert!(ms >= 5000, "not before the 5 s floor: {ms}");

    // The incident report is in the run directory, and `show` points to it.
    let report = v["report_path"].as_str().expect("a report path");
    let md = std::fs::read_to_string(report).expect("the report file");
    for part in ["# Incident: never-entered", "## Timeline", "## Last collectives per rank", "## Stacks"] {
        assert!(md.contains(part), "{part} missing from {report}");
    }
    // Its picture: each rank's collectives before the verdict, the culprit named and red.
    if std::path::Path::new("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf").exists() {
        assert!(md.contains("## Progress") && md.contains("the culprit (rank 1) in red"), "{md}");
        let png = md.split("](").nth(1).and_then(|r| r.split(')').next()).expect("the picture's link");
        let dir = std::path::Path::new(report).parent().expect("the run directory");
        let bytes = std::fs::read(dir.join(png)).expect("the PNG beside the report");
        assert!(bytes.len() > 10_000 && &bytes[1..4] == b"PNG", "{png}: {} bytes", bytes.len());
        let svg = std::fs::read_to_string(dir.join(png).with_extension("svg")).expect("the SVG beside it");
        assert!(svg.contains("rank 1 (culprit)") && svg.contains("rank 0"), "the legend names the culprit");
    } else {
        common::skipped(file!(), "no DejaVu font (fonts-dejavu-core): the incident picture is not checked");
    }
    let text = String::from_utf8_lossy(&db.run(&["show", &id]).stdout).to_string();
    assert!(text.contains(&format!("incident report: {report}")), "{text}");
    assert!(text.contains("status hung") || text.contains("hung"), "{text}");
    // Killed while hung: the final status is killed, and the reason says it was hung.
    let end = kill(&db, child, lines, &id);
    assert!(end.ends_with(", while hung"), "{end}");
    assert!(show(&db, &id)["run"]["reason"].as_str().unwrap().ends_with(", while hung"));

    // `report --incident` writes the stored report again with its picture drawn from the
    // history's flight records: elsewhere, or over the originals in the run directory.
    let again = tempfile::tempdir().expect("tempdir");
    let said = common::ok(&db.run(&["report", &id, "--incident", "--out", again.path().to_str().unwrap()]));
    let name = std::path::Path::new(report).file_name().expect("a file name");
    assert_eq!(said.trim(), format!("incident report written: {}", again.path().join(name).display()));
    let md = std::fs::read_to_string(again.path().join(name)).expect("the report rewritten");
    assert!(md.starts_with("# Incident: never-entered") && md.contains("## Stacks"), "{md}");
    if common::charts::have_font() {
        assert!(md.contains("the culprit (rank 1) in red"), "{md}");
        let files = common::charts::links(&md);
        let svg = again.path().join(&files[0]).with_extension("svg");
        let svg = std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("{}: {e}", svg.display()));
        assert!(svg.contains("rank 1 (culprit)") && svg.contains("rank 0"), "the legend names the culprit");
        let img = image::open(again.path().join(&files[0])).expect("the PNG").to_rgb8();
        // The culprit's line is drawn red (plotters' RED) from the stored records.
        assert!(img.pixels().filter(|p| p.0 == [255, 0, 0]).count() > 100, "no red culprit line");
    }
    let said = common::ok(&db.run(&["report", &id, "--incident"]));
    assert_eq!(said.trim(), format!("incident report written: {report}"), "in place, beside the original");
    db.finish();
}

#[test]
fn a_rank_stalled_inside_the_ring_is_stuck_and_its_stack_singles_it_out() {
    let db = Db::new();
    let (child, mut lines, id) = launch(&db, 3, ENDLESS, &strs(&fault("hang-in-collective", 4)));
    let line = read_until(&mut lines, |l| l.starts_with(&format!("{id} verdict ")));
    assert!(line.contains("verdict stuck-in-collective"), "{line}");
    let v = of_kind(&show(&db, &id), "stuck-in-collective")[0].clone();
    latency("stuck-in-collective", &v, injected_ms(&db, &id, 1));
    if !stack_tool() {
        assert!(line.contains("all 3 ranks entered"), "{line}");
        common::skipped(file!(), "naming the culprit: neither eu-stack nor gdb is installed (scripts/install-deps.sh)");
        return kill_and_finish(&db, child, lines, &id);
    }
    // Followers see the state at most once a second: the stacks may have sharpened it already.
    let sharper = match line.contains("all 3 ranks entered") {
        true => read_until(&mut lines, |l| l.starts_with(&format!("{id} verdict "))),
        false => line,
    };
    assert!(sharper.contains("rank 1 (local, pid") && sharper.contains("stopped inside all_reduce"), "{sharper}");
    let s = show(&db, &id);
    let v = &of_kind(&s, "stuck-in-collective")[0];
    assert_eq!(culprit_ranks(v), [1], "{v}");
    assert_eq!(v["waiting"], serde_json::json!([0, 2]));
    let events = s["events"].as_array().unwrap();
    let named = events.iter().find(|e| e["text"].as_str().is_some_and(|t| t.contains("(from the stacks)")));
    let named = named.expect("an event for the sharpened verdict")["t_ms"].as_u64().unwrap();
    let ms = named.saturating_sub(injected_ms(&db, &id, 1));
    println!("detection latency [stuck-in-collective, culprit named by its stack]: {ms} ms from the injected fault");
    kill_and_finish(&db, child, lines, &id);
}

fn flightdeck_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

#[test]
fn a_crashed_rank_is_dead_and_names_its_pid() {
    let db = Db::new();
    let (mut child, mut lines, id) = launch(&db, 2, 400, &strs(&fault("crash", 5)));
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("failed"), "{end}");
    assert!(!child.wait().unwrap().success());
    let s = show(&db, &id);
    let hangs: Vec<Value> =
        s["verdicts"].as_array().unwrap().iter().filter(|v| v["kind"] != "straggler").cloned().collect();
    assert_eq!(hangs.len(), 1, "one death, not one per rank the agent then stopped: {hangs:#?}");
    let v = &hangs[0];
    assert_eq!((v["kind"].as_str(), culprit_ranks(v)), (Some("dead"), vec![1]), "{v}");
    assert_eq!(v["culprits"][0]["pid"].as_u64(), Some(rank_pid(&s, 1)));
    assert!(v["summary"].as_str().unwrap().contains("signal 9 (SIGKILL)"), "{v}");
    latency("dead (rank exited)", v, injected_ms(&db, &id, 1));
    db.finish();
}

#[test]
fn a_size_mismatch_at_one_seq_is_named_and_is_not_called_a_death() {
    let db = Db::new();
    let (mut child, mut lines, id) = launch(&db, 3, 400, &strs(&fault("mismatch", 4)));
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("failed"), "{end}");
    assert!(!child.wait().unwrap().success());
    let s = show(&db, &id);
    let hangs: Vec<Value> =
        s["verdicts"].as_array().unwrap().iter().filter(|v| v["kind"] != "straggler").cloned().collect();
    assert_eq!(hangs.len(), 1, "the ring errors that follow are not deaths: {hangs:#?}");
    let v = &hangs[0];
    assert_eq!((v["kind"].as_str(), culprit_ranks(v)), (Some("mismatch"), vec![1]), "{v}");
    let summary = v["summary"].as_str().unwrap();
    assert!(summary.contains(&format!("mismatch at collective #{}", v["collective"]["seq"])), "{summary}");
    assert_eq!(v["waiting"], serde_json::json!([0, 2]));
    latency("mismatch", v, injected_ms(&db, &id, 1));
    db.finish();
}

#[test]
fn a_slow_rank_is_a_straggler_and_the_run_still_succeeds() {
    let db = Db::new();
    // Rank 1's backward sleeps ten times its own compute: slow against its peer at any machine
    // speed, and far past the lateness floor (a quarter of its peer's compute, at least 2 ms).
    let mut sets = fault("slow", 3);
    sets.push("fault.slow_pct=1000".into());
    let (mut child, mut lines, id) = launch(&db, 2, 30, &strs(&sets));
    let line = read_until(&mut lines, |l| l.starts_with(&format!("{id} verdict ")));
    assert!(line.contains("verdict straggler") && line.contains("rank 1 (local"), "{line}");
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("succeeded"), "{end}");
    assert!(child.wait().unwrap().success());
    let s = show(&db, &id);
    let kinds: Vec<&str> = s["verdicts"].as_array().unwrap().iter().map(|v| v["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["straggler"], "no hang is claimed for a slow rank");
    latency("straggler", &s["verdicts"][0], injected_ms(&db, &id, 1));
    db.finish();
}

#[test]
fn a_clean_run_gets_no_verdict() {
    let db = Db::new();
    let (mut child, mut lines, id) = launch(&db, 2, 40, &["checkpoint.every=20"]);
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("succeeded"), "{end}");
    assert!(child.wait().unwrap().success());
    let s = show(&db, &id);
    assert_eq!(s["verdicts"], serde_json::json!([]), "{}", s["verdicts"]);
    assert!(s["events"].as_array().unwrap().iter().all(|e| e["kind"] != "verdict"));
    db.finish();
}

#[test]
fn stacks_of_four_ranks_come_back_grouped_and_the_run_goes_on() {
    if !stack_tool() {
        common::skipped(file!(), "neither eu-stack nor gdb is installed (scripts/install-deps.sh installs them)");
        return;
    }
    let db = Db::new();
    // Endless, then stopped: a fixed count of the small model's steps is over in a second or two
    // on a quiet machine, before four ranks' stacks are dumped.
    let (mut child, mut lines, id) = launch(&db, 4, ENDLESS, &[]);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 2));
    let one = db.json(&["stacks", &id, "--rank", "2", "--json"]);
    assert_eq!(one["groups"][0]["ranks"], serde_json::json!([2]), "{one}");
    let report = db.json(&["stacks", &id, "--json"]);
    let groups = report["groups"].as_array().unwrap();
    let mut ranks: Vec<u64> =
        groups.iter().flat_map(|g| g["ranks"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap())).collect();
    ranks.sort();
    assert_eq!(ranks, [0, 1, 2, 3], "{report}");
    assert!(groups.iter().all(|g| !g["threads"].as_array().unwrap().is_empty()));
    println!("stack dump of 4 ranks: {} group(s); per rank (rank, pid, tool, ms): {}", groups.len(), report["timings"]);
    assert_eq!(db.run(&["stacks", &id, "--rank", "9"]).status.code(), Some(2), "not a rank of the run");

    // The dumped ranks train on, then stop gracefully when asked.
    let dumped = progress_step(&read_until(&mut lines, |l| progress_step(l).is_some())).unwrap();
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= dumped + 3));
    assert!(db.run(&["stop", &id]).status.success());
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("stopped"), "the dumped ranks stop unharmed: {end}");
    assert!(!child.wait().unwrap().success(), "a stopped run did not finish its steps");
    let s = show(&db, &id);
    assert!(s["ranks"].as_array().unwrap().iter().all(|r| !r["exit"].is_null()), "every rank exited: {}", s["ranks"]);
    assert_eq!(of_kind(&s, "dead"), Vec::<Value>::new(), "dumped ranks are not dead");
    assert_eq!(db.run(&["stacks", &id]).status.code(), Some(2), "an ended run has no live stacks");
    db.finish();
}

#[test]
fn a_frozen_node_agent_is_a_lost_node_by_its_heartbeat() {
    let db = Db::new();
    // Endless: a fast machine would otherwise finish its steps while the agent is stopped (ranks
    // drop telemetry rather than wait), and the run would end before the kill.
    let (child, mut lines, id) = launch(&db, 2, ENDLESS, &[]);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 2));
    let agent: i32 = db
        .leftover_processes()
        .iter()
        .find(|p| p.contains(" agent "))
        .and_then(|p| p.split(':').next()?.parse().ok())
        .expect("the run's agent process");
    let stopped = flightdeck_now();
    // SAFETY: signalling the agent this test's run started.
    assert_eq!(unsafe { libc::kill(agent, libc::SIGSTOP) }, 0);
    let line = read_until(&mut lines, |l| l.starts_with(&format!("{id} verdict ")));
    // SAFETY: as above; the run must be able to end.
    assert_eq!(unsafe { libc::kill(agent, libc::SIGCONT) }, 0);
    assert!(line.contains("verdict node-lost") && line.contains("node local lost (no heartbeat for "), "{line}");
    let v = of_kind(&show(&db, &id), "node-lost")[0].clone();
    assert_eq!(culprit_ranks(&v), [0, 1]);
    latency("node-lost (heartbeat)", &v, stopped);
    kill_and_finish(&db, child, lines, &id);
}
