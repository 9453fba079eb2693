//! Starting a run's agents on every node at once, all or nothing.
//!
//! One thread per node, each owning its session for the whole launch: connect, trust,
//! authenticate, deploy, upload the recipe (all nodes in parallel); then node 0's agent starts
//! and reports the rendezvous port; then every other node's agent starts with it. If any node
//! fails at any point, every node that got something removes it again (agents are killed, run
//! directories deleted) and the launch fails naming each failed host and its reason.
use super::config::{self, Target};
use super::deploy::{self, Deployed, Layout};
use super::quote::quote;
use super::session::{self, Node};
use super::trust::Verdict;
use super::{Limits, SshError};
use crate::ids::RunId;
use crate::protocol::spec::{AgentSpec, ClientEnv, SAVE_GRACE_MS, STOP_GRACE_MS};
use crate::recipe::Recipe;
use serde::{Deserialize, Serialize};
use std::sync::mpsc;

/// One node's running agent: what the server needs to reach it again (kept in `nodes.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteAgent {
    pub index: usize,
    pub target: Target,
    pub layout: Layout,
    /// The node's run directory: spec, recipe, sockets, rank logs.
    pub run_dir: String,
    pub pid: u32,
    pub limits: Limits,
}

impl RemoteAgent {
    /// Where the agent listens, for the run record (`ssh://user@host:port/dir/agent.sock`).
    pub fn address(&self) -> String {
        let t = &self.target;
        format!("ssh://{}@{}:{}{}/agent.sock", t.user, t.hostname, t.port, self.run_dir)
    }
}

/// Why a launch failed: every failed host with its reason, and any cleanup that failed too.
#[derive(Debug, thiserror::Error)]
#[error("{}{}", failures.join("; "), if cleanup.is_empty() { "; nothing was left running".to_string() } else { format!("; cleanup failed, check by hand: {}", cleanup.join("; ")) })]
pub struct LaunchError {
    pub failures: Vec<String>,
    pub cleanup: Vec<String>,
}

/// Progress lines as the launch goes: (host as written, what happened).
pub type Notes<'a> = &'a (dyn Fn(&str, &str) + Sync);

/// Node 0's agent's ports: its rendezvous store, and the MASTER_PORT it chose for the program.
#[derive(Clone, Copy, Default)]
struct Ports {
    store: u16,
    program: u16,
}

enum Go {
    Start(Ports),
    Abort,
}

enum Report {
    Prepared,
    Started(Ports),
    Failed(String),
}

/// What a run needs on its nodes; built once, read by every node thread.
pub struct Plan<'a> {
    pub run: &'a RunId,
    pub recipe: &'a Recipe,
    pub recipe_json: &'a str,
    pub targets: Vec<Target>,
    pub limits: Limits,
    /// One per run, in every node's spec (`collective::auth`).
    pub secret: crate::collective::auth::RunSecret,
    /// A resume: the checkpoint each node restores, and where its copy comes from.
    pub carry: Option<super::carry::Carry>,
}

impl Plan<'_> {
    /// Resolves the hosts that get ranks (rank r on host r / ranks_per_node).
    pub fn new<'a>(
        run: &'a RunId,
        recipe: &'a Recipe,
        recipe_json: &'a str,
        ctx: &ClientEnv,
    ) -> Result<Plan<'a>, SshError> {
        let targets = targets(recipe, ctx)?;
        let secret = crate::collective::auth::RunSecret::generate().map_err(|e| SshError::Command {
            host: "local".into(),
            what: "drawing the run's secret".into(),
            detail: e.to_string(),
        })?;
        Ok(Plan {
            run,
            recipe,
            recipe_json,
            targets,
            limits: Limits::from_recipe(&recipe.cluster),
            secret,
            carry: None,
        })
    }

    fn spec(&self, k: usize, exe: &str, ports: Ports, resume_from: Option<String>) -> AgentSpec {
        let world = self.recipe.world_size();
        AgentSpec {
            run: self.run.clone(),
            node: self.targets[k].spec.clone(),
            ranks: AgentSpec::node_ranks(k as u32, self.recipe.cluster.ranks_per_node, world),
            world_size: world,
            // The first node's address as the launcher reached it: on a cluster network, how
            // the other nodes reach it too. Its agent binds the rendezvous store there.
            master_addr: self.targets[0].hostname.clone(),
            master_port: ports.store,
            program_port: ports.program,
            host_store: k == 0,
            recipe: self.recipe.clone(),
            exe: exe.into(),
            stop_grace_ms: STOP_GRACE_MS,
            save_grace_ms: SAVE_GRACE_MS,
            // Each node restores its own copy of a resume's checkpoint (`prepare` put it there).
            resume_from: resume_from.map(Into::into),
            // Refused at launch for SSH runs (`server::init`).
            init_from: None,
            secret: self.secret.clone(),
            listen_tcp: None,
        }
    }
}

