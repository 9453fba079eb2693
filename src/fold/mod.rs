//! One fold of a run's agent frames into its state (status, step, ranks) and its events. The
//! server's tracker (what the history stores) and the cockpit's model (what it shows live) both
//! call it, so the words in the Events panel are the same live and after a reopen.
use crate::protocol::{AgentEvent, AgentFrame, CheckpointSaved, RankMsg, RunOutcome};
use crate::record::{EventKind, EventRecord, Phase, RankInfo, RunRecord, RunStatus};
use std::collections::BTreeSet;

/// What one frame changed besides the state itself.
#[derive(Debug, Default, PartialEq)]
pub struct Folded {
    /// Events the frame gives, in order.
    pub events: Vec<EventRecord>,
    /// The rank whose `RankInfo` changed, if one did.
    pub rank: Option<u32>,
}

/// A run as its frames have made it so far: its record and one `RankInfo` per rank (index =
/// rank). Pure: no clock, no I/O; a frame's time is its own stamp.
#[derive(Clone, Debug)]
pub struct RunState {
    pub record: RunRecord,
    pub ranks: Vec<RankInfo>,
    /// Ranks whose non-finite loss has been reported (once per rank, not once per step).
    nan_reported: BTreeSet<u32>,
}

impl RunState {
    /// The state from a stored record and the ranks stored with it.
    pub fn new(record: RunRecord, known: Vec<RankInfo>) -> RunState {
        let mut s = RunState { ranks: Vec::new(), nan_reported: BTreeSet::new(), record };
        for r in 0..s.record.world_size {
            s.rank_mut(r);
        }
        for info in known {
            let rank = info.rank;
            *s.rank_mut(rank) = info;
        }
        s
    }

    pub fn rank_mut(&mut self, rank: u32) -> &mut RankInfo {
        entry(&mut self.ranks, rank)
    }

    /// Ranks started and not exited.
    pub fn ranks_alive(&self) -> u32 {
        self.ranks.iter().filter(|r| r.is_alive()).count() as u32
    }

    /// Folds one frame in.
    pub fn apply(&mut self, f: &AgentFrame) -> Folded {
        let mut out = Folded::default();
        let t_ms = f.t_ms;
        let mut event = |kind, rank: Option<u32>, text: String| out.events.push(EventRecord { t_ms, kind, rank, text });
        match &f.event {
            AgentEvent::RankStarted { rank, local_rank, pid, host } => {
                let info = self.rank_mut(rank.0);
                info.pid = Some(*pid);
                info.host = host.clone();
                info.local_rank = Some(*local_rank);
                info.last_seen_ms = Some(t_ms);
                out.rank = Some(rank.0);
                if self.record.status == RunStatus::Starting {
                    self.record.status = RunStatus::Running;
                }
                let text = format!("rank {rank} (local rank {local_rank}) started on {host}, pid {pid}");
                event(EventKind::RankStarted, Some(rank.0), text);
            }
            AgentEvent::Rank { rank, msg } => {
                out.rank = Some(rank.0);
                let nan_reported = &mut self.nan_reported;
                let info = entry(&mut self.ranks, rank.0);
                info.last_seen_ms = Some(t_ms);
                match msg {
                    RankMsg::Register { pid, .. } => info.pid = Some(*pid),
                    RankMsg::Collective(_) | RankMsg::Metrics { .. } => {}
                    RankMsg::Finished { .. } => info.phase = Some(Phase::Done),
                    RankMsg::Phase { phase, .. } => info.phase = Some(*phase),
                    RankMsg::CheckpointSaved(c) if rank.0 == 0 => {
                        event(EventKind::CheckpointSaved, Some(rank.0), saved_text(c))
                    }
                    RankMsg::CheckpointSaved(c) => {
                        // Another node's copy (multi-node runs keep one per node).
                        let text = format!("rank {rank}'s copy on {}: {}", info.host, saved_text(c));
                        event(EventKind::CheckpointSaved, Some(rank.0), text)
                    }
                    RankMsg::CheckpointFailed { step, reason } => {
                        let text = format!("rank {rank}: checkpoint step {} failed: {reason}", step.0);
                        event(EventKind::CheckpointFailed, Some(rank.0), text);
                    }
                    RankMsg::Refused(r) => event(EventKind::Refused, Some(rank.0), refused_text(r)),
                    RankMsg::Step(m) => {
                        info.step = info.step.max(m.step.0);
                        info.last_loss = Some(m.loss);
                        info.step_time_ms = Some(m.step_time_ms);
                        if !m.loss.is_finite() && nan_reported.insert(rank.0) {
                            let text = format!("rank {rank} reported loss {} at step {}", m.loss, m.step.0);
                            event(EventKind::NanLoss, Some(rank.0), text);
                        }
                    }
                }
            }
            AgentEvent::ProcSample { rank, cpu_pct, rss_bytes } => {
                let info = self.rank_mut(rank.0);
                info.cpu_pct = Some(*cpu_pct);
                info.rss_bytes = Some(*rss_bytes);
                out.rank = Some(rank.0);
            }
            AgentEvent::RankExited { rank, pid, status, last_error } => {
                let info = self.rank_mut(rank.0);
                info.exit = Some(status.clone());
                // Its end is the last thing heard of it: which rank failed first is read from here.
                info.last_seen_ms = Some(t_ms);
                out.rank = Some(rank.0);
                let said = last_error.as_ref().filter(|_| !status.success()).map(|e| format!(": {e}"));
                let text = format!(
                    "rank {rank} ({}, pid {pid}) exited: {}{}",
                    info.host,
                    status.describe(),
                    said.unwrap_or_default()
                );
                event(EventKind::RankExited, Some(rank.0), text);
            }
            AgentEvent::LogRecord { rank, record } => {
                out.rank = Some(rank.0);
                if let Some((kind, about, text)) = self.log_record(rank.0, record, t_ms) {
                    event(kind, Some(about), text);
                }
            }
            AgentEvent::Notice { text } => event(EventKind::Notice, None, text.clone()),
            AgentEvent::Refused(r) => event(EventKind::Refused, None, refused_text(r)),
            AgentEvent::BadFrame { rank, reason } => {
                event(EventKind::BadFrame, rank.map(|r| r.0), format!("bad frame dropped: {reason}"))
            }
            AgentEvent::GpuXid { .. } | AgentEvent::GpuEcc { .. } | AgentEvent::GpuThrottle { .. } => {
                event(EventKind::Notice, None, gpu_event_text(&f.event))
            }
            AgentEvent::RunEnded { outcome, reason } => {
                out.events.push(self.end(status_of(*outcome), reason.clone(), t_ms));
            }
            AgentEvent::GpuSample(_)
            | AgentEvent::Heartbeat
            | AgentEvent::StackDump { .. }
            | AgentEvent::TorchFlight { .. }
            | AgentEvent::Log { .. } => {}
        }
        out
    }

