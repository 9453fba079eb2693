//! The classifier and the straggler rule on event sequences shaped like real runs' frames.
use super::*;
use crate::ids::{Rank, Step};
use crate::protocol::{CollectiveOp, StackGroup, ThreadStack};

const T0: u64 = 1_700_000_000_000;

/// Plays ranks through steps the way the worker reports them, with a clock.
struct Sim {
    a: Analyzer,
    now: u64,
    world: u32,
    seq: u64,
    step: u64,
    given: Vec<Verdict>,
    /// The agents' heartbeats every second while the clock runs (off to test their loss).
    beats: bool,
    /// Rank r runs on node r % nodes.
    nodes: u32,
    /// A node whose agent went silent: no frame from it at all.
    silent: Option<u32>,
}

/// The analysis settings every test here and in `torch_tests` runs with.
pub(super) fn config() -> Config {
    Config {
        hang_floor_ms: 5000,
        hang_k: 10.0,
        straggler_margin_pct: 25.0,
        straggler_window_steps: 5,
        heartbeat_lost_ms: 10_000,
    }
}

fn sim(world: u32) -> Sim {
    sim_on(world, 1)
}

/// `world` ranks on `nodes` nodes named n0, n1, ... (one node is "local").
fn sim_on(world: u32, nodes: u32) -> Sim {
    let cfg = config();
    let a = Analyzer::new(cfg, world, T0);
    let mut s = Sim { a, now: T0, world, seq: 0, step: 0, given: Vec::new(), beats: true, nodes, silent: None };
    for r in 0..world {
        let host = if nodes == 1 { "local".to_string() } else { format!("n{}", r % nodes) };
        s.ev(AgentEvent::RankStarted { rank: Rank(r), local_rank: r / nodes, pid: 100 + r, host });
        s.phase(r, 0, Phase::Init);
    }
    s
}

fn record(seq: u64, step: u64, elements: u64, start_ms: u64, done_ms: Option<u64>) -> CollectiveRecord {
    CollectiveRecord {
        seq,
        op: CollectiveOp::AllReduce,
        dtype: "f32".into(),
        elements,
        bytes: elements * 4,
        enqueue_us: start_ms * 1000,
        start_us: Some(start_ms * 1000),
        end_us: done_ms.map(|d| d * 1000),
        state: if done_ms.is_some() { CollectiveState::Completed } else { CollectiveState::Started },
        step: Step(step),
    }
}