/// The SSH targets of the hosts that get ranks (rank r on host r / ranks_per_node), resolved
/// through the asking client's SSH config.
pub fn targets(recipe: &Recipe, ctx: &ClientEnv) -> Result<Vec<Target>, SshError> {
    let rpn = recipe.cluster.ranks_per_node;
    let used = recipe.world_size().div_ceil(rpn) as usize;
    let mut targets = Vec::new();
    for spec in recipe.cluster.hosts.iter().take(used) {
        if spec == "local" {
            return Err(SshError::Command {
                host: "local".into(),
                what: "planning".into(),
                detail: "\"local\" cannot be mixed with SSH hosts in cluster.hosts; name this machine by its \
                         address (e.g. \"127.0.0.1\") to include it"
                    .into(),
            });
        }
        let explicit = recipe.cluster.ssh.ssh_config.as_deref().map(std::path::Path::new);
        targets.push(config::resolve(spec, explicit, ctx)?);
    }
    Ok(targets)
}

/// Launches the plan; Ok holds every node's agent, in host order.
pub fn launch(plan: &Plan, notes: Notes) -> Result<Vec<RemoteAgent>, LaunchError> {
    let n = plan.targets.len();
    let (report_tx, report_rx) = mpsc::channel::<(usize, Report)>();
    let mut go_txs = Vec::new();
    let mut fin_txs = Vec::new();
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for k in 0..n {
            let (go_tx, go_rx) = mpsc::channel::<Go>();
            let (fin_tx, fin_rx) = mpsc::channel::<bool>();
            go_txs.push(go_tx);
            fin_txs.push(fin_tx);
            let report = report_tx.clone();
            handles.push(s.spawn(move || node_thread(plan, k, notes, go_rx, fin_rx, report)));
        }
        let mut failures = Vec::new();
        let mut started = vec![false; n];
        let collect = |count: usize, failures: &mut Vec<String>, started: &mut Vec<bool>| -> Option<Ports> {
            let mut port = None;
            for _ in 0..count {
                match report_rx.recv() {
                    Ok((_, Report::Prepared)) => {}
                    Ok((k, Report::Started(p))) => {
                        started[k] = true;
                        port = Some(p);
                    }
                    Ok((_, Report::Failed(why))) => failures.push(why),
                    Err(_) => failures.push("a node thread ended without reporting".into()),
                }
            }
            port
        };
        collect(n, &mut failures, &mut started);
        if failures.is_empty() {
            let _ = go_txs[0].send(Go::Start(Ports::default()));
            let port = collect(1, &mut failures, &mut started);
            if failures.is_empty() {
                for tx in &go_txs[1..] {
                    let _ = tx.send(Go::Start(port.unwrap_or_default()));
                }
                collect(n - 1, &mut failures, &mut started);
            }
        }
        let ok = failures.is_empty();
        for (k, tx) in go_txs.iter().enumerate() {
            if !started[k] {
                let _ = tx.send(Go::Abort);
            }
        }
        for tx in &fin_txs {
            let _ = tx.send(ok);
        }
        let mut agents = Vec::new();
        let mut cleanup = Vec::new();
        for h in handles {
            match h.join() {
                Ok(Ok(Some(agent))) => agents.push(agent),
                Ok(Ok(None)) => {}
                Ok(Err(e)) => cleanup.push(e),
                Err(_) => cleanup.push("a node thread panicked".into()),
            }
        }
        if ok && agents.len() == n {
            Ok(agents)
        } else {
            Err(LaunchError { failures, cleanup })
        }
    })
}

