//! Where a run's agents start: on this machine, on SSH hosts, or on the nodes of a Slurm
//! allocation. Everything above this (the record, the events, the link, the tracker) is
//! one path in `launch.rs`; a placement only starts agents, says how to reach them, and takes
//! them down again when the launch cannot go on.
use super::transport::{TcpAgent, Transport};
use crate::ids::RunId;
use crate::paths::{DbPaths, RunDirPaths};
use crate::protocol::spec::{AgentSpec, ClientEnv, SAVE_GRACE_MS, STOP_GRACE_MS};
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
    Ssh(ClientEnv),
    /// One agent per node of a Slurm allocation, started by `srun` in the asking client's Slurm
    /// environment, reached over TCP.
    Slurm(crate::slurm::Slurm),
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
    /// The Slurm allocation, likewise.
    slurm: Option<SlurmNodes>,
}

/// A Slurm run's nodes: how to reach them again after a server restart, and what to cancel
/// when the run ends (`slurm.json` in the run directory: it holds the run secret, and is
/// private like everything Flightdeck writes).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SlurmNodes {
    pub slurm: crate::slurm::Slurm,
    pub allocation: crate::slurm::alloc::Allocation,
    pub agents: Vec<TcpAgent>,
    /// `cluster.remote_dir`: where on the nodes the run directories are.
    #[serde(default)]
    pub remote_dir: Option<String>,
    /// `cluster.grace_s`: how long before the limit Slurm warns.
    #[serde(default)]
    pub grace_s: u64,
}

impl Placement {
    pub fn of(recipe: &Recipe, env: ClientEnv) -> Placement {
        if recipe.is_slurm() {
            Placement::Slurm(crate::slurm::Slurm::of(&env))
        } else if recipe.is_local() {
            Placement::Local
        } else {
            Placement::Ssh(env)
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
            Placement::Ssh(ctx) => start_ssh(db, run, recipe, recipe_json, ctx.clone(), from.carry, progress).await,
            Placement::Slurm(slurm) => start_slurm(db, run, recipe, slurm.clone(), from, progress).await,
        }
    }

    /// Takes down what `start` started (the launch failed after it); returns what could not be.
    pub async fn abandon(&self, run: &RunId, started: Started) -> Vec<String> {
        match self {
            // The local agent ends by itself once no server comes: its ranks exit with it.
            Placement::Local => Vec::new(),
            Placement::Ssh(_) => {
                let remote = started.remote;
                tokio::task::spawn_blocking(move || ssh_launch::kill(&remote)).await.unwrap_or_default()
            }
            Placement::Slurm(_) => match started.slurm {
                Some(nodes) => {
                    let run = run.clone();
                    tokio::task::spawn_blocking(move || release(&nodes, &run, false)).await.unwrap_or_default()
                }
                None => Vec::new(),
            },
        }
    }
}

/// The checkpoints a run's ranks start from: a resume's whole state, or `[init]`'s weights.
#[derive(Clone, Debug, Default)]
pub struct StartFrom {
    pub resume: Option<PathBuf>,
    pub init: Option<PathBuf>,
    /// A resume over SSH: each node's own copy of the checkpoint (in place or carried there).
    pub carry: Option<crate::ssh::carry::Carry>,
}

async fn start_local(db: &DbPaths, run: &RunId, recipe: &Recipe, from: StartFrom) -> anyhow::Result<Started> {
    let paths = RunDirPaths::new(db.run_dir(run));
    let world = recipe.world_size();
    let spec = AgentSpec {
        node: "local".into(),
        ranks: AgentSpec::node_ranks(0, world, world),
        host_store: true,
        ..run_spec(run, recipe, "127.0.0.1", from)?
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
        slurm: None,
    })
}

/// The spec every node of a run shares, with a fresh run secret; no node's part yet (its name,
/// ranks, and whether it hosts the store).
fn run_spec(run: &RunId, recipe: &Recipe, master_addr: &str, from: StartFrom) -> anyhow::Result<AgentSpec> {
    Ok(AgentSpec {
        run: run.clone(),
        node: String::new(),
        ranks: Vec::new(),
        world_size: recipe.world_size(),
        master_addr: master_addr.into(),
        master_port: 0,
        program_port: 0,
        host_store: false,
        exe: std::env::current_exe().context("locating the flightdeck executable")?,
        recipe: recipe.clone(),
        stop_grace_ms: STOP_GRACE_MS,
        save_grace_ms: SAVE_GRACE_MS,
        resume_from: from.resume,
        init_from: from.init,
        secret: crate::collective::auth::RunSecret::generate().context("drawing the run's secret")?,
        listen_tcp: None,
    })
}

