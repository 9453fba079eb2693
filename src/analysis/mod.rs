//! Hang and straggler detection over one live run: pure logic, fed with timestamped frames.
//!
//! The server's link task owns one `Analyzer` per run and feeds it every agent event with the
//! moment it arrived and the node it came from (`observe`), and calls `tick` on a timer.
//! Liveness is judged on *arrival* times (the server's clock), per node, so a replay after a
//! server restart does not look like a hang; skew and durations use the ranks' own timestamps. Nothing here does I/O, so the tests feed
//! it recorded sequences.
mod classify;
mod logfail;
mod straggler;
#[cfg(test)]
mod tests;
mod torch;
#[cfg(test)]
mod torch_tests;

use crate::protocol::{
    AgentEvent, CollectiveRecord, CollectiveState, ExitStatus, Phase, RankMsg, StackGroup, StepMetrics, Verdict,
    VerdictKind,
};
use std::collections::{BTreeMap, VecDeque};

/// Thresholds, from the recipe's `[analysis]` table.
#[derive(Clone, Debug)]
pub struct Config {
    pub hang_floor_ms: u64,
    pub hang_k: f64,
    pub straggler_margin_pct: f64,
    pub straggler_window_steps: usize,
    /// No frame at all from a node's agent (it sends a heartbeat every second) for this long
    /// means the node is lost.
    pub heartbeat_lost_ms: u64,
}

impl Config {
    pub fn from_recipe(a: &crate::recipe::Analysis) -> Config {
        Config {
            hang_floor_ms: (a.hang_floor_s * 1000.0) as u64,
            hang_k: a.hang_k,
            straggler_margin_pct: a.straggler_margin_pct,
            straggler_window_steps: a.straggler_window_steps.max(1) as usize,
            heartbeat_lost_ms: HEARTBEAT_LOST_MS,
        }
    }
}

/// Ten missed heartbeats: a server that is itself slow for a few seconds must not kill a node.
pub const HEARTBEAT_LOST_MS: u64 = 10_000;
/// Saves failing this many times in a row on one writer make a `checkpoint-failing` verdict.
pub const FAILED_SAVES: usize = 2;
/// Three missed heartbeats: the node is silent, so the lack of progress says nothing about the
/// ranks; the heartbeat rule decides instead of the hang rule.
const SILENT_MS: u64 = 3_000;
/// Checkpoint saves, evaluation and the first step are not a step's length: a hang there needs
/// this many times the threshold.
pub const SLACK: u64 = 6;
/// Step times kept for the median (all ranks together).
const STEP_TIMES: usize = 64;
/// Flight records kept per rank: enough for the incident report's "last collectives".
const RECORDS: usize = 32;
/// A death or a mismatch is confirmed this long after it is first seen, so that records still in
/// flight from the other ranks (a different socket, a different order) arrive first.
const CONFIRM_MS: u64 = 1000;

/// What the analysis knows of one rank.
#[derive(Clone, Debug, Default)]
pub struct RankState {
    pub host: String,
    /// The index of the node whose agent runs it (the order of the run's hosts).
    pub node: usize,
    pub pid: Option<u32>,
    pub phase: Option<Phase>,
    pub phase_since_ms: u64,
    pub step: u64,
    pub last_started: u64,
    pub last_completed: u64,
    /// Newest last; a Completed record replaces its Started one.
    pub records: VecDeque<CollectiveRecord>,
    pub exit: Option<ExitStatus>,
    pub exit_ms: u64,
    pub finished: bool,
    pub last_metrics: Option<StepMetrics>,
    /// Its own last error line, once it exited.
    pub last_error: Option<String>,
    /// A Python rank's flight recorder, from its shim (`AgentEvent::TorchFlight`).
    pub torch: Option<crate::torchfr::Snapshot>,
    pub cpu_pct: Option<f64>,
    pub rss_bytes: Option<u64>,
}

impl RankState {
    /// Still expected to take part in collectives.
    pub fn live(&self) -> bool {
        self.exit.is_none() && !self.finished
    }

    pub fn record(&self, seq: u64) -> Option<&CollectiveRecord> {
        self.records.iter().rev().find(|r| r.seq == seq)
    }
}

