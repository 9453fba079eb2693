//! The node agent: spawns its node's ranks, watches them, and streams sequenced frames upstream.
//!
//! Started detached (its own session) so a run outlives the server, the cockpit and the SSH
//! session. It owns the run's state on this node; tasks around it only send it `Input`s.
mod link;
mod outbox;
mod ranks;
pub mod remote;
mod sampler;
mod telemetry;

use crate::ids::{Rank, RunId};
use crate::paths::RunDirPaths;
use crate::protocol::{AgentEvent, ExitStatus, RunOutcome};
use crate::recipe::Recipe;
use anyhow::Context;
use outbox::Outbox;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// What the launcher tells an agent to run, written to `spec.json` in its run directory.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AgentSpec {
    pub run: RunId,
    /// This node's name as the run's records show it (`local` for the embedded runtime).
    pub node: String,
    /// The global ranks this node runs, with their local ranks.
    pub ranks: Vec<(Rank, u32)>,
    pub world_size: u32,
    /// The rendezvous address every rank uses; this agent hosts the store when `host_store`.
    pub master_addr: String,
    pub master_port: u16,
    pub host_store: bool,
    pub recipe: Recipe,
    /// The executable the ranks run (`flightdeck worker`), normally this very binary.
    pub exe: PathBuf,
    /// SIGTERM, then SIGKILL after this long.
    pub stop_grace_ms: u64,
}

/// Everything the owner loop reacts to.
#[derive(Debug)]
pub(crate) enum Input {
    Event(AgentEvent),
    Exited {
        rank: Rank,
        pid: u32,
        status: ExitStatus,
    },
    Stop,
    Kill,
    /// The grace period after SIGTERM ran out.
    Escalate,
    /// A rank's telemetry connection reached its end: everything it sent has been forwarded.
    TelemetryClosed {
        rank: Rank,
    },
}

/// Bounded so a flood of log lines applies backpressure to the readers (which then block on
/// the rank's pipe) instead of growing memory; 8192 frames is seconds of the busiest run.
const INPUT_CAPACITY: usize = 8192;

/// How long an ended run's agent waits for a server to collect its last frames.
const LINGER: Duration = Duration::from_secs(600);

/// `flightdeck agent --run-dir DIR`: runs the node's part of a run to its end.
pub fn main(run_dir: PathBuf) -> anyhow::Result<()> {
    let paths = RunDirPaths::new(run_dir);
    let text = std::fs::read_to_string(paths.spec()).with_context(|| format!("reading {}", paths.spec().display()))?;
    let spec: AgentSpec = serde_json::from_str(&text).with_context(|| format!("parsing {}", paths.spec().display()))?;
    // current_thread: ranks are forked from this one thread, so PR_SET_PDEATHSIG (which fires
    // when the forking *thread* exits) only fires when the agent itself dies.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(spec, paths))
}

