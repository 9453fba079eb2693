//! The node agent: spawns its node's ranks, watches them, and streams sequenced frames upstream.
//!
//! Started detached (its own session) so a run outlives the server, the cockpit and the SSH
//! session. The run's state on this node has one owner (`owner.rs`, a pure step function);
//! this file's loop turns the tasks' `Input`s into its steps and carries out the `Effect`s.
mod flight;
mod input;
mod link;
pub mod nvml;
pub mod nvml_decode;
mod outbox;
mod output;
mod owner;
mod ranks;
pub mod remote;
mod sampler;
pub mod stacks;
mod telemetry;
mod telemetry_json;
mod torchrun;

use crate::collective::auth::Gate;
use crate::ids::Rank;
use crate::paths::RunDirPaths;
use crate::protocol::AgentEvent;
use crate::sync::lock;
use anyhow::Context;
use input::Inputs;
use outbox::Outbox;
pub(crate) use owner::Input;
use owner::{Effect, Exit, Owner, Signal};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub use crate::protocol::spec::AgentSpec;

/// Bounded so a flood of log lines applies backpressure to the readers (which then block on
/// the rank's pipe) instead of growing memory; 8192 frames is seconds of the busiest run.
const INPUT_CAPACITY: usize = 8192;

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
    let (tx, rx) = mpsc::channel::<Input>(INPUT_CAPACITY);
    // The ranks read the secret from here (FLIGHTDECK_RUN_SECRET_FILE), never from a variable.
    spec.secret.write_file(&paths.secret()).with_context(|| format!("writing {}", paths.secret().display()))?;
    if spec.host_store {
        let refused = tx.clone();
        let gate = Gate::new(
            spec.secret.clone(),
            // From the store's own threads, never the runtime's: blocking_send is allowed there.
            Arc::new(move |refusal| {
                let _ = refused.blocking_send(Input::Event(AgentEvent::Refused(refusal)));
            }),
        );
        let store = crate::collective::rendezvous::StoreServer::bind(&format!("{}:0", spec.master_addr), gate)
            .context("binding the rendezvous store")?;
        spec.master_port = store.local_addr().port();
        store.spawn();
        if spec.program_port == 0 {
            spec.program_port = free_port(&spec.master_addr).context("choosing a MASTER_PORT for the ranks")?;
        }
        // `agent start` tells an SSH launcher both ports, for the other nodes' specs.
        let ports = format!("{} {}", spec.master_port, spec.program_port);
        std::fs::write(remote::port_file(&paths), ports)?;
    }
    std::fs::create_dir_all(paths.root.join("logs"))?;
    let agent_listener = bind_fresh(&paths.agent_socket())?;
    let telemetry_listener = bind_fresh(&paths.telemetry_socket())?;
    let tcp = match &spec.listen_tcp {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind((addr.as_str(), 0))
                .await
                .with_context(|| format!("binding the agent's TCP port on {addr}"))?;
            let refused = tx.clone();
            let gate = Gate::new(
                spec.secret.clone(),
                // From a blocking handshake thread (`tcp_link::accept`): blocking_send is allowed.
                Arc::new(move |refusal| {
                    let _ = refused.blocking_send(Input::Event(AgentEvent::Refused(refusal)));
                }),
            );
            Some((listener, gate))
        }
    };
    let agent_port = match &tcp {
        Some((l, _)) => Some(l.local_addr()?.port()),
        None => None,
    };

    let (outbox, notify) = Outbox::shared();
    let acked = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(link::serve(
        agent_listener,
        tcp,
        outbox.clone(),
        notify.subscribe(),
        acked.clone(),
        tx.clone(),
        spec.run.clone(),
    ));
    tokio::spawn(telemetry::serve(telemetry_listener, tx.clone()));

    let mut owner = Owner::new(owner::Config::from_spec(&spec));
    let mut inputs = Inputs::new(rx, acked, outbox.clone());
    // The ranks the sampler watches: the owner's live ranks, copied after every step.
    let pids = Arc::new(Mutex::new(Vec::new()));
    let io = Io { outbox, notify, tx: tx.clone(), node: spec.node.clone() };
    let torchrun = spec.recipe.kind == crate::recipe::Kind::Command
        && spec.recipe.command.as_ref().is_some_and(|c| c.launcher == crate::recipe::Launcher::Torchrun);
    if torchrun {
        // torchrun starts the node's ranks; they are `Started` as it is seen to start them.
        let pid = torchrun::spawn(&spec, &paths, tx.clone()).await?;
        let ranks = spec.ranks.iter().map(|(rank, _)| *rank).collect();
        let effects = owner.step(Input::Launched { pid, ranks }, Instant::now());
        io.perform(effects, &mut inputs);
    }
    for &(rank, local_rank) in spec.ranks.iter().filter(|_| !torchrun) {
        let pid = ranks::spawn(&spec, &paths, rank, local_rank, tx.clone()).await?;
        let effects = owner.step(Input::Started { rank, local_rank, pid }, Instant::now());
        *lock(&pids) = owner.alive();
        // Starting a rank only sends its RankStarted frame; nothing here can end the agent.
        io.perform(effects, &mut inputs);
    }
    sampler::spawn(pids.clone(), tx.clone(), spec.recipe.telemetry.sample_interval_ms);
    if spec.recipe.command.as_ref().is_some_and(|c| c.instrument) && spec.recipe.kind == crate::recipe::Kind::Command {
        flight::spawn(paths.clone(), pids.clone(), tx.clone());
    }
    // The launcher waits for this line: the sockets are bound and every rank is started. An
    // agent on TCP also says where: the Slurm launcher reads this through srun's output.
    match agent_port {
        None => println!("ready"),
        Some(port) => println!(
            "ready node={} agent_port={port} store_port={} program_port={}",
            spec.node, spec.master_port, spec.program_port
        ),
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();

    loop {
        let input = inputs.next(owner.ended()).await;
        let effects = owner.step(input, Instant::now());
        *lock(&pids) = owner.alive();
        match io.perform(effects, &mut inputs) {
            None => {}
            Some(Exit::Collected) => {
                tracing::info!("run ended and every frame is acknowledged; agent exits");
                let _ = std::fs::remove_file(paths.agent_socket());
                let _ = std::fs::remove_file(paths.telemetry_socket());
                return Ok(());
            }
            Some(Exit::Unclaimed) => {
                tracing::warn!("no server collected the last frames within {:?}; exiting", owner::LINGER);
                return Ok(());
            }
        }
    }
}