/// Starts `flightdeck agent` in its own session and waits for its "ready" line.
fn start_agent(paths: &RunDirPaths) -> anyhow::Result<()> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("agent").arg("--run-dir").arg(&paths.root);
    if crate::detach::spawn_until_ready(cmd, &paths.agent_log()).context("starting the agent")?
        != crate::detach::Ready::Yes
    {
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
    ctx: ClientEnv,
    carry: Option<crate::ssh::carry::Carry>,
    progress: Progress,
) -> anyhow::Result<Started> {
    let env = ctx.clone();
    let launched = tokio::task::spawn_blocking({
        let (run, recipe, json) = (run.clone(), recipe.clone(), recipe_json.to_string());
        move || -> anyhow::Result<Vec<RemoteAgent>> {
            let mut plan = Plan::new(&run, &recipe, &json, &ctx)?;
            plan.carry = carry;
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
    // The asking client's SSH environment, for recovery's restarts (no client asks those).
    std::fs::write(ssh_env_file(db, run), serde_json::to_vec_pretty(&env)?)?;
    let where_: Vec<String> = launched.iter().map(|a| format!("{} (agent pid {})", a.target.spec, a.pid)).collect();
    Ok(Started {
        hosts: launched.iter().map(|a| a.target.spec.clone()).collect(),
        agent_sockets: launched.iter().map(RemoteAgent::address).collect(),
        transports: launched.iter().cloned().map(|a| Transport::Ssh(Arc::new(a))).collect(),
        place: "over SSH",
        nodes_text: format!(" on {}", where_.join(", ")),
        remote: launched,
        slurm: None,
    })
}

async fn start_slurm(
    db: &DbPaths,
    run: &RunId,
    recipe: &Recipe,
    slurm: crate::slurm::Slurm,
    from: StartFrom,
    progress: Progress,
) -> anyhow::Result<Started> {
    let dir = db.run_dir(run);
    let nodes = tokio::task::spawn_blocking({
        let (run, recipe) = (run.clone(), recipe.clone());
        move || -> anyhow::Result<SlurmNodes> {
            let (remote_dir, grace_s) = (recipe.cluster.ssh.remote_dir.clone(), recipe.cluster.slurm.grace_s);
            let notes = |text: &str| {
                tracing::info!("launch {run}: {text}");
                if let Some(tx) = &progress {
                    let _ = tx.try_send(("slurm".to_string(), text.to_string()));
                }
            };
            let allocation = crate::slurm::alloc::obtain(&slurm, &recipe, &run, &dir, &notes)?;
            notes(&format!("Slurm job {} runs on {}", allocation.job, allocation.nodes.join(", ")));
            match start_slurm_agents(&slurm, &allocation, &run, &recipe, &dir, from, &notes) {
                Ok(agents) => Ok(SlurmNodes { slurm, allocation, agents, remote_dir: Some(remote_dir), grace_s }),
                Err(e) => {
                    let nodes = SlurmNodes { slurm, allocation, agents: Vec::new(), remote_dir: None, grace_s };
                    let left = release(&nodes, &run, false);
                    if left.is_empty() {
                        Err(e)
                    } else {
                        Err(anyhow::anyhow!("{e}; cleanup failed, check by hand: {}", left.join("; ")))
                    }
                }
            }
        }
    })
    .await??;
    let file = slurm_file(db, run);
    std::fs::write(&file, serde_json::to_vec_pretty(&nodes)?).with_context(|| format!("writing {}", file.display()))?;
    let a = &nodes.allocation;
    let where_: Vec<String> = a.nodes.iter().zip(&a.addrs).map(|(n, addr)| format!("{n} ({addr})")).collect();
    Ok(Started {
        hosts: a.nodes.clone(),
        agent_sockets: nodes.agents.iter().map(|t| format!("tcp://{}", t.addr)).collect(),
        transports: nodes.agents.iter().cloned().map(|t| Transport::Tcp(Arc::new(t))).collect(),
        place: "through Slurm",
        nodes_text: format!(" in job {} on {}", a.job, where_.join(", ")),
        remote: Vec::new(),
        slurm: Some(nodes),
    })
}

/// Node 0's agent first (it hosts the rendezvous store and picks the ranks' MASTER_PORT), then
/// every other node's with those ports; all or an error.
fn start_slurm_agents(
    slurm: &crate::slurm::Slurm,
    allocation: &crate::slurm::alloc::Allocation,
    run: &RunId,
    recipe: &Recipe,
    dir: &std::path::Path,
    from: StartFrom,
    notes: &dyn Fn(&str),
) -> anyhow::Result<Vec<TcpAgent>> {
    use crate::slurm::agents;
    let began = std::time::Instant::now();
    // Slurm's NodeAddr of the first node: where every node reaches it (its hostname may not
    // resolve, or be the same on every node). Each node fills in its own part (`slurm::node`).
    let mut template = run_spec(run, recipe, &allocation.addrs[0], from)?;
    let limit = std::time::Duration::from_secs(recipe.cluster.ssh.command_timeout_s);
    let job = &allocation.job;
    let first =
        agents::Wave { job, nodes: &allocation.nodes[..1], offset: 0, template: &template, run_dir: dir, limit };
    let mut ready = agents::start(slurm, &first, notes)?;
    notes(&format!("the agent on {} is ready after {:.1} s", allocation.nodes[0], began.elapsed().as_secs_f64()));
    template.master_port = ready[0].store_port;
    template.program_port = ready[0].program_port;
    if let Some(rest) = allocation.nodes.get(1..).filter(|rest| !rest.is_empty()) {
        let wave = agents::Wave { job, nodes: rest, offset: 1, template: &template, run_dir: dir, limit };
        ready.extend(agents::start(slurm, &wave, notes)?);
        let secs = began.elapsed().as_secs_f64();
        notes(&format!("the agents on {} more node(s) are ready after {secs:.1} s", rest.len()));
    }
    Ok(ready
        .iter()
        .zip(&allocation.addrs)
        .map(|(r, addr)| TcpAgent {
            node: r.node.clone(),
            addr: format!("{addr}:{}", r.agent_port),
            secret: template.secret.clone(),
            link_timeout_s: recipe.cluster.ssh.link_timeout_s,
        })
        .collect())
}

/// Gives a Slurm run's nodes back: in the user's allocation, the run's agent steps are
/// cancelled (the allocation is theirs to keep); the run's own job is cancelled whole (agents,
/// ranks, the holder), or, when the run `ended` by itself, its holder is told to finish, so the
/// job ends COMPLETED rather than CANCELLED (Slurm still ends anything left with it). Returns
/// what could not be done.
pub fn release(nodes: &SlurmNodes, run: &RunId, ended: bool) -> Vec<String> {
    let a = &nodes.allocation;
    if !a.owned {
        return crate::slurm::agents::cancel_steps(&nodes.slurm, &a.job, run);
    }
    let args: &[&str] = if ended { &["--batch", "--signal=TERM", &a.job] } else { &[&a.job] };
    match nodes.slurm.run("scancel", args) {
        Ok(_) => Vec::new(),
        Err(e) => vec![format!("Slurm job {}: {e}", a.job)],
    }
}

/// The run directory that a run's relative `checkpoint.dir` is under: rank 0's. The server's
/// own for a local run; node 0's under Slurm (a Slurm resume reads it there: the nodes and the
/// server share the filesystem the home directory is on, as on most clusters).
pub fn rank0_dir(db: &DbPaths, run: &RunId) -> PathBuf {
    match slurm_nodes(db, run) {
        Ok(Some(nodes)) => match (nodes.allocation.nodes.first(), nodes.remote_dir.as_deref()) {
            (Some(node), Some(remote_dir)) => crate::slurm::node::run_dir(remote_dir, run, node),
            _ => db.run_dir(run),
        },
        _ => db.run_dir(run),
    }
}

/// Where a Slurm run keeps its nodes, in the database's run directory.
fn slurm_file(db: &DbPaths, run: &RunId) -> PathBuf {
    db.run_dir(run).join("slurm.json")
}

/// A recorded run's Slurm nodes, if it ran under Slurm.
pub fn slurm_nodes(db: &DbPaths, run: &RunId) -> anyhow::Result<Option<SlurmNodes>> {
    let file = slurm_file(db, run);
    if !file.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    Ok(Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?))
}

/// Where an SSH run keeps its nodes' agents, in the database's run directory.
fn nodes_file(db: &DbPaths, run: &RunId) -> PathBuf {
    db.run_dir(run).join("nodes.json")
}

fn ssh_env_file(db: &DbPaths, run: &RunId) -> PathBuf {
    db.run_dir(run).join("ssh_env.json")
}

/// The SSH environment of the client that launched a recorded SSH run, if it was kept.
pub fn ssh_env(db: &DbPaths, run: &RunId) -> Option<ClientEnv> {
    serde_json::from_slice(&std::fs::read(ssh_env_file(db, run)).ok()?).ok()
}

/// A recorded SSH run's agents, one per node in host order (None: not an SSH run).
pub fn ssh_nodes(db: &DbPaths, run: &RunId) -> anyhow::Result<Option<Vec<RemoteAgent>>> {
    let file = nodes_file(db, run);
    if !file.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    Ok(Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", file.display()))?))
}

/// How to reach each node of a recorded run again (after a server restart): SSH when it has
/// `nodes.json`, else its local agent sockets.
pub fn transports(db: &DbPaths, record: &crate::store::RunRecord) -> anyhow::Result<Vec<Transport>> {
    if let Some(nodes) = slurm_nodes(db, &record.id)? {
        return Ok(nodes.agents.into_iter().map(|t| Transport::Tcp(Arc::new(t))).collect());
    }
    match ssh_nodes(db, &record.id)? {
        Some(agents) => Ok(agents.into_iter().map(|a| Transport::Ssh(Arc::new(a))).collect()),
        None => Ok(record.agent_sockets.iter().map(|s| Transport::Local(PathBuf::from(s))).collect()),
    }
}