impl Sim {
    fn ev(&mut self, e: AgentEvent) {
        let rank = match &e {
            AgentEvent::RankStarted { rank, .. }
            | AgentEvent::Rank { rank, .. }
            | AgentEvent::RankExited { rank, .. } => Some(rank.0),
            _ => None,
        };
        self.ev_from(rank.map_or(0, |r| r % self.nodes), e);
    }
    fn ev_from(&mut self, node: u32, e: AgentEvent) {
        if self.silent == Some(node) {
            return;
        }
        let v = self.a.observe(self.now, node as usize, &e);
        self.given.extend(v);
    }
    fn msg(&mut self, rank: u32, msg: RankMsg) {
        self.ev(AgentEvent::Rank { rank: Rank(rank), msg });
    }
    fn phase(&mut self, rank: u32, step: u64, phase: Phase) {
        self.msg(rank, RankMsg::Phase { step: Step(step), phase, t_ms: self.now });
    }
    fn started(&mut self, rank: u32, elements: u64) {
        let rec = record(self.seq, self.step, elements, self.now, None);
        self.msg(rank, RankMsg::Collective(rec));
    }
    /// Advances the clock to `to`, ticking every 100 ms as the server does.
    fn wait_until(&mut self, to: u64) {
        while self.now < to {
            let before = self.now;
            self.now = (self.now + 100).min(to);
            if self.beats && before / 1000 != self.now / 1000 {
                for node in 0..self.nodes {
                    self.ev_from(node, AgentEvent::Heartbeat);
                }
            }
            let v = self.a.tick(self.now);
            self.given.extend(v);
        }
    }
    /// One whole step; `compute(rank)` is its data+fwd+bwd time in ms.
    fn step(&mut self, compute: impl Fn(u32) -> f64) {
        self.step += 1;
        self.seq += 1;
        let (base, s) = (self.now, self.step);
        let ms: Vec<u64> = (0..self.world).map(|r| compute(r) as u64).collect();
        let done = base + ms.iter().max().copied().unwrap_or(0) + 2;
        for r in 0..self.world {
            self.now = base;
            self.phase(r, s, Phase::Data);
            self.phase(r, s, Phase::Fwd);
            self.phase(r, s, Phase::Bwd);
            self.now = base + ms[r as usize];
            self.phase(r, s, Phase::Comm);
            let rec = record(self.seq, s, 1000, self.now, None);
            self.msg(r, RankMsg::Collective(rec));
        }
        self.now = done;
        for r in 0..self.world {
            let start = base + ms[r as usize];
            self.msg(r, RankMsg::Collective(record(self.seq, s, 1000, start, Some(done))));
            self.phase(r, s, Phase::Opt);
            let c = ms[r as usize] as f64;
            let m = StepMetrics {
                step: Step(s),
                loss: 2.0,
                lr: 1e-3,
                grad_norm: 1.0,
                tokens: 1024,
                step_time_ms: (done + 1 - base) as f64,
                data_ms: 1.0,
                fwd_ms: c / 3.0,
                bwd_ms: c * 2.0 / 3.0 - 1.0,
                comm_ms: (done - start) as f64,
                opt_ms: 1.0,
                mem_rss_bytes: 1 << 20,
            };
            self.msg(r, RankMsg::Step(m));
        }
        self.wait_until(done + 1);
    }
    fn steady(&mut self, n: usize) {
        for i in 0..n {
            // Deterministic jitter of ±10 %, as a busy machine gives.
            self.step(|r| 40.0 + ((i as u32 * 7 + r * 13) % 9) as f64 - 4.0);
        }
    }
    fn kinds(&self) -> Vec<VerdictKind> {
        self.given.iter().map(|v| v.kind).collect()
    }
}

#[test]
fn a_clean_run_gets_no_verdict() {
    let mut s = sim(4);
    s.steady(60);
    s.wait_until(s.now + 1000);
    for r in 0..4 {
        s.phase(r, 60, Phase::Done);
        s.ev(AgentEvent::RankExited { rank: Rank(r), pid: 100 + r, status: ExitStatus::Code(0), last_error: None });
    }
    s.wait_until(s.now + 60_000);
    let end = s.a.finish(s.now);
    assert!(s.given.is_empty() && end.is_empty(), "{:#?}", s.given);
}

#[test]
fn a_rank_that_never_enters_is_named_with_its_phase_after_the_floor() {
    let mut s = sim(2);
    s.steady(10);
    // Step 11: rank 0 enters the all-reduce; rank 1 stays in its data phase.
    s.step += 1;
    s.seq += 1;
    let step = s.step;
    s.phase(0, step, Phase::Data);
    s.phase(1, step, Phase::Data);
    s.phase(0, step, Phase::Comm);
    s.started(0, 1000);
    let since = s.now;
    s.wait_until(since + 4900);
    assert!(s.given.is_empty(), "too early: {:#?}", s.given);
    s.wait_until(since + 5100);
    assert_eq!(s.kinds(), [VerdictKind::NeverEntered]);
    let v = &s.given[0];
    let c = &v.culprits[..];
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].rank, c[0].pid, c[0].host.as_str(), c[0].phase), (1, Some(101), "local", Some(Phase::Data)));
    let coll = v.collective.as_ref().expect("the collective rank 0 waits in");
    assert_eq!((coll.seq, coll.op, coll.bytes, coll.step), (11, CollectiveOp::AllReduce, 4000, Step(11)));
    assert_eq!(v.waiting, [0]);
    assert!((5000..=5100).contains(&v.duration_ms()), "{}", v.duration_ms());
    assert!(v.summary.contains("rank 1 (local, pid 101) never entered all_reduce #11"), "{}", v.summary);
    assert!(v.summary.contains("last phase data"), "{}", v.summary);
    assert_eq!(s.a.active().len(), 1);
    // Only once while it holds; progress clears it.
    s.wait_until(s.now + 20_000);
    assert_eq!(s.given.len(), 1);
    s.phase(1, step, Phase::Fwd);
    assert!(s.a.active().is_empty());
}

