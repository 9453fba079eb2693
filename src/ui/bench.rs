//! `flightdeck bench-ui`: replays synthetic telemetry of a large run (default 1,024 ranks at 10
//! steps/s, with collectives, samples and logs) through the cockpit's real ingest and render
//! path, headless on a TestBackend, and reports frame times, backlog, CPU and peak RSS.
use super::app::{App, Start};
use super::effects::{DataEvent, Effects};
use crate::ids::{Rank, RunId, Step};
use crate::protocol::{AgentEvent, AgentFrame, CollectiveOp, CollectiveRecord, CollectiveState, Phase};
use crate::protocol::{RankMsg, RunSnapshot, StepMetrics, Stream};
use crate::store::{RankInfo, RunDetail, RunMeta, RunRecord, RunStatus, Summary};
use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::Terminal;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    #[arg(long, default_value_t = 1024)]
    pub ranks: u32,
    #[arg(long, default_value_t = 10.0)]
    pub steps_per_s: f64,
    #[arg(long, default_value_t = 60)]
    pub secs: u64,
    /// Ranks per node: one frame batch per node per step, as agents send them.
    #[arg(long, default_value_t = 8)]
    pub ranks_per_node: u32,
    #[arg(long, default_value_t = 160)]
    pub width: u16,
    #[arg(long, default_value_t = 48)]
    pub height: u16,
}

const RUN: &str = "20260101T000000-bench";

fn snapshot(ranks: u32, now_ms: u64) -> RunSnapshot {
    let meta = RunMeta {
        name: "bench".into(),
        recipe_name: "synthetic".into(),
        recipe_path: "-".into(),
        recipe_json: "{}".into(),
        world_size: ranks,
        steps_planned: 1_000_000,
    };
    let mut run = RunRecord::starting(RunId(RUN.into()), meta, vec!["local".into()], Vec::new(), None);
    (run.status, run.created_ms) = (RunStatus::Running, now_ms);
    let info = |rank| RankInfo { host: format!("node-{}", rank / 8), pid: Some(10_000 + rank), ..RankInfo::new(rank) };
    let detail = RunDetail {
        run,
        ranks: (0..ranks).map(info).collect(),
        events: Vec::new(),
        metrics: Vec::new(),
        summary: Summary::default(),
        verdicts: Vec::new(),
        attempts: Vec::new(),
        goodput: None,
    };
    RunSnapshot { detail, series: Vec::new(), collectives: Vec::new(), logs: Vec::new() }
}

/// One node's frames for one step: phases, the step's metrics, an all-reduce (started and
/// completed), a process sample each second, a log line every tenth step.
fn node_frames(node: u32, per_node: u32, step: u64, seq: &mut u64, t_ms: u64, steps_per_s: f64) -> Vec<AgentFrame> {
    let mut out = Vec::with_capacity(per_node as usize * 9);
    let mut push = |event: AgentEvent| {
        *seq += 1;
        out.push(AgentFrame { seq: *seq, t_ms, event });
    };
    for local in 0..per_node {
        let rank = Rank(node * per_node + local);
        // A straggler: rank 5 is 30% slower, so the heatmap has something to show.
        let slow = if rank.0 == 5 { 1.3 } else { 1.0 };
        let step_time_ms = 1000.0 / steps_per_s * slow * (1.0 + 0.05 * ((step + u64::from(rank.0)) % 7) as f64 / 7.0);
        for phase in [Phase::Data, Phase::Fwd, Phase::Bwd, Phase::Comm, Phase::Opt] {
            push(AgentEvent::Rank { rank, msg: RankMsg::Phase { step: Step(step), phase, t_ms } });
        }
        let loss = 3.0 * (-(step as f64) / 300.0).exp() + 0.5 + 0.01 * f64::from(rank.0 % 13);
        let m = StepMetrics {
            step: Step(step),
            loss,
            lr: 3e-3,
            grad_norm: 1.0 / (1.0 + step as f64 / 100.0),
            tokens: 1024,
            step_time_ms,
            data_ms: 1.0,
            fwd_ms: step_time_ms * 0.3,
            bwd_ms: step_time_ms * 0.5,
            comm_ms: step_time_ms * 0.15,
            opt_ms: 1.0,
            mem_rss_bytes: 2 << 30,
        };
        push(AgentEvent::Rank { rank, msg: RankMsg::Step(m) });
        let t_us = t_ms * 1000;
        for (state, end) in [(CollectiveState::Started, None), (CollectiveState::Completed, Some(t_us + 4_000))] {
            let rec = CollectiveRecord {
                seq: step,
                op: CollectiveOp::AllReduce,
                dtype: "f32".into(),
                elements: 1 << 20,
                bytes: 4 << 20,
                enqueue_us: t_us + u64::from(rank.0 % 17) * 50,
                start_us: Some(t_us + 1_000),
                end_us: end,
                state,
                step: Step(step),
            };
            push(AgentEvent::Rank { rank, msg: RankMsg::Collective(rec) });
        }
        if step.is_multiple_of(steps_per_s.max(1.0) as u64) {
            push(AgentEvent::ProcSample { rank, cpu_pct: 98.0, rss_bytes: 3 << 30 });
        }
        if step.is_multiple_of(10) {
            let line = format!("rank {} step {step} loss {loss:.4} step {step_time_ms:.1} ms", rank.0);
            push(AgentEvent::Log { rank, stream: Stream::Stdout, line });
        }
    }
    out
}