pub struct Analyzer {
    cfg: Config,
    world_size: u32,
    ranks: BTreeMap<u32, RankState>,
    /// Hang detection starts with the first phase report: a program that reports nothing
    /// (telemetry off, a foreign command) cannot be judged by progress.
    armed: bool,
    /// A step has completed, so the median step time means something.
    stepped: bool,
    last_progress_ms: u64,
    /// When each node's agent was last heard from (any frame), by node index.
    heard_ms: BTreeMap<usize, u64>,
    /// When the analysis began: a node not heard from yet counts from here.
    started_ms: u64,
    step_times: VecDeque<f64>,
    /// The hang verdict that holds now, and the silent nodes it is about when it is the
    /// heartbeat's (a frame from one of them clears it).
    hang: Option<(Verdict, Vec<usize>)>,
    /// A stop or kill was asked for, or the run ended: exits are expected now.
    ending: bool,
    /// A rank that exited abnormally: (rank, when, the ranks still live then).
    pending_dead: Option<(u32, u64, Vec<u32>)>,
    dead_given: bool,
    /// A sequence number with disagreeing records, and when that was first seen.
    pending_mismatch: Option<(u64, u64)>,
    mismatch_given: bool,
    /// Each writing rank's failed saves since its last good one: (step, reason, when).
    failed_saves: BTreeMap<u32, Vec<(u64, String, u64)>>,
    /// The newest checkpoint a rank committed.
    last_saved: Option<u64>,
    checkpoint_failing_given: bool,
    stragglers: straggler::Stragglers,
    /// What the ranks' logs reported failing, and the verdict it gave while it holds.
    log_failures: logfail::LogFailures,
    failure: Option<Verdict>,
}

/// Whether a rank's recorder shows its program in its loop: a collective open now that it
/// completed before in the same group with the same op and sizes (a training step repeating).
/// Start-up collectives (DDP's broadcasts, a first all-reduce) do not repeat yet.
fn repeating(dump: &crate::torchfr::Dump) -> bool {
    let done = || dump.entries.iter().filter(|e| e.finished());
    dump.entries
        .iter()
        .filter(|e| !e.finished())
        .any(|o| done().any(|d| d.group == o.group && d.name == o.name && d.input_sizes == o.input_sizes))
}

impl Analyzer {
    pub fn new(cfg: Config, world_size: u32, now_ms: u64) -> Analyzer {
        Analyzer {
            cfg,
            world_size,
            ranks: BTreeMap::new(),
            armed: false,
            stepped: false,
            last_progress_ms: now_ms,
            heard_ms: BTreeMap::new(),
            started_ms: now_ms,
            step_times: VecDeque::new(),
            hang: None,
            ending: false,
            pending_dead: None,
            dead_given: false,
            pending_mismatch: None,
            mismatch_given: false,
            failed_saves: BTreeMap::new(),
            last_saved: None,
            checkpoint_failing_given: false,
            stragglers: straggler::Stragglers::default(),
            log_failures: logfail::LogFailures::default(),
            failure: None,
        }
    }

    pub fn ranks(&self) -> &BTreeMap<u32, RankState> {
        &self.ranks
    }

    /// The median step time over recent steps of every rank, once there is one.
    pub fn p50_step_ms(&self) -> Option<f64> {
        median(self.step_times.iter().copied().collect())
    }

    /// How long without progress makes a hang right now.
    pub fn hang_threshold_ms(&self) -> u64 {
        let by_steps = self.p50_step_ms().map_or(0, |p| (p * self.cfg.hang_k) as u64);
        let base = self.cfg.hang_floor_ms.max(by_steps);
        let slow_phase = self.ranks.values().any(|r| r.live() && matches!(r.phase, Some(Phase::Ckpt | Phase::Eval)));
        if !self.stepped || slow_phase {
            base * SLACK
        } else {
            base
        }
    }

    /// The verdicts that hold now: the hang, if any, and the flagged stragglers.
    pub fn active(&self) -> Vec<Verdict> {
        let mut out: Vec<Verdict> = self.hang.iter().map(|(v, _)| v.clone()).collect();
        out.extend(self.failure.iter().cloned());
        out.extend(self.stragglers.flagged());
        out
    }

    /// A stop or kill is under way: the exits that follow are not deaths.
    pub fn ending(&mut self) {
        self.ending = true;
        self.pending_dead = None;
    }