#[test]
fn all_inside_one_collective_is_stuck_and_stacks_single_out_the_culprit() {
    let mut s = sim(3);
    s.steady(8);
    s.step += 1;
    s.seq += 1;
    for r in 0..3 {
        s.phase(r, 9, Phase::Comm);
        s.started(r, 1000);
    }
    s.wait_until(s.now + 5100);
    assert_eq!(s.kinds(), [VerdictKind::StuckInCollective]);
    assert_eq!(s.given[0].culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(s.given[0].collective.as_ref().map(|c| c.seq), Some(9));

    let group = |ranks: Vec<u32>| StackGroup { ranks, threads: Vec::<ThreadStack>::new() };
    // Two singletons single no one out.
    assert!(classify::single_out(&s.given[0], &[group(vec![0]), group(vec![1])], s.a.ranks()).is_none());
    let v = s.a.refine_with_stacks(&[group(vec![0, 2]), group(vec![1])]).expect("rank 1 stands apart");
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), [1]);
    assert_eq!(v.waiting, [0, 2]);
    assert!(v.summary.contains("rank 1 (local, pid 101) stopped inside all_reduce #9"), "{}", v.summary);
    assert_eq!(s.a.active()[0].culprits[0].rank, 1);
}

#[test]
fn a_crashed_rank_is_dead_once_and_the_exits_it_causes_are_not() {
    let mut s = sim(2);
    s.steady(5);
    s.phase(1, 6, Phase::Data);
    s.ev(AgentEvent::RankExited { rank: Rank(1), pid: 101, status: ExitStatus::Signal(9), last_error: None });
    assert!(s.given.is_empty(), "confirmed after a moment, not at once");
    s.wait_until(s.now + 1000);
    assert_eq!(s.kinds(), [VerdictKind::Dead]);
    let v = &s.given[0];
    assert_eq!((v.culprits[0].rank, v.culprits[0].pid, v.culprits[0].phase), (1, Some(101), Some(Phase::Data)));
    assert!(v.summary.contains("signal 9 (SIGKILL)") && v.summary.contains("all_reduce #5"), "{}", v.summary);
    assert_eq!(v.waiting, [0]);
    // The agent then terminates the peer.
    s.ev(AgentEvent::RankExited { rank: Rank(0), pid: 100, status: ExitStatus::Signal(15), last_error: None });
    s.wait_until(s.now + 2000);
    assert_eq!(s.a.finish(s.now), []);
    assert_eq!(s.given.len(), 1);
}

#[test]
fn a_death_right_before_the_run_ends_is_settled_by_finish() {
    let mut s = sim(2);
    s.steady(3);
    s.ev(AgentEvent::RankExited { rank: Rank(1), pid: 101, status: ExitStatus::Signal(9), last_error: None });
    let v = s.a.finish(s.now);
    assert_eq!(v.iter().map(|v| v.kind).collect::<Vec<_>>(), [VerdictKind::Dead]);
}

#[test]
fn a_different_size_at_one_seq_is_a_mismatch_that_names_the_minority() {
    let mut s = sim(3);
    s.steady(4);
    s.step += 1;
    s.seq += 1;
    s.started(0, 1000);
    s.started(1, 999);
    assert!(s.given.is_empty());
    s.started(2, 1000);
    s.wait_until(s.now + 100);
    assert_eq!(s.kinds(), [VerdictKind::Mismatch]);
    let v = &s.given[0];
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), [1]);
    assert_eq!(v.waiting, [0, 2]);
    assert_eq!(v.collective.as_ref().map(|c| (c.seq, c.elements)), Some((5, 1000)));
    assert!(v.summary.contains("999 elements (3.9 KiB)"), "{}", v.summary);
    // The ring errors that follow end every rank; none of that is a death.
    for r in 0..3 {
        s.ev(AgentEvent::RankExited { rank: Rank(r), pid: 100 + r, status: ExitStatus::Code(1), last_error: None });
    }
    s.wait_until(s.now + 3000);
    assert_eq!(s.a.finish(s.now), []);
    assert_eq!(s.given.len(), 1);
}

