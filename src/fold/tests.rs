//! The fold on hand-made frames: each event text, status change and rank update.
use super::*;
use crate::ids::{Rank, RunId, Step};
use crate::protocol::{ExitStatus, StepMetrics, ThrottleReason};
use crate::record::RunMeta;

fn state(world: u32) -> RunState {
    let meta = RunMeta {
        name: "f".into(),
        recipe_name: "f".into(),
        recipe_path: "f.toml".into(),
        recipe_json: "{}".into(),
        world_size: world,
        steps_planned: 10,
    };
    RunState::new(RunRecord::starting(RunId("r".into()), meta, vec!["local".into()], vec![], None), vec![])
}

fn frame(t_ms: u64, event: AgentEvent) -> AgentFrame {
    AgentFrame { seq: t_ms, t_ms, event }
}

fn rank_msg(t_ms: u64, rank: u32, msg: RankMsg) -> AgentFrame {
    frame(t_ms, AgentEvent::Rank { rank: Rank(rank), msg })
}

fn step(t_ms: u64, rank: u32, step: u64, loss: f64) -> AgentFrame {
    let m = StepMetrics { step: Step(step), loss, step_time_ms: 12.5, ..Default::default() };
    rank_msg(t_ms, rank, RankMsg::Step(m))
}

fn texts(f: &Folded) -> Vec<&str> {
    f.events.iter().map(|e| e.text.as_str()).collect()
}

#[test]
fn a_started_rank_makes_the_run_running_and_says_where() {
    let mut s = state(2);
    let started = AgentEvent::RankStarted { rank: Rank(1), local_rank: 1, pid: 42, host: "n0".into() };
    let f = s.apply(&frame(5, started));
    assert_eq!(s.record.status, RunStatus::Running);
    assert_eq!(texts(&f), ["rank 1 (local rank 1) started on n0, pid 42"]);
    assert_eq!((f.rank, f.events[0].t_ms, f.events[0].kind), (Some(1), 5, EventKind::RankStarted));
    let r = &s.ranks[1];
    assert_eq!((r.pid, r.local_rank, r.host.as_str(), r.last_seen_ms), (Some(42), Some(1), "n0", Some(5)));
    assert_eq!(s.ranks_alive(), 1);
}

#[test]
fn the_run_step_is_the_lowest_rank_step_and_its_loss_the_mean() {
    let mut s = state(2);
    for f in [step(1, 0, 3, 2.0), step(2, 1, 2, 4.0), step(3, 0, 4, 1.0)] {
        assert!(s.apply(&f).events.is_empty());
    }
    s.settle();
    assert_eq!(s.record.step, 2);
    assert_eq!(s.record.last_loss, Some(2.5));
    assert_eq!((s.ranks[0].step, s.ranks[0].step_time_ms), (4, Some(12.5)));
}

#[test]
fn a_non_finite_loss_is_reported_once_per_rank() {
    let mut s = state(2);
    let a = s.apply(&step(1, 0, 1, f64::NAN));
    let b = s.apply(&step(2, 0, 2, f64::NAN));
    let c = s.apply(&step(3, 1, 2, f64::INFINITY));
    assert_eq!(texts(&a), ["rank 0 reported loss NaN at step 1"]);
    assert!(b.events.is_empty(), "the same rank's second NaN is no new event");
    assert_eq!(texts(&c), ["rank 1 reported loss inf at step 2"]);
    assert_eq!(a.events[0].kind, EventKind::NanLoss);
}

#[test]
fn checkpoint_events_say_what_the_save_cost_and_why_one_failed() {
    let mut s = state(1);
    let saved = CheckpointSaved {
        step: Step(20),
        path: "/x".into(),
        bytes: 12_500_000,
        loss: 1.0,
        saved_ms: 9,
        blocking_ms: 3.25,
        write_ms: 41.0,
        write_gbps: 0.3,
        pruned: vec![],
    };
    let f = s.apply(&rank_msg(1, 0, RankMsg::CheckpointSaved(saved)));
    assert_eq!(texts(&f), ["checkpoint step 20 saved: 11.9 MiB in 41 ms (0.30 GB/s), training blocked 3.2 ms"]);
    let failed = RankMsg::CheckpointFailed { step: Step(30), reason: "disk full".into() };
    let f = s.apply(&rank_msg(2, 0, failed));
    assert_eq!(texts(&f), ["rank 0: checkpoint step 30 failed: disk full"]);
    assert_eq!(f.events[0].kind, EventKind::CheckpointFailed);
}

