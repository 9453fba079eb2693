//! One run as the cockpit knows it: the stored snapshot plus live frames, folded into bounded
//! per-panel data (series, ranks, collectives, logs, events). The ingest path of the cockpit.
use super::series::{Agg, Series};
use crate::protocol::{AgentEvent, AgentFrame, CollectiveRecord, GpuSample, RankMsg, RunOutcome, RunSnapshot};
use crate::protocol::{CollectiveOp, CollectiveState, ExitStatus, Phase};
use crate::store::{EventKind, EventRecord, RunRecord, RunStatus};
use std::collections::{BTreeMap, VecDeque};

/// Entries per cross-rank series (the mean / min–max band): a few per terminal column.
const CROSS_CAP: usize = 2048;
/// Entries per rank and metric: two or more per heatmap column at 160 columns; the heatmap reads
/// every rank each frame, so this bounds its cost (1,024 ranks × 128).
const PER_RANK_CAP: usize = 128;
/// Metrics kept per rank (the others only as the cross-rank aggregate, to bound memory).
const PER_RANK_METRICS: [&str; 2] = ["loss", "step_time_ms"];
/// Collective sequence numbers kept for the collectives panel.
const COLLECTIVES_KEPT: usize = 128;
const LOG_LINES_KEPT: usize = 5000;
const EVENTS_KEPT: usize = 2000;

#[derive(Clone, Debug, Default)]
pub struct RankRow {
    pub rank: u32,
    pub host: String,
    pub pid: Option<u32>,
    pub local_rank: Option<u32>,
    pub step: u64,
    pub step_time_ms: Option<f64>,
    pub loss: Option<f64>,
    pub phase: Option<Phase>,
    pub last_collective: Option<(u64, CollectiveOp, CollectiveState)>,
    pub last_seen_ms: Option<u64>,
    pub cpu_pct: Option<f64>,
    pub rss_bytes: Option<u64>,
    pub exit: Option<ExitStatus>,
}

#[derive(Clone, Debug)]
pub struct MetricSeries {
    /// Per step, aggregated over ranks: mean, min–max band.
    pub cross: Series,
    /// Per rank (only for `PER_RANK_METRICS`).
    pub per_rank: Vec<Series>,
    /// Per rank, the last step added: a live frame the snapshot already held is skipped by it.
    last_step: Vec<u64>,
}

/// One collective (one sequence number) across ranks.
#[derive(Clone, Debug)]
pub struct CollectiveRow {
    pub seq: u64,
    pub op: CollectiveOp,
    pub bytes: u64,
    pub step: u64,
    /// Indexed by rank: that rank's latest record of this collective.
    pub ranks: Vec<Option<CollectiveRecord>>,
}

#[derive(Clone, Debug)]
pub struct LogLine {
    pub rank: u32,
    pub line: String,
}

#[derive(Clone, Debug)]
pub struct RunModel {
    pub record: RunRecord,
    pub ranks: Vec<RankRow>,
    pub metrics: BTreeMap<String, MetricSeries>,
    pub collectives: BTreeMap<u64, CollectiveRow>,
    pub logs: VecDeque<LogLine>,
    pub events: VecDeque<EventRecord>,
    pub gpus: BTreeMap<u32, GpuSample>,
    /// Frames at or below this sequence number were in the snapshot.
    pub snapshot_seq: u64,
    /// When the last frame of this run was stamped (agent clock).
    pub last_data_ms: Option<u64>,
    /// Log lines received in total (so a follower knows something new arrived).
    pub log_count: u64,
    /// Verdicts the store holds (oldest first), and the hang verdicts seen live since.
    pub stored_verdicts: Vec<crate::protocol::Verdict>,
    /// The verdicts that hold now (from the progress stream); None until it first reports.
    pub live_verdicts: Option<Vec<crate::protocol::Verdict>>,
}