#[test]
fn a_mismatch_wins_over_an_exit_that_arrives_before_the_other_records() {
    let mut s = sim(2);
    s.steady(2);
    s.seq += 1;
    s.step += 1;
    s.started(1, 7);
    s.ev(AgentEvent::RankExited { rank: Rank(1), pid: 101, status: ExitStatus::Code(1), last_error: None });
    s.started(0, 8);
    s.ev(AgentEvent::RankExited { rank: Rank(0), pid: 100, status: ExitStatus::Code(1), last_error: None });
    let v = s.a.finish(s.now);
    assert_eq!(v.iter().map(|v| v.kind).collect::<Vec<_>>(), [VerdictKind::Mismatch]);
}

#[test]
fn checkpoints_and_the_first_step_get_slack() {
    let mut s = sim(2);
    // No step done yet: the first step (compilation, warm caches) may take long.
    s.phase(0, 1, Phase::Data);
    s.wait_until(T0 + 5000 * SLACK - 200);
    assert!(s.given.is_empty(), "{:#?}", s.given);
    s.wait_until(T0 + 5000 * SLACK + 200);
    assert_eq!(s.kinds(), [VerdictKind::NeverEntered]);

    let mut s = sim(2);
    s.steady(10);
    s.phase(0, 10, Phase::Ckpt);
    s.phase(1, 10, Phase::Ckpt);
    let since = s.now;
    s.wait_until(since + 20_000);
    assert!(s.given.is_empty(), "a long save is not a hang: {:#?}", s.given);
    s.wait_until(since + 5000 * SLACK + 100);
    assert_eq!(s.kinds(), [VerdictKind::NeverEntered]);
}

#[test]
fn the_threshold_follows_k_times_the_median_step() {
    let mut s = sim(2);
    for _ in 0..10 {
        s.step(|_| 900.0);
    }
    let p50 = s.a.p50_step_ms().unwrap();
    assert!((900.0..1000.0).contains(&p50), "{p50}");
    assert_eq!(s.a.hang_threshold_ms(), (p50 * 10.0) as u64);
}

#[test]
fn silence_from_the_node_is_a_lost_heartbeat_and_a_frame_clears_it() {
    let mut s = sim(2);
    s.steady(3);
    s.beats = false;
    let since = s.now;
    // Past the 5 s hang floor: a silent node says nothing about progress, so no hang verdict.
    s.wait_until(since + 9_900);
    assert!(s.given.is_empty(), "{:#?}", s.given);
    s.wait_until(since + 10_100);
    assert_eq!(s.kinds(), [VerdictKind::NodeLost]);
    assert!(s.given[0].summary.starts_with("node local lost (no heartbeat for 10.0 s)"), "{}", s.given[0].summary);
    assert_eq!(s.given[0].culprits.len(), 2);
    s.ev(AgentEvent::Heartbeat);
    assert!(s.a.active().is_empty());
}

#[test]
fn one_silent_node_among_beating_ones_is_lost_by_name_and_only_its_frames_clear_it() {
    let mut s = sim_on(4, 2);
    s.steady(3);
    s.silent = Some(1);
    let since = s.now;
    // Node 0 beats on; node 1 (ranks 1 and 3) says nothing. Its ranks' silence is no hang.
    s.wait_until(since + 9_900);
    assert!(s.given.is_empty(), "{:#?}", s.given);
    s.wait_until(since + 10_100);
    assert_eq!(s.kinds(), [VerdictKind::NodeLost]);
    let v = &s.given[0];
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), [1, 3]);
    assert!(v.culprits.iter().all(|c| c.host == "n1"), "{:?}", v.culprits);
    assert_eq!(v.waiting, [0, 2]);
    assert!(v.summary.starts_with("node n1 lost (no heartbeat for 10.0 s): ranks 1 (n1, pid 101), 3"), "{}", v.summary);
    // Node 0's heartbeat does not clear it; node 1's does.
    s.wait_until(s.now + 2_000);
    assert_eq!(s.a.active().len(), 1);
    s.silent = None;
    s.ev_from(1, AgentEvent::Heartbeat);
    assert!(s.a.active().is_empty());
}

