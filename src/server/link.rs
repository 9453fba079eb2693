//! The server's side of one agent: attach, replay, ingest in batches, ack after flush, relay
//! commands. One task per live run; it owns that run's `Tracker`.
use super::incident::{self, Stacks};
use super::ingest::Ingest;
use super::tracker::{Tracker, VerdictKey};
use super::{Live, Registry, RunView, StackAsk};
use crate::agent::lock;
use crate::ids::{unix_ms, Rank};
use crate::protocol::{
    read_frame_async, write_frame_async, AgentCommand, AgentEvent, AgentFrame, Hello, Role, PROTOCOL_VERSION,
};
use crate::protocol::{RankStacks, StackReport, Verdict};
use crate::store::{Batch, EventKind, RunStatus, VerdictRecord};
use std::collections::HashMap;
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
    // A handful of people asking for stacks at once is plenty; more wait their turn.
    let (stacks_tx, stacks_rx) = mpsc::channel::<StackAsk>(8);
    // Incident reports go beside the agent's files in the run's directory.
    let run_dir = socket.parent().map(PathBuf::from);
    let (view_tx, view_rx) = watch::channel(RunView { progress: tracker.progress(), ended: None });
    let run = tracker.record.id.clone();
    let (frames_out, _) = tokio::sync::broadcast::channel(WATCH_BACKLOG);
    let live = Live { commands: cmd_tx, view: view_rx, frames: frames_out.clone(), stacks: stacks_tx };
    lock(&registry).insert(run.clone(), live);
    tokio::spawn(async move {
        let mut link = Link {
            tracker,
            ingest: ingest.clone(),
            view: view_tx,
            frames_out,
            wr,
            run_dir,
            next_request: 0,
            pending: HashMap::new(),
            incidents: HashMap::new(),
        };
        let outcome = link.run(frames_rx, cmd_rx, stacks_rx).await;
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
    run_dir: Option<PathBuf>,
    next_request: u64,
    /// Stack dumps asked of the agent and not yet answered, by request number.
    pending: HashMap<u64, Pending>,
    /// Hang verdicts with a report: the verdict as it stands, and whether its file exists yet.
    incidents: HashMap<VerdictKey, (Verdict, bool)>,
}

/// Who is waiting for a stack dump.
enum Pending {
    Client(tokio::sync::oneshot::Sender<Vec<RankStacks>>),
    Incident(VerdictKey),
}

impl Link {
    async fn run(
        &mut self,
        mut frames: mpsc::Receiver<AgentFrame>,
        mut cmds: mpsc::Receiver<AgentCommand>,
        mut stack_asks: mpsc::Receiver<StackAsk>,
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
                _ = tick.tick() => {
                    self.flush(&mut pending).await?;
                    self.analyze().await?;
                }
                Some(ask) = stack_asks.recv() => self.ask_stacks(Pending::Client(ask.reply), ask.rank).await,
                Some(cmd) = cmds.recv() => {
                    if matches!(cmd, AgentCommand::Stop | AgentCommand::Kill) {
                        self.tracker.analyzer.ending();
                    }
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
        self.after_batch().await
    }

    /// Lets the analysis give its time-based verdicts (no frame needs to arrive for a hang).
    async fn analyze(&mut self) -> anyhow::Result<()> {
        if !self.tracker.record.status.is_live() {
            return Ok(());
        }
        let mut batch = Batch::default();
        self.tracker.tick(unix_ms(), &mut batch);
        if batch.is_empty() {
            return Ok(());
        }
        batch.runs.push(self.tracker.record.clone());
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        self.publish(false);
        self.after_batch().await
    }

    /// Acts on what the last batch brought: reports for new hangs (and a stack dump for them),
    /// and stack dumps for whoever asked.
    async fn after_batch(&mut self) -> anyhow::Result<()> {
        for (key, verdict) in self.tracker.take_new_hangs() {
            let live = self.tracker.record.status.is_live() && self.tracker.analyzer.ranks().values().any(|r| r.live());
            let stacks =
                if live { Stacks::Pending } else { Stacks::Unavailable("the run ended with the verdict".into()) };
            self.incidents.insert(key, (verdict, false));
            self.write_incident(key, stacks).await?;
            if live {
                self.ask_stacks(Pending::Incident(key), None).await;
            }
        }
        for (request, stacks) in self.tracker.take_stack_dumps() {
            match self.pending.remove(&request) {
                Some(Pending::Client(reply)) => {
                    let _ = reply.send(stacks);
                }
                Some(Pending::Incident(key)) => {
                    let report = group(self.tracker.record.id.clone(), &stacks);
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
                }
                None => {}
            }
        }
        Ok(())
    }

    async fn ask_stacks(&mut self, waiter: Pending, rank: Option<u32>) {
        self.next_request += 1;
        let request = self.next_request;
        let cmd = AgentCommand::DumpStacks { request, rank: rank.map(Rank) };
        match write_frame_async(&mut self.wr, &cmd).await {
            // A client whose request is dropped hears that the run's agent did not answer.
            Ok(()) => drop(self.pending.insert(request, waiter)),
            Err(e) => tracing::warn!("run {}: stack dump not asked: {e}", self.tracker.record.id),
        }
    }

    /// Writes (or rewrites) a hang's report file and its verdict record; says so once.
    async fn write_incident(&mut self, key: VerdictKey, stacks: Stacks<'_>) -> anyhow::Result<()> {
        let Some((verdict, written)) = self.incidents.get(&key).cloned() else { return Ok(()) };
        let md = incident::render(&self.tracker.record, &verdict, &self.tracker.analyzer, stacks);
        let path = self.run_dir.as_ref().map(|d| d.join(incident::file_name(&verdict)));
        let mut batch = Batch::default();
        let mut report_path = None;
        if let Some(p) = &path {
            match tokio::fs::write(p, &md).await {
                Ok(()) => report_path = Some(p.display().to_string()),
                Err(e) => tracing::warn!("writing {}: {e}", p.display()),
            }
        }
        if !written {
            let text = match &report_path {
                Some(p) => format!("incident report written: {p}"),
                None => "incident report kept in the history (no run directory to write it to)".into(),
            };
            self.tracker.event_now(&mut batch, EventKind::Incident, verdict.culprits.first().map(|c| c.rank), text);
        }
        let record = VerdictRecord { verdict: verdict.clone(), report_path, report_md: Some(md) };
        batch.verdicts.push((self.tracker.record.id.clone(), key, record));
        self.incidents.insert(key, (verdict, true));
        self.ingest.write(batch).await.map_err(anyhow::Error::msg)?;
        self.publish(!self.tracker.record.status.is_live());
        Ok(())
    }

    fn publish(&self, ended: bool) {
        let r = &self.tracker.record;
        let ended = ended.then(|| (r.status, r.reason.clone()));
        self.view.send_replace(RunView { progress: self.tracker.progress(), ended });
    }
}

/// Groups a dump's ranks by identical stacks, with each rank's tool and time.
pub fn group(run: crate::ids::RunId, stacks: &[RankStacks]) -> StackReport {
    let (groups, failures) = crate::agent::stacks::group(stacks);
    let timings = stacks.iter().map(|s| (s.rank, s.pid, s.tool, s.elapsed_ms)).collect();
    StackReport { run, groups, failures, timings }
}
