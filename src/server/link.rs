//! The server's side of one run's agents: attach, replay, ingest in batches, ack after flush,
//! relay commands. One task per live run owns that run's `Tracker`; one task per node keeps
//! that node's link up (`transport.rs`), over a Unix socket or SSH alike.
use super::ingest::Ingest;
use super::tracker::Tracker;
use super::transport::{self, Incoming, NodeHandle, Transport};
use super::{Live, NodeFrames, Registry, RunView};
use crate::agent::lock;
use crate::ids::unix_ms;
use crate::protocol::{AgentCommand, AgentEvent, AgentFrame, RunOutcome};
use crate::store::{Batch, EventKind, EventRecord, RunStatus};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Frames per batch at most; with the flush interval this bounds ack latency and batch size.
const BATCH_FRAMES: usize = 2048;
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// How long the last acks may take to reach the agents when a run ends.
const ACK_GRACE: Duration = Duration::from_secs(10);
/// Batches a watcher may fall behind (about 25 s at the flush interval) before it is told it
/// lagged and must reload from the store.
const WATCH_BACKLOG: usize = 256;

/// Connects to a local run's agent and starts its link task; Err if the agent cannot be reached.
pub async fn attach(tracker: Tracker, socket: PathBuf, ingest: Ingest, registry: Registry) -> anyhow::Result<()> {
    attach_nodes(tracker, vec![Transport::Local(socket)], ingest, registry).await
}

/// Connects to every node's agent (all must answer) and starts the run's link task.
pub async fn attach_nodes(
    tracker: Tracker,
    transports: Vec<Transport>,
    ingest: Ingest,
    registry: Registry,
) -> anyhow::Result<()> {
    let run = tracker.record.id.clone();
    let after: Vec<u64> =
        (0..transports.len()).map(|k| tracker.record.acked_seq.get(k).copied().unwrap_or(0)).collect();
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
    let (in_tx, in_rx) = mpsc::channel::<Incoming>(BATCH_FRAMES);
    let mut nodes = Vec::new();
    for (k, (t, conn)) in transports.into_iter().zip(conns).enumerate() {
        let conn = conn.ok_or_else(|| anyhow::anyhow!("node {k}: no link"))?;
        let host = tracker.record.hosts.get(k).cloned().unwrap_or_else(|| t.describe());
        let handle = transport::spawn_node(k, t, run.clone(), conn, after[k], in_tx.clone());
        nodes.push(Node { handle, host, last_seq: after[k], ended: None, lost: None, pending: Vec::new() });
    }
    drop(in_tx);

    let (cmd_tx, cmd_rx) = mpsc::channel::<AgentCommand>(8);
    let (view_tx, view_rx) = watch::channel(RunView { progress: tracker.progress(), ended: None });
    let (frames_out, _) = tokio::sync::broadcast::channel(WATCH_BACKLOG);
    lock(&registry).insert(run.clone(), Live { commands: cmd_tx, view: view_rx, frames: frames_out.clone() });
    tokio::spawn(async move {
        let mut link = Link { tracker, ingest: ingest.clone(), view: view_tx, frames_out, nodes, notes: Vec::new() };
        if let Err(e) = link.run(in_rx, cmd_rx).await {
            tracing::warn!("run {run}: link failed: {e}");
        }
        ingest.close_run(run.clone()).await;
        lock(&registry).remove(&run);
    });
    Ok(())
}

struct Node {
    handle: NodeHandle,
    host: String,
    /// The newest frame taken from this node; replays of older ones are dropped.
    last_seq: u64,
    ended: Option<(RunOutcome, String)>,
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
}