#[test]
fn no_verdict_comes_from_silence_while_the_server_itself_is_behind() {
    let mut s = sim_on(4, 2);
    s.steady(3);
    s.beats = false;
    let since = s.now;
    // The server's queue is full for 30 s: nothing arrives, and nothing is judged.
    while s.now < since + 30_000 {
        let t = s.now + 1_000;
        s.a.behind(t);
        s.wait_until(t);
    }
    assert!(s.given.is_empty(), "{:#?}", s.given);
    // Caught up and still silent: the heartbeat rule decides, 10 s after the backlog ended.
    s.wait_until(s.now + 9_900);
    assert!(s.given.is_empty(), "{:#?}", s.given);
    s.wait_until(s.now + 200);
    assert_eq!(s.kinds(), [VerdictKind::NodeLost]);
}

#[test]
fn a_node_whose_agent_is_gone_is_lost_at_once_and_the_kills_that_follow_are_not_deaths() {
    let mut s = sim_on(4, 2);
    s.steady(3);
    let v = s.a.node_lost(s.now, 1, "its agent's port refused the reconnect").expect("a verdict");
    assert_eq!(v.kind, VerdictKind::NodeLost);
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), [1, 3]);
    assert!(v.summary.starts_with("node n1 lost (its agent's port refused the reconnect)"), "{}", v.summary);
    assert_eq!(s.a.active().len(), 1);
    // The server kills node 0's ranks: their exits are the loss's doing, not new deaths.
    for r in [0, 2] {
        s.ev(AgentEvent::RankExited { rank: Rank(r), pid: 100 + r, status: ExitStatus::Signal(9), last_error: None });
    }
    s.wait_until(s.now + 5_000);
    assert!(s.given.is_empty(), "{:#?}", s.given);
    assert!(s.a.finish(s.now).is_empty());
    // Once ending, a loss is no verdict.
    let mut t = sim_on(2, 2);
    t.steady(2);
    t.a.ending();
    assert!(t.a.node_lost(t.now, 1, "gone").is_none());
}

#[test]
fn ranks_that_report_nothing_are_never_judged_by_progress() {
    let cfg = Config::from_recipe(&crate::recipe::Analysis::default());
    let mut a = Analyzer::new(cfg, 2, T0);
    a.observe(T0, 0, &AgentEvent::RankStarted { rank: Rank(0), local_rank: 0, pid: 1, host: "local".into() });
    for t in (0..120).map(|i| T0 + i * 1000) {
        a.observe(t, 0, &AgentEvent::Heartbeat);
        assert!(a.tick(t).is_empty());
    }
}

#[test]
fn a_stop_or_kill_makes_exits_expected() {
    let mut s = sim(2);
    s.steady(3);
    s.a.ending();
    s.ev(AgentEvent::RankExited { rank: Rank(0), pid: 100, status: ExitStatus::Signal(9), last_error: None });
    s.wait_until(s.now + 60_000);
    assert!(s.given.is_empty() && s.a.finish(s.now).is_empty());
}

#[test]
fn a_slow_rank_is_flagged_once_as_a_straggler_and_its_peers_are_not() {
    let mut s = sim(3);
    s.steady(5);
    assert!(s.given.is_empty());
    for _ in 0..20 {
        s.step(|r| if r == 2 { 60.0 } else { 40.0 });
    }
    assert_eq!(s.kinds(), [VerdictKind::Straggler]);
    let v = &s.given[0];
    assert_eq!(v.culprits[0].rank, 2);
    // Arrival at the first collective shows it first (it leads the step's metrics).
    assert!(v.summary.contains("is a straggler") && v.summary.contains("arrives 20.0 ms late"), "{}", v.summary);
    assert!(v.summary.contains("(over 10.0 ms in 5 of 5 steps)"), "{}", v.summary);
    assert_eq!(s.a.active().len(), 1);
    let lags = s.a.stragglers.lags(5, s.a.ranks(), 3);
    assert_eq!((lags[&2].compute_ms, lags[&2].others_compute_ms), (60.0, 40.0));
    assert_eq!(lags[&2].late_ms, [20.0; 5]);
    // A fast rank's others are one fast and one slow rank: the upper median is the slow one.
    assert_eq!(lags[&0].late_ms, [-20.0; 5]);
    // It catches up: the flag clears.
    s.steady(10);
    assert!(s.a.active().is_empty());
}

