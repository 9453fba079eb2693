//! The Slurm placement against a real Slurm (tests/common/slurm.rs: slurmctld and fake slurmd
//! nodes on loopback addresses): tiny-gpt on 2 nodes × 1 rank through `cluster.launcher =
//! "slurm"` gives a local 2-rank run's losses bit for bit and gives its job back; `kill` leaves
//! no job and no process; Slurm's time-limit warning stops a run with a checkpoint and recovery
//! resubmits it to finish bit-exact; a hang on the second node's rank is named with that node;
//! a node whose slurmd and processes die is a `node-lost` verdict naming it, before
//! Slurm itself marks it down; the agent steps hold every CPU the job has on their nodes; an
//! agents' srun that fails is tried once more. Slots 0 to 9 are this file's.
mod common;
#[allow(dead_code)]
#[path = "common/slurm.rs"]
mod slurm;

use common::{csv_rows, read_until, recipe, stdout_lines, Db};
use slurm::Cluster;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// `run tiny-gpt --headless` as run `name` on 2 Slurm nodes × 1 rank, the nodes' run
/// directories in `dir`, with `train.steps` and the further overrides in `sets`.
fn slurm_run(dir: &std::path::Path, name: &str, steps: u64, sets: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["run", &tiny_gpt(), "--headless", "--name", name].map(String::from).into();
    let slurm = [
        format!("train.steps={steps}"),
        "cluster.launcher=slurm".into(),
        "cluster.nodes=2".into(),
        "cluster.ranks_per_node=1".into(),
        format!("cluster.remote_dir={}", dir.join("nodes").display()),
        THREADS.into(),
    ];
    for set in slurm.into_iter().chain(sets.iter().map(|s| s.to_string())) {
        args.extend(["--set".to_string(), set]);
    }
    args
}

/// The same recipe as a local 2-rank run `name`, to compare with; it must succeed.
fn run_local(db: &Db, name: &str, steps: u64) {
    let steps = format!("train.steps={steps}");
    let local = db
        .cmd(&["run", &tiny_gpt(), "--headless", "--name", name, "--set", &steps, "--set", THREADS])
        .output()
        .expect("run");
    assert!(local.status.success(), "{}", String::from_utf8_lossy(&local.stderr));
}

/// Starts `args` with piped output and reads its progress until step `step`; the child and the
/// rest of its stdout.
fn spawn_until_step(
    db: &Db,
    c: &Cluster,
    args: &[String],
    step: u64,
) -> (std::process::Child, impl Iterator<Item = std::io::Result<String>>) {
    spawn_until(db, c, args, move |l| common::progress_step(l).is_some_and(|s| s >= step))
}

/// Starts `args` with piped output and reads it until a line `done` accepts; the child and the
/// rest of its stdout.
fn spawn_until(
    db: &Db,
    c: &Cluster,
    args: &[String],
    done: impl Fn(&str) -> bool,
) -> (std::process::Child, impl Iterator<Item = std::io::Result<String>>) {
    let mut child = cmd(db, c, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, done);
    (child, lines)
}

/// More steps than any machine trains while a test waits: runs the test stops itself.
const ENDLESS: u64 = 1_000_000;

/// Every run of these tests: one intra-op thread per rank, as a local 2-rank run on 2 cores has
/// (a Slurm node's one rank would take both cores, and sum its matmuls in another order): the
/// recipe key that makes placements agree bit for bit (issue 47).
const THREADS: &str = "train.threads=1";

fn cmd(db: &Db, c: &Cluster, args: &[String]) -> std::process::Command {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = db.cmd(&args);
    for (k, v) in c.env() {
        cmd.env(k, v);
    }
    cmd
}

/// (step, rank) → loss bits of one run.
fn losses(db: &Db, run: &str) -> BTreeMap<(u64, u32), u64> {
    let out = db.run(&["metrics", run, "--key", "loss", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v.to_bits())).collect()
}

fn tiny_gpt() -> String {
    recipe("tiny-gpt.toml").display().to_string()
}