    /// Takes in one event that arrived at `now_ms` from node `node`'s agent; returns verdicts it
    /// settles at once.
    pub fn observe(&mut self, now_ms: u64, node: usize, event: &AgentEvent) -> Vec<Verdict> {
        self.heard_ms.insert(node, now_ms);
        if self.hang.as_ref().is_some_and(|(_, silent)| silent.contains(&node)) {
            self.hang = None;
        }
        let mut out = Vec::new();
        match event {
            AgentEvent::RankStarted { rank, pid, host, .. } => {
                let r = self.ranks.entry(rank.0).or_default();
                (r.pid, r.host, r.node) = (Some(*pid), host.clone(), node);
                self.progress(now_ms);
            }
            AgentEvent::Rank { rank, msg } => out = self.rank_msg(now_ms, rank.0, msg),
            AgentEvent::ProcSample { rank, cpu_pct, rss_bytes } => {
                let r = self.ranks.entry(rank.0).or_default();
                (r.cpu_pct, r.rss_bytes) = (Some(*cpu_pct), Some(*rss_bytes));
            }
            AgentEvent::RankExited { rank, status, last_error, .. } => {
                let r = self.ranks.entry(rank.0).or_default();
                (r.exit, r.exit_ms) = (Some(status.clone()), now_ms);
                r.last_error.clone_from(last_error);
                let others: Vec<u32> = self.ranks.iter().filter(|(_, r)| r.live()).map(|(k, _)| *k).collect();
                if !status.success()
                    && !self.ending
                    && !self.dead_given
                    && self.pending_dead.is_none()
                    && !others.is_empty()
                {
                    self.pending_dead = Some((rank.0, now_ms, others));
                }
            }
            AgentEvent::LogRecord { rank, record } => self.log_record(now_ms, rank.0, record),
            AgentEvent::TorchFlight { rank, snapshot } => self.torch_flight(now_ms, rank.0, snapshot),
            AgentEvent::RunEnded { .. } => {}
            AgentEvent::GpuSample(_)
            | AgentEvent::GpuXid { .. }
            | AgentEvent::GpuEcc { .. }
            | AgentEvent::GpuThrottle { .. }
            | AgentEvent::Log { .. }
            | AgentEvent::Notice { .. }
            | AgentEvent::BadFrame { .. }
            | AgentEvent::Heartbeat
            | AgentEvent::Refused(_)
            | AgentEvent::StackDump { .. } => {}
        }
        out
    }

    /// A training step read from a rank's log is progress like a reported step: it arms hang
    /// detection for programs that report nothing else, and its step time feeds the median. A
    /// failure it reports feeds the `failure` verdict, unless a stop or kill caused it.
    fn log_record(&mut self, now_ms: u64, rank: u32, record: &crate::adapters::Record) {
        if record.kind == crate::adapters::RecordKind::Event && !self.ending {
            self.log_failures.observe(now_ms, rank, record);
        }
        if record.kind != crate::adapters::RecordKind::Step {
            return;
        }
        let r = self.ranks.entry(rank).or_default();
        r.step = record.step.map_or(r.step + 1, |s| r.step.max(s));
        self.armed = true;
        if let Some((_, ms)) = crate::adapters::standard(record).into_iter().find(|(n, _)| *n == "step_time_ms") {
            self.stepped = true;
            self.step_times.push_back(ms);
            if self.step_times.len() > STEP_TIMES {
                self.step_times.pop_front();
            }
        }
        self.progress(now_ms);
    }

    /// A Python rank's recorder: any group's collectives moving is progress, and it arms hang
    /// detection for a program that prints nothing.
    fn torch_flight(&mut self, now_ms: u64, rank: u32, snapshot: &crate::torchfr::Snapshot) {
        let r = self.ranks.entry(rank).or_default();
        let moved = r.torch.as_ref().is_none_or(|old| old.dump.progress() != snapshot.dump.progress());
        let had = r.torch.is_some();
        r.torch = Some(snapshot.clone());
        self.armed = true;
        if moved {
            // Collectives that keep completing after the first look, or a collective open now
            // that the rank already completed once (its loop repeating): the program is past
            // its start-up, so the start-up slack no longer applies (a program whose log gives
            // no step time would otherwise wait six floors, also when it hung before the
            // shim's first look).
            if had || repeating(&snapshot.dump) {
                self.stepped = true;
            }
            self.progress(now_ms);
        }
    }

    fn progress(&mut self, now_ms: u64) {
        self.last_progress_ms = now_ms;
        if self.hang.take().is_some() {
            tracing::info!("progress resumed: the hang verdict no longer holds");
        }
        if self.failure.take().is_some() {
            tracing::info!("progress resumed: the failure verdict no longer holds");
        }
    }