impl RunModel {
    pub fn from_snapshot(s: &RunSnapshot) -> RunModel {
        let d = &s.detail;
        let world = d.run.world_size.max(d.ranks.iter().map(|r| r.rank + 1).max().unwrap_or(0));
        let mut m = RunModel {
            record: d.run.clone(),
            ranks: (0..world).map(|rank| RankRow { rank, ..RankRow::default() }).collect(),
            metrics: BTreeMap::new(),
            collectives: BTreeMap::new(),
            logs: VecDeque::new(),
            events: d.events.iter().cloned().collect(),
            gpus: BTreeMap::new(),
            snapshot_seq: d.run.acked_seq.first().copied().unwrap_or(0),
            last_data_ms: None,
            log_count: 0,
            stored_verdicts: d.verdicts.iter().map(|r| r.verdict.clone()).collect(),
            live_verdicts: None,
        };
        for info in &d.ranks {
            let row = m.rank_mut(info.rank);
            row.host = info.host.clone();
            row.pid = info.pid;
            row.step = info.step;
            row.phase = info.phase;
            row.loss = info.last_loss;
            row.cpu_pct = info.cpu_pct;
            row.rss_bytes = info.rss_bytes;
            row.exit = info.exit.clone();
        }
        for ss in &s.series {
            for b in &ss.buckets {
                m.add_point(&ss.metric, ss.rank, Agg::from_bucket(b));
            }
            if ss.metric == "step_time_ms" {
                let last = ss.buckets.last().map(|b| b.last);
                m.rank_mut(ss.rank).step_time_ms = last;
            }
        }
        for (rank, recs) in &s.collectives {
            for r in recs {
                m.add_collective(*rank, r.clone());
            }
        }
        for (rank, lines) in &s.logs {
            for line in lines {
                m.push_log(*rank, line.clone());
            }
        }
        m
    }

    fn rank_mut(&mut self, rank: u32) -> &mut RankRow {
        let i = rank as usize;
        if i >= self.ranks.len() {
            let from = self.ranks.len() as u32;
            self.ranks.extend((from..=rank).map(|rank| RankRow { rank, ..RankRow::default() }));
        }
        &mut self.ranks[i]
    }

    pub fn world(&self) -> usize {
        self.ranks.len()
    }

    pub fn is_live(&self) -> bool {
        self.record.status.is_live()
    }

    fn add_point(&mut self, metric: &str, rank: u32, a: Agg) {
        let world = self.ranks.len().max(rank as usize + 1);
        let keep_per_rank = PER_RANK_METRICS.contains(&metric);
        // get_mut first: the common case allocates no key.
        if !self.metrics.contains_key(metric) {
            let fresh = MetricSeries { cross: Series::new(CROSS_CAP), per_rank: Vec::new(), last_step: Vec::new() };
            self.metrics.insert(metric.to_string(), fresh);
        }
        let Some(ms) = self.metrics.get_mut(metric) else { return };
        if ms.last_step.len() < world {
            ms.last_step.resize(world, 0);
        }
        let last = &mut ms.last_step[rank as usize];
        if a.step <= *last && *last > 0 {
            return;
        }
        *last = a.step;
        if keep_per_rank {
            if ms.per_rank.len() < world {
                ms.per_rank.resize_with(world, || Series::new(PER_RANK_CAP));
            }
            ms.per_rank[rank as usize].add(a);
        }
        ms.cross.add(a);
    }

    fn add_collective(&mut self, rank: u32, rec: CollectiveRecord) {
        let world = self.ranks.len().max(rank as usize + 1);
        let row = self.rank_mut(rank);
        if row.last_collective.is_none_or(|(seq, _, _)| rec.seq >= seq) {
            row.last_collective = Some((rec.seq, rec.op, rec.state));
        }
        let oldest = self.collectives.keys().next().copied();
        if self.collectives.len() >= COLLECTIVES_KEPT && oldest.is_some_and(|o| rec.seq < o) {
            return;
        }
        let entry = self.collectives.entry(rec.seq).or_insert_with(|| CollectiveRow {
            seq: rec.seq,
            op: rec.op,
            bytes: rec.bytes,
            step: rec.step.0,
            ranks: vec![None; world],
        });
        if entry.ranks.len() < world {
            entry.ranks.resize(world, None);
        }
        entry.ranks[rank as usize] = Some(rec);
        while self.collectives.len() > COLLECTIVES_KEPT {
            self.collectives.pop_first();
        }
    }

