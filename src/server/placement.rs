//! Where a run's agents start: on this machine, or on SSH hosts (and the Slurm placement that a
//! later issue adds). Everything above this (the record, the events, the link, the tracker) is
//! one path in `launch.rs`; a placement only starts agents, says how to reach them, and takes
//! them down again when the launch cannot go on.
use super::transport::Transport;
use crate::ids::{Rank, RunId};
use crate::paths::{DbPaths, RunDirPaths};
use crate::protocol::spec::{AgentSpec, SshContext, SAVE_GRACE_MS, STOP_GRACE_MS};
use crate::recipe::Recipe;
use crate::ssh::launch::{self as ssh_launch, Plan, RemoteAgent};
use anyhow::Context;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Where a launch reports each host's progress: (host as written, what happened). Bounded by
/// the client handler; a full channel drops a line rather than wait.
pub type Progress = Option<mpsc::Sender<(String, String)>>;

/// Where a run's agents run.
#[derive(Clone, Debug)]
pub enum Placement {
    /// One agent on this machine, beside the server.
    Local,
    /// One agent per host of `cluster.hosts`, started over SSH in the asking client's SSH
    /// environment.
    Ssh(SshContext),
}

/// Agents that started, one per node, in node order.
pub struct Started {
    /// Each node's name as the run's records show it.
    pub hosts: Vec<String>,
    /// Where each node's agent listens (for the run record).
    pub agent_sockets: Vec<String>,
    pub transports: Vec<Transport>,
    /// Where the run went, for the run's first event: "on local", or "over SSH" and then, after
    /// the rank count, each host with its agent's pid.
    pub place: &'static str,
    pub nodes_text: String,
    /// The SSH nodes, to take down again if the launch cannot go on.
    remote: Vec<RemoteAgent>,
}

impl Placement {
    pub fn of(recipe: &Recipe, ssh: SshContext) -> Placement {
        if recipe.is_local() {
            Placement::Local
        } else {
            Placement::Ssh(ssh)
        }
    }

    /// Starts the run's agents (all or none). `dir` exists and holds `recipe.json`.
    pub async fn start(
        &self,
        db: &DbPaths,
        run: &RunId,
        recipe: &Recipe,
        recipe_json: &str,
        from: StartFrom,
        progress: Progress,
    ) -> anyhow::Result<Started> {
        match self {
            Placement::Local => start_local(db, run, recipe, from).await,
            Placement::Ssh(ctx) => start_ssh(db, run, recipe, recipe_json, ctx.clone(), progress).await,
        }
    }

    /// Takes down what `start` started (the launch failed after it); returns what could not be.
    pub async fn abandon(&self, started: Started) -> Vec<String> {
        match self {
            // The local agent ends by itself once no server comes: its ranks exit with it.
            Placement::Local => Vec::new(),
            Placement::Ssh(_) => {
                let remote = started.remote;
                tokio::task::spawn_blocking(move || ssh_launch::kill(&remote)).await.unwrap_or_default()
            }
        }
    }
}

/// The checkpoints a run's ranks start from: a resume's whole state, or `[init]`'s weights.
#[derive(Clone, Debug, Default)]
pub struct StartFrom {
    pub resume: Option<PathBuf>,
    pub init: Option<PathBuf>,
}

async fn start_local(db: &DbPaths, run: &RunId, recipe: &Recipe, from: StartFrom) -> anyhow::Result<Started> {
    let paths = RunDirPaths::new(db.run_dir(run));
    let world = recipe.world_size();
    let spec = AgentSpec {
        run: run.clone(),
        node: "local".into(),
        ranks: (0..world).map(|r| (Rank(r), r)).collect(),
        world_size: world,
        master_addr: "127.0.0.1".into(),
        master_port: 0,
        program_port: 0,
        host_store: true,
        exe: std::env::current_exe().context("locating the flightdeck executable")?,
        recipe: recipe.clone(),
        stop_grace_ms: STOP_GRACE_MS,
        save_grace_ms: SAVE_GRACE_MS,
        resume_from: from.resume,
        init_from: from.init,
        secret: crate::collective::auth::RunSecret::generate().context("drawing the run's secret")?,
    };
    std::fs::write(paths.spec(), serde_json::to_vec_pretty(&spec)?)?;
    tokio::task::spawn_blocking({
        let paths = paths.clone();
        move || start_agent(&paths)
    })
    .await??;
    let socket = paths.agent_socket();
    Ok(Started {
        hosts: vec!["local".into()],
        agent_sockets: vec![socket.display().to_string()],
        transports: vec![Transport::Local(socket)],
        place: "on local",
        nodes_text: String::new(),
        remote: Vec::new(),
    })
}

/// Starts `flightdeck agent` in its own session and waits for its "ready" line.
fn start_agent(paths: &RunDirPaths) -> anyhow::Result<()> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("agent").arg("--run-dir").arg(&paths.root);
    if !crate::detach::spawn_until_ready(cmd, &paths.agent_log()).context("starting the agent")? {
        let log = paths.agent_log();
        anyhow::bail!(
            "the agent failed to start: it exited before it was ready; {}: {}",
            log.display(),
            crate::detach::log_tail(&log, 5)
        );
    }
    Ok(())
}

async fn start_ssh(
    db: &DbPaths,
    run: &RunId,
    recipe: &Recipe,
    recipe_json: &str,
    ctx: SshContext,
    progress: Progress,
) -> anyhow::Result<Started> {
    let launched = tokio::task::spawn_blocking({
        let (run, recipe, json) = (run.clone(), recipe.clone(), recipe_json.to_string());
        move || -> anyhow::Result<Vec<RemoteAgent>> {
            let plan = Plan::new(&run, &recipe, &json, &ctx)?;
            let notes = |host: &str, text: &str| {
                tracing::info!("launch {run} {host}: {text}");
                if let Some(tx) = &progress {
                    // Never wait on a slow client: a dropped progress line loses nothing durable.
                    let _ = tx.try_send((host.to_string(), text.to_string()));
                }
            };
            Ok(ssh_launch::launch(&plan, &notes)?)
        }
    })
    .await??;
    std::fs::write(nodes_file(db, run), serde_json::to_vec_pretty(&launched)?)?;
    let where_: Vec<String> = launched.iter().map(|a| format!("{} (agent pid {})", a.target.spec, a.pid)).collect();
    Ok(Started {
        hosts: launched.iter().map(|a| a.target.spec.clone()).collect(),
        agent_sockets: launched.iter().map(RemoteAgent::address).collect(),
        transports: launched.iter().cloned().map(|a| Transport::Ssh(Arc::new(a))).collect(),
        place: "over SSH",
        nodes_text: format!(" on {}", where_.join(", ")),
        remote: launched,
    })
}

/// Where an SSH run keeps its nodes' agents, in the database's run directory.
fn nodes_file(db: &DbPaths, run: &RunId) -> PathBuf {
    db.run_dir(run).join("nodes.json")
}

/// How to reach each node of a recorded run again (after a server restart): SSH when it has
/// `nodes.json`, else its local agent sockets.
pub fn transports(db: &DbPaths, record: &crate::store::RunRecord) -> anyhow::Result<Vec<Transport>> {
    let file = nodes_file(db, &record.id);
    if !file.is_file() {
        return Ok(record.agent_sockets.iter().map(|s| Transport::Local(PathBuf::from(s))).collect());
    }
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let agents: Vec<RemoteAgent> =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?;
    Ok(agents.into_iter().map(|a| Transport::Ssh(Arc::new(a))).collect())
}