    /// What a rank's log said: a training step moves the rank on like a step it reported (to
    /// the step it printed, else one past its last; its standard series give its loss and step
    /// time); a failure becomes an event about the rank
    /// it names (torchrun prints its children's failures), a NaN loss the same event as ever.
    fn log_record(
        &mut self,
        rank: u32,
        record: &crate::adapters::Record,
        t_ms: u64,
    ) -> Option<(EventKind, u32, String)> {
        use crate::adapters::RecordKind;
        let info = entry(&mut self.ranks, rank);
        info.last_seen_ms = Some(t_ms);
        if record.kind == RecordKind::Event {
            let (name, about, text) = failure(record, rank);
            if name == "nan_loss" {
                return self.nan_reported.insert(about).then_some((EventKind::NanLoss, about, text));
            }
            return Some((EventKind::Failure, about, text));
        }
        if record.kind != RecordKind::Step {
            return None;
        }
        // A line that prints no step (HF's dicts) is the rank's next logged step.
        info.step = match record.step {
            Some(step) => info.step.max(step),
            None => info.step + 1,
        };
        let standard = crate::adapters::standard(record);
        let value = |name: &str| standard.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        if let Some(ms) = value("step_time_ms") {
            info.step_time_ms = Some(ms);
        }
        let loss = value("loss")?;
        info.last_loss = Some(loss);
        let step = record.step.unwrap_or(info.step);
        (!loss.is_finite() && self.nan_reported.insert(rank)).then(|| {
            (EventKind::NanLoss, rank, format!("rank {rank} reported loss {loss} at step {step} (in its log)"))
        })
    }

    /// After a batch of frames: the run's step is the lowest step every rank has reached, its
    /// loss the mean of the ranks' latest (once per batch: it reads every rank).
    pub fn settle(&mut self) {
        self.record.step = self.ranks.iter().map(|r| r.step).min().unwrap_or(0);
        let losses: Vec<f64> = self.ranks.iter().filter_map(|r| r.last_loss).collect();
        if !losses.is_empty() {
            self.record.last_loss = Some(losses.iter().sum::<f64>() / losses.len() as f64);
        }
    }