    fn rank_msg(&mut self, now_ms: u64, rank: u32, msg: &RankMsg) -> Vec<Verdict> {
        let r = self.ranks.entry(rank).or_default();
        match msg {
            RankMsg::Register { pid, .. } => r.pid = Some(*pid),
            RankMsg::Phase { step, phase, t_ms } => {
                // The rank's own stamp: reports arrive in batches, their moments matter.
                (r.phase, r.phase_since_ms, r.step) = (Some(*phase), *t_ms, r.step.max(step.0));
                if *phase == Phase::Done {
                    r.finished = true;
                }
                self.armed = true;
            }
            RankMsg::Step(m) => {
                r.step = r.step.max(m.step.0);
                r.last_metrics = Some(m.clone());
                self.stepped = true;
                self.step_times.push_back(m.step_time_ms);
                if self.step_times.len() > STEP_TIMES {
                    self.step_times.pop_front();
                }
                self.stragglers.on_step(rank, m);
                self.progress(now_ms);
                return self.stragglers.evaluate(&self.cfg, &self.ranks, self.world_size, now_ms);
            }
            RankMsg::Collective(rec) => {
                match rec.state {
                    CollectiveState::Completed => r.last_completed = r.last_completed.max(rec.seq),
                    CollectiveState::Started | CollectiveState::Scheduled => {
                        r.last_started = r.last_started.max(rec.seq)
                    }
                }
                r.records.retain(|x| x.seq != rec.seq);
                r.records.push_back(rec.clone());
                if r.records.len() > RECORDS {
                    r.records.pop_front();
                }
                self.stragglers.on_collective(rank, rec);
                if self.pending_mismatch.is_none() && !self.mismatch_given && classify::disagree(&self.ranks, rec.seq) {
                    self.pending_mismatch = Some((rec.seq, now_ms));
                }
            }
            RankMsg::Finished { .. } => r.finished = true,
            // Someone else knocking on the rank's port says nothing about the rank's progress.
            RankMsg::Refused(_) => return Vec::new(),
            // A finished save is work done: it counts as progress below.
            RankMsg::CheckpointSaved(c) => {
                self.failed_saves.remove(&rank);
                self.last_saved = self.last_saved.max(Some(c.step.0));
            }
            RankMsg::CheckpointFailed { step, reason } => {
                let failed = self.failed_saves.entry(rank).or_default();
                failed.push((step.0, reason.clone(), now_ms));
                let in_a_row = failed.len();
                self.progress(now_ms);
                if in_a_row >= FAILED_SAVES && !self.checkpoint_failing_given && !self.ending {
                    self.checkpoint_failing_given = true;
                    let failed = self.failed_saves.get(&rank).cloned().unwrap_or_default();
                    return vec![classify::checkpoint_failing(&self.ranks, rank, &failed, self.last_saved, now_ms)];
                }
                return Vec::new();
            }
            // So is an eval's result.
            RankMsg::Metrics { .. } => {}
        }
        self.progress(now_ms);
        Vec::new()
    }

