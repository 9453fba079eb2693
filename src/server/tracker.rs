//! Turns one run's agent frames into store batches and a live view of the run.
use crate::analysis::{Analyzer, Config};
use crate::fold::RunState;
use crate::ids::{unix_ms, RunId};
use crate::protocol::{AgentEvent, AgentFrame, Progress, RankMsg, RankStacks, Verdict};
use crate::store::{Batch, EventKind, EventRecord, Point, RankInfo, RunRecord, RunStatus, VerdictRecord};
use std::collections::{BTreeMap, BTreeSet};

/// Where a verdict is stored: (detected ms, index), so its record can be rewritten in place.
pub type VerdictKey = (u64, u32);

/// What the server knows of a live run; owned by that run's link task.
pub struct Tracker {
    /// The run's record and ranks, as the frames so far made them (the same fold as the cockpit's).
    pub state: RunState,
    log_lines: BTreeMap<u32, u64>,
    pub analyzer: Analyzer,
    verdicts_given: u32,
    /// Hang verdicts given since the link last looked (it writes their incident reports).
    new_hangs: Vec<(VerdictKey, Verdict)>,
    /// Stack dumps that arrived since the link last looked: (request, stacks).
    stack_dumps: Vec<(u64, Vec<RankStacks>)>,
    /// The incident reports the link has written, by path, in order.
    pub incident_reports: Vec<String>,
    /// The checkpoints saved while this server followed the run, by step: each node's copy
    /// merges into its step's record.
    checkpoints: BTreeMap<u64, crate::store::CheckpointRecord>,
    checkpoints_pruned: std::collections::BTreeSet<u64>,
    /// A `checkpoint-failing` verdict the link has not acted on yet.
    checkpoint_failing: bool,
}

impl Tracker {
    pub fn new(record: RunRecord, known_ranks: Vec<RankInfo>) -> Tracker {
        // The stored recipe was validated at launch; one that no longer parses (an older
        // version's) gets the default thresholds rather than no analysis.
        let analysis =
            serde_json::from_str::<crate::recipe::Recipe>(&record.recipe_json).map(|r| r.analysis).unwrap_or_default();
        Tracker {
            analyzer: Analyzer::new(Config::from_recipe(&analysis), record.world_size, unix_ms()),
            verdicts_given: 0,
            new_hangs: Vec::new(),
            stack_dumps: Vec::new(),
            incident_reports: Vec::new(),
            checkpoints: BTreeMap::new(),
            checkpoints_pruned: Default::default(),
            checkpoint_failing: false,
            state: RunState::new(record, known_ranks),
            log_lines: BTreeMap::new(),
        }
    }

    /// Numbers each rank's next log line after the ones the store holds (a reattach after a
    /// server restart), so its tail goes on in order.
    pub fn continue_log_lines(&mut self, stored: BTreeMap<u32, u64>) {
        self.log_lines = stored;
    }

    fn run(&self) -> RunId {
        self.state.record.id.clone()
    }

    /// Adds frames from node `node` to a batch; the run record (with the node's new acked
    /// sequence number) goes into the same batch, so what is acked is exactly what is durable.
    pub fn apply(&mut self, node: usize, frames: &[AgentFrame], batch: &mut Batch) {
        let mut touched: BTreeSet<u32> = BTreeSet::new();
        for f in frames {
            self.apply_one(node, f, batch, &mut touched);
        }
        if let (Some(last), Some(slot)) = (frames.last(), self.state.record.acked_seq.get_mut(node)) {
            *slot = last.seq;
        }
        self.state.settle();
        self.settle_hang();
        batch.runs.push(self.state.record.clone());
        for r in touched {
            if let Some(info) = self.state.ranks.get(r as usize) {
                batch.ranks.push((self.run(), info.clone()));
            }
        }
    }

    fn event(&self, batch: &mut Batch, t_ms: u64, kind: EventKind, rank: Option<u32>, text: String) {
        batch.events.push((self.run(), EventRecord { t_ms, kind, rank, text }));
    }

    /// Stores verdicts (record and event) and queues the hangs for their incident reports.
    pub fn give(&mut self, verdicts: Vec<Verdict>, batch: &mut Batch) {
        for v in verdicts {
            let key = (v.detected_ms, self.verdicts_given);
            self.verdicts_given += 1;
            let text = format!("{}: {}", v.kind.name(), v.summary);
            self.event(batch, v.detected_ms, EventKind::Verdict, v.culprits.first().map(|c| c.rank), text);
            let record = VerdictRecord { verdict: v.clone(), report_path: None, report_md: None };
            batch.verdicts.push((self.run(), key, record));
            if v.kind == crate::record::VerdictKind::CheckpointFailing {
                self.checkpoint_failing = true;
            }
            if v.kind.is_hang() {
                self.new_hangs.push((key, v));
            }
        }
    }