/// One node's whole launch. Ok(Some) when committed; Ok(None) when rolled back cleanly;
/// Err(what could not be cleaned up).
fn node_thread(
    plan: &Plan,
    k: usize,
    notes: Notes,
    go: mpsc::Receiver<Go>,
    fin: mpsc::Receiver<bool>,
    report: mpsc::Sender<(usize, Report)>,
) -> Result<Option<RemoteAgent>, String> {
    let target = &plan.targets[k];
    let say = |text: &str| notes(&target.spec, text);
    let fail = |e: SshError| {
        say(&format!("failed: {e}"));
        let _ = report.send((k, Report::Failed(e.to_string())));
    };
    say("connecting");
    let node = match session::connect(target, &plan.limits) {
        Ok(node) => node,
        Err(e) => {
            fail(e);
            return Ok(None);
        }
    };
    let trust = match &node.verdict {
        Verdict::Known => "host key known".to_string(),
        Verdict::AcceptedNew(fp) => format!("new host key {fp} accepted and recorded"),
    };
    say(&format!("connected ({trust}; authenticated with {})", node.auth));
    let run_dir = match prepare(plan, k, &node, &say) {
        Ok(x) => x,
        Err((e, dir)) => {
            fail(e);
            return dir.map_or(Ok(None), |dir| remove(&node, &dir, None).map(|_| None));
        }
    };
    let _ = report.send((k, Report::Prepared));
    let (layout, dir, resume_from) = run_dir;
    let ports = match go.recv() {
        Ok(Go::Start(ports)) => ports,
        Ok(Go::Abort) | Err(_) => return remove(&node, &dir, None).map(|_| None),
    };
    let (pid, started) = match start(plan, k, &node, &layout, &dir, ports, resume_from) {
        Ok(x) => x,
        Err(e) => {
            fail(e);
            return remove(&node, &dir, None).map(|_| None);
        }
    };
    let ranks = AgentSpec::node_ranks(k as u32, plan.recipe.cluster.ranks_per_node, plan.recipe.world_size());
    say(&format!("agent started (pid {pid}, ranks on this node: {})", ranks.len()));
    let _ = report.send((k, Report::Started(started)));
    match fin.recv() {
        Ok(true) => Ok(Some(RemoteAgent {
            index: k,
            target: target.clone(),
            layout,
            run_dir: dir,
            pid,
            limits: plan.limits.clone(),
        })),
        _ => {
            say("rolling back: another node failed");
            remove(&node, &dir, Some(pid)).map(|_| None)
        }
    }
}

/// The node's layout, its run directory, and the checkpoint its ranks restore (a resume).
type Prepared = (Layout, String, Option<String>);

/// Probe, deploy, upload the recipe, and for a resume make the checkpoint readable on the node;
/// on failure, the run directory to remove if one exists.
fn prepare(plan: &Plan, k: usize, node: &Node, say: &dyn Fn(&str)) -> Result<Prepared, (SshError, Option<String>)> {
    let c = &plan.recipe.cluster;
    let layout = deploy::probe(node, &c.ssh.remote_dir, c.ssh.libtorch.as_deref()).map_err(|e| (e, None))?;
    let tag = format!("{}-{k}", plan.run);
    match deploy::deploy(node, &layout, &tag).map_err(|e| (e, None))? {
        Deployed::Present => say(&format!("binary present at {}", layout.exe)),
        Deployed::Uploaded { bytes } => {
            say(&format!("binary uploaded to {} ({:.1} MB, sha256 verified)", layout.exe, bytes as f64 / 1e6))
        }
    }
    let dir = format!("{}/runs/{}/node-{k}", layout.root, plan.run);
    let q = |v: &str| quote("the node's run directory", v).map_err(|e| (SshError::from(e), None));
    let cmd = format!("mkdir -p -- {} && cat > {}", q(&format!("{dir}/logs"))?, q(&format!("{dir}/recipe.json"))?);
    node.check("writing the recipe", &cmd, Some(plan.recipe_json.as_bytes())).map_err(|e| (e, Some(dir.clone())))?;
    let resume_from = match plan.carry.as_ref().and_then(|c| c.sources.get(k).map(|s| (c, s))) {
        None => None,
        Some((_, super::carry::Source::InPlace { path })) => {
            say(&format!(
                "resumes from checkpoint step {} on this node ({path})",
                plan.carry.as_ref().map_or(0, |c| c.step)
            ));
            Some(path.clone())
        }
        Some((carry, super::carry::Source::Copy { from, limits, dir: src })) => {
            let dest = format!("{dir}/resume/{}", crate::store::checkpoints::disk::step_dir_name(carry.step));
            let fail = |e: SshError| (e, Some(dir.clone()));
            say(&format!("copying checkpoint step {} from {}", carry.step, from.spec));
            let source = session::connect(from, limits).map_err(fail)?;
            let bytes = super::carry::copy(&source, src, node, &dest, &carry.manifest).map_err(fail)?;
            say(&format!(
                "checkpoint step {} copied from {} ({:.1} MB, sha256 verified in transit) to {dest}",
                carry.step,
                from.spec,
                bytes as f64 / 1e6
            ));
            Some(dest)
        }
    };
    Ok((layout, dir, resume_from))
}