    fn push_log(&mut self, rank: u32, line: String) {
        self.logs.push_back(LogLine { rank, line });
        self.log_count += 1;
        if self.logs.len() > LOG_LINES_KEPT {
            self.logs.pop_front();
        }
    }

    pub(super) fn push_event(&mut self, t_ms: u64, kind: EventKind, rank: Option<u32>, text: String) {
        self.events.push_back(EventRecord { t_ms, kind, rank, text });
        if self.events.len() > EVENTS_KEPT {
            self.events.pop_front();
        }
    }

    /// Folds a batch of live frames in; frames the snapshot already held are skipped.
    pub fn apply_frames(&mut self, frames: &[AgentFrame]) {
        for f in frames {
            if f.seq <= self.snapshot_seq {
                continue;
            }
            self.last_data_ms = Some(self.last_data_ms.map_or(f.t_ms, |t| t.max(f.t_ms)));
            self.apply(f);
        }
    }

    fn apply(&mut self, f: &AgentFrame) {
        match &f.event {
            AgentEvent::RankStarted { rank, local_rank, pid, host } => {
                let row = self.rank_mut(rank.0);
                row.pid = Some(*pid);
                row.host = host.clone();
                row.local_rank = Some(*local_rank);
                row.last_seen_ms = Some(f.t_ms);
                if self.record.status == RunStatus::Starting {
                    self.record.status = RunStatus::Running;
                }
                let text = format!("rank {rank} (local rank {local_rank}) started on {host}, pid {pid}");
                self.push_event(f.t_ms, EventKind::RankStarted, Some(rank.0), text);
            }
            AgentEvent::Rank { rank, msg } => {
                self.rank_mut(rank.0).last_seen_ms = Some(f.t_ms);
                match msg {
                    RankMsg::Register { pid, .. } => self.rank_mut(rank.0).pid = Some(*pid),
                    RankMsg::Phase { phase, .. } => self.rank_mut(rank.0).phase = Some(*phase),
                    RankMsg::Step(m) => {
                        for (name, v) in m.series() {
                            self.add_point(name, rank.0, Agg::point(m.step.0, v));
                        }
                        let row = self.rank_mut(rank.0);
                        row.step = row.step.max(m.step.0);
                        row.loss = Some(m.loss);
                        row.step_time_ms = Some(m.step_time_ms);
                        if !m.loss.is_finite() {
                            let text = format!("rank {rank} reported loss {} at step {}", m.loss, m.step.0);
                            self.push_event(f.t_ms, EventKind::NanLoss, Some(rank.0), text);
                        }
                        self.record.step = self.ranks.iter().map(|r| r.step).min().unwrap_or(0);
                    }
                    RankMsg::Collective(rec) => self.add_collective(rank.0, rec.clone()),
                    RankMsg::Finished { .. } => self.rank_mut(rank.0).phase = Some(Phase::Done),
                    RankMsg::CheckpointSaved(c) => {
                        let text = format!("rank {rank} saved checkpoint at step {} ({} bytes)", c.step.0, c.bytes);
                        self.push_event(f.t_ms, EventKind::CheckpointSaved, Some(rank.0), text);
                    }
                    RankMsg::CheckpointFailed { .. } => {
                        let text = format!("rank {rank}: checkpoint save failed");
                        self.push_event(f.t_ms, EventKind::CheckpointFailed, Some(rank.0), text);
                    }
                }
            }
            AgentEvent::ProcSample { rank, cpu_pct, rss_bytes } => {
                let row = self.rank_mut(rank.0);
                row.cpu_pct = Some(*cpu_pct);
                row.rss_bytes = Some(*rss_bytes);
            }
            AgentEvent::GpuSample(g) => {
                self.gpus.insert(g.index, (**g).clone());
            }
            AgentEvent::Log { rank, line, .. } => self.push_log(rank.0, line.clone()),
            AgentEvent::RankExited { rank, pid, status } => {
                let row = self.rank_mut(rank.0);
                row.exit = Some(status.clone());
                let text = format!("rank {rank} ({}, pid {pid}) exited: {}", row.host, status.describe());
                self.push_event(f.t_ms, EventKind::RankExited, Some(rank.0), text);
            }
            AgentEvent::Notice { text } => self.push_event(f.t_ms, EventKind::Notice, None, text.clone()),
            AgentEvent::BadFrame { rank, reason } => {
                let text = format!("bad frame dropped: {reason}");
                self.push_event(f.t_ms, EventKind::BadFrame, rank.map(|r| r.0), text);
            }
            AgentEvent::Heartbeat | AgentEvent::StackDump { .. } => {}
            AgentEvent::GpuXid { .. } | AgentEvent::GpuEcc { .. } | AgentEvent::GpuThrottle { .. } => {
                let text = crate::server::tracker::gpu_event_text(&f.event);
                self.push_event(f.t_ms, EventKind::Notice, None, text);
            }
            AgentEvent::RunEnded { outcome, reason } => {
                self.record.status = match outcome {
                    RunOutcome::Succeeded => RunStatus::Succeeded,
                    RunOutcome::Failed => RunStatus::Failed,
                    RunOutcome::Stopped => RunStatus::Stopped,
                    RunOutcome::Killed => RunStatus::Killed,
                };
                self.record.reason = reason.clone();
                self.record.ended_ms = Some(f.t_ms);
                let text = format!("run {}: {reason}", self.record.status.name());
                self.push_event(f.t_ms, EventKind::RunEnded, None, text);
            }
        }
    }