/// Runs `steps` steps of `compute` on a fresh world of `world` ranks; the verdicts' culprits.
fn culprits_of(world: u32, steps: usize, compute: impl Fn(usize, u32) -> f64) -> Vec<u32> {
    let mut s = sim(world);
    for i in 0..steps {
        s.step(|r| compute(i, r));
    }
    assert!(s.given.iter().all(|v| v.kind == VerdictKind::Straggler), "{:#?}", s.given);
    s.given.iter().map(|v| v.culprits[0].rank).collect()
}

#[test]
fn a_clearly_slow_rank_on_a_fast_machines_few_ms_steps_is_a_straggler() {
    // 3 ms steps and a rank four times slower: 9 ms late, past the 2 ms clock guard.
    assert_eq!(culprits_of(2, 30, |_, r| if r == 1 { 12.0 } else { 3.0 }), [1]);
    assert_eq!(culprits_of(4, 30, |_, r| if r == 3 { 12.0 } else { 3.0 }), [3]);
}

#[test]
fn lateness_under_the_clock_guard_is_noise_however_short_the_steps() {
    // +33 % compute on 3 ms steps is 1 ms late: under 2 ms, whatever its share of the step.
    assert_eq!(culprits_of(2, 30, |_, r| if r == 1 { 4.0 } else { 3.0 }), Vec::<u32>::new());
}

#[test]
fn within_the_margin_is_not_a_straggler() {
    // +20 % compute is past half the margin, but 8 ms late is under 25 % of 40 ms.
    assert_eq!(culprits_of(2, 30, |_, r| if r == 1 { 48.0 } else { 40.0 }), Vec::<u32>::new());
}

#[test]
fn late_in_some_steps_only_is_scheduling_not_a_straggler() {
    // +50 % and 20 ms late, but every fourth step on time: never nine steps in ten.
    assert_eq!(culprits_of(2, 40, |i, r| if r == 1 && i % 4 != 0 { 60.0 } else { 40.0 }), Vec::<u32>::new());
}

#[test]
fn when_most_ranks_are_slow_none_is_a_straggler() {
    // An oversubscribed box: three of four ranks +15 %, the fourth alone on a core.
    assert_eq!(culprits_of(4, 40, |i, r| if r == 0 { 40.0 } else { 46.0 + (i % 3) as f64 }), Vec::<u32>::new());
    // Half the ranks +40 % and late: each is slow against the median, but a third may be flagged.
    assert_eq!(culprits_of(4, 40, |_, r| if r >= 2 { 56.0 } else { 40.0 }), Vec::<u32>::new());
    // Two of six are a third: both are named.
    assert_eq!(culprits_of(6, 40, |_, r| if r >= 4 { 60.0 } else { 40.0 }), [4, 5]);
}

#[test]
fn a_second_slow_rank_past_the_cap_is_not_named_while_the_first_holds() {
    let mut s = sim(4);
    for _ in 0..20 {
        s.step(|r| if r == 3 { 60.0 } else { 40.0 });
    }
    for _ in 0..20 {
        s.step(|r| if r >= 2 { 60.0 } else { 40.0 });
    }
    assert_eq!(s.given.iter().map(|v| v.culprits[0].rank).collect::<Vec<_>>(), [3]);
}

#[test]
fn slow_compute_that_still_arrives_on_time_is_not_a_straggler() {
    use crate::protocol::CollectiveOp;
    let cfg = Config::from_recipe(&crate::recipe::Analysis { straggler_window_steps: 5, ..Default::default() });
    let mut ranks = BTreeMap::new();
    for r in 0..2u32 {
        ranks.insert(r, RankState { host: "local".into(), pid: Some(r), ..Default::default() });
    }
    let mut st = straggler::Stragglers::default();
    for s in 1..=10u64 {
        // Rank 1 computes twice as long yet enters the collective with rank 0 (it started early).
        for (r, compute) in [(0u32, 15.0), (1, 30.0)] {
            let m = StepMetrics {
                step: Step(s),
                loss: 2.0,
                lr: 1e-3,
                grad_norm: 1.0,
                tokens: 1,
                step_time_ms: 40.0,
                data_ms: 0.0,
                fwd_ms: compute / 2.0,
                bwd_ms: compute / 2.0,
                comm_ms: 1.0,
                opt_ms: 1.0,
                mem_rss_bytes: 0,
            };
            st.on_step(r, &m);
            let mut rec = record(s, s, 10, s * 100, None);
            rec.op = CollectiveOp::AllReduce;
            st.on_collective(r, &rec);
        }
        assert!(st.evaluate(&cfg, &ranks, 2, T0).is_empty(), "step {s}");
    }
    let lags = st.lags(5, &ranks, 2);
    assert_eq!((lags[&1].compute_ms, &lags[&1].late_ms[..]), (30.0, &[0.0; 5][..]));
}