    /// Settles what waits on time: confirmed deaths and mismatches, lost heartbeats, hangs.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Verdict> {
        let mut out = self.confirm(now_ms, false);
        if self.ending || self.hang.is_some() || !self.ranks.values().any(RankState::live) {
            return out;
        }
        let lost = self.silent_nodes(now_ms, self.cfg.heartbeat_lost_ms);
        if let Some(since) = lost.iter().map(|(_, since)| *since).min() {
            let nodes: Vec<usize> = lost.iter().map(|(n, _)| *n).collect();
            let secs = classify::secs(now_ms.saturating_sub(since));
            let v = classify::node_lost(&self.ranks, &nodes, &format!("no heartbeat for {secs}"), since, now_ms);
            self.hang = Some((v.clone(), nodes));
            out.push(v);
            return out;
        }
        // A node silent for a few heartbeats says nothing about its ranks' progress: the
        // heartbeat rule decides then, not the hang rule.
        let silent = !self.silent_nodes(now_ms, SILENT_MS).is_empty();
        if self.armed && !silent && now_ms.saturating_sub(self.last_progress_ms) >= self.hang_threshold_ms() {
            // A PyTorch program's recorders, matched per process group, say more when they have it.
            let since = self.last_progress_ms;
            let v =
                torch::judge(&self.ranks, since, now_ms).unwrap_or_else(|| classify::hang(&self.ranks, since, now_ms));
            self.hang = Some((v.clone(), Vec::new()));
            out.push(v);
        }
        out
    }

    /// The server's own queue of frames is behind: what arrives late says nothing about the
    /// nodes or the ranks. The clocks of silence and of progress restart now, so no verdict
    /// comes from a wait the server caused; a real loss or hang is judged once it caught up.
    pub fn behind(&mut self, now_ms: u64) {
        for heard in self.heard_ms.values_mut() {
            *heard = (*heard).max(now_ms);
        }
        self.started_ms = self.started_ms.max(now_ms);
        self.last_progress_ms = self.last_progress_ms.max(now_ms);
    }

    /// The nodes with live ranks not heard from for `ms`, with when each was last heard.
    fn silent_nodes(&self, now_ms: u64, ms: u64) -> Vec<(usize, u64)> {
        let nodes: std::collections::BTreeSet<usize> =
            self.ranks.values().filter(|r| r.live()).map(|r| r.node).collect();
        nodes
            .into_iter()
            .map(|n| (n, self.heard_ms.get(&n).copied().unwrap_or(self.started_ms)))
            .filter(|(_, heard)| now_ms.saturating_sub(*heard) >= ms)
            .collect()
    }

    /// Node `node`'s agent is gone for certain (its port refused the reconnect): its live ranks
    /// are lost with it, at once. The exits that follow (the others, killed) are its doing. None
    /// when the run is ending or the node had no live rank left.
    pub fn node_lost(&mut self, now_ms: u64, node: usize, why: &str) -> Option<Verdict> {
        if self.ending || !self.ranks.values().any(|r| r.live() && r.node == node) {
            return None;
        }
        let since = self.heard_ms.get(&node).copied().unwrap_or(self.started_ms);
        let v = classify::node_lost(&self.ranks, &[node], why, since, now_ms);
        (self.pending_dead, self.dead_given) = (None, true);
        self.hang = Some((v.clone(), Vec::new()));
        Some(v)
    }

    /// The run ended: settle what was pending now, and judge nothing more.
    pub fn finish(&mut self, now_ms: u64) -> Vec<Verdict> {
        let out = self.confirm(now_ms, true);
        self.ending = true;
        self.hang = None;
        out
    }

    fn confirm(&mut self, now_ms: u64, now_or_never: bool) -> Vec<Verdict> {
        let mut out = Vec::new();
        let due = |since: u64| now_or_never || now_ms.saturating_sub(since) >= CONFIRM_MS;
        if let Some((seq, since)) = self.pending_mismatch {
            let all_in = self.ranks.values().filter(|r| r.record(seq).is_some()).count() as u32 >= self.world_size;
            if all_in || due(since) {
                self.pending_mismatch = None;
                self.mismatch_given = true;
                // The ranks' ring errors and exits that follow are the mismatch's doing.
                self.pending_dead = None;
                let v = torch::judge(&self.ranks, since, now_ms)
                    .filter(|v| v.kind == VerdictKind::Mismatch)
                    .unwrap_or_else(|| classify::mismatch(&self.ranks, seq, since, now_ms));
                self.hang = Some((v.clone(), Vec::new()));
                out.push(v);
            }
        }
        let hang = self.hang.as_ref().map(|(v, _)| v);
        if let Some(v) = self.log_failures.confirm(&self.ranks, now_ms, now_or_never, hang) {
            self.failure = Some(v.clone());
            out.push(v);
        }
        if let Some((rank, since, waiting)) = self.pending_dead.clone() {
            if self.mismatch_given || self.pending_mismatch.is_some() && !now_or_never {
                // Wait for the mismatch to settle first (or be dropped by it).
            } else if due(since) {
                self.pending_dead = None;
                self.dead_given = true;
                let v = classify::dead(&self.ranks, rank, waiting, since, now_ms);
                self.hang = Some((v.clone(), Vec::new()));
                out.push(v);
            }
        }
        out
    }

    /// Stacks can single out the rank of a collective that every rank entered: the one whose
    /// stack differs from all the others'. Returns the sharpened verdict when they do.
    pub fn refine_with_stacks(&mut self, groups: &[StackGroup]) -> Option<Verdict> {
        let (current, silent) = self.hang.as_ref()?;
        if current.kind != VerdictKind::StuckInCollective || !silent.is_empty() {
            return None;
        }
        let v = classify::single_out(current, groups, &self.ranks)?;
        self.hang = Some((v.clone(), Vec::new()));
        Some(v)
    }
}

/// The value at fraction `q` (0..=1) of sorted values, nearest rank; None for no values.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    sorted.get(((sorted.len() as f64 - 1.0) * q).round() as usize).copied()
}

/// The median (the upper one of an even count), or None for no values.
pub fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}
