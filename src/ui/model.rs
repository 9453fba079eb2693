//! One run as the cockpit knows it: the stored snapshot plus live frames, folded into bounded
//! per-panel data (series, ranks, collectives, logs, events). The ingest path of the cockpit.
use super::series::{Agg, Series};
use crate::fold::RunState;
use crate::protocol::{AgentEvent, AgentFrame, CollectiveRecord, GpuSample, RankMsg, RunSnapshot};
use crate::protocol::{CollectiveOp, CollectiveState};
use crate::store::{EventKind, EventRecord, RankInfo, RunStatus};
use std::collections::{BTreeMap, VecDeque};

/// Entries per cross-rank series (the mean / min–max band): a few per terminal column.
const CROSS_CAP: usize = 2048;
/// Entries per rank and metric: two or more per heatmap column at 160 columns; the heatmap reads
/// every rank each frame, so this bounds its cost (1,024 ranks × 128).
const PER_RANK_CAP: usize = 128;
/// Metrics kept per rank (the others only as the cross-rank aggregate, to bound memory).
const PER_RANK_METRICS: [&str; 2] = ["loss", STEP_TIME];
/// The metric the heatmap draws.
pub const STEP_TIME: &str = "step_time_ms";
/// Collective sequence numbers kept for the collectives panel.
const COLLECTIVES_KEPT: usize = 128;
const LOG_LINES_KEPT: usize = 5000;
const EVENTS_KEPT: usize = 2000;

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
    /// The run's record and ranks, folded from the snapshot and the live frames by the same
    /// fold as the server's, so the cockpit shows what the history will hold.
    pub state: RunState,
    /// Per rank: the newest collective it reported (sequence number, op, state).
    pub last_collective: Vec<Option<(u64, CollectiveOp, CollectiveState)>>,
    pub metrics: BTreeMap<String, MetricSeries>,
    /// Every rank's step times in shared buckets, for the heatmap (kept as points arrive).
    pub step_grid: super::heat_grid::HeatGrid,
    pub collectives: BTreeMap<u64, CollectiveRow>,
    pub logs: VecDeque<LogLine>,
    pub events: VecDeque<EventRecord>,
    pub gpus: BTreeMap<u32, GpuSample>,
    /// Per node: frames at or below this sequence number were in the snapshot (each node's
    /// agent numbers its own frames).
    pub snapshot_seq: Vec<u64>,
    /// When the last frame of this run was stamped (agent clock).
    pub last_data_ms: Option<u64>,
    /// Log lines received in total (so a follower knows something new arrived).
    pub log_count: u64,
    /// Verdicts the store holds (oldest first), and the hang verdicts seen live since.
    pub stored_verdicts: Vec<crate::protocol::Verdict>,
    /// The verdicts that hold now (from the progress stream); None until it first reports.
    pub live_verdicts: Option<Vec<crate::protocol::Verdict>>,
    /// A torch job's Python ranks: each one's newest flight-recorder snapshot (live only), for
    /// the matrix by process group.
    pub flights: BTreeMap<u32, crate::torchfr::Snapshot>,
    /// The lineage's goodput, as the history had it when the run was opened (once it ended).
    pub goodput: Option<crate::record::Goodput>,
}