impl Link {
    async fn run(
        &mut self,
        mut incoming: mpsc::Receiver<Incoming>,
        mut cmds: mpsc::Receiver<AgentCommand>,
    ) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        while !self.nodes.iter().all(Node::done) {
            tokio::select! {
                i = incoming.recv() => match i {
                    Some(Incoming::Frame(k, f)) => self.frame(k, f).await?,
                    Some(Incoming::Down(k, why)) => self.note(format!("lost the link to {}: {why}; reconnecting", self.nodes[k].host)),
                    Some(Incoming::Up(k, after)) => {
                        self.note(format!("reconnected to {}; replaying after frame {after}", self.nodes[k].host))
                    }
                    Some(Incoming::Lost(k, why)) => {
                        self.nodes[k].lost = Some(why);
                        self.command_others(k, AgentCommand::Kill);
                    }
                    None => break,
                },
                _ = tick.tick() => self.flush().await?,
                Some(cmd) = cmds.recv() => {
                    for n in self.nodes.iter().filter(|n| !n.done()) {
                        if n.handle.cmds.try_send(cmd.clone()).is_err() {
                            tracing::warn!("run {}: command {cmd:?} not delivered to {}", self.tracker.record.id, n.host);
                        }
                    }
                }
            }
        }
        self.flush().await?;
        if self.tracker.record.status.is_live() {
            let (status, reason) = self.outcome();
            let mut batch = Batch::default();
            self.tracker.end_without_agent(status, reason, &mut batch);
            self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        }
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
        let node = &mut self.nodes[k];
        if f.seq <= node.last_seq {
            return Ok(()); // replayed after a reconnect; already taken
        }
        node.last_seq = f.seq;
        let ended = if let AgentEvent::RunEnded { outcome, reason } = &f.event {
            node.ended = Some((*outcome, reason.clone()));
            node.handle.ended.store(true, Ordering::SeqCst);
            if multi {
                // One node's end is not the run's: it ends when every node has.
                let text = format!("{}: {} ({reason})", node.host, outcome_status(*outcome).name());
                if *outcome != RunOutcome::Succeeded {
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
        // The first node to end other than successfully names the run's outcome.
        let failed = self.nodes.iter().filter_map(|n| n.ended.as_ref()).find(|(o, _)| *o != RunOutcome::Succeeded);
        match failed {
            Some((o, reason)) => (outcome_status(*o), reason.clone()),
            None if self.nodes.iter().all(|n| n.ended.is_some()) => (
                RunStatus::Succeeded,
                format!("all {} ranks finished on {} nodes", self.tracker.record.world_size, self.nodes.len()),
            ),
            None => (RunStatus::Interrupted, "lost the node agent before the run ended".into()),
        }
    }

    fn command_others(&self, k: usize, cmd: AgentCommand) {
        for (i, n) in self.nodes.iter().enumerate() {
            if i != k && !n.done() {
                let _ = n.handle.cmds.try_send(cmd.clone());
            }
        }
    }

    fn note(&mut self, text: String) {
        tracing::info!("run {}: {text}", self.tracker.record.id);
        self.notes.push(EventRecord { t_ms: unix_ms(), kind: EventKind::Notice, rank: None, text });
    }

    async fn flush(&mut self) -> anyhow::Result<()> {
        if self.notes.is_empty() && self.nodes.iter().all(|n| n.pending.is_empty()) {
            return Ok(());
        }
        let mut batch = Batch::default();
        let run = self.tracker.record.id.clone();
        batch.events.extend(self.notes.drain(..).map(|e| (run.clone(), e)));
        let mut taken = Vec::new();
        for (k, node) in self.nodes.iter_mut().enumerate() {
            if !node.pending.is_empty() {
                self.tracker.apply(k, &node.pending, &mut batch);
                taken.push((k, std::mem::take(&mut node.pending)));
            }
        }
        if taken.is_empty() {
            batch.runs.push(self.tracker.record.clone());
        }
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        for (k, frames) in taken {
            let last = frames.last().map(|f| f.seq).unwrap_or(0);
            // The node task sends the ack; an agent that has just exited no longer needs it.
            self.nodes[k].handle.acks.send_replace(last);
            // No watcher is not an error.
            let _ = self.frames_out.send(std::sync::Arc::new(NodeFrames { node: k as u32, frames }));
        }
        let ended = !self.tracker.record.status.is_live();
        self.publish(ended);
        Ok(())
    }

    fn publish(&self, ended: bool) {
        let r = &self.tracker.record;
        let ended = ended.then(|| (r.status, r.reason.clone()));
        self.view.send_replace(RunView { progress: self.tracker.progress(), ended });
    }
}

fn outcome_status(o: RunOutcome) -> RunStatus {
    match o {
        RunOutcome::Succeeded => RunStatus::Succeeded,
        RunOutcome::Failed => RunStatus::Failed,
        RunOutcome::Stopped => RunStatus::Stopped,
        RunOutcome::Killed => RunStatus::Killed,
    }
}
