//! The server's side of one agent: attach, replay, ingest in batches, ack after flush, relay
//! commands. One task per live run; it owns that run's `Tracker`.
use super::ingest::Ingest;
use super::tracker::Tracker;
use super::{Live, Registry, RunView};
use crate::agent::lock;
use crate::protocol::{
    read_frame_async, write_frame_async, AgentCommand, AgentEvent, AgentFrame, Hello, Role, PROTOCOL_VERSION,
};
use crate::store::{Batch, RunStatus};
use std::path::PathBuf;
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};

/// Frames per batch at most; with the flush interval this bounds ack latency and batch size.
const BATCH_FRAMES: usize = 2048;
const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Batches a watcher may fall behind (about 25 s at the flush interval) before it is told it
/// lagged and must reload from the store.
const WATCH_BACKLOG: usize = 256;

/// Connects to a run's agent and starts its link task; Err if the agent cannot be reached.
pub async fn attach(tracker: Tracker, socket: PathBuf, ingest: Ingest, registry: Registry) -> anyhow::Result<()> {
    let stream = UnixStream::connect(&socket).await?;
    let (mut rd, mut wr) = stream.into_split();
    write_frame_async(&mut wr, &Hello::new(Role::Server, "local")).await?;
    let hello: Hello = read_frame_async(&mut rd).await?.ok_or_else(|| anyhow::anyhow!("agent closed before hello"))?;
    if hello.protocol_version != PROTOCOL_VERSION {
        anyhow::bail!("agent speaks protocol {}, this server {PROTOCOL_VERSION}", hello.protocol_version);
    }
    let after_seq = tracker.record.acked_seq.first().copied().unwrap_or(0);
    write_frame_async(&mut wr, &AgentCommand::Attach { run: tracker.record.id.clone(), after_seq }).await?;

    // Reading frames on its own task keeps the select loop below cancel-safe.
    let (frames_tx, frames_rx) = mpsc::channel::<AgentFrame>(BATCH_FRAMES);
    tokio::spawn(async move {
        while let Ok(Some(f)) = read_frame_async::<AgentFrame, _>(&mut rd).await {
            if frames_tx.send(f).await.is_err() {
                break;
            }
        }
    });
    let (cmd_tx, cmd_rx) = mpsc::channel::<AgentCommand>(8);
    let (view_tx, view_rx) = watch::channel(RunView { progress: tracker.progress(), ended: None });
    let run = tracker.record.id.clone();
    let (frames_out, _) = tokio::sync::broadcast::channel(WATCH_BACKLOG);
    lock(&registry).insert(run.clone(), Live { commands: cmd_tx, view: view_rx, frames: frames_out.clone() });
    tokio::spawn(async move {
        let mut link = Link { tracker, ingest: ingest.clone(), view: view_tx, frames_out, wr };
        let outcome = link.run(frames_rx, cmd_rx).await;
        if let Err(e) = outcome {
            tracing::warn!("run {run}: link failed: {e}");
        }
        ingest.close_run(run.clone()).await;
        lock(&registry).remove(&run);
    });
    Ok(())
}

struct Link {
    tracker: Tracker,
    ingest: Ingest,
    view: watch::Sender<RunView>,
    frames_out: tokio::sync::broadcast::Sender<std::sync::Arc<Vec<AgentFrame>>>,
    wr: tokio::net::unix::OwnedWriteHalf,
}

impl Link {
    async fn run(
        &mut self,
        mut frames: mpsc::Receiver<AgentFrame>,
        mut cmds: mpsc::Receiver<AgentCommand>,
    ) -> anyhow::Result<()> {
        let mut pending: Vec<AgentFrame> = Vec::new();
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        let mut ended = false;
        loop {
            tokio::select! {
                f = frames.recv() => match f {
                    Some(f) => {
                        ended |= matches!(f.event, AgentEvent::RunEnded { .. });
                        pending.push(f);
                        if pending.len() >= BATCH_FRAMES || ended {
                            self.flush(&mut pending).await?;
                        }
                    }
                    None => break,
                },
                _ = tick.tick() => self.flush(&mut pending).await?,
                Some(cmd) = cmds.recv() => {
                    if let Err(e) = write_frame_async(&mut self.wr, &cmd).await {
                        tracing::warn!("run {}: command {cmd:?} not delivered: {e}", self.tracker.record.id);
                    }
                }
            }
        }
        self.flush(&mut pending).await?;
        if !self.tracker.record.status.is_live() {
            self.publish(true);
            return Ok(());
        }
        // The agent went away without saying the run ended: its ranks died with it.
        let mut batch = Batch::default();
        let reason = "lost the node agent before the run ended".to_string();
        self.tracker.end_without_agent(RunStatus::Interrupted, reason, &mut batch);
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        self.publish(true);
        Ok(())
    }

    async fn flush(&mut self, pending: &mut Vec<AgentFrame>) -> anyhow::Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::default();
        self.tracker.apply(0, pending, &mut batch);
        let last = pending.last().map(|f| f.seq).unwrap_or(0);
        let frames = std::sync::Arc::new(std::mem::take(pending));
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        // No watcher is not an error.
        let _ = self.frames_out.send(frames);
        let ended = !self.tracker.record.status.is_live();
        self.publish(ended);
        // An agent that has just exited cannot take the ack; it no longer needs it.
        if let Err(e) = write_frame_async(&mut self.wr, &AgentCommand::Ack { seq: last }).await {
            tracing::info!("run {}: ack {last} not delivered: {e}", self.tracker.record.id);
        }
        Ok(())
    }

    fn publish(&self, ended: bool) {
        let r = &self.tracker.record;
        let ended = ended.then(|| (r.status, r.reason.clone()));
        self.view.send_replace(RunView { progress: self.tracker.progress(), ended });
    }
}