    /// Lets time-based verdicts (hangs, confirmed deaths, lost heartbeats) out.
    pub fn tick(&mut self, now_ms: u64, batch: &mut Batch) {
        let v = self.analyzer.tick(now_ms);
        self.give(v, batch);
        let was = self.state.record.status;
        self.settle_hang();
        if self.state.record.status != was {
            batch.runs.push(self.state.record.clone());
        }
    }

    /// Node `node`'s agent is gone for certain: a `node-lost` verdict for its ranks, if it had any
    /// live ones.
    pub fn node_lost(&mut self, node: usize, why: &str, batch: &mut Batch) {
        let verdicts: Vec<Verdict> = self.analyzer.node_lost(unix_ms(), node, why).into_iter().collect();
        if !verdicts.is_empty() {
            self.give(verdicts, batch);
            self.settle_hang();
            batch.runs.push(self.state.record.clone());
        }
    }

    /// `Hung` while a hang verdict holds, `Running` again once progress resumes.
    fn settle_hang(&mut self) {
        let hung = self.analyzer.active().iter().any(|v| v.kind.is_hang());
        self.state.settle_hang(hung);
    }

    /// Whether a `checkpoint-failing` verdict came since the link last looked.
    pub fn take_checkpoint_failing(&mut self) -> bool {
        std::mem::take(&mut self.checkpoint_failing)
    }

    pub fn take_new_hangs(&mut self) -> Vec<(VerdictKey, Verdict)> {
        std::mem::take(&mut self.new_hangs)
    }

    pub fn take_stack_dumps(&mut self) -> Vec<(u64, Vec<RankStacks>)> {
        std::mem::take(&mut self.stack_dumps)
    }

    pub fn event_now(&self, batch: &mut Batch, kind: EventKind, rank: Option<u32>, text: String) {
        self.event(batch, unix_ms(), kind, rank, text);
    }

    /// One frame: the analysis sees it first (its verdicts come before the frame's own events),
    /// then the fold; what only the history keeps (points, collectives, logs, checkpoints) is
    /// added here.
    fn apply_one(&mut self, node: usize, f: &AgentFrame, batch: &mut Batch, touched: &mut BTreeSet<u32>) {
        let run = self.run();
        let now = unix_ms();
        let verdicts = self.analyzer.observe(now, node, &f.event);
        self.give(verdicts, batch);
        if let AgentEvent::RunEnded { .. } = &f.event {
            // Deaths and mismatches seen just before the end are settled now, before it.
            let verdicts = self.analyzer.finish(now);
            self.give(verdicts, batch);
        }
        let folded = self.state.apply(f);
        touched.extend(folded.rank);
        batch.events.extend(folded.events.into_iter().map(|e| (run.clone(), e)));
        match &f.event {
            AgentEvent::Rank { rank, msg: RankMsg::Step(m) } => {
                for (name, value) in m.series() {
                    batch.points.push((run.clone(), name.into(), Point { step: m.step.0, rank: rank.0, value }));
                }
            }
            AgentEvent::Rank { rank, msg: RankMsg::Metrics { step, metrics } } => {
                for (name, value) in metrics {
                    batch.points.push((
                        run.clone(),
                        name.clone().into(),
                        Point { step: step.0, rank: rank.0, value: *value },
                    ));
                }
            }
            AgentEvent::Rank { rank, msg: RankMsg::Collective(rec) } => {
                batch.collectives.push((run.clone(), rank.0, rec.clone()));
            }
            AgentEvent::Rank { rank, msg: RankMsg::CheckpointSaved(c) } => self.checkpoint_saved(rank.0, c, batch),
            AgentEvent::GpuSample(sample) => self.gpu_sample(sample, batch),
            AgentEvent::StackDump { request, stacks } => self.stack_dumps.push((*request, stacks.clone())),
            AgentEvent::LogRecord { rank, record } => {
                // At the step the line printed, else the rank's latest (a progress bar, a memory report).
                let step = record.step.unwrap_or_else(|| self.state.ranks.get(rank.0 as usize).map_or(0, |r| r.step));
                for (name, value) in crate::adapters::series(record) {
                    batch.points.push((run.clone(), name, Point { step, rank: rank.0, value }));
                }
            }
            AgentEvent::Log { rank, line, .. } => {
                let n = self.log_lines.entry(rank.0).or_insert(0);
                *n += 1;
                batch.logs.push((run.clone(), rank.0, *n, line.clone()));
            }
            _ => {}
        }
    }