/// A program seen only through its log: steps read by an adapter.
fn logged(s: &mut Sim, rank: u32, step: u64) {
    let mut record = crate::adapters::Record::at(1, crate::adapters::RecordKind::Step);
    record.step = Some(step);
    record.metrics = vec![("loss".into(), 2.0), ("time_ms".into(), 100.0)];
    s.ev(AgentEvent::LogRecord { rank: Rank(rank), record });
}

#[test]
fn a_rank_whose_log_stops_while_its_peers_go_on_is_the_hang() {
    let mut s = sim(3);
    for step in 1..=5 {
        for r in 0..3 {
            logged(&mut s, r, step);
        }
        s.wait_until(s.now + 100);
    }
    // Rank 1's log stops at step 5; the others log three more steps, then wait on it.
    for step in 6..=8 {
        logged(&mut s, 0, step);
        logged(&mut s, 2, step);
        s.wait_until(s.now + 100);
    }
    assert!(s.given.is_empty(), "progress continues: {:?}", s.given);
    s.wait_until(s.now + 5000 * SLACK + 1000);
    let v = s.given.first().expect("a hang verdict").clone();
    assert_eq!(v.kind, VerdictKind::NeverEntered);
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), vec![1], "{}", v.summary);
    assert!(v.summary.contains("stopped at step 5") && v.summary.contains("reached step 8"), "{}", v.summary);
}

fn saved(step: u64) -> RankMsg {
    RankMsg::CheckpointSaved(crate::protocol::CheckpointSaved {
        step: Step(step),
        path: format!("/r/checkpoints/step-{step:08}"),
        bytes: 1 << 20,
        loss: 2.0,
        saved_ms: T0,
        blocking_ms: 1.0,
        write_ms: 5.0,
        write_gbps: 0.2,
        pruned: Vec::new(),
    })
}

fn failed(step: u64) -> RankMsg {
    RankMsg::CheckpointFailed { step: Step(step), reason: format!("no space for checkpoint step {step}") }
}

#[test]
fn two_failed_saves_in_a_row_are_a_checkpoint_failing_verdict_naming_the_steps_and_the_last_good_one() {
    let mut s = sim(2);
    s.steady(3);
    s.msg(0, saved(10));
    // One failure, then a good save: a passing hiccup, no verdict.
    s.msg(0, failed(20));
    s.msg(0, saved(30));
    s.msg(0, failed(40));
    s.steady(2);
    assert!(s.kinds().is_empty(), "{:?}", s.given);
    s.msg(0, failed(50));
    assert_eq!(s.kinds(), vec![VerdictKind::CheckpointFailing]);
    let v = &s.given[0];
    assert!(!v.kind.is_hang(), "no incident report or stack dump for it");
    assert_eq!((v.culprits[0].rank, v.waiting.clone()), (0, vec![1]));
    for part in [
        "2 saves in a row failed",
        "steps 40, 50",
        "no space for checkpoint step 50",
        "newest good checkpoint is step 30",
    ] {
        assert!(v.summary.contains(part), "{part}: {}", v.summary);
    }
    // Given once: the stop it brings may fail its own save too.
    s.msg(0, failed(51));
    assert_eq!(s.kinds().len(), 1);
}

/// A failure event as the failure adapter gives it, from rank `rank`'s log.
fn log_failure(s: &mut Sim, rank: u32, event: &str, labels: &[(&str, i64)]) {
    use crate::adapters::{Label, Record, RecordKind};
    let mut record = Record::at(7, RecordKind::Event);
    record.labels.push(("event".into(), Label::Text(event.into())));
    record.labels.extend(labels.iter().map(|(k, v)| (k.to_string(), Label::Int(*v))));
    s.ev(AgentEvent::LogRecord { rank: Rank(rank), record });
}

