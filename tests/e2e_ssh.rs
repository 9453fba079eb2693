//! End to end over real OpenSSH: nodes are network namespaces with their own sshd (see
//! tests/ssh_support), reached by the real binary's ssh2 launcher.
mod common;
mod ssh_support;
use common::*;
use ssh_support::*;
use std::collections::BTreeMap;
use std::process::{Command, Output};

/// A flightdeck command for this lab: its SSH config, no ssh-agent (keys come from the config).
fn ssh_cmd(db: &Db, lab: &Lab, args: &[&str]) -> Command {
    let mut c = db.cmd(args);
    c.env("FLIGHTDECK_SSH_CONFIG", lab.config_path()).env_remove("SSH_AUTH_SOCK");
    c
}

/// `run RECIPE --headless --hosts HOSTS` with the lab's remote dir and short timeouts, plus `extra`.
fn launch_args(lab: &Lab, recipe_file: &str, hosts: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec!["run".into(), recipe(recipe_file).display().to_string(), "--headless".into()];
    args.extend(["--hosts".into(), hosts.into()]);
    for set in [
        format!("cluster.remote_dir={:?}", lab.remote_dir().display().to_string()),
        "cluster.connect_timeout_s=3".into(),
        "cluster.command_timeout_s=30".into(),
        "cluster.link_timeout_s=2".into(),
    ] {
        args.extend(["--set".into(), set]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run_ssh(db: &Db, lab: &Lab, recipe_file: &str, hosts: &str, extra: &[&str]) -> Output {
    let args = launch_args(lab, recipe_file, hosts, extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    ssh_cmd(db, lab, &refs).output().expect("running flightdeck")
}

fn text(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn losses(db: &Db, run: &str) -> BTreeMap<(u64, u32), f64> {
    let out = db.run(&["metrics", run, "--key", "loss", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v)).collect()
}

fn events(db: &Db, run: &str) -> Vec<String> {
    let show = db.json(&["show", run, "--json"]);
    show["events"].as_array().unwrap().iter().map(|e| e["text"].as_str().unwrap().to_string()).collect()
}

fn assert_every_step(rows: &BTreeMap<(u64, u32), f64>, steps: u64, world: u32) {
    for step in 1..=steps {
        for rank in 0..world {
            assert!(rows.contains_key(&(step, rank)), "step {step} of rank {rank} is missing");
        }
    }
    assert_eq!(rows.len() as u64, steps * u64::from(world));
}

#[test]
fn two_nodes_by_two_ranks_over_ssh_train_exactly_like_four_local_ranks() {
    if skip("two_nodes_by_two_ranks_over_ssh_train_exactly_like_four_local_ranks") {
        return;
    }
    let lab = Lab::new(2);
    let db = Db::new();
    let steps = "train.steps=24";
    let out =
        run_ssh(&db, &lab, "tiny-gpt.toml", "node0,node1", &["--ranks-per-node", "2", "--name", "ssh", "--set", steps]);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Per-host progress in headless output, and the deploy step really copied the binary.
    for host in ["node0", "node1"] {
        assert!(stdout.contains(&format!("launch {host}: connected (host key known")), "{stdout}");
        assert!(stdout.contains(&format!("launch {host}: agent started")), "{stdout}");
    }
    assert!(stdout.contains("binary uploaded to") && stdout.contains("sha256 verified"), "{stdout}");
    let installed: Vec<_> = std::fs::read_dir(lab.remote_dir().join("bin")).unwrap().flatten().collect();
    assert_eq!(installed.len(), 1, "one versioned binary directory");
    assert!(installed[0].path().join("flightdeck.sha256").is_file());

    let local = db.run(&[
        "run",
        recipe("tiny-gpt.toml").to_str().unwrap(),
        "--headless",
        "--ranks-per-node",
        "4",
        "--name",
        "local",
        "--set",
        steps,
    ]);
    assert!(local.status.success(), "{}", text(&local));

    let show = db.json(&["show", "ssh", "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    assert_eq!(show["run"]["hosts"], serde_json::json!(["node0", "node1"]));
    let hosts: BTreeMap<u64, String> = show["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["rank"].as_u64().unwrap(), r["host"].as_str().unwrap().to_string()))
        .collect();
    let want: BTreeMap<u64, String> =
        [(0, "node0"), (1, "node0"), (2, "node1"), (3, "node1")].into_iter().map(|(r, h)| (r, h.to_string())).collect();
    assert_eq!(hosts, want, "rank r runs on host r / ranks_per_node");
    let (remote, here) = (losses(&db, "ssh"), losses(&db, "local"));
    assert_every_step(&remote, 24, 4);
    for (k, v) in &here {
        assert_eq!(v.to_bits(), remote[k].to_bits(), "step/rank {k:?}: local {v} vs ssh {}", remote[k]);
    }
    // The SSH run's report: every rank's series came home, so every chart and table is there.
    let out = tempfile::tempdir().expect("tempdir");
    common::ok(&db.run(&["report", "ssh", "--out", out.path().to_str().unwrap()]));
    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    let row = md.lines().find(|l| l.contains("| ssh | pretrain | succeeded |")).unwrap_or_else(|| panic!("{md}"));
    assert!(row.contains("| 4 | 24/24 |"), "{row}");
    assert!(md.contains("## Collectives") && md.contains("## Goodput"), "{md}");
    if common::charts::have_font() {
        let files = common::charts::check_images(out.path(), &md);
        assert!(
            ["loss.png", "step_time.png", "bandwidth.png"].iter().all(|f| files.contains(&f.to_string())),
            "{files:?}"
        );
    }
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn cutting_a_nodes_link_mid_run_loses_no_step() {
    if skip("cutting_a_nodes_link_mid_run_loses_no_step") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    let args = launch_args(&lab, "tiny-gpt.toml", "node0,node1", &["--ranks-per-node", "1", "--set", "train.steps=40"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = ssh_cmd(&db, &lab, &refs).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 5));
    // The fault: node1's network is down for longer than the link timeout (2 s) plus the
    // keepalive interval (1 s), so the server notices; then it is back.
    lab.link(1, false);
    std::thread::sleep(std::time::Duration::from_secs(5));
    lab.link(1, true);
    let end = read_until(&mut lines, |l| l.starts_with("run ") && !l.contains(" rank(s), "));
    assert!(end.contains("succeeded"), "{end}");
    assert!(child.wait().unwrap().success());
    let id = db.json(&["runs", "--json"])["runs"][0]["id"].as_str().unwrap().to_string();
    let ev = events(&db, &id);
    assert!(ev.iter().any(|e| e.starts_with("lost the link to node1")), "{ev:#?}");
    assert!(ev.iter().any(|e| e.starts_with("reconnected to node1")), "{ev:#?}");
    assert_every_step(&losses(&db, &id), 40, 2);
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn server_kill_9_mid_ssh_run_reattaches_and_stores_every_step() {
    if skip("server_kill_9_mid_ssh_run_reattaches_and_stores_every_step") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    let args = launch_args(&lab, "tiny-gpt.toml", "node0,node1", &["--ranks-per-node", "1", "--set", "train.steps=40"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = ssh_cmd(&db, &lab, &refs).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 5));
    let pid: i32 = std::fs::read_to_string(db.path().join("server.lock")).unwrap().trim().parse().unwrap();
    // SAFETY: signalling the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    // The follower starts the server again; it reattaches over SSH and the run finishes.
    read_until(&mut lines, |l| l.contains("reconnected to the server; following on"));
    read_until(&mut lines, |l| l.starts_with("run ") && l.contains(" succeeded"));
    assert!(child.wait().unwrap().success(), "the follower exits with the run's outcome");

    // The next client (without the SSH config in its environment: the run remembers its nodes)
    // reads the run back.
    let runs = db.json(&["runs", "--json"]);
    let id = runs["runs"][0]["id"].as_str().unwrap().to_string();
    db.wait_server_exit();
    let show = db.json(&["show", &id, "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    assert_every_step(&losses(&db, &id), 40, 2);
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn host_keys_unknown_refused_accept_new_recorded_changed_and_wrong_user_key_refused() {
    if skip("host_keys_unknown_refused_accept_new_recorded_changed_and_wrong_user_key_refused") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    // Unknown: refused with the fingerprint and the exact line that trusts it.
    std::fs::write(lab.known_hosts(), "").unwrap();
    let out = run_ssh(&db, &lab, "command-env.toml", "node0", &["--ranks-per-node", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("node0") && err.contains("host key not known"), "{err}");
    assert!(err.contains(&lab.fingerprint(0)), "the fingerprint ssh-keygen prints: {err}");
    assert!(err.contains(lab.known_line(0, 0).trim()), "the exact known_hosts line: {err}");
    assert!(err.contains("--accept-new-host-keys") && err.contains("nothing was left running"), "{err}");

    // accept-new: trusted on first use and recorded; the next launch needs no flag.
    let out = run_ssh(&db, &lab, "command-env.toml", "node0", &["--ranks-per-node", "1", "--accept-new-host-keys"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("new host key {} accepted", lab.fingerprint(0))));
    assert_eq!(std::fs::read_to_string(lab.known_hosts()).unwrap(), lab.known_line(0, 0));
    let out = run_ssh(&db, &lab, "command-env.toml", "node0", &["--ranks-per-node", "1"]);
    assert!(out.status.success(), "{}", text(&out));

    // Changed: node1 recorded with node0's key. Refused loudly, also with accept-new.
    std::fs::write(lab.known_hosts(), lab.known_line(0, 0) + &lab.known_line(1, 0)).unwrap();
    let out = run_ssh(&db, &lab, "command-env.toml", "node0,node1", &["--accept-new-host-keys"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("node1") && err.contains("HOST KEY HAS CHANGED") && err.contains(&lab.fingerprint(1)),
        "{err}"
    );

    // A user key the node does not authorise: refused, naming the host and what was tried.
    let stranger = lab.path().join("stranger");
    sh(&["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", stranger.to_str().unwrap()]).unwrap();
    lab.write_config(&[("stranger0", 0, &stranger)]);
    lab.trust_all();
    let out = run_ssh(&db, &lab, "command-env.toml", "stranger0", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stranger0") && err.contains("authentication as \"root\" failed"), "{err}");
    assert!(err.contains(stranger.to_str().unwrap()), "{err}");

    let runs = db.json(&["runs", "--json"]);
    assert_eq!(runs["runs"].as_array().unwrap().len(), 2, "refused launches record no run: {runs}");
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn an_unreachable_host_fails_the_launch_within_its_timeout_and_rolls_back_the_others() {
    if skip("an_unreachable_host_fails_the_launch_within_its_timeout_and_rolls_back_the_others") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    lab.link(1, false);
    let started = std::time::Instant::now();
    let out = run_ssh(&db, &lab, "command-env.toml", "node0,node1", &["--ranks-per-node", "1"]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("node1") && err.contains("cannot connect within 3 s"), "{err}");
    assert!(err.contains("nothing was left running"), "{err}");
    // Generous bound: 3 s connect timeout plus process start-up on a busy 2-core machine.
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
    // node0 was prepared (recipe uploaded) and rolled back: no run directory is left.
    let runs = lab.remote_dir().join("runs");
    let left: Vec<_> = std::fs::read_dir(&runs)
        .map(|d| {
            d.flatten()
                .flat_map(|r| std::fs::read_dir(r.path()).into_iter().flatten().flatten())
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left on the nodes: {left:?}");
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn hostile_recipe_values_reach_the_node_literally_and_run_nothing() {
    if skip("hostile_recipe_values_reach_the_node_literally_and_run_nothing") {
        return;
    }
    let lab = Lab::new(1);
    let db = Db::new();
    // cluster.libtorch (a directory that must exist on the node) carries the long hostile value;
    // cluster.remote_dir a short one, as Unix socket paths under it are limited to 108 bytes.
    // Relative canaries would land in the remote user's home, where the remote shell starts.
    let home = sh(&["sh", "-c", "cd ~root && pwd"]).unwrap().trim().to_string();
    let canary = lab.path().join("pwned");
    let c = canary.display();
    let lib = format!("lib 'sq' \"dq\" ;touch {c}1; $(touch {c}2) `touch {c}3` && touch {c}4 | x > {c}5 \\ $HOME");
    let libdir = lab.path().join(&lib);
    std::fs::create_dir_all(&libdir).unwrap();
    let weird = "r'\";$(touch fdpw1)`touch fdpw2`";
    let remote = lab.remote_dir().join(weird);
    let canaries: Vec<std::path::PathBuf> = (1..=5)
        .map(|i| lab.path().join(format!("pwned{i}")))
        .chain((1..=3).map(|i| std::path::Path::new(&home).join(format!("fdpw{i}"))))
        .collect();
    for f in &canaries {
        let _ = std::fs::remove_file(f);
    }
    let remote_set = format!("cluster.remote_dir={:?}", remote.display().to_string());
    let lib_set = format!("cluster.libtorch={:?}", libdir.display().to_string());
    let out = run_ssh(
        &db,
        &lab,
        "command-env.toml",
        "node0",
        &["--ranks-per-node", "1", "--set", &remote_set, "--set", &lib_set],
    );
    assert!(out.status.success(), "{}", text(&out));
    for f in &canaries {
        assert!(!f.exists(), "a recipe value ran a command: {} exists", f.display());
    }
    // It arrived literally: the binary and the run directory are under the weird path.
    assert!(remote.join("bin").is_dir(), "{}", remote.display());
    let runs: Vec<_> = std::fs::read_dir(remote.join("runs")).unwrap().flatten().collect();
    assert_eq!(runs.len(), 1);
    assert!(runs[0].path().join("node-0/spec.json").is_file());

    // A newline is refused before anything is sent anywhere.
    let nl = format!("cluster.remote_dir={:?}", format!("{}\ntouch fdpw3", lab.remote_dir().display()));
    let out = run_ssh(&db, &lab, "command-env.toml", "node0", &["--set", &nl]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster.remote_dir") && err.contains("control character"), "{err}");
    assert!(!canaries[7].exists());
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn doctor_checks_every_node_in_parallel_in_one_table() {
    if skip("doctor_checks_every_node_in_parallel_in_one_table") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    let remote = format!("cluster.remote_dir={:?}", lab.remote_dir().display().to_string());
    let out = ssh_cmd(&db, &lab, &["doctor", "--hosts", "node0,node1", "--set", &remote]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    let header = stdout.lines().next().unwrap();
    for col in ["HOST", "reach", "auth", "binary", "libtorch", "nvml", "gpus", "ports", "disk"] {
        assert!(header.contains(col), "{header}");
    }
    for host in ["node0", "node1"] {
        let row = stdout.lines().find(|l| l.starts_with(host)).unwrap_or_else(|| panic!("no row for {host}: {stdout}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[1..5], ["ok", "ok", "ok", "ok"], "reach, auth, binary, libtorch: {row}");
        assert_eq!(cells[7], "ok", "ports: {row}");
    }
    // An unreachable node fails its row, not the others.
    lab.link(1, false);
    let out = ssh_cmd(
        &db,
        &lab,
        &["doctor", "--hosts", "node0,node1", "--set", &remote, "--set", "cluster.connect_timeout_s=2"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().any(|l| l.starts_with("node1") && l.split_whitespace().nth(1) == Some("FAIL")), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("node0") && l.split_whitespace().nth(3) == Some("ok")), "{stdout}");
    assert!(stdout.contains("node1 reach: node1") && stdout.contains("cannot connect within 2 s"), "{stdout}");
    lab.assert_nothing_running();
}

#[test]
fn a_hang_on_the_second_node_is_named_with_its_host_and_kill_leaves_nothing_on_any_node() {
    if skip("a_hang_on_the_second_node_is_named_with_its_host_and_kill_leaves_nothing_on_any_node") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    // Rank 1 lives on node1; it sits in its data phase and never enters the next collective.
    let extra = [
        "--ranks-per-node",
        "1",
        "--set",
        "train.steps=400",
        "--set",
        "model.d_model=64",
        "--set",
        "model.context=32",
        "--set",
        "fault.kind=hang-before-collective",
        "--set",
        "fault.rank=1",
        "--set",
        "fault.step=4",
    ];
    let args = launch_args(&lab, "tiny-gpt.toml", "node0,node1", &extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = ssh_cmd(&db, &lab, &refs).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = stdout_lines(&mut child);
    let first = read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.trim_start_matches("run ").split(':').next().unwrap().to_string();
    let verdict = read_until(&mut lines, |l| l.starts_with(&format!("{id} verdict ")));
    assert!(verdict.contains("never-entered"), "{verdict}");

    let show = db.json(&["show", &id, "--json"]);
    let v = show["verdicts"].as_array().unwrap().iter().find(|v| v["kind"] == "never-entered").cloned();
    let v = v.unwrap_or_else(|| panic!("no never-entered verdict: {}", show["verdicts"]));
    let culprit = &v["culprits"][0];
    assert_eq!(culprit["rank"], 1, "{v}");
    assert_eq!(culprit["host"], "node1", "the culprit's host as the run names it: {v}");
    assert!(culprit["pid"].as_u64().is_some(), "{v}");
    assert_eq!(v["waiting"], serde_json::json!([0]), "{v}");

    let out = ssh_cmd(&db, &lab, &["kill", &id]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let end = read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(end.contains("killed"), "{end}");
    assert!(!child.wait().unwrap().success());
    db.finish();
    lab.assert_nothing_running();
}

/// A child that is killed and reaped when dropped, so a failed assertion leaves no process.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_launch_uses_the_ssh_context_of_the_client_that_asks_not_the_servers() {
    if skip("a_launch_uses_the_ssh_context_of_the_client_that_asks_not_the_servers") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    let homes = tempfile::Builder::new().prefix("fdh").tempdir_in("/tmp").unwrap();
    let (server_home, client_home) = (homes.path().join("server"), homes.path().join("client"));
    std::fs::create_dir_all(server_home.join(".ssh")).unwrap();
    std::fs::create_dir_all(client_home.join(".ssh")).unwrap();
    // The client's ~/.ssh/config has the host aliases; the server's home has none.
    std::fs::copy(lab.config_path(), client_home.join(".ssh/config")).unwrap();

    // A server started from an earlier login (another HOME, a dead agent socket), kept up.
    let mut server = Command::new(bin());
    server.arg("--db").arg(db.path()).arg("server").arg("--foreground");
    server.env("HOME", &server_home).env("SSH_AUTH_SOCK", server_home.join("dead-agent.sock"));
    server.env_remove("FLIGHTDECK_SSH_CONFIG").env("FLIGHTDECK_SERVER_IDLE_MS", "600000");
    let mut server = Reaped(server.stdout(std::process::Stdio::piped()).spawn().expect("starting the server"));
    // Its stdout stays open (read) for its whole life.
    let mut server_out = stdout_lines(&mut server.0);
    read_until(&mut server_out, |l| l == "ready");

    let args = launch_args(&lab, "tiny-gpt.toml", "node0,node1", &["--ranks-per-node", "1", "--set", "train.steps=24"]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut client = db.cmd(&refs);
    client.env("HOME", &client_home).env_remove("FLIGHTDECK_SSH_CONFIG").env_remove("SSH_AUTH_SOCK");
    let out = client.output().expect("running flightdeck");
    assert!(out.status.success(), "{}", text(&out));
    assert!(server.0.try_wait().unwrap().is_none(), "the first server served the launch");
    let id = db.json(&["runs", "--json"])["runs"][0]["id"].as_str().unwrap().to_string();
    let show = db.json(&["show", &id, "--json"]);
    assert_eq!(show["run"]["status"], "succeeded", "{}", show["run"]);
    assert_eq!(show["run"]["hosts"], serde_json::json!(["node0", "node1"]));

    drop(server);
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn a_two_node_run_opened_in_the_cockpit_mid_way_shows_every_step_of_every_rank_once() {
    use flightdeck::ui::effects::{Command as UiCommand, DataEvent};
    use flightdeck::ui::model::RunModel;
    if skip("a_two_node_run_opened_in_the_cockpit_mid_way_shows_every_step_of_every_rank_once") {
        return;
    }
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    // Under the cockpit's per-rank series cap (128 entries), so every step stays its own entry.
    let steps = 120u64;
    let extra = ["--ranks-per-node", "1", "--set", "train.steps=120"];
    let args = launch_args(&lab, "tiny-gpt.toml", "node0,node1", &extra);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut child = ssh_cmd(&db, &lab, &refs).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let mut lines = stdout_lines(&mut child);
    let first = read_until(&mut lines, |l| l.starts_with("run "));
    let id = first.trim_start_matches("run ").split(':').next().unwrap().to_string();
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 5));

    // The cockpit's own stream (ui::io), opened while the run trains: snapshot, then frames.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let model = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let mut link = flightdeck::ui::io::ServerLink::new(flightdeck::paths::DbPaths::new(db.path().into()), tx);
        link.handle(UiCommand::Open { run: id.clone() });
        let mut model: Option<RunModel> = None;
        while let Some(ev) = rx.recv().await {
            match ev {
                DataEvent::Snapshot(s) => model = Some(RunModel::from_snapshot(&s)),
                DataEvent::Frames { node, frames, .. } => {
                    model.as_mut().expect("the snapshot comes first").apply_frames(node as usize, &frames)
                }
                DataEvent::Ended { .. } => break,
                DataEvent::Error(e) | DataEvent::Done(e) => panic!("stream: {e}"),
                _ => {}
            }
        }
        model.expect("a snapshot")
    });
    // The stream's tasks (and their connections to the server) go with the runtime; the server
    // then has no client left and exits, which `finish` waits for.
    drop(rt);
    read_until(&mut lines, |l| l.starts_with(&format!("run {id} ")));
    assert!(child.wait().unwrap().success());
    let loss = &model.metrics["loss"];
    for rank in 0..2 {
        let seen: Vec<u64> = loss.per_rank[rank].entries().iter().map(|e| e.step).collect();
        assert_eq!(seen, (1..=steps).collect::<Vec<u64>>(), "rank {rank}: every step once");
    }
    assert!(loss.cross.entries().iter().all(|e| e.count == 2), "each step has both ranks exactly once");
    let started: Vec<&str> =
        model.events.iter().filter(|e| e.text.contains(") started on ")).map(|e| e.text.as_str()).collect();
    assert_eq!(started.len(), 2, "each rank's start once: {started:#?}");
    db.finish();
    lab.assert_nothing_running();
}

#[test]
fn an_unmodified_torch_distributed_program_spans_two_ssh_nodes() {
    if skip("an_unmodified_torch_distributed_program_spans_two_ssh_nodes") {
        return;
    }
    let Some(python) = venv_python() else {
        common::skipped(file!(), "the torch.distributed ranks: FD_VENV is not set (run through make test)");
        return;
    };
    let lab = Lab::new(2);
    lab.preinstall();
    let db = Db::new();
    let recipe_file = lab.path().join("ddp.toml");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/torch_ddp.py");
    // The lab's nodes share one hostname, which resolves to loopback: gloo is told the
    // interface (as on a cluster whose hostnames do not route, GLOO_SOCKET_IFNAME is the fix).
    let argv = ["env", "GLOO_SOCKET_IFNAME=eth0", python.to_str().unwrap(), script.to_str().unwrap()];
    command_recipe(&recipe_file, "ddp", &argv, 1);
    let out = run_ssh(&db, &lab, recipe_file.to_str().unwrap(), "node0,node1", &[]);
    let id = db.json(&["runs", "--json"])["runs"][0]["id"].as_str().unwrap().to_string();
    // Each node keeps its ranks' logs in its own run directory under the remote dir.
    let logs: String = walk_logs(&lab.remote_dir().join("runs").join(&id));
    assert!(out.status.success(), "{}\nevents: {:#?}\nlogs: {logs}", text(&out), events(&db, &id));
    let node0 = lab.hosts[0].addr.clone();
    for r in 0..2 {
        assert!(logs.contains(&format!("rank {r} of 2: sum 3 via {node0}:")), "rank {r}: {logs}");
    }
    db.finish();
    lab.assert_nothing_running();
}

/// Every rank log under `dir`, concatenated.
fn walk_logs(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.push_str(&walk_logs(&path));
        } else if path.extension().is_some_and(|e| e == "log") && path.to_string_lossy().contains("rank-") {
            out.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    out
}
