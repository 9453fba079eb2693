//! The server's side of one run's agents: attach, replay, ingest in batches, ack after flush,
//! relay commands. One task per live run owns that run's `Tracker`; one task per node keeps
//! that node's link up (`transport.rs`), over a Unix socket or SSH alike.
use super::incident::{self, Stacks};
use super::ingest::Ingest;
use super::tracker::{Tracker, VerdictKey};
use super::transport::{self, Incoming, NodeHandle, Transport};
use super::{Live, NodeFrames, RunView, Shared, StackAsk};
use crate::ids::{unix_ms, Rank};
use crate::protocol::{AgentCommand, AgentEvent, AgentFrame, RankStacks, RunOutcome, StackReport, Verdict};
use crate::record::VerdictKind;
use crate::store::{Batch, EventKind, EventRecord, RunStatus, VerdictRecord};
use crate::sync::lock;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Frames per batch at most; with the flush interval this bounds ack latency and batch size.
/// The link waits for each batch's flush to disk, so a server that fell behind must catch up
/// in large batches: at 2,048, 1,024 ranks at 10 steps/s (20,480 frames/s) outran it while it
/// sat idle waiting on the disk.
const BATCH_FRAMES: usize = 16 * 1024;
/// Frames waiting in the link's queue that mean the server is behind its agents: silence and
/// missing progress are then its own doing, not the nodes'.
const BEHIND_FRAMES: usize = 1024;
/// The link's queue, in messages (each a node's batch of frames, as one read brought them).
const INCOMING_BATCHES: usize = 256;
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How long the last acks may take to reach the agents when a run ends.
const ACK_GRACE: Duration = Duration::from_secs(10);
/// How long recovery waits for a hung run's stacks (for its incident report) before it kills
/// the run to restart it.
const STACKS_GRACE: Duration = Duration::from_secs(10);
/// Batches a watcher may fall behind (about 25 s at the flush interval) before it is told it
/// lagged and must reload from the store.
const WATCH_BACKLOG: usize = 256;

/// Connects to every node's agent (all must answer) and starts the run's link task; incident
/// reports go to `run_dir`.
pub async fn attach_nodes(
    tracker: Tracker,
    transports: Vec<Transport>,
    run_dir: Option<PathBuf>,
    shared: &Shared,
) -> anyhow::Result<()> {
    let (ingest, registry, shared) = (shared.ingest.clone(), shared.registry.clone(), shared.clone());
    let queue = shared.queue.clone();
    let recovery = super::recovery::settings(&tracker.state.record);
    let run = tracker.state.record.id.clone();
    let after: Vec<u64> =
        (0..transports.len()).map(|k| tracker.state.record.acked_seq.get(k).copied().unwrap_or(0)).collect();
    let mut opening = tokio::task::JoinSet::new();
    for (k, t) in transports.iter().enumerate() {
        let (t, run, after) = (t.clone(), run.clone(), after[k]);
        opening.spawn(async move { (k, transport::connect_within(&t, &run, after).await) });
    }
    let mut conns: Vec<Option<transport::Conn>> = (0..transports.len()).map(|_| None).collect();
    while let Some(joined) = opening.join_next().await {
        let (k, conn) = joined?;
        let conn = conn.map_err(|e| anyhow::anyhow!("node {k} ({}): {e}", transports[k].describe()))?;
        conns[k] = Some(conn);
    }
    // Batches of frames, and the odd word on a node's link; `queued` counts the frames in it.
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(INCOMING_BATCHES);
    let queued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut nodes = Vec::new();
    for (k, (t, conn)) in transports.into_iter().zip(conns).enumerate() {
        let conn = conn.ok_or_else(|| anyhow::anyhow!("node {k}: no link"))?;
        let host = tracker.state.record.hosts.get(k).cloned().unwrap_or_else(|| t.describe());
        let handle = transport::spawn_node(k, t, run.clone(), conn, after[k], in_tx.clone(), queued.clone());
        nodes.push(Node { handle, host, last_seq: after[k], ended: None, lost: None, pending: Vec::new() });
    }
    drop(in_tx);

    let (cmd_tx, cmd_rx) = mpsc::channel::<AgentCommand>(8);
    // A handful of people asking for stacks at once is plenty; more wait their turn.
    let (stacks_tx, stacks_rx) = mpsc::channel::<StackAsk>(8);
    let (view_tx, view_rx) = watch::channel(RunView { progress: tracker.progress(), ended: None });
    let (frames_out, _) = tokio::sync::broadcast::channel(WATCH_BACKLOG);
    let time_limited = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A Slurm run's nodes: watched while it lives, given back when it ends.
    let slurm = super::placement::slurm_nodes(&shared.db, &run).unwrap_or_else(|e| {
        tracing::warn!("run {run}: {e:#}");
        None
    });
    if let Some(nodes) = &slurm {
        let watch = super::slurm_watch::Watch {
            nodes: nodes.clone(),
            run: run.clone(),
            commands: cmd_tx.clone(),
            view: view_rx.clone(),
            ingest: ingest.clone(),
            time_limited: time_limited.clone(),
        };
        tokio::spawn(watch.run());
    }
    let live = Live { commands: cmd_tx, view: view_rx, frames: frames_out.clone(), stacks: stacks_tx };
    lock(&registry).insert(run.clone(), live);
    tokio::spawn(async move {
        let mut link = Link {
            tracker,
            ingest: ingest.clone(),
            view: view_tx,
            frames_out,
            nodes,
            notes: Vec::new(),
            run_dir,
            next_request: 0,
            pending: HashMap::new(),
            incidents: HashMap::new(),
            shared,
            recovery,
            hang_kill_at: None,
            stopped_by: None,
            time_limited,
            taken_up: false,
            lag: super::lag::IngestLag::new(std::time::Instant::now()),
            queued,
        };
        if let Err(e) = link.run(in_rx, cmd_rx, stacks_rx).await {
            tracing::warn!("run {run}: link failed: {e}");
        }
        if let Some(nodes) = slurm {
            release_slurm(nodes, &run).await;
        }
        ingest.close_run(run.clone()).await;
        lock(&registry).remove(&run);
        // A sweep's next point may start in the room this run leaves.
        queue.poke();
    });
    Ok(())
}