/// Writes the node's spec and starts its agent detached; returns the agent's pid and ports (the
/// store's and the program's, from the node hosting the store).
fn start(
    plan: &Plan,
    k: usize,
    node: &Node,
    layout: &Layout,
    dir: &str,
    ports: Ports,
    resume_from: Option<String>,
) -> Result<(u32, Ports), SshError> {
    let spec = serde_json::to_vec_pretty(&plan.spec(k, &layout.exe, ports, resume_from))
        .map_err(|e| SshError::Command { host: node.host(), what: "writing the spec".into(), detail: e.to_string() })?;
    let spec_path = quote("the spec path", &format!("{dir}/spec.json"))?;
    let cmd = format!(
        "cat > {spec_path} && {}",
        layout.command(&[("", "agent"), ("", "start"), ("", "--run-dir"), ("the node's run directory", dir)])?
    );
    let out = node.check("starting the agent", &cmd, Some(&spec))?;
    let ready = out.lines().find_map(|l| l.strip_prefix("ready ")).unwrap_or("");
    let mut words = ready.split_whitespace();
    let pid = words.next().and_then(|w| w.parse::<u32>().ok());
    let store = words.next().and_then(|w| w.parse::<u16>().ok());
    let program = words.next().and_then(|w| w.parse::<u16>().ok());
    match (pid, store, program) {
        (Some(pid), Some(store), Some(program)) => Ok((pid, Ports { store, program })),
        _ => Err(SshError::Command {
            host: node.host(),
            what: "starting the agent".into(),
            detail: format!("expected `ready PID STORE_PORT PROGRAM_PORT`, got {:?}", out.trim()),
        }),
    }
}

/// Kills the agent (when `pid` is known and still this run's) and deletes the run directory.
fn remove(node: &Node, dir: &str, pid: Option<u32>) -> Result<(), String> {
    let qdir = quote("the node's run directory", dir).map_err(|e| e.to_string())?;
    let mut cmd = String::new();
    if let Some(pid) = pid {
        // Only if that pid is still this run's agent (its command line names the run directory).
        // Its ranks die with it (PR_SET_PDEATHSIG).
        cmd.push_str(&format!(
            "if tr '\\0' ' ' < /proc/{pid}/cmdline 2>/dev/null | grep -qF -- {qdir}; then kill -KILL {pid}; fi; "
        ));
    }
    cmd.push_str(&format!("rm -rf -- {qdir}"));
    node.check("rolling back", &cmd, None).map(|_| ()).map_err(|e| e.to_string())
}

/// Kills already launched agents (used when the server cannot attach after a launch).
pub fn kill(agents: &[RemoteAgent]) -> Vec<String> {
    super::fanout::each(agents.len(), |i| {
        let a = &agents[i];
        session::connect(&a.target, &a.limits)
            .map_err(|e| e.to_string())
            .and_then(|node| remove(&node, &a.run_dir, Some(a.pid)))
            .err()
    })
    .into_iter()
    .flatten()
    .collect()
}
