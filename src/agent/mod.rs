//! The node agent: spawns its node's ranks, watches them, and streams sequenced frames upstream.
//!
//! Started detached (its own session) so a run outlives the server, the cockpit and the SSH
//! session. It owns the run's state on this node; tasks around it only send it `Input`s.
mod link;
pub mod nvml;
pub mod nvml_decode;
mod outbox;
mod ranks;
pub mod remote;
mod sampler;
pub mod stacks;
mod telemetry;
mod telemetry_json;

use crate::ids::Rank;
use crate::paths::RunDirPaths;
use crate::protocol::{AgentEvent, ExitStatus, RunOutcome};
use crate::sync::lock;
use anyhow::Context;
use outbox::Outbox;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

pub use crate::protocol::spec::AgentSpec;

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
    /// A graceful stop's grace period ran out: fall back to SIGTERM.
    SaveOverdue,
    /// A rank's telemetry connection reached its end: everything it sent has been forwarded.
    TelemetryClosed {
        rank: Rank,
    },
    /// Read the stacks of the live ranks (or one); answered with `AgentEvent::StackDump`.
    DumpStacks {
        request: u64,
        rank: Option<Rank>,
    },
}

/// Bounded so a flood of log lines applies backpressure to the readers (which then block on
/// the rank's pipe) instead of growing memory; 8192 frames is seconds of the busiest run.
const INPUT_CAPACITY: usize = 8192;

/// How long an ended run's agent waits for a server to collect its last frames.
const LINGER: Duration = Duration::from_secs(600);