#[test]
fn an_exit_names_the_host_and_how_it_ended() {
    let mut s = state(1);
    s.apply(&frame(1, AgentEvent::RankStarted { rank: Rank(0), local_rank: 0, pid: 7, host: "n3".into() }));
    let f = s.apply(&frame(
        2,
        AgentEvent::RankExited { rank: Rank(0), pid: 7, status: ExitStatus::Signal(9), last_error: None },
    ));
    assert_eq!(texts(&f), ["rank 0 (n3, pid 7) exited: signal 9 (SIGKILL)"]);
    assert_eq!(s.ranks_alive(), 0);
}

#[test]
fn each_outcome_ends_the_run_with_its_status_reason_and_time() {
    for (outcome, status) in [
        (RunOutcome::Succeeded, RunStatus::Succeeded),
        (RunOutcome::Failed, RunStatus::Failed),
        (RunOutcome::Stopped, RunStatus::Stopped),
        (RunOutcome::Killed, RunStatus::Killed),
    ] {
        let mut s = state(1);
        let f = s.apply(&frame(77, AgentEvent::RunEnded { outcome, reason: "because".into() }));
        assert_eq!((s.record.status, s.record.reason.as_str(), s.record.ended_ms), (status, "because", Some(77)));
        assert_eq!(texts(&f), [format!("run {}: because", status.name())]);
        assert_eq!(f.events[0].kind, EventKind::RunEnded);
    }
}

#[test]
fn a_rank_past_the_world_size_gets_a_row_of_its_own() {
    let mut s = state(1);
    s.apply(&rank_msg(1, 3, RankMsg::Register { rank: Rank(3), pid: 9 }));
    assert_eq!(s.ranks.len(), 4);
    assert_eq!((s.ranks[3].rank, s.ranks[3].pid), (3, Some(9)));
    s.apply(&rank_msg(2, 3, RankMsg::Finished { steps: 1, final_loss: 1.0 }));
    assert_eq!(s.ranks[3].phase, Some(Phase::Done));
}

#[test]
fn gpu_events_and_notices_become_notice_events() {
    let mut s = state(1);
    let f = s.apply(&frame(1, AgentEvent::GpuThrottle { index: 2, reasons: vec![ThrottleReason::HwThermal] }));
    assert_eq!(texts(&f), ["GPU 2: clocks held down by hw-thermal"]);
    let f = s.apply(&frame(2, AgentEvent::GpuThrottle { index: 2, reasons: vec![] }));
    assert_eq!(texts(&f), ["GPU 2: clocks no longer held down"]);
    let f = s.apply(&frame(3, AgentEvent::Notice { text: "hello".into() }));
    assert_eq!((texts(&f), f.events[0].kind), (vec!["hello"], EventKind::Notice));
}

#[test]
fn a_run_is_hung_while_a_hang_holds_and_says_so_when_it_ends_hung() {
    let mut s = state(2);
    let started = AgentEvent::RankStarted { rank: Rank(0), local_rank: 0, pid: 7, host: "n0".into() };
    s.apply(&frame(1, started));
    s.settle_hang(true);
    assert_eq!(s.record.status, RunStatus::Hung);
    assert!(s.record.status.is_live(), "a hung run is live: stop, kill and stacks still reach it");
    // Progress resumed, no rank gone: running again.
    s.settle_hang(false);
    assert_eq!(s.record.status, RunStatus::Running);
    // Hung, then killed: the exits clear the verdict but not the hang; the end names it.
    s.settle_hang(true);
    let exited = AgentEvent::RankExited { rank: Rank(0), pid: 7, status: ExitStatus::Signal(9), last_error: None };
    s.apply(&frame(2, exited));
    s.settle_hang(false);
    assert_eq!(s.record.status, RunStatus::Hung);
    let ended = AgentEvent::RunEnded { outcome: RunOutcome::Killed, reason: "killed on request".into() };
    let f = s.apply(&frame(3, ended));
    assert_eq!((s.record.status, s.record.reason.as_str()), (RunStatus::Killed, "killed on request, while hung"));
    assert_eq!(texts(&f), ["run killed: killed on request, while hung"]);
    // Only a live run becomes hung.
    s.settle_hang(true);
    assert_eq!(s.record.status, RunStatus::Killed);
}