    /// Indexes a committed checkpoint (and forgets the ones pruned to make room), with what the
    /// save cost as series points at its step. Rank 0's save is the record; another node's copy
    /// of the same step adds its node to the record's `nodes`.
    fn checkpoint_saved(&mut self, rank: u32, c: &crate::protocol::CheckpointSaved, batch: &mut Batch) {
        let run = self.run();
        let node = self.state.ranks.get(rank as usize).map(|r| r.host.clone()).unwrap_or_default();
        let primary = rank == 0;
        if !primary && self.checkpoints_pruned.contains(&c.step.0) {
            // A copy reported after rank 0 pruned its step: that step is gone from every node.
            return;
        }
        let rec = self.checkpoints.entry(c.step.0).or_insert_with(|| crate::store::CheckpointRecord {
            run: run.clone(),
            step: c.step.0,
            path: c.path.clone(),
            bytes: c.bytes,
            loss: Some(c.loss),
            saved_ms: c.saved_ms,
            blocking_ms: c.blocking_ms,
            write_ms: c.write_ms,
            // The writer hashed the very bytes it wrote and committed them with their hashes.
            verified: true,
            checked: "sha256".into(),
            checked_ms: c.saved_ms,
            problem: None,
            nodes: Vec::new(),
        });
        if primary {
            (rec.path, rec.saved_ms, rec.blocking_ms, rec.write_ms) =
                (c.path.clone(), c.saved_ms, c.blocking_ms, c.write_ms);
            if !rec.nodes.contains(&node) {
                rec.nodes.insert(0, node);
            }
        } else if !rec.nodes.contains(&node) {
            rec.nodes.push(node);
        }
        batch.checkpoints.push(rec.clone());
        if primary {
            // Every writer prunes its own copies alike; rank 0's word removes the records.
            for s in &c.pruned {
                self.checkpoints.remove(s);
                self.checkpoints_pruned.insert(*s);
            }
            batch.checkpoints_removed.extend(c.pruned.iter().map(|s| (run.clone(), *s)));
        }
        for (name, value) in [
            ("ckpt_bytes", c.bytes as f64),
            ("ckpt_write_gbps", c.write_gbps),
            ("ckpt_blocking_ms", c.blocking_ms),
            ("ckpt_write_ms", c.write_ms),
        ] {
            batch.points.push((run.clone(), name.into(), Point { step: c.step.0, rank, value }));
        }
    }

    /// Marks the run as ended without its agent's word (the agent is gone).
    pub fn end_without_agent(&mut self, status: RunStatus, reason: String, batch: &mut Batch) {
        let event = self.state.end(status, reason, unix_ms());
        batch.events.push((self.run(), event));
        batch.runs.push(self.state.record.clone());
    }

    pub fn progress(&self) -> Progress {
        let losses: Vec<f64> = self.state.ranks.iter().filter_map(|r| r.last_loss).collect();
        let times: Vec<f64> = self.state.ranks.iter().filter_map(|r| r.step_time_ms).collect();
        let mean = |xs: &[f64]| (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64);
        Progress {
            run: self.run(),
            status: self.state.record.status,
            step: self.state.record.step,
            steps: self.state.record.steps_planned,
            loss_mean: mean(&losses),
            step_time_ms_mean: mean(&times),
            ranks_alive: self.state.ranks_alive(),
            world_size: self.state.record.world_size,
            verdicts: self.analyzer.active(),
            incidents: self.incident_reports.clone(),
        }
    }
}

