//! Stragglers: a rank that, step after step, computes slower than the other ranks and arrives
//! at the step's first collective after them, by margins relative to the step's own length.
//!
//! Collective *duration* is deliberately not a signal: in a synchronous all-reduce the fast
//! ranks wait for the slow one, so their collectives last longest.
use super::{classify, median, Config, RankState};
use crate::protocol::{CollectiveRecord, CollectiveState, StepMetrics, Verdict, VerdictKind};
use std::collections::{btree_map::Entry, BTreeMap, BTreeSet, VecDeque};

/// Lateness below this is clock and wake-up noise, however short the steps are (ms).
pub const CLOCK_GUARD_MS: f64 = 2.0;

#[derive(Default)]
pub struct Stragglers {
    /// Per rank: (step, data + forward + backward ms), newest last.
    compute: BTreeMap<u32, VecDeque<(u64, f64)>>,
    /// Per step: each rank's start of the step's first collective (µs, the rank's clock).
    arrivals: BTreeMap<u64, BTreeMap<u32, u64>>,
    flagged: BTreeMap<u32, Verdict>,
}

/// What the window says about one rank: the measurements the rule judges.
#[derive(Clone, Debug, PartialEq)]
pub struct Lag {
    /// Median over the window of this rank's compute (data + forward + backward).
    pub compute_ms: f64,
    /// Median of the other ranks' `compute_ms`.
    pub others_compute_ms: f64,
    /// Per step of the window, newest first: this rank's arrival at the step's first
    /// collective minus the other ranks' median arrival. Empty until every rank has arrived at
    /// a whole window of steps.
    pub late_ms: Vec<f64>,
}

impl Lag {
    fn compute_excess_pct(&self) -> f64 {
        (self.compute_ms / self.others_compute_ms.max(1e-9) - 1.0) * 100.0
    }

    /// How late counts as late: the margin's share of the others' compute, but never less than
    /// clock noise.
    pub fn late_floor_ms(&self, margin_pct: f64) -> f64 {
        CLOCK_GUARD_MS.max(margin_pct / 100.0 * self.others_compute_ms)
    }

    /// Steps of the window in which this rank arrived later than the floor.
    pub fn late_steps(&self, margin_pct: f64) -> usize {
        let floor = self.late_floor_ms(margin_pct);
        self.late_ms.iter().filter(|l| **l > floor).count()
    }
}

/// Where the rule puts one rank now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judged {
    Slow,
    /// Neither slow nor clearly back: a flag holds, none is raised (so the edge does not flap).
    Edge,
    /// Back within the margins: a flag clears.
    KeepsUp,
}

/// The rule for one rank over a window of `window` steps, with the recipe's margin.
///
/// Slow: its compute exceeds the others' median by more than half the margin, and in nine
/// steps of ten it arrived later than the others' median by more than the floor. Arrival is
/// what holds the others up; slow compute says it is the rank's own work (not a late start a
/// busy machine gave it). Without arrivals (no collective yet) compute alone decides, by the
/// whole margin. Back (a flag clears): compute within a quarter of the margin, or late in
/// fewer than half the steps.
pub fn judge(lag: &Lag, margin_pct: f64, window: usize) -> Judged {
    let excess = lag.compute_excess_pct();
    if lag.late_ms.is_empty() {
        return match excess {
            e if e > margin_pct => Judged::Slow,
            e if e < margin_pct / 4.0 => Judged::KeepsUp,
            _ => Judged::Edge,
        };
    }
    let late = lag.late_steps(margin_pct);
    if excess < margin_pct / 4.0 || late * 2 < window {
        Judged::KeepsUp
    } else if excess > margin_pct / 2.0 && late >= window - window / 10 {
        Judged::Slow
    } else {
        Judged::Edge
    }
}

/// At most a third of the live ranks (at least one) may be stragglers at once: a rank is slow
/// against its peers, and when many ranks are "slow" it is the machine, not them.
pub fn most_flagged(live: usize) -> usize {
    (live / 3).max(1)
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

    /// Each live rank's lag over the last `window` steps, once every live rank has that many.
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
        let late = |k: u32| -> Vec<f64> {
            if complete.len() < window {
                return Vec::new();
            }
            let gap = |a: &BTreeMap<u32, u64>| {
                let others = median(a.iter().filter(|(j, _)| **j != k).map(|(_, t)| *t as f64).collect())?;
                Some((*a.get(&k)? as f64 - others) / 1000.0)
            };
            complete.iter().filter_map(|a| gap(a)).collect()
        };
        own.iter()
            .map(|(k, c)| {
                let others = median(own.iter().filter(|(j, _)| *j != k).map(|(_, v)| *v).collect()).unwrap_or(0.0);
                (*k, Lag { compute_ms: *c, others_compute_ms: others, late_ms: late(*k) })
            })
            .collect()
    }

    /// Flags ranks the rule calls slow (once, until they are back), within the cap on how many
    /// may be flagged at once; returns the new flags.
    pub fn evaluate(
        &mut self,
        cfg: &Config,
        ranks: &BTreeMap<u32, RankState>,
        world: u32,
        now_ms: u64,
    ) -> Vec<Verdict> {
        let (margin, window) = (cfg.straggler_margin_pct, cfg.straggler_window_steps);
        let lags = self.lags(window, ranks, world);
        let judged: BTreeMap<u32, Judged> = lags.iter().map(|(k, lag)| (*k, judge(lag, margin, window))).collect();
        for (k, j) in &judged {
            if *j == Judged::KeepsUp {
                self.flagged.remove(k);
            }
        }
        let slow: BTreeSet<u32> = judged.iter().filter(|(_, j)| **j == Judged::Slow).map(|(k, _)| *k).collect();
        let would_be: BTreeSet<u32> = slow.iter().chain(self.flagged.keys()).copied().collect();
        if would_be.len() > most_flagged(lags.len()) {
            return Vec::new();
        }
        let mut out = Vec::new();
        for k in slow {
            if let Entry::Vacant(e) = self.flagged.entry(k) {
                let v = verdict(k, &ranks[&k], &lags[&k], margin, window, now_ms);
                out.push(e.insert(v).clone());
            }
        }
        out
    }
}

fn verdict(rank: u32, r: &RankState, lag: &Lag, margin_pct: f64, window: usize, now_ms: u64) -> Verdict {
    let late = match median(lag.late_ms.clone()) {
        Some(l) => format!(
            "; arrives {l:.1} ms late at the step's first collective (over {:.1} ms in {} of {window} steps)",
            lag.late_floor_ms(margin_pct),
            lag.late_steps(margin_pct)
        ),
        None => String::new(),
    };
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