    /// Ends the run: by its agent's word (`RunEnded`) or without it (the agent is gone).
    /// `Hung` while a hang verdict holds; `Running` again once none does, unless a rank has
    /// exited meanwhile (a kill of the hung run): then it stays hung until it ends.
    pub fn settle_hang(&mut self, hang_holds: bool) {
        let exiting = self.ranks.iter().any(|r| r.exit.is_some());
        let hung = hang_holds || (self.record.status == RunStatus::Hung && exiting);
        self.record.status = self.record.status.with_hang(hung);
    }

    /// A run that ends hung says so: its reason ends `, while hung`.
    pub fn end(&mut self, status: RunStatus, reason: String, t_ms: u64) -> EventRecord {
        let reason = if self.record.status == RunStatus::Hung { format!("{reason}, while hung") } else { reason };
        self.record.status = status;
        self.record.ended_ms = Some(t_ms);
        let text = format!("run {}: {reason}", status.name());
        self.record.reason = reason;
        EventRecord { t_ms, kind: EventKind::RunEnded, rank: None, text }
    }
}

/// A rank's info, with the ranks up to it made (a rank can be heard of before the world size).
fn entry(ranks: &mut Vec<RankInfo>, rank: u32) -> &mut RankInfo {
    let i = rank as usize;
    if i >= ranks.len() {
        let from = ranks.len() as u32;
        ranks.extend((from..=rank).map(RankInfo::new));
    }
    &mut ranks[i]
}

/// The run status an agent's outcome gives.
pub fn status_of(outcome: RunOutcome) -> RunStatus {
    match outcome {
        RunOutcome::Succeeded => RunStatus::Succeeded,
        RunOutcome::Failed => RunStatus::Failed,
        RunOutcome::Stopped => RunStatus::Stopped,
        RunOutcome::Killed => RunStatus::Killed,
    }
}

/// A refused connection as an event: which port, who, why, and how many so far.
fn refused_text(r: &crate::protocol::message::Refusal) -> String {
    let so_far = match r.count {
        1 => String::new(),
        n => format!(" ({n} refused so far)"),
    };
    format!("{} refused a connection from {}: {}{so_far}", r.listener, r.peer, r.reason)
}

/// The event text of a committed checkpoint: its size and what the save cost.
pub fn saved_text(c: &CheckpointSaved) -> String {
    format!(
        "checkpoint step {} saved: {} in {:.0} ms ({}), training blocked {:.1} ms",
        c.step.0,
        crate::units::bytes(c.bytes),
        c.write_ms,
        crate::units::gb_per_s(c.write_gbps),
        c.blocking_ms
    )
}

/// The event text of a GPU event.
pub fn gpu_event_text(e: &AgentEvent) -> String {
    match e {
        AgentEvent::GpuXid { index, xid } => format!("GPU {index}: XID {xid} (see NVIDIA's XID catalogue)"),
        AgentEvent::GpuEcc { index, uncorrected: true } => format!("GPU {index}: uncorrected ECC error"),
        AgentEvent::GpuEcc { index, uncorrected: false } => format!("GPU {index}: corrected ECC error"),
        AgentEvent::GpuThrottle { index, reasons } if reasons.is_empty() => {
            format!("GPU {index}: clocks no longer held down")
        }
        AgentEvent::GpuThrottle { index, reasons } => {
            let names: Vec<&str> = reasons.iter().map(|r| r.name()).collect();
            format!("GPU {index}: clocks held down by {}", names.join(", "))
        }
        _ => String::new(),
    }
}

/// A failure a rank's log showed: its name, the rank it is about (the `rank` it names, else the
/// rank that printed it) and the event's words, with everything the adapter took from it.
fn failure(record: &crate::adapters::Record, printer: u32) -> (String, u32, String) {
    use crate::adapters::Label;
    let (name, about) = record.failure(printer).unwrap_or(("failure", printer));
    let name = name.to_string();
    let mut parts: Vec<String> = record
        .labels
        .iter()
        .filter(|(k, _)| k != "event" && k != "rank")
        .map(|(k, v)| match v {
            Label::Int(i) => format!("{k} {i}"),
            Label::Text(t) => format!("{k} {t}"),
        })
        .collect();
    parts.extend(record.metrics.iter().map(|(k, v)| format!("{k} {v}")));
    let details = if parts.is_empty() { String::new() } else { format!(": {}", parts.join(", ")) };
    let from = if about == printer { String::new() } else { format!(" (printed by rank {printer})") };
    let line = match record.end_line {
        Some(end) => format!("lines {}-{end}", record.line),
        None => format!("line {}", record.line),
    };
    (name.clone(), about, format!("rank {about}: {}{details}{from}, log {line}", name.replace('_', " ")))
}

#[cfg(test)]
mod tests;
