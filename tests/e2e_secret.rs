//! The run's secret on its TCP ports (docs/security.md): strangers on a live run's store and
//! ring listeners are refused, named in its events, and change nothing of its training.
mod common;
mod ssh_support;
use common::*;
use flightdeck::collective::auth::{self, Gate, Purpose, RunSecret, CHALLENGE_BYTES, PROOF_BYTES};
use flightdeck::collective::rendezvous::StoreClient;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const TINY: &str = "tiny-gpt.toml";
const STEPS: &str = "train.steps=20";
/// Not a timing assertion: a run that never shows its events fails instead of hanging CI.
const GUARD: Duration = Duration::from_secs(300);

fn losses(db: &Db, run: &str) -> BTreeMap<(u64, u32), u64> {
    let out = db.run(&["metrics", run, "--key", "loss", "--format", "csv"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    csv_rows(&String::from_utf8_lossy(&out.stdout)).into_iter().map(|(s, r, v)| ((s, r), v.to_bits())).collect()
}

fn run_ids(db: &Db) -> Vec<String> {
    let runs = db.json(&["runs", "--json"]);
    runs["runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect()
}

/// Polls `until` (a file appearing, an event landing) up to the guard.
fn wait_for<T>(what: &str, mut until: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + GUARD;
    loop {
        if let Some(t) = until() {
            return t;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Strangers on `addr`: one with no secret (the port's plain protocol at once), one with a
/// wrong secret, and one replaying the genuine answer recorded from a fourth connection (which
/// hangs up before it answers). Returns the four addresses; each is over when this returns.
fn knock(addr: &str, secret: &RunSecret, purpose: Purpose, plain: &[u8]) -> Vec<String> {
    let mut from = Vec::new();
    let mut no_secret = TcpStream::connect(addr).unwrap();
    from.push(no_secret.local_addr().unwrap().to_string());
    no_secret.write_all(plain).unwrap();
    no_secret.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    let _ = no_secret.read_to_end(&mut got);
    assert!(got.len() <= CHALLENGE_BYTES, "a client without the secret got an answer: {got:?}");

    let mut wrong = TcpStream::connect(addr).unwrap();
    from.push(wrong.local_addr().unwrap().to_string());
    let err = auth::dial(&mut wrong, &RunSecret::generate().unwrap(), purpose);
    assert!(err.is_err(), "a wrong secret passed the handshake");

    // A genuine answer, recorded (an eavesdropper's copy), then the connection dropped.
    let mut genuine = TcpStream::connect(addr).unwrap();
    from.push(genuine.local_addr().unwrap().to_string());
    let mut challenge = [0u8; CHALLENGE_BYTES];
    genuine.read_exact(&mut challenge).unwrap();
    let answer = auth::Answer::new(secret, purpose, &challenge).unwrap().bytes;
    drop(genuine);
    let mut replay = TcpStream::connect(addr).unwrap();
    from.push(replay.local_addr().unwrap().to_string());
    replay.read_exact(&mut challenge).unwrap();
    replay.write_all(&answer).unwrap();
    let mut proof = Vec::new();
    let _ = replay.read_to_end(&mut proof);
    assert!(proof.len() < PROOF_BYTES, "the replayed answer was accepted: {proof:?}");
    from
}

/// The refused events of a run: (rank, text).
fn refusals(db: &Db, id: &str) -> Vec<(Option<u64>, String)> {
    let show = db.json(&["show", id, "--json"]);
    show["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "refused")
        .map(|e| (e["rank"].as_u64(), e["text"].as_str().unwrap().to_string()))
        .collect()
}

#[test]
fn strangers_on_a_live_runs_store_and_ring_are_refused_named_and_change_no_loss() {
    let db = Db::new();
    let recipe = recipe(TINY);
    let recipe = recipe.to_str().unwrap();
    let calm = db.run(&["run", recipe, "--headless", "--ranks-per-node", "2", "--set", STEPS]);
    assert!(calm.status.success(), "{}", String::from_utf8_lossy(&calm.stderr));
    let calm_id = run_ids(&db).pop().unwrap();

    // Rank 1 joins the ring only when told, so rank 0's listener is open while we knock.
    let sets = ["--set", STEPS, "--set", "fault.kind=hold-join", "--set", "fault.rank=1"];
    let child = db.spawn(&[&["run", recipe, "--headless", "--ranks-per-node", "2"][..], &sets[..]].concat());
    let id = wait_for("the second run", || run_ids(&db).into_iter().find(|r| *r != calm_id));
    let dir = db.path().join("runs").join(&id);
    let ports = wait_for("the store's port file", || std::fs::read_to_string(dir.join("rendezvous.port")).ok());
    let store_addr = format!("127.0.0.1:{}", ports.split_whitespace().next().unwrap());
    // The test is the run's own user: it may read the secret, as the ranks do.
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("spec.json")).unwrap()).unwrap();
    let secret = RunSecret::from_hex(spec["secret"].as_str().unwrap()).unwrap();
    let gate = Gate::new(secret.clone(), std::sync::Arc::new(|_| {}));

    let key = b"ring/rank0/addr";
    let get = [&[2u8][..], &(key.len() as u32).to_le_bytes(), key, &0u64.to_le_bytes()].concat();
    let plain_get = [&(get.len() as u32).to_le_bytes()[..], &get].concat();
    let mut strangers = knock(&store_addr, &secret, Purpose::Store, &plain_get);
    let mut own = StoreClient::connect(&store_addr, &gate, GUARD).unwrap();
    let ring0 = String::from_utf8(own.get("ring/rank0/addr", GUARD).unwrap()).unwrap();
    let hello = [&b"FDRING01"[..], &1u32.to_le_bytes(), &2u32.to_le_bytes()].concat();
    strangers.extend(knock(&ring0, &secret, Purpose::Ring, &hello));

    // Every stranger is an event naming its address, before rank 1 even joins.
    let seen = wait_for("eight refused events", || Some(refusals(&db, &id)).filter(|r| r.len() >= strangers.len()));
    for peer in &strangers {
        assert!(seen.iter().any(|(_, text)| text.contains(&format!("from {peer}:"))), "{peer} not named: {seen:?}");
    }
    assert_eq!(seen.iter().filter(|(rank, t)| rank.is_none() && t.starts_with("store refused")).count(), 4);
    assert_eq!(
        seen.iter().filter(|(rank, t)| *rank == Some(0) && t.starts_with("ring listener of rank 0 refused")).count(),
        4,
        "{seen:?}"
    );
    assert!(seen.iter().any(|(_, t)| t.contains("does not hold this run's secret")), "{seen:?}");

    own.set("fault/release", b"go").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stderr), run_logs(&db));
    let show = db.json(&["show", &id, "--json"]);
    assert_eq!(show["run"]["status"], "succeeded");
    let (calm_losses, losses) = (losses(&db, &calm_id), losses(&db, &id));
    assert_eq!(calm_losses.len(), 40, "20 steps of 2 ranks");
    assert_eq!(losses, calm_losses, "the knocked-on run's losses are bit-equal to the calm run's");
    db.finish();
}

/// `flightdeck run` on the lab's nodes: its SSH config, its remote dir, short timeouts.
fn ssh_run(db: &Db, lab: &ssh_support::Lab, name: &str, extra: &[&str]) -> std::process::Child {
    let recipe = recipe(TINY);
    let remote = format!("cluster.remote_dir={:?}", lab.remote_dir().display().to_string());
    let mut args = vec!["run", recipe.to_str().unwrap(), "--headless", "--hosts", "node0,node1", "--name", name];
    args.extend(["--set", &remote, "--set", "cluster.connect_timeout_s=3", "--set", "cluster.command_timeout_s=30"]);
    args.extend(extra);
    let mut cmd = db.cmd(&args);
    cmd.env("FLIGHTDECK_SSH_CONFIG", lab.config_path()).env_remove("SSH_AUTH_SOCK");
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("flightdeck run")
}

#[test]
fn strangers_on_the_network_are_refused_by_two_ssh_nodes_whose_run_directories_are_owner_only() {
    if ssh_support::skip("strangers_on_the_network_are_refused_by_two_ssh_nodes_whose_run_directories_are_owner_only") {
        return;
    }
    let db = Db::new();
    let recipe = recipe(TINY);
    let calm = db.run(&["run", recipe.to_str().unwrap(), "--headless", "--ranks-per-node", "2", "--set", STEPS]);
    assert!(calm.status.success(), "{}", String::from_utf8_lossy(&calm.stderr));
    let calm_id = run_ids(&db).pop().unwrap();
    for umask in [0o022, 0o000] {
        // The nodes' sshd, and so every command the launcher runs there, under this umask.
        let lab = ssh_support::Lab::with_umask(2, Some(umask));
        let name = format!("ssh-umask-{umask:03o}");
        let sets = ["--ranks-per-node", "1", "--set", STEPS, "--set", "fault.kind=hold-join", "--set", "fault.rank=1"];
        let child = ssh_run(&db, &lab, &name, &sets);
        let id = wait_for("the SSH run", || {
            let out = db.run(&["show", &name, "--json"]);
            out.status.success().then(|| serde_json::from_slice::<serde_json::Value>(&out.stdout).ok()).flatten()
        })["run"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let node0 = lab.remote_dir().join("runs").join(&id).join("node-0");
        let ports = wait_for("node 0's port file", || std::fs::read_to_string(node0.join("rendezvous.port")).ok());
        let store_addr = format!("{}:{}", lab.hosts[0].addr, ports.split_whitespace().next().unwrap());
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(node0.join("spec.json")).unwrap()).unwrap();
        let secret = RunSecret::from_hex(spec["secret"].as_str().unwrap()).unwrap();
        let gate = Gate::new(secret.clone(), std::sync::Arc::new(|_| {}));

        // From this machine's namespace: another host on the cluster network.
        let mut strangers = knock(&store_addr, &secret, Purpose::Store, b"\x04\x00\x00\x00junk");
        let mut own = StoreClient::connect(&store_addr, &gate, GUARD).unwrap();
        let ring0 = String::from_utf8(own.get("ring/rank0/addr", GUARD).unwrap()).unwrap();
        assert!(ring0.starts_with(&lab.hosts[0].addr), "rank 0 listens on node 0: {ring0}");
        let hello = [&b"FDRING01"[..], &1u32.to_le_bytes(), &2u32.to_le_bytes()].concat();
        strangers.extend(knock(&ring0, &secret, Purpose::Ring, &hello));
        let seen = wait_for("eight refused events", || Some(refusals(&db, &id)).filter(|r| r.len() >= strangers.len()));
        for peer in &strangers {
            assert!(seen.iter().any(|(_, t)| t.contains(&format!("from {peer}:"))), "{peer} not named: {seen:?}");
        }
        // Mid-run, with the secret on disk: nothing on either node is open to others.
        let open = open_to_others(&lab.remote_dir());
        assert!(open.is_empty(), "under the nodes' umask {umask:03o}, open to others mid-run: {open:#?}");

        own.set("fault/release", b"go").unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}\n{}", String::from_utf8_lossy(&out.stderr), run_logs(&db));
        let (calm_losses, losses) = (losses(&db, &calm_id), losses(&db, &id));
        assert_eq!(losses, calm_losses, "two knocked-on SSH nodes train bit-equal to two calm local ranks");
        let open = open_to_others(&lab.remote_dir());
        assert!(open.is_empty(), "under the nodes' umask {umask:03o}, open to others after the run: {open:#?}");
        assert!(node0.join("logs").is_dir(), "the node's run directory is kept, with its logs");
        lab.assert_nothing_running();
    }
    let open = open_to_others(db.path());
    assert!(open.is_empty(), "the database, open to others: {open:#?}");
    db.finish();
}

#[test]
fn a_live_runs_agent_and_telemetry_sockets_refuse_another_user_and_say_so() {
    let Some(other) = ThrowawayUser::make(file!()) else { return };
    let db = Db::new();
    let recipe = recipe(TINY);
    let mut child = db.spawn(&[
        "run",
        recipe.to_str().unwrap(),
        "--headless",
        "--ranks-per-node",
        "2",
        "--set",
        "train.steps=1000000",
    ]);
    let mut lines = stdout_lines(&mut child);
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= 1));
    let id = run_ids(&db).pop().unwrap();
    // Every directory on the way left open and both sockets open to all, as a database on a
    // badly set up shared filesystem would be: only SO_PEERCRED stands in the way.
    use std::os::unix::fs::PermissionsExt;
    let dir = db.path().join("runs").join(&id);
    for d in [db.path().to_path_buf(), db.path().join("runs"), dir.clone()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for socket in ["agent.sock", "telemetry.sock"] {
        std::fs::set_permissions(dir.join(socket), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(other.probe_socket(&dir.join(socket)), "closed", "{socket}");
    }
    let seen = wait_for("two refused events", || Some(refusals(&db, &id)).filter(|r| r.len() >= 2));
    for listener in ["agent socket", "telemetry socket"] {
        assert!(
            seen.iter().any(|(_, t)| t.starts_with(&format!("{listener} refused a connection from uid "))
                && t.contains("another user")),
            "{listener}: {seen:?}"
        );
    }
    // The run goes on, its link to the server untouched, and stops when asked.
    let sent = progress_step(&read_until(&mut lines, |l| progress_step(l).is_some())).unwrap();
    read_until(&mut lines, |l| progress_step(l).is_some_and(|s| s >= sent + 2));
    assert!(db.run(&["stop", &id]).status.success());
    assert_eq!(child.wait().unwrap().code(), Some(3), "a run stopped on request exits 3");
    db.finish();
}