#[test]
fn a_failure_in_a_ranks_log_is_a_verdict_naming_the_first_rank_to_fail() {
    let mut s = sim(3);
    s.steady(3);
    // Rank 2's log fails first; rank 0's a little later, because of it.
    let mut reader = crate::adapters::LogReader::new(crate::adapters::Choice::Auto);
    let line = b"[rank2]:[E1203 10:00:00.123456 4243 ProcessGroupNCCL.cpp:632] [Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600012 milliseconds before timing out.";
    for record in reader.push(1, line) {
        s.ev(AgentEvent::LogRecord { rank: Rank(2), record });
    }
    s.wait_until(s.now + 200);
    log_failure(&mut s, 0, "dist_backend_error", &[]);
    assert!(s.kinds().is_empty(), "the verdict waits for the other ranks' lines: {:?}", s.given);
    s.wait_until(s.now + 2 * CONFIRM_MS);
    assert_eq!(s.kinds(), vec![VerdictKind::Failure]);
    let v = &s.given[0];
    assert_eq!(v.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(), vec![2, 0], "root cause first: {}", v.summary);
    assert!(v.summary.starts_with("rank 2 (local, pid 102) failed first: nccl timeout"), "{}", v.summary);
    assert!(
        v.summary.contains("ALLREDUCE work 5") && v.summary.contains("then rank 0 (dist backend error)"),
        "{}",
        v.summary
    );
    assert_eq!(v.waiting, vec![1], "the rank that said nothing");
    assert!(v.kind.is_hang(), "an incident report and a stack dump");
    assert!(s.a.active().iter().any(|a| a.kind == VerdictKind::Failure), "it holds");
    s.steady(1);
    assert!(!s.a.active().iter().any(|a| a.kind == VerdictKind::Failure), "progress ends it");
}

#[test]
fn the_rank_whose_last_completed_work_is_behind_is_named_whatever_the_order_of_the_lines() {
    let mut s = sim(4);
    s.steady(2);
    // Ranks 0, 2, 3 completed work 5 and timed out in 6; rank 1 never finished 5. Its line
    // arrives last.
    for r in [0, 2, 3] {
        log_failure(&mut s, r, "nccl_timeout", &[("seq", 6), ("last_enqueued", 6), ("last_completed", 5)]);
    }
    log_failure(&mut s, 1, "nccl_timeout", &[("seq", 5), ("last_enqueued", 5), ("last_completed", 4)]);
    s.wait_until(s.now + 2 * CONFIRM_MS);
    let v = &s.given[0];
    assert_eq!(v.culprits[0].rank, 1, "{}", v.summary);
    assert!(v.summary.starts_with("rank 1 (local, pid 101) never finished work 5"), "{}", v.summary);
}

#[test]
fn failures_printed_while_a_run_is_stopped_give_no_verdict() {
    let mut s = sim(2);
    s.steady(2);
    s.a.ending();
    log_failure(&mut s, 0, "signal_exception", &[("signal", 15)]);
    s.wait_until(s.now + 2 * CONFIRM_MS);
    assert!(s.kinds().is_empty(), "{:?}", s.given);
    // A NaN loss is no failure of a rank either (recovery.on_nan decides).
    let mut s = sim(2);
    s.steady(2);
    log_failure(&mut s, 0, "nan_loss", &[]);
    s.wait_until(s.now + 2 * CONFIRM_MS);
    assert!(s.kinds().is_empty(), "{:?}", s.given);
}

#[test]
fn a_failure_verdict_says_whether_the_flight_recorder_agrees() {
    let mut s = sim(2);
    s.steady(3);
    // Rank 1 never enters the next collective: the hang verdict names it.
    s.seq += 1;
    let seq = s.seq;
    s.msg(0, RankMsg::Collective(record(seq, s.step + 1, 1024, s.now, None)));
    s.wait_until(s.now + 5000 * SLACK + 1000);
    assert_eq!(s.kinds(), vec![VerdictKind::NeverEntered], "{:?}", s.given);
    log_failure(&mut s, 1, "nccl_timeout", &[("seq", seq as i64)]);
    s.wait_until(s.now + 2 * CONFIRM_MS);
    let v = s.given.iter().find(|v| v.kind == VerdictKind::Failure).expect("a failure verdict");
    assert!(v.summary.contains("the flight recorder agrees (never-entered"), "{}", v.summary);
}