fn cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU time of this thread: unlike wall time, not inflated when a busy machine preempts us.
fn thread_cpu_ms() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1000.0 + t.tv_nsec as f64 / 1e6
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok());
    kb.unwrap_or(0.0) / 1024.0
}

use super::frame_stats::percentile as pct;

pub async fn run(args: BenchArgs) -> anyhow::Result<i32> {
    let (keymap, layouts) = super::load_config()?;
    let area = Rect::new(0, 0, args.width, args.height);
    let mut app = App::new(Effects::live(), keymap, layouts, Start::Open(RUN.into()), area);
    app.effects.take();
    app.on_data(DataEvent::Snapshot(Box::new(snapshot(args.ranks, crate::ids::unix_ms()))));
    let mut term = Terminal::new(TestBackend::new(args.width, args.height))?;
    // The same bounded queue as the live cockpit: a slow UI makes the producer wait.
    let (tx, mut rx) = mpsc::channel::<DataEvent>(super::DATA_QUEUE);
    let nodes = args.ranks.div_ceil(args.ranks_per_node);
    let (per_node, steps_per_s) = (args.ranks_per_node, args.steps_per_s);
    let total_steps = (args.secs as f64 * steps_per_s) as u64;
    let start = Instant::now();
    let producer = tokio::spawn(async move {
        let mut seq = 0u64;
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / steps_per_s));
        let mut max_lag_ms = 0u128;
        for step in 1..=total_steps {
            tick.tick().await;
            let due = Duration::from_secs_f64((step - 1) as f64 / steps_per_s);
            max_lag_ms = max_lag_ms.max(start.elapsed().saturating_sub(due).as_millis());
            let t_ms = crate::ids::unix_ms();
            for node in 0..nodes {
                let frames = node_frames(node, per_node, step, &mut seq, t_ms, steps_per_s);
                if tx.send(DataEvent::Frames { run: RunId(RUN.into()), node, frames }).await.is_err() {
                    return (step, max_lag_ms);
                }
            }
        }
        (total_steps, max_lag_ms)
    });
    let cpu0 = cpu_s();
    let mut frame_ms: Vec<f64> = Vec::new();
    let mut frame_cpu_ms: Vec<f64> = Vec::new();
    let mut ingest_cpu_ms = 0.0;
    let load_before = loadavg();
    let mut busy = Duration::ZERO;
    let mut backlog: Vec<usize> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(33));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut dirty = true;
    let mut open = true;
    while open {
        tokio::select! {
            data = rx.recv() => match data {
                Some(d) => {
                    let (t, c) = (Instant::now(), thread_cpu_ms());
                    dirty |= app.on_data(d);
                    while let Ok(more) = rx.try_recv() {
                        app.on_data(more);
                    }
                    busy += t.elapsed();
                    ingest_cpu_ms += thread_cpu_ms() - c;
                }
                None => open = false,
            },
            _ = tick.tick() => {
                backlog.push(rx.len());
                dirty |= app.on_tick();
                if dirty {
                    let (t, c) = (Instant::now(), thread_cpu_ms());
                    term.draw(|f| f.render_widget(&app, f.area()))?;
                    let e = t.elapsed();
                    busy += e;
                    frame_ms.push(e.as_secs_f64() * 1000.0);
                    frame_cpu_ms.push(thread_cpu_ms() - c);
                    dirty = false;
                }
            }
        }
    }
    let (steps_sent, max_lag_ms) = producer.await?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_s() - cpu0;
    frame_ms.sort_by(f64::total_cmp);
    frame_cpu_ms.sort_by(f64::total_cmp);
    let half = backlog.len() / 2;
    let mean = |xs: &[usize]| xs.iter().sum::<usize>() as f64 / xs.len().max(1) as f64;
    let frames_per_s = f64::from(args.ranks) * steps_per_s;
    println!(
        "cockpit render benchmark: {} ranks × {steps_per_s} steps/s for {}s, {}x{}",
        args.ranks, args.secs, args.width, args.height
    );
    println!("  telemetry: {steps_sent}/{total_steps} steps sent, ~{:.0} rank-steps/s (9–11 frames each), producer max lag {max_lag_ms} ms", frames_per_s);
    println!(
        "  frames drawn: {} in {wall:.1}s; frame wall time p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        frame_ms.len(),
        pct(&frame_ms, 0.5),
        pct(&frame_ms, 0.99),
        frame_ms.last().copied().unwrap_or(0.0)
    );
    println!(
        "  frame CPU time (this thread) p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; ingest CPU {:.1} ms per s",
        pct(&frame_cpu_ms, 0.5),
        pct(&frame_cpu_ms, 0.99),
        frame_cpu_ms.last().copied().unwrap_or(0.0),
        ingest_cpu_ms / wall
    );
    println!(
        "  ingest backlog (queued batches, cap {}): first half mean {:.1}, second half mean {:.1}, max {}",
        super::DATA_QUEUE,
        mean(&backlog[..half]),
        mean(&backlog[half..]),
        backlog.iter().max().copied().unwrap_or(0)
    );
    println!("  UI task busy (ingest + render): {:.1}% of one core; process CPU {:.1}% of one core (includes the synthetic producer)", busy.as_secs_f64() / wall * 100.0, cpu / wall * 100.0);
    println!("  peak RSS {:.1} MB; load average before {load_before}, after {}", peak_rss_mb(), loadavg());
    Ok(0)
}