/// What carries out the owner's effects.
struct Io {
    outbox: Arc<Mutex<Outbox>>,
    notify: tokio::sync::watch::Sender<u64>,
    /// Stack dumps answer through the owner's own channel, so they are sequenced like any frame.
    tx: mpsc::Sender<Input>,
    node: String,
}

impl Io {
    /// Carries out `effects` in order; stops at an `Exit` and returns it.
    fn perform(&self, effects: Vec<Effect>, inputs: &mut Inputs) -> Option<Exit> {
        for effect in effects {
            match effect {
                Effect::Send(event) => push(&self.outbox, &self.notify, event),
                Effect::Signal { pid, signal, .. } | Effect::SignalLauncher { pid, signal } => {
                    signal_group(pid, signal)
                }
                Effect::Arm { timer, at } => inputs.arm(timer, at),
                Effect::DumpStacks { request, targets, native } => {
                    tokio::spawn(dump_stacks(request, targets, native, self.node.clone(), self.tx.clone()));
                }
                Effect::Exit(exit) => return Some(exit),
            }
        }
        None
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
fn signal_group(pid: u32, signal: Signal) {
    let signal = match signal {
        Signal::Save => libc::SIGUSR1,
        Signal::Terminate => libc::SIGTERM,
        Signal::Kill => libc::SIGKILL,
    };
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    unsafe {
        libc::kill(-(pid as i32), signal);
    }
}

/// Dumps the target ranks side by side (each dump stops only its own rank, briefly) and sends
/// the answer back through the owner loop, so it is sequenced and acknowledged like any frame.
async fn dump_stacks(request: u64, targets: Vec<(Rank, u32)>, native: bool, node: String, tx: mpsc::Sender<Input>) {
    let mut set = tokio::task::JoinSet::new();
    for (rank, pid) in targets {
        let node = node.clone();
        set.spawn(async move { stacks::dump(rank.0, &node, pid, native).await });
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

/// A TCP port on `addr` that is free now: the kernel picks it, and it is released at once for
/// the ranks' program to bind (torchrun's own free-port choice works the same way).
fn free_port(addr: &str) -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind((addr, 0))?.local_addr()?.port())
}
