//! Resuming runs over real OpenSSH: every node keeps its own copy of each checkpoint, a resume
//! onto the same hosts reads them in place, and a node new to the lineage gets one carried from
//! the node it replaces. Nodes are network namespaces with their own sshd and their own home
//! (tests/ssh_support `with_homes`), so with a relative `cluster.remote_dir` no node sees
//! another's files: a copy that was not carried is not there.
mod common;
mod ssh_support;
use common::*;
use ssh_support::*;
use std::collections::BTreeMap;
use std::process::Command;

const STEPS: u64 = 24;
const WORLD: u32 = 4;

fn ssh_cmd(db: &Db, lab: &Lab, args: &[&str]) -> Command {
    let mut c = db.cmd(args);
    c.env("FLIGHTDECK_SSH_CONFIG", lab.config_path()).env_remove("SSH_AUTH_SOCK");
    c
}

/// The `--set`s every launch here takes: each node's own `~/fd`, short timeouts.
fn cluster_sets() -> Vec<String> {
    let mut out = Vec::new();
    for set in ["cluster.remote_dir=\"fd\"", "cluster.connect_timeout_s=3", "cluster.command_timeout_s=30"] {
        out.extend(["--set".to_string(), set.to_string()]);
    }
    out.extend(["--set".into(), "cluster.link_timeout_s=2".into()]);
    out
}

fn loss_bits(db: &Db, run: &str) -> BTreeMap<(u64, u32), u64> {
    let out = db.run(&["metrics", run, "--key", "loss", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v.to_bits())).collect()
}

/// Starts `args` headless, waits until the run has trained past `past`, stops it, and returns
/// (run id, everything it printed). A stop saves a checkpoint at the step boundary it lands on.
fn stopped_mid_way(db: &Db, lab: &Lab, args: &[String], past: u64) -> (String, String) {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = ssh_cmd(db, lab, &refs).stdout(std::process::Stdio::piped()).spawn().expect("flightdeck");
    let mut lines = stdout_lines(&mut child);
    let mut printed = String::new();
    let mut id = String::new();
    for line in lines.by_ref() {
        let line = line.expect("stdout");
        printed.push_str(&line);
        printed.push('\n');
        if id.is_empty() && line.starts_with("run ") {
            id = line["run ".len()..].split(':').next().unwrap_or("").to_string();
        }
        let step = line.split(" step ").nth(1).and_then(|t| t.split('/').next()).and_then(|s| s.parse::<u64>().ok());
        if !id.is_empty() && step.is_some_and(|s| s > past) {
            break;
        }
    }
    assert!(!id.is_empty(), "no run started:\n{printed}");
    let stop = ssh_cmd(db, lab, &["stop", &id]).output().expect("stop");
    assert!(stop.status.success(), "{}", String::from_utf8_lossy(&stop.stderr));
    for line in lines {
        let line = line.expect("stdout");
        printed.push_str(&line);
        printed.push('\n');
    }
    assert_eq!(child.wait().unwrap().code(), Some(3), "a run stopped on request exits 3:\n{printed}");
    assert!(printed.contains("stopped on request after step"), "{printed}");
    (id, printed)
}

/// The step a stopped run saved at, from its `stopped on request after step N` line.
fn stop_step(printed: &str) -> u64 {
    let after = printed.split("stopped on request after step ").nth(1).unwrap_or_else(|| panic!("{printed}"));
    after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{printed}"))
}

fn manifest(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("manifest JSON")
}

/// Three nodes with homes of their own (the binary installed in each `~/fd`), and the losses of
/// the uninterrupted run every lineage here is compared with: 4 local ranks, `STEPS` steps.
fn lab_and_straight(db: &Db) -> (Lab, BTreeMap<(u64, u32), u64>) {
    let lab = Lab::with_homes(3);
    for i in 0..3 {
        lab.preinstall_at(&lab.home(i).join("fd"));
    }
    let steps = format!("train.steps={STEPS}");
    let tiny = recipe("tiny-gpt.toml");
    let args = ["run", tiny.to_str().unwrap(), "--headless", "--ranks-per-node", "4", "--name", "straight"];
    let straight = ok(&db.run(&[&args[..], &["--set", &steps, "--set", "checkpoint.every=0"]].concat()));
    let id = straight.lines().find_map(|l| l.strip_prefix("run ")).unwrap().split(':').next().unwrap();
    let want = loss_bits(db, id);
    assert_eq!(want.len() as u64, STEPS * u64::from(WORLD));
    (lab, want)
}