/// Waits until slurmctld lists no pending, running or completing job.
fn wait_no_jobs(c: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !c.jobs().is_empty() {
        assert!(Instant::now() < deadline, "jobs left: {:?}", c.jobs());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// No job and no process on any node (`db.finish()` then checks the database's own processes).
fn assert_nothing_left(c: &Cluster) {
    wait_no_jobs(c);
    for node in c.node_names() {
        assert_eq!(c.node_processes(&node), Vec::<u32>::new(), "processes left on {node}");
    }
}

/// A recipe in `dir` whose ranks only wait, `ranks_per_node` on each of 2 Slurm nodes; the
/// arguments that run it headless as run "wait".
fn wait_run(dir: &std::path::Path, ranks_per_node: u32) -> Vec<String> {
    let recipe = dir.join("wait.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"wait\"\nkind = \"command\"\n[command]\nargv = [\"sleep\", \"600\"]\n\
             [cluster]\nlauncher = \"slurm\"\nnodes = 2\nranks_per_node = {ranks_per_node}\nremote_dir = {:?}\n",
            dir.join("nodes").display().to_string()
        ),
    )
    .expect("recipe");
    ["run", &recipe.display().to_string(), "--headless", "--name", "wait"].map(String::from).into()
}

/// Kills run "wait", reads its client to the end, and checks it ended killed, leaving nothing.
fn kill_wait(
    db: &Db,
    c: &Cluster,
    mut child: std::process::Child,
    lines: impl Iterator<Item = std::io::Result<String>>,
) {
    common::ok(&db.run(&["kill", "wait"]));
    let _rest: Vec<String> = lines.map_while(Result::ok).collect();
    child.wait().expect("wait");
    assert_eq!(db.json(&["show", "wait", "--json"])["run"]["status"], "killed");
    assert_nothing_left(c);
    db.finish();
}

#[test]
fn tiny_gpt_on_two_slurm_nodes_matches_a_local_run_and_kill_leaves_nothing() {
    let test = "tiny_gpt_on_two_slurm_nodes_matches_a_local_run_and_kill_leaves_nothing";
    let Some(c) = Cluster::start_or_skip(test, 4, 0) else { return };
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    run_local(&db, "local", 20);
    let out = cmd(&db, &c, &slurm_run(dir.path(), "slurm", 20, &[])).output().expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(losses(&db, "slurm"), losses(&db, "local"), "the same losses, bit for bit");

    let show = db.json(&["show", "slurm", "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    assert_eq!(show["run"]["hosts"], serde_json::json!(["n1", "n2"]), "the ranks' nodes by Slurm's names");
    let texts = common::event_texts(&show);
    let launched = texts.iter().find(|t| t.starts_with("launched")).expect("launch event");
    assert!(
        launched.contains("through Slurm") && launched.contains(" in job ") && launched.contains("n2 (127.0."),
        "{launched}"
    );
    // The run gave its job back: it ended COMPLETED (its holder told to finish), not cancelled.
    wait_no_jobs(&c);

    // A hang injected on the second node's rank is named with that node's Slurm name; then
    // kill: the job goes and nothing of the run is left on any node.
    let hang = ["fault.kind=hang-before-collective", "fault.rank=1", "fault.step=4"];
    let (mut child, mut lines) = spawn_until_step(&db, &c, &slurm_run(dir.path(), "hung", 100_000, &hang), 2);
    assert_eq!(c.jobs().len(), 1, "the run's own job: {:?}", c.jobs());
    let line = read_until(&mut lines, |l| l.contains(" verdict "));
    assert!(line.contains("verdict never-entered"), "{line}");
    let show = db.json(&["show", "hung", "--json"]);
    let verdict = &show["verdicts"].as_array().expect("verdicts")[0];
    let culprit = &verdict["culprits"][0];
    assert_eq!((culprit["rank"].as_u64(), culprit["host"].as_str()), (Some(1), Some("n2")), "{verdict}");
    assert!(verdict["summary"].as_str().unwrap_or_default().contains("rank 1 (n2, pid "), "{verdict}");
    common::ok(&db.run(&["kill", "hung"]));
    let status = child.wait().expect("wait");
    assert!(!status.success(), "a killed run's headless client exits non-zero");
    assert_eq!(db.json(&["show", "hung", "--json"])["run"]["status"], "killed");
    assert_nothing_left(&c);
    db.finish();
}

#[test]
fn the_time_limit_warning_stops_with_a_checkpoint_and_recovery_finishes_bit_exact() {
    let test = "the_time_limit_warning_stops_with_a_checkpoint_and_recovery_finishes_bit_exact";
    let Some(c) = Cluster::start_or_skip(test, 2, 1) else { return };
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    // Endless runs, stopped by hand once they are past the steps compared: whatever the
    // machine's speed, the warning comes before the run could end by itself.
    let recovery = ["recovery.max_restarts=2", "recovery.backoff_s=0", "checkpoint.every=0"];
    let (mut child, mut lines) = spawn_until_step(&db, &c, &slurm_run(dir.path(), "limited", ENDLESS, &recovery), 3);
    let jobs = c.jobs();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    // Slurm's warning, now instead of GRACE seconds before the limit: to the batch shell only.
    let sent = c.cmd("scancel", &["--signal=USR2", "--batch", &jobs[0]]);
    assert!(sent.status.success(), "{sent:?}");
    let restarted = read_until(&mut lines, |l| l.contains("recovery restarted it after a time_limit as run "));
    let child_run = restarted.rsplit("as run ").next().and_then(|r| r.split_whitespace().next()).expect("the new run");
    let child_run = child_run.trim_end_matches(['.', ':', ',']).to_string();
    // The resumed attempt trains on in its new allocation; three of its steps, then a stop.
    let resumed = read_until(&mut lines, |l| common::progress_step(l).is_some());
    let from = common::progress_step(&resumed).expect("a step");
    read_until(&mut lines, |l| common::progress_step(l).is_some_and(|s| s >= from + 3));
    common::ok(&db.run(&["stop", &child_run]));
    let _rest: Vec<String> = lines.map_while(Result::ok).collect();
    child.wait().expect("wait");

    let show = db.json(&["show", &child_run, "--json"]);
    let attempts = show["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0]["status"], "stopped", "{}", attempts[0]);
    assert_eq!(attempts[1]["restart"]["cause"], "time_limit");
    assert_eq!(attempts[1]["status"], "stopped", "the person's stop ends the lineage: {}", attempts[1]);
    let first = db.json(&["show", attempts[0]["run"].as_str().expect("id"), "--json"]);
    let reason = first["run"]["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("stopped for Slurm's time limit after step "), "{reason}");
    let texts = common::event_texts(&first);
    assert!(texts.iter().any(|t| t.contains("time-limit warning came")), "{texts:?}");
    let mut lineage: BTreeMap<(u64, u32), u64> = BTreeMap::new();
    for a in attempts {
        lineage.extend(losses(&db, a["run"].as_str().expect("run id")));
    }
    let last = lineage.keys().map(|(step, _)| *step).max().expect("steps");
    assert!(last >= from + 3, "the second attempt trained: up to step {last}");
    assert_nothing_left(&c);

    // The same recipe uninterrupted, on 2 local ranks, up to the lineage's last step.
    let args: Vec<String> = [
        "run",
        &tiny_gpt(),
        "--headless",
        "--name",
        "straight",
        "--set",
        &format!("train.steps={ENDLESS}"),
        "--set",
        THREADS,
    ]
    .map(String::from)
    .into();
    let (mut straight, lines) = spawn_until_step(&db, &c, &args, last);
    common::ok(&db.run(&["stop", "straight"]));
    let _rest: Vec<String> = lines.map_while(Result::ok).collect();
    straight.wait().expect("wait");
    let reference = losses(&db, "straight");
    let common_steps: BTreeMap<(u64, u32), u64> =
        reference.into_iter().filter(|(k, _)| lineage.contains_key(k)).collect();
    assert_eq!(lineage, common_steps, "the lineage's losses are the uninterrupted run's, step by step");
    db.finish();
}

#[test]
fn a_dead_node_is_lost_by_name_before_slurm_marks_it_down() {
    let test = "a_dead_node_is_lost_by_name_before_slurm_marks_it_down";
    let Some(c) = Cluster::start_or_skip(test, 2, 2) else { return };
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, lines) = spawn_until_step(&db, &c, &slurm_run(dir.path(), "lost", 100_000, &[]), 2);
    // The node dies: its slurmd, its step daemons, the agent and its rank, all at once.
    c.kill_slurmd("n2");
    assert!(c.kill_node_processes("n2") > 0, "the agent and rank ran on n2");
    let _rest: Vec<String> = lines.map_while(Result::ok).collect();
    child.wait().expect("wait");
    let state = c.node_state("n2");
    assert!(!state.contains("down"), "Flightdeck saw the loss before Slurm did (n2 is {state})");
    let show = db.json(&["show", "lost", "--json"]);
    assert_eq!(show["run"]["status"], "interrupted", "{}", show["run"]);
    let reason = show["run"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("lost the agent on n2"), "{reason}");
    // The verdict names the node and its rank; the rank on n1 is no death of its own.
    let verdicts = show["verdicts"].as_array().expect("verdicts");
    let kinds: Vec<&str> = verdicts.iter().filter_map(|v| v["kind"].as_str()).collect();
    assert_eq!(kinds, ["node-lost"], "{verdicts:?}");
    let v = &verdicts[0];
    assert_eq!((v["culprits"][0]["rank"].as_u64(), v["culprits"][0]["host"].as_str()), (Some(1), Some("n2")), "{v}");
    // Rank 0 waits for it, or has already failed on the broken ring: either way not a culprit.
    assert_eq!(v["culprits"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(v["summary"].as_str().unwrap_or_default().starts_with("node n2 lost ("), "{v}");
    c.restart_slurmd("n2");
    assert_nothing_left(&c);
    db.finish();
}

#[test]
fn doctor_slurm_checks_a_real_cluster_and_names_what_is_wrong() {
    let test = "doctor_slurm_checks_a_real_cluster_and_names_what_is_wrong";
    let Some(c) = Cluster::start_or_skip(test, 2, 3) else { return };
    let db = Db::new();
    let doctor = |sets: &[&str]| {
        let mut args = vec!["doctor".to_string(), "--slurm".into()];
        for s in sets {
            args.extend(["--set".to_string(), s.to_string()]);
        }
        let out = cmd(&db, &c, &args).output().expect("doctor");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    let line = |text: &str, name: &str| {
        text.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_default().to_string()
    };

    let (ok, text) = doctor(&[]);
    assert!(ok, "{text}");
    for name in ["commands", "controller", "partition", "nodes", "step", "node-torch", "node-dir"] {
        assert!(line(&text, name).split_whitespace().nth(1) == Some("ok"), "{name}:\n{text}");
    }
    assert!(line(&text, "partition").contains("debug (the default): up, 2 nodes (2 idle)"), "{text}");
    let step = line(&text, "step");
    assert!(step.contains("a 1-node step ran ") && (step.ends_with(" s") && step.contains(" on n")), "{step}");
    // The step is gone once doctor is: nothing holds a node.
    wait_no_jobs(&c);

    let (ok, text) = doctor(&["cluster.partition=gpu"]);
    assert!(!ok, "{text}");
    assert!(line(&text, "partition").contains("FAIL  no partition \"gpu\"; the cluster has: debug"), "{text}");
    assert!(line(&text, "step").is_empty(), "no step without a partition: {text}");

    let (ok, text) = doctor(&["cluster.nodes=3"]);
    assert!(!ok, "{text}");
    assert!(line(&text, "nodes").contains("debug has 2 nodes; the recipe asks for 3 (cluster.nodes)"), "{text}");

    // A cluster that cannot be reached is the line that fails, saying why, at once (Slurm's
    // clients would retry a missing config for a minute).
    let mut broken = db.cmd(&["doctor", "--slurm"]);
    broken.env("SLURM_CONF", c.dir().join("no-such-slurm.conf"));
    let out = broken.output().expect("doctor");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "{text}");
    let controller = line(&text, "controller");
    assert!(controller.contains("FAIL") && controller.contains("no-such-slurm.conf: no such file"), "{text}");
    assert!(line(&text, "partition").is_empty(), "{text}");
    db.finish();
}

#[test]
fn the_agent_steps_hold_every_cpu_the_job_has_on_their_nodes() {
    let test = "the_agent_steps_hold_every_cpu_the_job_has_on_their_nodes";
    let Some(c) = Cluster::start_or_skip(test, 2, 4) else { return };
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    // 2 nodes × 4 ranks of a program that only waits: the job holds 4 CPUs on each node, and
    // each node's agent step (node 0's, then the rest) must hold them all for its ranks, not
    // the one CPU its single task would get where steps are exact (task/cgroup would confine
    // the ranks to it). Slurm 22.05 gives a step the job's CPUs by default; the launch asks for
    // them (--whole) whatever a site's default is.
    let args = wait_run(dir.path(), 4);
    let (child, lines) = spawn_until(&db, &c, &args, |l| l.contains("ranks 8/8 running"));
    let out = c.cmd("scontrol", &["-o", "show", "step"]);
    let steps = String::from_utf8_lossy(&out.stdout).to_string();
    let agents: Vec<&str> = steps.lines().filter(|l| l.contains("Name=flightdeck-agents-")).collect();
    assert_eq!(agents.len(), 2, "node 0's step and the other node's:\n{steps}");
    for step in agents {
        assert!(
            step.contains(" Nodes=1 ") && step.contains(" CPUs=4 "),
            "each agent step holds its node's 4 CPUs: {step}"
        );
    }
    kill_wait(&db, &c, child, lines);
}

#[test]
fn an_agents_srun_that_fails_is_tried_once_more_and_the_run_starts() {
    let test = "an_agents_srun_that_fails_is_tried_once_more_and_the_run_starts";
    let Some(c) = Cluster::start_or_skip(test, 2, 5) else { return };
    let db = Db::new();
    let dir = tempfile::tempdir().expect("tempdir");
    // An srun first on the server's PATH that fails the first agents' step it is asked for, as
    // Slurm's own trouble does under load ("Unexpected missing socket error"), and is the real
    // srun for everything else.
    let real = String::from_utf8_lossy(
        &std::process::Command::new("sh").args(["-c", "command -v srun"]).output().expect("sh").stdout,
    )
    .trim()
    .to_string();
    assert!(!real.is_empty(), "a cluster started, so srun is on PATH");
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let failed = dir.path().join("failed");
    let wrapper = bin.join("srun");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \"$*\" in *\"agent slurm\"*) if [ ! -e {failed:?} ]; then : > {failed:?}; \
             echo 'srun: error: injected by the test' >&2; exit 1; fi;; esac\nexec {real:?} \"$@\"\n"
        ),
    )
    .expect("wrapper");
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = cmd(&db, &c, &wait_run(dir.path(), 1))
        .env("PATH", path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| l.contains("ranks 2/2 running"));
    assert!(failed.exists(), "the wrapper failed the first agents' step");
    let log = std::fs::read_to_string(db.path().join("server.log")).expect("server.log");
    assert!(log.contains("injected by the test") && log.contains("trying once more"), "{log}");
    let run_dir = db.path().join("runs").join(db.json(&["show", "wait", "--json"])["run"]["id"].as_str().expect("id"));
    assert!(run_dir.join("slurm-agents-0-again.out").exists(), "the second try has files of its own");
    kill_wait(&db, &c, child, lines);
}