impl RunModel {
    pub fn from_snapshot(s: &RunSnapshot) -> RunModel {
        let d = &s.detail;
        let mut m = RunModel {
            state: RunState::new(d.run.clone(), d.ranks.clone()),
            last_collective: Vec::new(),
            metrics: BTreeMap::new(),
            step_grid: Default::default(),
            collectives: BTreeMap::new(),
            logs: VecDeque::new(),
            events: d.events.iter().cloned().collect(),
            gpus: BTreeMap::new(),
            snapshot_seq: d.run.acked_seq.clone(),
            last_data_ms: None,
            log_count: 0,
            stored_verdicts: d.verdicts.iter().map(|r| r.verdict.clone()).collect(),
            live_verdicts: None,
            flights: BTreeMap::new(),
            goodput: d.goodput.clone(),
        };
        m.last_collective.resize(m.state.ranks.len(), None);
        for ss in &s.series {
            for b in &ss.buckets {
                m.add_point(&ss.metric, ss.rank, Agg::from_bucket(b));
            }
            if ss.metric == "step_time_ms" {
                let last = ss.buckets.last().map(|b| b.last);
                if last.is_some() {
                    m.state.rank_mut(ss.rank).step_time_ms = last;
                }
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

    /// The torch job's process groups, as the matrix draws them.
    pub fn process_groups(&self) -> Vec<crate::ui::groups::GroupView> {
        crate::ui::groups::groups(&self.flights)
    }

    pub fn world(&self) -> usize {
        self.state.ranks.len()
    }

    pub fn is_live(&self) -> bool {
        self.state.record.status.is_live()
    }

    /// The newest collective a rank reported.
    pub fn last_collective_of(&self, rank: u32) -> Option<(u64, CollectiveOp, CollectiveState)> {
        self.last_collective.get(rank as usize).copied().flatten()
    }

    fn add_point(&mut self, metric: &str, rank: u32, a: Agg) {
        let world = self.world().max(rank as usize + 1);
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
        if metric == STEP_TIME {
            self.step_grid.add(rank as usize, a.step, a.sum, a.count);
        }
        if keep_per_rank {
            if ms.per_rank.len() < world {
                ms.per_rank.resize_with(world, || Series::new(PER_RANK_CAP));
            }
            ms.per_rank[rank as usize].add(a);
        }
        ms.cross.add(a);
    }

    fn add_collective(&mut self, rank: u32, rec: CollectiveRecord) {
        self.state.rank_mut(rank);
        let world = self.world();
        if self.last_collective.len() < world {
            self.last_collective.resize(world, None);
        }
        let last = &mut self.last_collective[rank as usize];
        if last.is_none_or(|(seq, _, _)| rec.seq >= seq) {
            *last = Some((rec.seq, rec.op, rec.state));
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

    /// Folds a batch of node `node`'s live frames in; frames the snapshot already held (by that
    /// node's acked sequence number) are skipped.
    pub fn apply_frames(&mut self, node: usize, frames: &[AgentFrame]) {
        let held = self.snapshot_seq.get(node).copied().unwrap_or(0);
        for f in frames.iter().filter(|f| f.seq > held) {
            self.last_data_ms = Some(self.last_data_ms.map_or(f.t_ms, |t| t.max(f.t_ms)));
            self.apply(f);
        }
        self.state.settle();
    }

    /// One frame: the shared fold for state and events, then what only the cockpit keeps.
    fn apply(&mut self, f: &AgentFrame) {
        let folded = self.state.apply(f);
        for e in folded.events {
            self.push_event(e.t_ms, e.kind, e.rank, e.text);
        }
        match &f.event {
            AgentEvent::Rank { rank, msg: RankMsg::Step(m) } => {
                for (name, v) in m.series() {
                    self.add_point(name, rank.0, Agg::point(m.step.0, v));
                }
            }
            AgentEvent::Rank { rank, msg: RankMsg::Metrics { step, metrics } } => {
                for (name, v) in metrics {
                    self.add_point(name, rank.0, Agg::point(step.0, *v));
                }
            }
            AgentEvent::Rank { rank, msg: RankMsg::Collective(rec) } => self.add_collective(rank.0, rec.clone()),
            AgentEvent::GpuSample(g) => {
                self.gpus.insert(g.index, (**g).clone());
            }
            AgentEvent::TorchFlight { rank, snapshot } => {
                self.flights.insert(rank.0, (**snapshot).clone());
            }
            AgentEvent::Log { rank, line, .. } => self.push_log(rank.0, line.clone()),
            AgentEvent::LogRecord { rank, record } => {
                let step = record.step.unwrap_or_else(|| self.state.ranks.get(rank.0 as usize).map_or(0, |r| r.step));
                for (name, v) in crate::adapters::series(record) {
                    self.add_point(&name, rank.0, Agg::point(step, v));
                }
            }
            _ => {}
        }
    }

    /// The server's final word on a run (its stream ended).
    pub fn ended(&mut self, status: RunStatus, reason: &str) {
        if self.state.record.status.is_live() {
            self.state.record.status = status;
            self.state.record.reason = reason.to_string();
        }
    }

    /// GPU sample of a rank: the GPU NVML lists the rank's process on, else the GPU whose index
    /// is the rank's local rank (GPUs are keyed by index: one node today).
    pub fn gpu_of(&self, row: &RankInfo) -> Option<&GpuSample> {
        let by_pid = self.gpus.values().find(|g| g.processes.iter().any(|p| p.rank.is_some_and(|r| r.0 == row.rank)));
        by_pid.or_else(|| self.local_rank_of(row).and_then(|l| self.gpus.get(&l)))
    }

    /// A rank's local rank: as its agent reported it, else (ranks read from the store) its place
    /// among the ranks on its host, as torchrun numbers them.
    pub fn local_rank_of(&self, row: &RankInfo) -> Option<u32> {
        if row.local_rank.is_some() || row.host.is_empty() {
            return row.local_rank;
        }
        Some(self.state.ranks.iter().filter(|r| r.host == row.host && r.rank < row.rank).count() as u32)
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

#[cfg(test)]
#[path = "model_tests.rs"]
mod tests;
