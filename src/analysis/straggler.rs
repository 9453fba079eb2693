//! Stragglers: a rank whose compute time, or arrival at each step's first collective, trails
//! the median of the other ranks by the recipe's margin over a window of steps.
//!
//! Collective *duration* is deliberately not a signal: in a synchronous all-reduce the fast
//! ranks wait for the slow one, so their collectives last longest.
use super::{classify, median, Config, RankState};
use crate::protocol::{CollectiveRecord, CollectiveState, StepMetrics, Verdict, VerdictKind};
use std::collections::{BTreeMap, VecDeque};

/// A rank is never called late for arriving less than this after the first (ms).
pub const MIN_LATE_MS: f64 = 20.0;

#[derive(Default)]
pub struct Stragglers {
    /// Per rank: (step, data + forward + backward ms), newest last.
    compute: BTreeMap<u32, VecDeque<(u64, f64)>>,
    /// Per step: each rank's start of the step's first collective (µs, the rank's clock).
    arrivals: BTreeMap<u64, BTreeMap<u32, u64>>,
    flagged: BTreeMap<u32, Verdict>,
}

/// What the window says about one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lag {
    pub compute_ms: f64,
    pub others_compute_ms: f64,
    /// Median over the window of (this rank's arrival − the first rank's arrival).
    pub late_ms: Option<f64>,
}

impl Lag {
    fn compute_excess_pct(&self) -> f64 {
        (self.compute_ms / self.others_compute_ms.max(1e-9) - 1.0) * 100.0
    }
    fn late_pct(&self) -> f64 {
        self.late_ms.map_or(0.0, |l| l / self.others_compute_ms.max(1e-9) * 100.0)
    }
}

impl Stragglers {
    pub fn on_step(&mut self, rank: u32, m: &StepMetrics) {
        let q = self.compute.entry(rank).or_default();
        q.push_back((m.step.0, m.data_ms + m.fwd_ms + m.bwd_ms));
        if q.len() > 256 {
            q.pop_front();
        }
    }

    pub fn on_collective(&mut self, rank: u32, rec: &CollectiveRecord) {
        let (Some(start), CollectiveState::Started) = (rec.start_us, rec.state) else { return };
        if rec.step.0 == 0 {
            return;
        }
        // The first record of a step on this rank is its arrival; later buckets are not.
        self.arrivals.entry(rec.step.0).or_default().entry(rank).or_insert(start);
        while self.arrivals.len() > 256 {
            self.arrivals.pop_first();
        }
    }

    pub fn flagged(&self) -> impl Iterator<Item = Verdict> + '_ {
        self.flagged.values().cloned()
    }

    /// Each rank's lag over the last `window` steps, once every live rank has that many.
    pub fn lags(&self, window: usize, ranks: &BTreeMap<u32, RankState>, world: u32) -> BTreeMap<u32, Lag> {
        let live: Vec<u32> = ranks.iter().filter(|(_, r)| r.live()).map(|(k, _)| *k).collect();
        if world < 2 || live.len() < 2 {
            return BTreeMap::new();
        }
        let mut own: BTreeMap<u32, f64> = BTreeMap::new();
        for k in &live {
            let Some(q) = self.compute.get(k).filter(|q| q.len() >= window) else { return BTreeMap::new() };
            let last: Vec<f64> = q.iter().rev().take(window).map(|x| x.1).collect();
            own.insert(*k, median(last).unwrap_or(0.0));
        }
        // Steps every rank of the world has arrived at, newest first.
        let complete: Vec<&BTreeMap<u32, u64>> =
            self.arrivals.values().rev().filter(|a| a.len() as u32 >= world).take(window).collect();
        let late = |k: u32| -> Option<f64> {
            if complete.len() < window {
                return None;
            }
            let gaps: Vec<f64> =
                complete.iter().filter_map(|a| Some((a.get(&k)? - a.values().min()?) as f64 / 1000.0)).collect();
            median(gaps)
        };
        own.iter()
            .map(|(k, c)| {
                let others = median(own.iter().filter(|(j, _)| *j != k).map(|(_, v)| *v).collect()).unwrap_or(0.0);
                (*k, Lag { compute_ms: *c, others_compute_ms: others, late_ms: late(*k) })
            })
            .collect()
    }

    /// Flags ranks past the margin (once, until they keep up again); returns the new flags.
    pub fn evaluate(
        &mut self,
        cfg: &Config,
        ranks: &BTreeMap<u32, RankState>,
        world: u32,
        now_ms: u64,
    ) -> Vec<Verdict> {
        let margin = cfg.straggler_margin_pct;
        let mut out = Vec::new();
        for (k, lag) in self.lags(cfg.straggler_window_steps, ranks, world) {
            // Both signals must agree: arriving late is what holds the others up, and slow compute
            // says it is the rank's own work (not, say, a late start that a busy machine gave it).
            // Without arrivals (no collective yet), compute alone decides.
            // Lateness must also clear an absolute floor: a few milliseconds of skew are how a
            // busy machine schedules, whatever fraction of a short CPU step they are.
            let late =
                lag.late_ms.is_none_or(|l| l >= MIN_LATE_MS) && (lag.late_ms.is_none() || lag.late_pct() > margin);
            let slow = late
                && lag.compute_excess_pct() > margin / 2.0
                && lag.compute_excess_pct().max(lag.late_pct()) > margin;
            // Below half the margin to clear, so a rank on the edge does not flap.
            let recovered = lag.late_pct() < margin / 2.0 || lag.compute_excess_pct() < margin / 4.0;
            if slow && !self.flagged.contains_key(&k) {
                let v = verdict(k, &ranks[&k], lag, cfg.straggler_window_steps, now_ms);
                self.flagged.insert(k, v.clone());
                out.push(v);
            } else if recovered {
                self.flagged.remove(&k);
            }
        }
        out
    }
}

fn verdict(rank: u32, r: &RankState, lag: Lag, window: usize, now_ms: u64) -> Verdict {
    let late =
        lag.late_ms.map(|l| format!("; arrives {l:.1} ms late at the step's first collective")).unwrap_or_default();
    let detail = format!(
        "compute {:.1} ms vs {:.1} ms median of the others ({:+.0}%) over {window} steps{late}",
        lag.compute_ms,
        lag.others_compute_ms,
        lag.compute_excess_pct()
    );
    let c = classify::culprit(rank, r, detail.clone());
    let summary = format!("{} is a straggler: {detail}", classify::who(std::slice::from_ref(&c)));
    // The window began about `window` compute times ago.
    let since_ms = now_ms.saturating_sub((lag.compute_ms * window as f64) as u64);
    Verdict {
        kind: VerdictKind::Straggler,
        culprits: vec![c],
        collective: None,
        waiting: Vec::new(),
        since_ms,
        detected_ms: now_ms,
        summary,
    }
}