impl Tracker {
    /// A GPU sample becomes series points of each rank using that GPU, at the rank's current
    /// step (`gpu_*` metrics; several samples in one step keep the last), so GPU history
    /// charts on the same step axis as the loss.
    fn gpu_sample(&mut self, s: &crate::protocol::GpuSample, batch: &mut Batch) {
        let run = self.run();
        for p in &s.processes {
            let Some(rank) = p.rank else { continue };
            let step = self.state.ranks.get(rank.0 as usize).map_or(0, |r| r.step);
            let mut put = |name: &'static str, value: f64| {
                batch.points.push((run.clone(), name.into(), Point { step, rank: rank.0, value }));
            };
            put("gpu_util_pct", s.util_pct);
            put("gpu_mem_used_bytes", s.mem_used_bytes as f64);
            put("gpu_power_w", s.power_w);
            put("gpu_temp_c", s.temp_c);
            let optional = [
                ("gpu_sm_active_pct", s.sm_active_pct),
                ("gpu_tensor_active_pct", s.tensor_active_pct),
                ("gpu_sm_clock_mhz", s.sm_clock_mhz.map(f64::from)),
                ("gpu_proc_mem_bytes", p.mem_used_bytes.map(|b| b as f64)),
                ("gpu_nvlink_rx_bytes_per_s", s.nvlink_rx_bytes_per_s.map(|b| b as f64)),
                ("gpu_nvlink_tx_bytes_per_s", s.nvlink_tx_bytes_per_s.map(|b| b as f64)),
            ];
            for (name, value) in optional {
                if let Some(v) = value {
                    put(name, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod gpu_tests {
    use super::*;
    use crate::ids::{Rank, Step};
    use crate::protocol::{GpuProcess, GpuSample, StepMetrics, ThrottleReason};

    fn record() -> RunRecord {
        let meta = crate::record::RunMeta {
            name: "g".into(),
            recipe_name: "g".into(),
            recipe_path: "g.toml".into(),
            recipe_json: "{}".into(),
            world_size: 2,
            steps_planned: 10,
        };
        RunRecord::starting(RunId::new_now(), meta, vec!["local".into()], vec![], None)
    }

    fn frame(seq: u64, event: AgentEvent) -> AgentFrame {
        AgentFrame { seq, t_ms: seq, event }
    }

    #[test]
    fn after_a_reattach_log_lines_are_numbered_on_from_the_stored_ones() {
        let mut t = Tracker::new(record(), vec![]);
        t.continue_log_lines(BTreeMap::from([(1, 41)]));
        let log = |seq, rank| {
            let line = format!("line {seq}");
            frame(seq, AgentEvent::Log { rank: Rank(rank), stream: crate::protocol::Stream::Stdout, line })
        };
        let mut batch = Batch::default();
        t.apply(0, &[log(1, 1), log(2, 0), log(3, 1)], &mut batch);
        let numbered: Vec<(u32, u64)> = batch.logs.iter().map(|(_, rank, n, _)| (*rank, *n)).collect();
        assert_eq!(numbered, [(1, 42), (0, 1), (1, 43)]);
    }

    #[test]
    fn gpu_samples_become_series_of_the_ranks_on_the_gpu_and_events_notices() {
        let mut t = Tracker::new(record(), vec![]);
        let step = StepMetrics { step: Step(7), loss: 1.0, ..Default::default() };
        let sample = GpuSample {
            index: 0,
            util_pct: 97.0,
            sm_active_pct: Some(81.0),
            processes: vec![
                GpuProcess { pid: 41, rank: Some(Rank(1)), mem_used_bytes: Some(1 << 30) },
                GpuProcess { pid: 99, rank: None, mem_used_bytes: Some(5) },
            ],
            ..Default::default()
        };
        let frames = [
            frame(1, AgentEvent::Rank { rank: Rank(1), msg: RankMsg::Step(step) }),
            frame(2, AgentEvent::GpuSample(Box::new(sample))),
            frame(3, AgentEvent::GpuXid { index: 0, xid: 79 }),
            frame(4, AgentEvent::GpuThrottle { index: 0, reasons: vec![ThrottleReason::HwThermal] }),
        ];
        let mut batch = Batch::default();
        t.apply(0, &frames, &mut batch);
        let gpu: Vec<(&str, u64, u32, f64)> = batch
            .points
            .iter()
            .filter(|(_, name, _)| name.starts_with("gpu_"))
            .map(|(_, name, p)| (name.as_ref(), p.step, p.rank, p.value))
            .collect();
        // Only rank 1's process is ours; its points sit at rank 1's step.
        assert!(gpu.contains(&("gpu_util_pct", 7, 1, 97.0)), "{gpu:?}");
        assert!(gpu.contains(&("gpu_sm_active_pct", 7, 1, 81.0)), "{gpu:?}");
        assert!(gpu.contains(&("gpu_proc_mem_bytes", 7, 1, f64::from(1u32 << 30))), "{gpu:?}");
        assert!(gpu.iter().all(|(_, _, rank, _)| *rank == 1));
        assert!(!gpu.iter().any(|(name, ..)| *name == "gpu_nvlink_rx_bytes_per_s"), "unknown fields are not stored");
        let texts: Vec<&str> = batch.events.iter().map(|(_, e)| e.text.as_str()).collect();
        assert_eq!(texts, ["GPU 0: XID 79 (see NVIDIA's XID catalogue)", "GPU 0: clocks held down by hw-thermal"]);
    }
}