/// A heartbeat frame this often while the run lives, so the server can tell a silent node from
/// a quiet one (the analysis calls a node lost after ten missed beats).
const HEARTBEAT: Duration = Duration::from_secs(1);

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
    // A graceful stop in progress: ranks are saving, and may exit 0 with steps to spare.
    let mut graceful = false;
    // The most steps any rank reported finishing: where a graceful stop ended.
    let mut finished_steps: Option<u64> = None;
    // Ranks that said hello on the telemetry socket: their SIGUSR1 handler is installed.
    let mut registered: std::collections::BTreeSet<Rank> = Default::default();
    let mut ended = false;
    let mut linger_deadline = None;
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let input = tokio::select! {
            i = rx.recv() => i,
            _ = heartbeat.tick(), if !ended => Some(Input::Event(AgentEvent::Heartbeat)),
            _ = acked.notified(), if ended => None,
            _ = sleep_until_opt(linger_deadline) => {
                tracing::warn!("no server collected the last frames within {LINGER:?}; exiting");
                return Ok(());
            }
        };
        match input {
            Some(Input::Event(e)) => {
                match &e {
                    AgentEvent::Rank { rank, msg: crate::protocol::RankMsg::Register { .. } } => {
                        telemetry_open.insert(*rank);
                        registered.insert(*rank);
                        // A stop that came before this rank could catch SIGUSR1: deliver it now.
                        if let (true, Some(pid)) = (graceful, alive.get(rank)) {
                            signal(*pid, libc::SIGUSR1);
                        }
                    }
                    AgentEvent::Rank { msg: crate::protocol::RankMsg::Finished { steps, .. }, .. } => {
                        finished_steps = finished_steps.max(Some(*steps));
                    }
                    _ => {}
                }
                push(&outbox, &notify, e)
            }
            Some(Input::TelemetryClosed { rank }) => {
                telemetry_open.remove(&rank);
            }
            Some(Input::Exited { rank, pid, status }) => {
                alive.remove(&rank);
                lock(&pids).retain(|(r, _)| *r != rank);
                if !status.success() && (ending.is_none() || graceful) {
                    let during = if graceful { " while stopping gracefully" } else { "" };
                    let reason =
                        format!("rank {rank} ({}, pid {pid}) ended with {}{during}", spec.node, status.describe());
                    ending = Some((RunOutcome::Failed, reason));
                    graceful = false;
                    terminate(&alive, libc::SIGTERM);
                    schedule_escalation(tx.clone(), spec.stop_grace_ms);
                }
                push(&outbox, &notify, AgentEvent::RankExited { rank, pid, status });
            }
            Some(Input::Stop) if ending.is_none() && spec.recipe.kind == crate::recipe::Kind::Pretrain => {
                // The worker's ranks agree on a step boundary, save a checkpoint and exit 0.
                ending = Some((RunOutcome::Stopped, "stopped on request at a step boundary, checkpoint saved".into()));
                graceful = true;
                // Only to ranks past start-up: SIGUSR1 would kill one still loading (its
                // default action); the others get it when they register.
                for (rank, pid) in &alive {
                    if registered.contains(rank) {
                        signal(*pid, libc::SIGUSR1);
                    }
                }
                schedule(tx.clone(), spec.save_grace_ms, Input::SaveOverdue);
            }
            Some(Input::Stop) if ending.is_none() => {
                ending = Some((RunOutcome::Stopped, "stopped on request".into()));
                terminate(&alive, libc::SIGTERM);
                schedule_escalation(tx.clone(), spec.stop_grace_ms);
            }
            Some(Input::SaveOverdue) if graceful && !alive.is_empty() => {
                let reason = format!(
                    "stopped on request; the ranks did not reach a step boundary and save within {} s, so they \
                     were terminated (no checkpoint from the stop)",
                    spec.save_grace_ms / 1000
                );
                ending = Some((RunOutcome::Stopped, reason));
                graceful = false;
                terminate(&alive, libc::SIGTERM);
                schedule_escalation(tx.clone(), spec.stop_grace_ms);
            }
            Some(Input::SaveOverdue) => {}
            Some(Input::Kill) => {
                if ending.is_none() || matches!(ending, Some((RunOutcome::Stopped, _))) {
                    ending = Some((RunOutcome::Killed, "killed on request".into()));
                }
                graceful = false;
                terminate(&alive, libc::SIGKILL);
            }
            Some(Input::Escalate) => terminate(&alive, libc::SIGKILL),
            Some(Input::DumpStacks { request, rank }) => {
                let targets: Vec<(u32, u32)> =
                    alive.iter().filter(|(r, _)| rank.is_none_or(|want| want == **r)).map(|(r, p)| (r.0, *p)).collect();
                tokio::spawn(dump_stacks(request, targets, spec.node.clone(), tx.clone()));
            }
            Some(Input::Stop) | None => {}
        }
        if alive.is_empty() && telemetry_open.is_empty() && !ended {
            let (outcome, mut reason) =
                ending.take().unwrap_or((RunOutcome::Succeeded, format!("all {} ranks finished", spec.ranks.len())));
            if let (true, Some(step)) = (graceful, finished_steps) {
                reason = format!("stopped on request after step {step}, checkpoint saved");
            }
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

fn push(outbox: &Mutex<Outbox>, notify: &tokio::sync::watch::Sender<u64>, event: AgentEvent) {
    let seq = lock(outbox).push(event);
    notify.send_replace(seq);
}

/// Signals one rank's process group (each rank leads its own).
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    unsafe {
        libc::kill(-(pid as i32), signal);
    }
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
    schedule(tx, grace_ms, Input::Escalate);
}

fn schedule(tx: mpsc::Sender<Input>, after_ms: u64, input: Input) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        let _ = tx.send(input).await;
    });
}

/// Dumps the target ranks side by side (each dump stops only its own rank, briefly) and sends
/// the answer back through the owner loop, so it is sequenced and acknowledged like any frame.
async fn dump_stacks(request: u64, targets: Vec<(u32, u32)>, node: String, tx: mpsc::Sender<Input>) {
    let mut set = tokio::task::JoinSet::new();
    for (rank, pid) in targets {
        let node = node.clone();
        set.spawn(async move { stacks::dump(rank, &node, pid).await });
    }
    let mut stacks = Vec::new();
    while let Some(done) = set.join_next().await {
        match done {
            Ok(s) => stacks.push(s),
            Err(e) => tracing::warn!("a stack dump task failed: {e}"),
        }
    }
    stacks.sort_by_key(|s| s.rank);
    let _ = tx.send(Input::Event(AgentEvent::StackDump { request, stacks })).await;
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
