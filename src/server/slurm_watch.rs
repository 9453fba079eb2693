//! The watch on a Slurm run's allocation, while the run lives: the time-limit warning (which
//! the holder script notes on the job) becomes a graceful stop with a checkpoint, and a job that
//! Slurm ends under the run (cancelled, timed out, a node failure) is an event that says so.
use super::ingest::Ingest;
use super::placement::SlurmNodes;
use super::RunView;
use crate::ids::{unix_ms, RunId};
use crate::protocol::AgentCommand;
use crate::slurm::alloc::GRACE_COMMENT;
use crate::store::{Batch, EventKind, EventRecord};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// How often the job is asked about: the warning comes minutes before the limit
/// (`cluster.grace_s`), so seconds of delay cost nothing, and slurmctld gets one query per run
/// every few seconds.
const POLL: Duration = Duration::from_secs(2);

pub struct Watch {
    pub nodes: SlurmNodes,
    pub run: RunId,
    /// The run's command channel (as a client's stop takes).
    pub commands: mpsc::Sender<AgentCommand>,
    pub view: watch::Receiver<RunView>,
    pub ingest: Ingest,
    pub time_limited: Arc<AtomicBool>,
}

impl Watch {
    pub async fn run(mut self) {
        let job = self.nodes.allocation.job.clone();
        let mut told_state = String::from("RUNNING");
        // An interval keeps its schedule while the view changes (every flush) wake the select.
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = self.view.changed() => {
                    if changed.is_err() || self.view.borrow().ended.is_some() {
                        return;
                    }
                    continue;
                }
                _ = poll.tick() => {}
            }
            let slurm = self.nodes.slurm.clone();
            let asked = job.clone();
            let info = match tokio::task::spawn_blocking(move || slurm.job(&asked)).await {
                Ok(Ok(info)) => info,
                Ok(Err(e)) => {
                    tracing::warn!("run {}: asking Slurm about job {job}: {e}", self.run);
                    continue;
                }
                Err(_) => return,
            };
            let Some(info) = info else { continue };
            if info.comment == GRACE_COMMENT && !self.time_limited.swap(true, Ordering::SeqCst) {
                let text = format!(
                    "Slurm job {job}: the time-limit warning came ({} s before the limit, cluster.grace_s); \
                     stopping at the next step boundary with a checkpoint",
                    self.nodes.grace_s
                );
                self.note(text).await;
                if self.commands.send(AgentCommand::Stop).await.is_err() {
                    return;
                }
            }
            if info.state != told_state && !info.running() {
                let text = format!("Slurm job {job} is {} ({}) while the run is live", info.state, info.reason);
                self.note(text).await;
                told_state = info.state.clone();
            }
        }
    }

    async fn note(&self, text: String) {
        tracing::info!("run {}: {text}", self.run);
        let mut batch = Batch::default();
        batch
            .events
            .push((self.run.clone(), EventRecord { t_ms: unix_ms(), kind: EventKind::Notice, rank: None, text }));
        if let Err(e) = self.ingest.write(batch).await {
            tracing::warn!("run {}: recording a Slurm event: {e}", self.run);
        }
    }
}