    /// The server's final word on a run (its stream ended).
    pub fn ended(&mut self, status: RunStatus, reason: &str) {
        if self.record.status.is_live() {
            self.record.status = status;
            self.record.reason = reason.to_string();
        }
    }

    /// GPU sample of a rank: the GPU NVML lists the rank's process on, else the GPU whose index
    /// is the rank's local rank (GPUs are keyed by index: one node today).
    pub fn gpu_of(&self, row: &RankRow) -> Option<&GpuSample> {
        let by_pid = self.gpus.values().find(|g| g.processes.iter().any(|p| p.rank.is_some_and(|r| r.0 == row.rank)));
        by_pid.or_else(|| self.local_rank_of(row).and_then(|l| self.gpus.get(&l)))
    }

    /// A rank's local rank: as its agent reported it, else (ranks read from the store) its place
    /// among the ranks on its host, as torchrun numbers them.
    pub fn local_rank_of(&self, row: &RankRow) -> Option<u32> {
        if row.local_rank.is_some() || row.host.is_empty() {
            return row.local_rank;
        }
        Some(self.ranks.iter().filter(|r| r.host == row.host && r.rank < row.rank).count() as u32)
    }

    /// Metric names with data, `loss` first.
    pub fn metric_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.metrics.keys().cloned().collect();
        names.sort_by_key(|n| (n != "loss", n.clone()));
        names
    }

    /// Training time at the end of each step (s), from the cumulative mean step time: the
    /// wall-clock axis, the same for a live run and for history.
    pub fn wall_axis(&self) -> Vec<(u64, f64)> {
        let Some(ms) = self.metrics.get("step_time_ms") else {
            return Vec::new();
        };
        let mut t = 0.0;
        let mut prev_step = 0;
        ms.cross
            .entries()
            .iter()
            .map(|e| {
                let steps = (e.step - prev_step.min(e.step)).max(1) as f64;
                t += e.mean() * steps / 1000.0;
                prev_step = e.step;
                (e.step, t)
            })
            .collect()
    }
}

/// Maps a step to its wall-axis time by the table `wall_axis` built (linear in between).
pub fn wall_of(table: &[(u64, f64)], step: u64) -> f64 {
    let i = table.partition_point(|(s, _)| *s < step);
    match (i.checked_sub(1).and_then(|j| table.get(j)), table.get(i)) {
        (_, Some((s, t))) if *s == step => *t,
        (Some((s0, t0)), Some((s1, t1))) => t0 + (t1 - t0) * (step - s0) as f64 / (s1 - s0).max(1) as f64,
        (Some((_, t0)), None) => *t0,
        (None, Some((_, t1))) => *t1,
        (None, None) => step as f64,
    }
}