/// Bit for bit: every step each attempt trained equals the uninterrupted run's, and together
/// the attempts cover every step of every rank.
fn assert_lineage_is_the_straight_run(db: &Db, runs: &[&str], want: &BTreeMap<(u64, u32), u64>) {
    let mut lineage = BTreeMap::new();
    for run in runs {
        for (k, v) in loss_bits(db, run) {
            assert_eq!(want.get(&k), Some(&v), "run {run}, (step, rank) {k:?} differs from the straight run");
            lineage.insert(k, v);
        }
    }
    assert_eq!(&lineage, want, "the lineage covers every step of every rank");
}

#[test]
fn a_two_node_run_stopped_and_resumed_on_its_hosts_then_onto_another_second_node_is_bit_exact() {
    let test = "a_two_node_run_stopped_and_resumed_on_its_hosts_then_onto_another_second_node_is_bit_exact";
    if skip(test) {
        return;
    }
    let db = Db::new();
    let (lab, want) = lab_and_straight(&db);
    let steps = format!("train.steps={STEPS}");
    let tiny = recipe("tiny-gpt.toml");

    // The SSH run, slowed (a sleep in rank 3's backward: timing only) so a stop lands mid-way.
    let mut args: Vec<String> =
        ["run", tiny.to_str().unwrap(), "--headless", "--hosts", "node0,node1"].into_iter().map(String::from).collect();
    args.extend(["--ranks-per-node", "2", "--name", "ssh-resume", "--set", &steps].map(String::from));
    for set in ["checkpoint.every=0", "fault.kind=slow", "fault.rank=3", "fault.slow_pct=400"] {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(cluster_sets());
    let (parent, printed) = stopped_mid_way(&db, &lab, &args, 2);
    let s1 = stop_step(&printed);
    assert!(s1 < STEPS, "the stop landed before the end (step {s1})");
    // Each node committed its own copy, on its own disk, naming itself.
    for (i, node) in [(0, "node0"), (1, "node1")] {
        let dir = lab.home(i).join(format!("fd/runs/{parent}/node-{i}/checkpoints/step-{s1:08}"));
        let m = manifest(&dir.join("MANIFEST.json"));
        assert_eq!((m["step"].as_u64(), m["node"].as_str()), (Some(s1), Some(node)), "{m}");
    }
    assert!(!lab.home(2).join("fd/runs").exists(), "node2 has not been used yet");
    let ckpts = db.json(&["ckpts", &parent, "--json"]);
    let saved = ckpts["checkpoints"].as_array().unwrap().iter().find(|c| c["step"] == s1).cloned();
    assert_eq!(saved.map(|c| c["nodes"].clone()), Some(serde_json::json!(["node0", "node1"])), "{ckpts}");
    // --verify checks each node's copy on the node itself.
    let verified = db.json(&["ckpts", &parent, "--verify", "--json"]);
    let saved = verified["checkpoints"].as_array().unwrap().iter().find(|c| c["step"] == s1).cloned().unwrap();
    assert_eq!((&saved["verified"], &saved["checked"]), (&serde_json::json!(true), &serde_json::json!("sha256")));
    assert_eq!(saved["nodes"], serde_json::json!(["node0", "node1"]), "{verified}");
    assert_eq!(verified["latest"], s1);

    // Resumed on the same hosts (each node reads its own copy), slowed again and stopped again.
    let mut again: Vec<String> = ["resume", parent.as_str(), "--headless"].into_iter().map(String::from).collect();
    again.extend(cluster_sets());
    let (first, printed) = stopped_mid_way(&db, &lab, &again, s1 + 1);
    for node in ["node0", "node1"] {
        assert!(
            printed.contains(&format!("launch {node}: resumes from checkpoint step {s1} on this node")),
            "{printed}"
        );
    }
    assert!(!printed.contains("copied from"), "nothing is carried onto the same hosts:\n{printed}");
    let s2 = stop_step(&printed);
    assert!(s2 > s1 && s2 < STEPS, "the second stop is past the first and before the end: {s1} {s2}");

    // Resumed onto node0 and node2: node2 never held anything of this lineage, so it gets the
    // copy of node1 (the node it replaces), carried over the two SSH sessions.
    let mut moved: Vec<String> =
        ["resume", first.as_str(), "--headless", "--hosts", "node0,node2"].into_iter().map(String::from).collect();
    moved.extend(["--set".to_string(), "fault.kind=none".to_string()]);
    moved.extend(cluster_sets());
    let refs: Vec<&str> = moved.iter().map(String::as_str).collect();
    let out = ssh_cmd(&db, &lab, &refs).output().expect("resume");
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{printed}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(printed.contains(&format!("launch node0: resumes from checkpoint step {s2} on this node")), "{printed}");
    assert!(printed.contains(&format!("launch node2: checkpoint step {s2} copied from node1 (")), "{printed}");
    let second = printed.lines().find_map(|l| l.strip_prefix("run ")).unwrap().split(':').next().unwrap().to_string();
    let carried = lab.home(2).join(format!("fd/runs/{second}/node-1/resume/step-{s2:08}/MANIFEST.json"));
    assert_eq!(manifest(&carried)["node"], "node1", "the carried copy is node1's");
    let show = db.json(&["show", &second, "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    assert_eq!(show["run"]["hosts"], serde_json::json!(["node0", "node2"]));

    assert_lineage_is_the_straight_run(&db, &[parent.as_str(), first.as_str(), second.as_str()], &want);
    db.finish();
    lab.assert_nothing_running();
}

const CRASHES_ON_NODE1: &str = r#"
[[fault]]
kind = "crash"
rank = 2
step = 7

[[fault]]
kind = "crash"
rank = 3
step = 13

[recovery]
max_restarts = 3
backoff_s = 0
"#;

#[test]
fn a_host_that_crashed_twice_is_replaced_by_a_spare_that_gets_the_checkpoint_carried_and_the_lineage_finishes() {
    let test =
        "a_host_that_crashed_twice_is_replaced_by_a_spare_that_gets_the_checkpoint_carried_and_the_lineage_finishes";
    if skip(test) {
        return;
    }
    let db = Db::new();
    let (lab, want) = lab_and_straight(&db);
    let steps = format!("train.steps={STEPS}");
    let tiny = recipe("tiny-gpt.toml");

    // Both crashes are on node1 (ranks 2 and 3); node2 is the spare.
    let dir = tempfile::tempdir().expect("tempdir");
    let faulty = dir.path().join("faulty.toml");
    let base = std::fs::read_to_string(&tiny).expect("tiny-gpt.toml");
    std::fs::write(&faulty, format!("{base}\n{CRASHES_ON_NODE1}")).expect("recipe");
    let mut args: Vec<String> = ["run", faulty.to_str().unwrap(), "--headless", "--hosts", "node0,node1"]
        .into_iter()
        .map(String::from)
        .collect();
    args.extend(["--ranks-per-node", "2", "--name", "spared", "--set", &steps].map(String::from));
    for set in ["checkpoint.every=4", r#"cluster.spare_hosts=["node2"]"#] {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(cluster_sets());
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = ssh_cmd(&db, &lab, &refs).output().expect("run");
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the lineage succeeds:\n{printed}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let show = db.json(&["show", "spared", "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    let attempts: Vec<String> =
        show["attempts"].as_array().unwrap().iter().map(|a| a["run"].as_str().unwrap().to_string()).collect();
    assert_eq!(attempts.len(), 3, "{}", show["attempts"]);
    let hosts: Vec<serde_json::Value> =
        attempts.iter().map(|r| db.json(&["show", r, "--json"])["run"]["hosts"].clone()).collect();
    let (two, spared) = (serde_json::json!(["node0", "node1"]), serde_json::json!(["node0", "node2"]));
    assert_eq!(hosts, vec![two.clone(), two, spared], "node1 failed twice: the third attempt runs on node2");
    let second = db.json(&["show", &attempts[1], "--json"]);
    let said: Vec<String> =
        second["events"].as_array().unwrap().iter().map(|e| e["text"].as_str().unwrap().to_string()).collect();
    assert!(
        said.iter().any(|t| t.contains("node1 failed 2 times in this lineage: the restart runs on spare node2")),
        "{said:#?}"
    );
    // node2 never held anything of this lineage: it got a copy carried from a node that held
    // the checkpoint (node1's, the node it replaces, unless that one's last save was cut short by
    // its own crash; the step is the newest any node committed before it).
    let third = db.json(&["show", &attempts[2], "--json"]);
    let said: Vec<String> =
        third["events"].as_array().unwrap().iter().map(|e| e["text"].as_str().unwrap().to_string()).collect();
    let carry = said.iter().find(|t| t.starts_with("checkpoint step ")).unwrap_or_else(|| panic!("{said:#?}"));
    let step: u64 = carry["checkpoint step ".len()..].split(':').next().unwrap().parse().expect("a step");
    assert!((4..=12).contains(&step), "{carry}");
    let source = carry.split("node2 got ").nth(1).and_then(|t| t.split("'s, carried").next()).expect(carry);
    assert!(carry.ends_with("carried and sha256-verified"), "{carry}");
    let carried = lab.home(2).join(format!("fd/runs/{}/node-1/resume/step-{step:08}/MANIFEST.json", attempts[2]));
    assert_eq!(manifest(&carried)["node"], source, "the carried copy is {source}'s");
    let runs: Vec<&str> = attempts.iter().map(String::as_str).collect();
    assert_lineage_is_the_straight_run(&db, &runs, &want);
    db.finish();
    lab.assert_nothing_running();
}