/// A Slurm run's nodes go back once it has ended: its own job finishes (nothing of the run is
/// left on them), or its steps in the user's allocation are cancelled.
async fn release_slurm(nodes: super::placement::SlurmNodes, run: &crate::ids::RunId) {
    let run = run.clone();
    let left = tokio::task::spawn_blocking(move || super::placement::release(&nodes, &run, true)).await;
    for problem in left.unwrap_or_default() {
        tracing::warn!("releasing the Slurm allocation: {problem}");
    }
}

struct Node {
    handle: NodeHandle,
    host: String,
    /// The newest frame taken from this node; replays of older ones are dropped.
    last_seq: u64,
    /// How this node's agent ended the run on its side, and how many nodes had ended before it.
    ended: Option<(RunOutcome, String, usize)>,
    lost: Option<String>,
    pending: Vec<AgentFrame>,
}

impl Node {
    fn done(&self) -> bool {
        self.ended.is_some() || self.lost.is_some()
    }
}

struct Link {
    tracker: Tracker,
    ingest: Ingest,
    view: watch::Sender<RunView>,
    frames_out: tokio::sync::broadcast::Sender<std::sync::Arc<NodeFrames>>,
    nodes: Vec<Node>,
    /// Link events (cut, reconnected) for the next batch.
    notes: Vec<EventRecord>,
    /// Where incident reports are written (the run's directory in the database).
    run_dir: Option<PathBuf>,
    next_request: u64,
    /// Stack dumps asked of the agents and not yet fully answered, by request number.
    pending: HashMap<u64, StackWait>,
    /// Hang verdicts with a report: the verdict as it stands, and whether its file exists yet.
    incidents: HashMap<VerdictKey, (Verdict, bool)>,
    shared: Shared,
    /// The recipe's `[recovery]`, when it restarts runs.
    recovery: Option<crate::recipe::Recovery>,
    /// A hung run recovery will kill: when, at the latest (sooner once its stacks are in).
    hang_kill_at: Option<tokio::time::Instant>,
    /// The server stopped or killed the run itself, and why (a hang, failing checkpoints).
    stopped_by: Option<crate::record::Cause>,
    /// Set by the Slurm watch when it stopped the run on the time-limit warning.
    time_limited: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Whether the run's end was handed to recovery (once).
    taken_up: bool,
    /// How far the store is behind the agents, logged each window.
    lag: super::lag::IngestLag,
    /// Frames the node tasks have queued for this task and it has not yet taken.
    queued: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// A stack dump in progress: who waits, how many nodes have yet to answer, what came so far.
struct StackWait {
    waiter: Pending,
    nodes_left: usize,
    stacks: Vec<RankStacks>,
}

/// Who is waiting for a stack dump.
enum Pending {
    Client(tokio::sync::oneshot::Sender<Vec<RankStacks>>),
    Incident(VerdictKey),
}

impl Link {
    async fn run(
        &mut self,
        mut incoming: mpsc::Receiver<Incoming>,
        mut cmds: mpsc::Receiver<AgentCommand>,
        mut stack_asks: mpsc::Receiver<StackAsk>,
    ) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        // After a slow flush the next tick is a full interval away: the ticks missed meanwhile
        // would otherwise fire at once, each flushing (and syncing) a handful of frames.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !self.nodes.iter().all(Node::done) {
            tokio::select! {
                i = incoming.recv() => match i {
                    Some(Incoming::Frames(k, frames)) => {
                        self.queued.fetch_sub(frames.len(), Ordering::SeqCst);
                        for f in frames {
                            self.frame(k, f).await?;
                        }
                    }
                    Some(Incoming::Down(k, why)) => self.note(format!("lost the link to {}: {why}; reconnecting", self.nodes[k].host)),
                    Some(Incoming::Up(k, after)) => {
                        self.note(format!("reconnected to {}; replaying after frame {after}", self.nodes[k].host))
                    }
                    Some(Incoming::Lost(k, why)) => self.node_lost(k, why).await?,
                    None => break,
                },
                _ = tick.tick() => {
                    self.flush().await?;
                    if self.queued.load(Ordering::SeqCst) >= BEHIND_FRAMES {
                        self.tracker.analyzer.behind(unix_ms());
                    }
                    self.analyze().await?;
                    if self.hang_kill_at.is_some_and(|t| tokio::time::Instant::now() >= t) {
                        self.kill_for_recovery();
                    }
                }
                Some(ask) = stack_asks.recv() => self.ask_stacks(Pending::Client(ask.reply), ask.rank, ask.native),
                Some(cmd) = cmds.recv() => {
                    if matches!(cmd, AgentCommand::Stop | AgentCommand::Kill) {
                        self.tracker.analyzer.ending();
                    }
                    for n in self.nodes.iter().filter(|n| !n.done()) {
                        if n.handle.cmds.try_send(cmd.clone()).is_err() {
                            tracing::warn!("run {}: command {cmd:?} not delivered to {}", self.tracker.state.record.id, n.host);
                        }
                    }
                }
            }
        }
        self.flush().await?;
        if self.tracker.state.record.status.is_live() {
            let (status, reason) = self.outcome();
            let mut batch = Batch::default();
            self.tracker.end_without_agent(status, reason, &mut batch);
            self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        }
        self.take_up();
        self.publish(true);
        self.deliver_last_acks().await;
        Ok(())
    }

    /// Lets every node task send its last ack before the run is deregistered (after which the
    /// server may exit): an agent that never hears it would linger for its whole grace period.
    async fn deliver_last_acks(&mut self) {
        let tasks: Vec<_> = self
            .nodes
            .drain(..)
            .map(|n| {
                // Dropping the senders tells each task that nothing newer will come.
                let NodeHandle { task, .. } = n.handle;
                task
            })
            .collect();
        for task in tasks {
            // Bounded: a node whose link is down cannot take the ack, and its agent times out.
            let _ = tokio::time::timeout(ACK_GRACE, task).await;
        }
    }

    async fn frame(&mut self, k: usize, mut f: AgentFrame) -> anyhow::Result<()> {
        let multi = self.nodes.len() > 1;
        let ended_before = self.nodes.iter().filter(|n| n.ended.is_some()).count();
        let node = &mut self.nodes[k];
        if f.seq <= node.last_seq {
            return Ok(()); // replayed after a reconnect; already taken
        }
        node.last_seq = f.seq;
        if let AgentEvent::RunEnded { outcome: RunOutcome::Stopped, reason } = &mut f.event {
            // The stop the Slurm watch asked for is the time limit's, not a person's; one the
            // server asked for is the failing checkpoints'.
            if self.time_limited.load(Ordering::SeqCst) {
                *reason = reason.replacen("stopped on request", "stopped for Slurm's time limit", 1);
            } else if self.stopped_by == Some(crate::record::Cause::Checkpoint) {
                *reason = reason.replacen("stopped on request", "stopped because checkpoint saves kept failing", 1);
            }
        }
        let ended = if let AgentEvent::RunEnded { outcome, reason } = &f.event {
            node.ended = Some((*outcome, reason.clone(), ended_before));
            node.handle.ended.store(true, Ordering::SeqCst);
            if multi {
                // One node's end is not the run's: it ends when every node has.
                let text = format!("{}: {} ({reason})", node.host, crate::fold::status_of(*outcome).name());
                // A failed node takes the others down at once (no rank holds the allocation
                // waiting for it); a stopped one does not: the others are stopping at the same
                // step boundary, and a kill now would cut their checkpoint short.
                if !matches!(*outcome, RunOutcome::Succeeded | RunOutcome::Stopped) {
                    self.command_others(k, AgentCommand::Kill);
                }
                f.event = AgentEvent::Notice { text };
            }
            true
        } else {
            false
        };
        let node = &mut self.nodes[k];
        node.pending.push(f);
        let queued: usize = self.nodes.iter().map(|n| n.pending.len()).sum();
        if queued >= BATCH_FRAMES || ended {
            self.flush().await?;
        }
        Ok(())
    }

    /// The run's end when it is not one node's own word: a lost node, or several nodes.
    fn outcome(&self) -> (RunStatus, String) {
        if let Some((n, why)) = self.nodes.iter().find_map(|n| n.lost.as_ref().map(|w| (n, w))) {
            return (RunStatus::Interrupted, format!("lost the agent on {} before the run ended: {why}", n.host));
        }
        // The first node to end other than successfully names the run's outcome: a failure on
        // one node, not the kill it made the server send the others.
        let failed = self
            .nodes
            .iter()
            .filter_map(|n| n.ended.as_ref())
            .filter(|(o, _, _)| *o != RunOutcome::Succeeded)
            .min_by_key(|(_, _, order)| *order);
        match failed {
            Some((o, reason, _)) => (crate::fold::status_of(*o), reason.clone()),
            None if self.nodes.iter().all(|n| n.ended.is_some()) => (
                RunStatus::Succeeded,
                format!("all {} ranks finished on {} nodes", self.tracker.state.record.world_size, self.nodes.len()),
            ),
            None => (RunStatus::Interrupted, "lost the node agent before the run ended".into()),
        }
    }

    /// Node `k`'s agent is gone: its ranks get a `node-lost` verdict naming it (after whatever
    /// it sent before it went), and the other nodes are killed, since no rank of theirs can
    /// finish a collective without it.
    async fn node_lost(&mut self, k: usize, why: String) -> anyhow::Result<()> {
        self.flush().await?;
        if self.tracker.state.record.status.is_live() {
            let mut batch = Batch::default();
            self.tracker.node_lost(k, &why, &mut batch);
            if !batch.is_empty() {
                self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
                self.publish(false);
            }
        }
        self.nodes[k].lost = Some(why);
        self.after_batch().await?;
        self.command_others(k, AgentCommand::Kill);
        Ok(())
    }

    fn command_others(&self, k: usize, cmd: AgentCommand) {
        for (i, n) in self.nodes.iter().enumerate() {
            if i != k && !n.done() {
                let _ = n.handle.cmds.try_send(cmd.clone());
            }
        }
    }

    fn note(&mut self, text: String) {
        tracing::info!("run {}: {text}", self.tracker.state.record.id);
        self.notes.push(EventRecord { t_ms: unix_ms(), kind: EventKind::Notice, rank: None, text });
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.notes.is_empty() && self.nodes.iter().all(|n| n.pending.is_empty()) {
            return Ok(());
        }
        let mut batch = Batch::default();
        let run = self.tracker.state.record.id.clone();
        batch.events.extend(self.notes.drain(..).map(|e| (run.clone(), e)));
        let mut taken = Vec::new();
        for (k, node) in self.nodes.iter_mut().enumerate() {
            if !node.pending.is_empty() {
                self.tracker.apply(k, &node.pending, &mut batch);
                taken.push((k, std::mem::take(&mut node.pending)));
            }
        }
        if taken.is_empty() {
            batch.runs.push(self.tracker.state.record.clone());
        }
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        let durable_ms = unix_ms();
        for f in taken.iter().flat_map(|(_, frames)| frames) {
            self.lag.durable(durable_ms, f.t_ms);
        }
        if let Some(window) = self.lag.take_window(std::time::Instant::now()) {
            tracing::info!("run {}: {window}", self.tracker.state.record.id);
        }
        for (k, frames) in taken {
            let last = frames.last().map(|f| f.seq).unwrap_or(0);
            // The node task sends the ack; an agent that has just exited no longer needs it.
            self.nodes[k].handle.acks.send_replace(last);
            // No watcher is not an error.
            let _ = self.frames_out.send(std::sync::Arc::new(NodeFrames { node: k as u32, frames }));
        }
        let ended = !self.tracker.state.record.status.is_live();
        if ended {
            self.take_up();
        }
        self.publish(ended);
        self.after_batch().await
    }

    /// Hands the run's end to recovery when its recipe restarts and the cause is one it undoes;
    /// before the end is published, so followers find the restart.
    fn take_up(&mut self) {
        let Some(recovery) = self.recovery.clone().filter(|_| !self.taken_up) else { return };
        self.taken_up = true;
        let record = self.tracker.state.record.clone();
        let time_limited = self.time_limited.load(Ordering::SeqCst);
        let ranks = &self.tracker.state.ranks;
        if let Some(cause) = super::recovery::cause(&record, ranks, self.stopped_by, time_limited) {
            super::recovery::take_up(&self.shared, record, ranks.clone(), cause, recovery);
        }
    }

    /// Checkpoints keep failing: stops the run at its next step boundary (the stop's own save may
    /// get through; if not, the run ends failed), rather than let it train on unprotected.
    fn stop_for_checkpoints(&mut self) {
        if self.stopped_by.is_some() || !self.tracker.state.record.status.is_live() {
            return;
        }
        self.stopped_by = Some(crate::record::Cause::Checkpoint);
        self.note("checkpoints are failing: stopping the run at its next step boundary".into());
        self.tracker.analyzer.ending();
        for n in self.nodes.iter().filter(|n| !n.done()) {
            let _ = n.handle.cmds.try_send(AgentCommand::Stop);
        }
    }

    /// Kills a hung run so that recovery can restart it.
    fn kill_for_recovery(&mut self) {
        if self.hang_kill_at.take().is_none() || !self.tracker.state.record.status.is_live() {
            return;
        }
        self.stopped_by = Some(crate::record::Cause::Hang);
        self.note("recovery: killing the hung run to restart it".into());
        self.tracker.analyzer.ending();
        for n in self.nodes.iter().filter(|n| !n.done()) {
            let _ = n.handle.cmds.try_send(AgentCommand::Kill);
        }
    }

    /// Lets the analysis give its time-based verdicts (no frame needs to arrive for a hang).
    async fn analyze(&mut self) -> anyhow::Result<()> {
        if !self.tracker.state.record.status.is_live() {
            return Ok(());
        }
        let mut batch = Batch::default();
        self.tracker.tick(unix_ms(), &mut batch);
        if batch.is_empty() {
            return Ok(());
        }
        batch.runs.push(self.tracker.state.record.clone());
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        self.publish(false);
        self.after_batch().await
    }

    /// Acts on what the last batch brought: reports for new hangs (and a stack dump for them),
    /// and stack dumps for whoever asked.
    async fn after_batch(&mut self) -> anyhow::Result<()> {
        if self.tracker.take_checkpoint_failing() {
            self.stop_for_checkpoints();
        }
        for (key, verdict) in self.tracker.take_new_hangs() {
            let live =
                self.tracker.state.record.status.is_live() && self.tracker.analyzer.ranks().values().any(|r| r.live());
            // A lost node's ranks cannot be read, and the others only wait for them: no dump (at
            // a thousand ranks, one would load every node for nothing).
            let lost = verdict.kind == VerdictKind::NodeLost;
            let stacks = match (live, lost) {
                (true, false) => Stacks::Pending,
                (_, true) => Stacks::Unavailable("its node is lost; the other ranks wait for it".into()),
                (false, false) => Stacks::Unavailable("the run ended with the verdict".into()),
            };
            let hang = matches!(verdict.kind, VerdictKind::NeverEntered | VerdictKind::StuckInCollective);
            if live && hang && self.recovery.is_some() && self.hang_kill_at.is_none() {
                self.hang_kill_at = Some(tokio::time::Instant::now() + STACKS_GRACE);
            }
            self.incidents.insert(key, (verdict, false));
            self.write_incident(key, stacks).await?;
            if live && !lost {
                self.ask_stacks(Pending::Incident(key), None, false);
            }
        }
        for (request, stacks) in self.tracker.take_stack_dumps() {
            // Each node's agent answers for its own ranks; the dump is whole when all have.
            let Some(wait) = self.pending.get_mut(&request) else { continue };
            wait.stacks.extend(stacks);
            wait.nodes_left = wait.nodes_left.saturating_sub(1);
            if wait.nodes_left > 0 {
                continue;
            }
            let Some(StackWait { waiter, stacks, .. }) = self.pending.remove(&request) else { continue };
            match waiter {
                Pending::Client(reply) => {
                    let _ = reply.send(stacks);
                }
                Pending::Incident(key) => {
                    let report = StackReport::from_dumps(self.tracker.state.record.id.clone(), &stacks);
                    if let Some(sharper) = self.tracker.analyzer.refine_with_stacks(&report.groups) {
                        let mut batch = Batch::default();
                        let text = format!("{} (from the stacks): {}", sharper.kind.name(), sharper.summary);
                        let rank = sharper.culprits.first().map(|c| c.rank);
                        self.tracker.event_now(&mut batch, EventKind::Verdict, rank, text);
                        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
                        if let Some(entry) = self.incidents.get_mut(&key) {
                            entry.0 = sharper;
                        }
                    }
                    self.write_incident(key, Stacks::Grouped(&report)).await?;
                    // The report has its stacks: a hung run recovery waits on can go now.
                    self.kill_for_recovery();
                }
            }
        }
        Ok(())
    }

    /// Asks every node's agent for its ranks' stacks (or the one rank's).
    fn ask_stacks(&mut self, waiter: Pending, rank: Option<u32>, native: bool) {
        self.next_request += 1;
        let request = self.next_request;
        let cmd = AgentCommand::DumpStacks { request, rank: rank.map(Rank), native };
        let mut asked = 0;
        for n in self.nodes.iter().filter(|n| !n.done()) {
            match n.handle.cmds.try_send(cmd.clone()) {
                Ok(()) => asked += 1,
                Err(e) => {
                    tracing::warn!("run {}: stack dump not asked of {}: {e}", self.tracker.state.record.id, n.host)
                }
            }
        }
        // A client whose request is dropped hears that the run's agent did not answer.
        if asked > 0 {
            self.pending.insert(request, StackWait { waiter, nodes_left: asked, stacks: Vec::new() });
        }
    }

    /// Writes (or rewrites) a hang's report file and its verdict record; says so once.
    async fn write_incident(&mut self, key: VerdictKey, stacks: Stacks<'_>) -> anyhow::Result<()> {
        let Some((verdict, written)) = self.incidents.get(&key).cloned() else { return Ok(()) };
        // The picture first (CPU work, off the async threads), so the report names it only if drawn.
        let mut chart = None;
        if let Some(dir) = self.run_dir.clone() {
            let series = incident::progress(&verdict, &self.tracker.analyzer);
            let (v, name) = (verdict.clone(), self.tracker.state.record.name.clone());
            let drawn =
                tokio::task::spawn_blocking(move || crate::report::incident::draw(&dir, &v, &name, &series)).await;
            match drawn {
                Ok(Ok(png)) => chart = Some(png),
                Ok(Err(e)) => tracing::warn!("incident picture: {e}"),
                Err(e) => tracing::warn!("incident picture: {e}"),
            }
        }
        let md =
            incident::render(&self.tracker.state.record, &verdict, &self.tracker.analyzer, stacks, chart.as_deref());
        let path = self.run_dir.as_ref().map(|d| d.join(verdict.report_file_name()));
        let mut batch = Batch::default();
        let mut report_path = None;
        if let Some(p) = &path {
            match tokio::fs::write(p, &md).await {
                Ok(()) => report_path = Some(p.display().to_string()),
                Err(e) => tracing::warn!("writing {}: {e}", p.display()),
            }
        }
        if let (false, Some(p)) = (written, &report_path) {
            self.tracker.incident_reports.push(p.clone());
        }
        if !written {
            let text = match &report_path {
                Some(p) => format!("incident report written: {p}"),
                None => "incident report kept in the history (no run directory to write it to)".into(),
            };
            self.tracker.event_now(&mut batch, EventKind::Incident, verdict.culprits.first().map(|c| c.rank), text);
        }
        let record = VerdictRecord { verdict: verdict.clone(), report_path, report_md: Some(md) };
        batch.verdicts.push((self.tracker.state.record.id.clone(), key, record));
        self.incidents.insert(key, (verdict, true));
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        self.publish(!self.tracker.state.record.status.is_live());
        Ok(())
    }

    fn publish(&self, ended: bool) {
        let r = &self.tracker.state.record;
        let ended = ended.then(|| (r.status, r.reason.clone()));
        self.view.send_replace(RunView { progress: self.tracker.progress(), ended });
    }
}