async fn run(mut spec: AgentSpec, paths: RunDirPaths) -> anyhow::Result<()> {
    if spec.host_store {
        let store = crate::collective::rendezvous::StoreServer::bind(&format!("{}:0", spec.master_addr))
            .context("binding the rendezvous store")?;
        spec.master_port = store.local_addr().port();
        store.spawn();
        // `agent start` tells an SSH launcher this port, for the other nodes' MASTER_PORT.
        std::fs::write(remote::port_file(&paths), spec.master_port.to_string())?;
    }
    std::fs::create_dir_all(paths.root.join("logs"))?;
    let agent_listener = bind_fresh(&paths.agent_socket())?;
    let telemetry_listener = bind_fresh(&paths.telemetry_socket())?;

    let (tx, mut rx) = mpsc::channel::<Input>(INPUT_CAPACITY);
    let (outbox, notify) = Outbox::shared();
    let acked = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(link::serve(
        agent_listener,
        outbox.clone(),
        notify.subscribe(),
        acked.clone(),
        tx.clone(),
        spec.run.clone(),
    ));
    tokio::spawn(telemetry::serve(telemetry_listener, tx.clone()));

    let pids = Arc::new(Mutex::new(Vec::new()));
    let mut alive: BTreeMap<Rank, u32> = BTreeMap::new();
    for &(rank, local_rank) in &spec.ranks {
        let pid = ranks::spawn(&spec, &paths, rank, local_rank, tx.clone()).await?;
        alive.insert(rank, pid);
        lock(&pids).push((rank, pid));
        push(&outbox, &notify, AgentEvent::RankStarted { rank, local_rank, pid, host: spec.node.clone() });
    }
    sampler::spawn(pids.clone(), tx.clone(), spec.recipe.telemetry.sample_interval_ms);
    // The launcher waits for this line: the sockets are bound and every rank is started.
    println!("ready");

    // Ranks whose telemetry connection is still open: the run ends only once these drain too,
    // so the last step of every rank is in the history.
    let mut telemetry_open: std::collections::BTreeSet<Rank> = Default::default();
    let mut ending: Option<(RunOutcome, String)> = None;
    let mut ended = false;
    let mut linger_deadline = None;
    loop {
        let input = tokio::select! {
            i = rx.recv() => i,
            _ = acked.notified(), if ended => None,
            _ = sleep_until_opt(linger_deadline) => {
                tracing::warn!("no server collected the last frames within {LINGER:?}; exiting");
                return Ok(());
            }
        };
        match input {
            Some(Input::Event(e)) => {
                if let AgentEvent::Rank { rank, msg: crate::protocol::RankMsg::Register { .. } } = &e {
                    telemetry_open.insert(*rank);
                }
                push(&outbox, &notify, e)
            }
            Some(Input::TelemetryClosed { rank }) => {
                telemetry_open.remove(&rank);
            }
            Some(Input::Exited { rank, pid, status }) => {
                alive.remove(&rank);
                lock(&pids).retain(|(r, _)| *r != rank);
                if !status.success() && ending.is_none() {
                    let reason = format!("rank {rank} ({}, pid {pid}) ended with {}", spec.node, status.describe());
                    ending = Some((RunOutcome::Failed, reason));
                    terminate(&alive, libc::SIGTERM);
                    schedule_escalation(tx.clone(), spec.stop_grace_ms);
                }
                push(&outbox, &notify, AgentEvent::RankExited { rank, pid, status });
            }
            Some(Input::Stop) if ending.is_none() => {
                ending = Some((RunOutcome::Stopped, "stopped on request".into()));
                terminate(&alive, libc::SIGTERM);
                schedule_escalation(tx.clone(), spec.stop_grace_ms);
            }
            Some(Input::Kill) => {
                if ending.is_none() || matches!(ending, Some((RunOutcome::Stopped, _))) {
                    ending = Some((RunOutcome::Killed, "killed on request".into()));
                }
                terminate(&alive, libc::SIGKILL);
            }
            Some(Input::Escalate) => terminate(&alive, libc::SIGKILL),
            Some(Input::Stop) | None => {}
        }
        if alive.is_empty() && telemetry_open.is_empty() && !ended {
            let (outcome, reason) =
                ending.take().unwrap_or((RunOutcome::Succeeded, format!("all {} ranks finished", spec.ranks.len())));
            push(&outbox, &notify, AgentEvent::RunEnded { outcome, reason });
            ended = true;
            linger_deadline = Some(tokio::time::Instant::now() + LINGER);
        }
        if ended && lock(&outbox).is_empty() {
            tracing::info!("run ended and every frame is acknowledged; agent exits");
            let _ = std::fs::remove_file(paths.agent_socket());
            let _ = std::fs::remove_file(paths.telemetry_socket());
            return Ok(());
        }
    }
}

fn bind_fresh(path: &std::path::Path) -> anyhow::Result<tokio::net::UnixListener> {
    let _ = std::fs::remove_file(path);
    tokio::net::UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; carry on with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn push(outbox: &Mutex<Outbox>, notify: &tokio::sync::watch::Sender<u64>, event: AgentEvent) {
    let seq = lock(outbox).push(event);
    notify.send_replace(seq);
}

/// Signals each live rank's process group (each rank leads its own).
fn terminate(alive: &BTreeMap<Rank, u32>, signal: i32) {
    for pid in alive.values() {
        // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
        unsafe {
            libc::kill(-(*pid as i32), signal);
        }
    }
}

fn schedule_escalation(tx: mpsc::Sender<Input>, grace_ms: u64) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(grace_ms)).await;
        let _ = tx.send(Input::Escalate).await;
    });
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
