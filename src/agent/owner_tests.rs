//! The owner's rules of run end, stop and kill, driven step by step; timers run on paused time.
use super::*;
use crate::agent::input::Timers;
use crate::protocol::Stream;

/// Test values, unlike the shipped ones, so a rule that ignores the config shows.
const STOP_GRACE: Duration = Duration::from_secs(3);
const SAVE_GRACE: Duration = Duration::from_secs(40);

fn config(ranks: usize, graceful_stop: bool) -> Config {
    Config { node: "n1".into(), ranks, graceful_stop, stop_grace: STOP_GRACE, save_grace: SAVE_GRACE }
}

/// Rank r runs as pid 100 + r.
fn pid(rank: u32) -> u32 {
    100 + rank
}

/// An owner with its timers, as the agent's loop drives it.
struct Agent {
    owner: Owner,
    timers: Timers,
    start: Instant,
}

impl Agent {
    /// `ranks` ranks started, none registered yet (still loading).
    fn started(ranks: u32, graceful_stop: bool) -> Agent {
        let mut agent = Agent {
            owner: Owner::new(config(ranks as usize, graceful_stop)),
            timers: Timers::default(),
            start: Instant::now(),
        };
        for r in 0..ranks {
            let effects = agent.step(Input::Started { rank: Rank(r), local_rank: r, pid: pid(r) });
            let host = "n1".to_string();
            let started = AgentEvent::RankStarted { rank: Rank(r), local_rank: r, pid: pid(r), host };
            assert_eq!(effects, vec![Effect::Send(started)]);
        }
        agent
    }

    /// `ranks` ranks started and registered on the telemetry socket.
    fn running(ranks: u32, graceful_stop: bool) -> Agent {
        let mut agent = Agent::started(ranks, graceful_stop);
        for r in 0..ranks {
            agent.step(register(r));
        }
        agent
    }

    fn step(&mut self, input: Input) -> Vec<Effect> {
        let effects = self.owner.step(input, Instant::now());
        for effect in &effects {
            if let Effect::Arm { timer, at } = effect {
                self.timers.arm(*timer, *at);
            }
        }
        effects
    }

    /// Waits (on paused time) for the next armed timer and steps it; returns it, when it fired
    /// (since the start) and what the owner did.
    async fn fire(&mut self) -> (Timer, Duration, Vec<Effect>) {
        let timer = self.timers.next().await;
        let at = Instant::now() - self.start;
        (timer, at, self.step(Input::Timer(timer)))
    }

    /// Rank `r` exits with `status` and its telemetry connection closes.
    fn gone(&mut self, r: u32, status: ExitStatus) -> Vec<Effect> {
        let mut effects = self.step(exited(r, status));
        effects.extend(self.step(Input::TelemetryClosed { rank: Rank(r) }));
        effects
    }
}

fn register(r: u32) -> Input {
    Input::Event(AgentEvent::Rank { rank: Rank(r), msg: RankMsg::Register { rank: Rank(r), pid: pid(r) } })
}

fn exited(r: u32, status: ExitStatus) -> Input {
    Input::Exited { rank: Rank(r), pid: pid(r), status, last_error: None }
}

const OK: ExitStatus = ExitStatus::Code(0);
const SIGTERMED: ExitStatus = ExitStatus::Signal(libc::SIGTERM);
const SIGKILLED: ExitStatus = ExitStatus::Signal(libc::SIGKILL);

fn signals(effects: &[Effect]) -> Vec<(u32, Signal)> {
    let sent = effects.iter().filter_map(|e| match e {
        Effect::Signal { rank, pid: p, signal } => {
            assert_eq!(*p, pid(rank.0), "signal to the wrong pid");
            Some((rank.0, *signal))
        }
        _ => None,
    });
    sent.collect()
}

fn armed(effects: &[Effect]) -> Vec<Timer> {
    effects.iter().filter_map(|e| if let Effect::Arm { timer, .. } = e { Some(*timer) } else { None }).collect()
}

fn run_ended(effects: &[Effect]) -> Option<(RunOutcome, String)> {
    effects.iter().find_map(|e| match e {
        Effect::Send(AgentEvent::RunEnded { outcome, reason }) => Some((*outcome, reason.clone())),
        _ => None,
    })
}

/// Paused time wakes a timer on the millisecond tick at or after its deadline.
fn assert_fired_at(at: Duration, want: Duration) {
    assert!(at >= want && at < want + Duration::from_millis(2), "fired at {at:?}, want {want:?}");
}

#[test]
fn the_run_succeeds_once_every_rank_has_exited_and_its_telemetry_drained() {
    let mut a = Agent::running(2, true);
    let log = AgentEvent::Log { rank: Rank(0), stream: Stream::Stdout, line: "step 1".into() };
    assert_eq!(a.step(Input::Event(log.clone())), vec![Effect::Send(log)], "events go upstream as they are");
    let e = a.step(exited(0, OK));
    assert_eq!(
        e,
        vec![Effect::Send(AgentEvent::RankExited { rank: Rank(0), pid: pid(0), status: OK, last_error: None })]
    );
    assert!(run_ended(&a.gone(1, OK)).is_none(), "rank 0's telemetry is still open");
    let e = a.step(Input::TelemetryClosed { rank: Rank(0) });
    assert_eq!(run_ended(&e), Some((RunOutcome::Succeeded, "all 2 ranks finished".into())));
    assert_eq!(armed(&e), vec![Timer::Linger]);
    assert!(a.owner.ended());
    assert!(a.owner.alive().is_empty());
}

#[test]
fn a_rank_that_never_registered_ends_the_run_at_its_exit() {
    let mut a = Agent::started(1, true);
    let e = a.step(exited(0, OK));
    assert_eq!(run_ended(&e), Some((RunOutcome::Succeeded, "all 1 ranks finished".into())));
}

#[tokio::test(start_paused = true)]
async fn a_crash_fails_the_run_and_terminates_then_kills_the_rest() {
    let mut a = Agent::running(3, true);
    let e = a.step(exited(1, ExitStatus::Code(3)));
    assert_eq!(signals(&e), vec![(0, Signal::Terminate), (2, Signal::Terminate)], "the dead rank is not signalled");
    assert_eq!(armed(&e), vec![Timer::Escalate]);
    assert_eq!(a.owner.alive(), vec![(Rank(0), pid(0)), (Rank(2), pid(2))]);
    a.step(Input::TelemetryClosed { rank: Rank(1) });
    // Rank 0 obeys SIGTERM; rank 2 ignores it and is killed once the grace runs out.
    assert!(run_ended(&a.gone(0, SIGTERMED)).is_none());
    let (timer, at, e) = a.fire().await;
    assert_eq!(timer, Timer::Escalate);
    assert_fired_at(at, STOP_GRACE);
    assert_eq!(signals(&e), vec![(2, Signal::Kill)]);
    let (outcome, reason) = run_ended(&a.gone(2, SIGKILLED)).expect("the run ended");
    assert_eq!(outcome, RunOutcome::Failed);
    assert_eq!(reason, "rank 1 (n1, pid 101) ended with exit code 3", "the first failure is the reason");
}

#[test]
fn a_failed_ranks_last_error_line_is_quoted_in_the_reason_and_its_exit() {
    let mut a = Agent::running(1, true);
    let said = "memory allocation of 120000000000 bytes failed".to_string();
    let e = a.step(Input::Exited {
        rank: Rank(0),
        pid: pid(0),
        status: ExitStatus::Signal(6),
        last_error: Some(said.clone()),
    });
    let exited =
        AgentEvent::RankExited { rank: Rank(0), pid: pid(0), status: ExitStatus::Signal(6), last_error: Some(said) };
    assert!(e.contains(&Effect::Send(exited)), "{e:?}");
    let (_, reason) = run_ended(&a.step(Input::TelemetryClosed { rank: Rank(0) })).expect("the run ended");
    assert_eq!(
        reason,
        "rank 0 (n1, pid 100) ended with signal 6 (SIGABRT): memory allocation of 120000000000 bytes failed"
    );
}

#[test]
fn nothing_is_sent_after_the_run_ended_so_the_last_ack_empties_the_outbox() {
    let mut a = Agent::running(1, true);
    assert!(run_ended(&a.gone(0, OK)).is_some());
    let late = AgentEvent::ProcSample { rank: Rank(0), cpu_pct: 1.0, rss_bytes: 1 };
    assert_eq!(a.step(Input::Event(late)), vec![], "a sample taken before the exit arrives after the end");
    assert_eq!(a.step(Input::AllAcked), vec![Effect::Exit(Exit::Collected)]);
}

#[test]
fn a_rank_that_exits_0_early_does_not_end_or_fail_the_run() {
    let mut a = Agent::running(2, true);
    let e = a.gone(0, OK);
    assert!(signals(&e).is_empty() && armed(&e).is_empty() && run_ended(&e).is_none(), "{e:?}");
    assert_eq!(run_ended(&a.gone(1, OK)).map(|(o, _)| o), Some(RunOutcome::Succeeded));
}

#[test]
fn a_graceful_stop_asks_for_a_save_and_ends_stopped_after_the_last_step() {
    let mut a = Agent::running(2, true);
    let e = a.step(Input::Stop);
    assert_eq!(signals(&e), vec![(0, Signal::Save), (1, Signal::Save)], "SIGUSR1, not SIGTERM");
    assert_eq!(armed(&e), vec![Timer::SaveOverdue]);
    for r in 0..2 {
        // The most steps any rank finished, not the last report: rank 1 reports last, fewer.
        let finished = RankMsg::Finished { steps: 41 - r as u64, final_loss: 2.5 };
        a.step(Input::Event(AgentEvent::Rank { rank: Rank(r), msg: finished }));
    }
    assert!(run_ended(&a.gone(0, OK)).is_none());
    let ended = run_ended(&a.gone(1, OK));
    assert_eq!(ended, Some((RunOutcome::Stopped, "stopped on request after step 41, checkpoint saved".into())));
}

#[test]
fn a_graceful_stop_with_no_finished_step_still_says_it_saved() {
    let mut a = Agent::running(1, true);
    a.step(Input::Stop);
    let ended = run_ended(&a.gone(0, OK));
    assert_eq!(ended, Some((RunOutcome::Stopped, "stopped on request at a step boundary, checkpoint saved".into())));
}

#[test]
fn a_stop_during_start_up_reaches_each_rank_when_it_registers() {
    let mut a = Agent::started(2, true);
    assert!(signals(&a.step(register(0))).is_empty(), "no stop yet: registering signals nothing");
    let e = a.step(Input::Stop);
    assert_eq!(signals(&e), vec![(0, Signal::Save)], "SIGUSR1 would kill rank 1 while it loads");
    let e = a.step(register(1));
    assert_eq!(signals(&e), vec![(1, Signal::Save)]);
    assert!(matches!(e.last(), Some(Effect::Send(AgentEvent::Rank { .. }))), "the Register goes upstream too");
}

#[tokio::test(start_paused = true)]
async fn an_overdue_save_falls_back_to_sigterm_then_sigkill() {
    let mut a = Agent::running(2, true);
    a.step(Input::Stop);
    let (timer, at, e) = a.fire().await;
    assert_eq!(timer, Timer::SaveOverdue);
    assert_fired_at(at, SAVE_GRACE);
    assert_eq!(signals(&e), vec![(0, Signal::Terminate), (1, Signal::Terminate)]);
    assert_eq!(armed(&e), vec![Timer::Escalate]);
    let (timer, at, e) = a.fire().await;
    assert_eq!(timer, Timer::Escalate);
    assert_fired_at(at, SAVE_GRACE + STOP_GRACE);
    assert_eq!(signals(&e), vec![(0, Signal::Kill), (1, Signal::Kill)]);
    a.gone(0, SIGKILLED);
    let (outcome, reason) = run_ended(&a.gone(1, SIGKILLED)).expect("the run ended");
    assert_eq!(outcome, RunOutcome::Stopped, "signalled exits after a stop are not a failure");
    assert!(reason.contains("did not reach a step boundary and save within 40 s"), "{reason}");
}

#[tokio::test(start_paused = true)]
async fn a_save_that_finished_in_time_is_not_overdue() {
    let mut a = Agent::running(1, true);
    a.step(Input::Stop);
    // The rank saved and exited; its last frames are still on their way.
    a.step(exited(0, OK));
    let (timer, _, e) = a.fire().await;
    assert_eq!(timer, Timer::SaveOverdue);
    assert_eq!(e, vec![], "nothing to terminate, and the outcome stays a saved stop");
    let ended = run_ended(&a.step(Input::TelemetryClosed { rank: Rank(0) }));
    assert_eq!(ended, Some((RunOutcome::Stopped, "stopped on request at a step boundary, checkpoint saved".into())));
}

#[tokio::test(start_paused = true)]
async fn a_failure_while_saving_fails_the_run() {
    let mut a = Agent::running(2, true);
    a.step(Input::Stop);
    let e = a.step(exited(0, ExitStatus::Code(1)));
    assert_eq!(signals(&e), vec![(1, Signal::Terminate)]);
    let (timer, at, e) = a.fire().await;
    assert_eq!((timer, signals(&e)), (Timer::Escalate, vec![(1, Signal::Kill)]));
    assert_fired_at(at, STOP_GRACE);
    a.step(Input::TelemetryClosed { rank: Rank(0) });
    let (outcome, reason) = run_ended(&a.gone(1, SIGKILLED)).expect("the run ended");
    assert_eq!(outcome, RunOutcome::Failed);
    assert_eq!(reason, "rank 0 (n1, pid 100) ended with exit code 1 while stopping gracefully");
    let (timer, _, e) = a.fire().await;
    assert_eq!((timer, e.len()), (Timer::SaveOverdue, 0), "the stop's save timer no longer matters");
}

#[tokio::test(start_paused = true)]
async fn a_stop_of_a_command_run_terminates_then_kills() {
    let mut a = Agent::running(2, false);
    let e = a.step(Input::Stop);
    assert_eq!(signals(&e), vec![(0, Signal::Terminate), (1, Signal::Terminate)], "no SIGUSR1 handler to ask");
    assert_eq!(armed(&e), vec![Timer::Escalate]);
    a.gone(0, SIGTERMED);
    let (_, at, e) = a.fire().await;
    assert_fired_at(at, STOP_GRACE);
    assert_eq!(signals(&e), vec![(1, Signal::Kill)]);
    let ended = run_ended(&a.gone(1, SIGKILLED));
    assert_eq!(ended, Some((RunOutcome::Stopped, "stopped on request".into())));
}

#[test]
fn a_repeated_stop_changes_nothing() {
    let mut a = Agent::started(2, true);
    a.step(register(0));
    assert_eq!(signals(&a.step(Input::Stop)), vec![(0, Signal::Save)]);
    assert_eq!(a.step(Input::Stop), vec![], "no second SIGUSR1, no second save timer");
    assert_eq!(signals(&a.step(register(1))), vec![(1, Signal::Save)], "a late rank still gets exactly one");

    let mut a = Agent::running(2, false);
    assert_eq!(armed(&a.step(Input::Stop)), vec![Timer::Escalate]);
    assert_eq!(a.step(Input::Stop), vec![], "no second SIGTERM, and the SIGKILL stays where it was");
}

#[test]
fn a_kill_during_start_up_kills_every_rank_at_once() {
    let mut a = Agent::started(2, true);
    let e = a.step(Input::Kill);
    assert_eq!(
        e,
        vec![
            Effect::Signal { rank: Rank(0), pid: pid(0), signal: Signal::Kill },
            Effect::Signal { rank: Rank(1), pid: pid(1), signal: Signal::Kill },
        ]
    );
    a.step(exited(0, SIGKILLED));
    let ended = run_ended(&a.step(exited(1, SIGKILLED)));
    assert_eq!(ended, Some((RunOutcome::Killed, "killed on request".into())), "SIGKILLed ranks are not a failure");
}

#[test]
fn a_kill_overrides_a_stop_but_not_a_failure() {
    let mut a = Agent::running(2, true);
    a.step(Input::Stop);
    assert_eq!(signals(&a.step(Input::Kill)), vec![(0, Signal::Kill), (1, Signal::Kill)]);
    a.gone(0, SIGKILLED);
    let ended = run_ended(&a.gone(1, SIGKILLED));
    assert_eq!(ended, Some((RunOutcome::Killed, "killed on request".into())), "not 'stopped after step N'");

    let mut a = Agent::running(2, true);
    a.step(exited(0, ExitStatus::Signal(libc::SIGSEGV)));
    assert_eq!(signals(&a.step(Input::Kill)), vec![(1, Signal::Kill)]);
    a.step(Input::TelemetryClosed { rank: Rank(0) });
    let (outcome, reason) = run_ended(&a.gone(1, SIGKILLED)).expect("the run ended");
    assert_eq!(outcome, RunOutcome::Failed);
    assert!(reason.starts_with("rank 0 (n1, pid 100) ended with signal 11"), "{reason}");
}

#[test]
fn stack_dumps_target_the_live_ranks() {
    let mut a = Agent::running(3, true);
    a.step(exited(1, OK));
    let all = vec![(Rank(0), pid(0)), (Rank(2), pid(2))];
    assert_eq!(
        a.step(Input::DumpStacks { request: 7, rank: None, native: false }),
        vec![Effect::DumpStacks { request: 7, targets: all, native: false }]
    );
    let one = a.step(Input::DumpStacks { request: 8, rank: Some(Rank(2)), native: true });
    assert_eq!(one, vec![Effect::DumpStacks { request: 8, targets: vec![(Rank(2), pid(2))], native: true }]);
    let gone = a.step(Input::DumpStacks { request: 9, rank: Some(Rank(1)), native: false });
    assert_eq!(
        gone,
        vec![Effect::DumpStacks { request: 9, targets: vec![], native: false }],
        "an exited rank is answered, empty"
    );
}

#[test]
fn heartbeats_stop_at_the_run_end_and_the_last_ack_exits() {
    let mut a = Agent::running(1, true);
    assert_eq!(a.step(Input::Heartbeat), vec![Effect::Send(AgentEvent::Heartbeat)]);
    assert_eq!(a.step(Input::AllAcked), vec![], "a run still going never exits on an ack");
    a.gone(0, OK);
    assert_eq!(a.step(Input::Heartbeat), vec![]);
    assert_eq!(a.step(Input::Stop), vec![], "a stop after the end does nothing");
    assert_eq!(a.step(Input::AllAcked), vec![Effect::Exit(Exit::Collected)]);
}

#[tokio::test(start_paused = true)]
async fn an_ended_run_nobody_collects_exits_after_the_linger() {
    let mut a = Agent::running(1, true);
    tokio::time::advance(Duration::from_secs(7)).await;
    a.gone(0, OK);
    let (timer, at, e) = a.fire().await;
    assert_eq!(timer, Timer::Linger);
    assert_fired_at(at, Duration::from_secs(7) + LINGER);
    assert_eq!(e, vec![Effect::Exit(Exit::Unclaimed)]);
}

/// Rank r's worker, found as torchrun's child: pid 200 + r; torchrun is pid 99.
const TORCHRUN: u32 = 99;

fn launched(ranks: u32) -> Agent {
    let mut agent =
        Agent { owner: Owner::new(config(ranks as usize, false)), timers: Timers::default(), start: Instant::now() };
    let effects = agent.step(Input::Launched { pid: TORCHRUN, ranks: (0..ranks).map(Rank).collect() });
    assert!(effects.is_empty(), "nothing is sent before a rank is found: {effects:?}");
    agent
}

fn found(r: u32) -> Input {
    Input::Started { rank: Rank(r), local_rank: r, pid: 200 + r }
}

fn all_signals(effects: &[Effect]) -> Vec<(u32, Signal)> {
    let sent = effects.iter().filter_map(|e| match e {
        Effect::Signal { pid, signal, .. } | Effect::SignalLauncher { pid, signal } => Some((*pid, *signal)),
        _ => None,
    });
    sent.collect()
}

#[test]
fn a_launched_rank_keeps_the_run_alive_until_it_is_found_and_has_exited() {
    let mut a = launched(2);
    assert!(a.owner.alive().is_empty(), "the sampler watches no pid before a rank is found");
    assert!(run_ended(&a.step(Input::Heartbeat)).is_none(), "pending ranks are not gone ranks");
    a.step(found(0));
    assert_eq!(a.owner.alive(), vec![(Rank(0), 200)]);
    a.step(Input::Exited { rank: Rank(0), pid: 200, status: OK, last_error: None });
    assert!(run_ended(&a.step(Input::Heartbeat)).is_none(), "rank 1 is still pending");
    let e = a.step(Input::Exited { rank: Rank(1), pid: TORCHRUN, status: OK, last_error: None });
    assert_eq!(run_ended(&e), Some((RunOutcome::Succeeded, "all 2 ranks finished".into())));
}

#[test]
fn a_kill_reaches_the_found_ranks_torchrun_and_a_rank_found_after_it() {
    let mut a = launched(2);
    a.step(found(0));
    let e = a.step(Input::Kill);
    assert_eq!(all_signals(&e), vec![(200, Signal::Kill), (TORCHRUN, Signal::Kill)]);
    assert_eq!(all_signals(&a.step(found(1))), vec![(201, Signal::Kill)], "found late, killed at once");
    a.step(Input::Exited { rank: Rank(1), pid: 201, status: SIGKILLED, last_error: None });
    let e = a.step(Input::Exited { rank: Rank(0), pid: 200, status: SIGKILLED, last_error: None });
    assert_eq!(run_ended(&e).map(|(o, _)| o), Some(RunOutcome::Killed));
    let (timer, ..) = (Timer::Escalate, ());
    let e = a.step(Input::Timer(timer));
    assert!(all_signals(&e).is_empty(), "torchrun's pid is forgotten once its ranks are gone: {e:?}");
}

#[test]
fn a_stop_terminates_torchrun_too_and_never_sends_it_the_workers_save_signal() {
    let mut a = launched(1);
    a.step(found(0));
    let e = a.step(Input::Stop);
    assert_eq!(all_signals(&e), vec![(200, Signal::Terminate), (TORCHRUN, Signal::Terminate)]);
    let mut saving = Agent::running(1, true);
    saving.step(Input::Launched { pid: TORCHRUN, ranks: Vec::new() });
    let e = saving.step(Input::Stop);
    assert_eq!(all_signals(&e), vec![(pid(0), Signal::Save)]);
}

/// A rank's printed HF dict, as the adapters read it: no step.
fn printed(r: u32, line: u64, loss: f64) -> AgentEvent {
    let mut record = crate::adapters::Record::at(line, RecordKind::Step);
    record.metrics.push(("loss".into(), loss));
    AgentEvent::LogRecord { rank: Rank(r), record }
}

fn trainer_log(r: u32, step: u64, loss: f64) -> AgentEvent {
    let logged: writers::Logged = serde_json::from_value(serde_json::json!({
        "writer": "hf_trainer", "step": step, "metrics": [["loss", loss]]
    }))
    .expect("a Logged");
    AgentEvent::LogRecord { rank: Rank(r), record: writers::record(1, logged) }
}

#[test]
fn once_a_rank_reports_trainer_log_its_printed_dicts_are_not_sent_again_but_other_ranks_and_lines_are() {
    let mut a = Agent::running(2, false);
    let sent = |effects: Vec<Effect>| {
        effects.iter().filter(|e| matches!(e, Effect::Send(AgentEvent::LogRecord { .. }))).count()
    };
    // Before the shim's first report the printed dict is all there is.
    assert_eq!(sent(a.step(Input::Event(printed(0, 1, 0.9)))), 1);
    assert_eq!(sent(a.step(Input::Event(trainer_log(0, 1, 0.9)))), 1);
    assert_eq!(sent(a.step(Input::Event(printed(0, 2, 0.8)))), 0, "rank 0's printed copy of Trainer.log");
    assert_eq!(sent(a.step(Input::Event(trainer_log(0, 2, 0.8)))), 1);
    // A line that prints its own step, and a failure, are not Trainer dicts.
    let mut stepped = crate::adapters::Record::at(3, RecordKind::Step);
    stepped.step = Some(3);
    assert_eq!(sent(a.step(Input::Event(AgentEvent::LogRecord { rank: Rank(0), record: stepped }))), 1);
    let failure = crate::adapters::Record::at(4, RecordKind::Event);
    assert_eq!(sent(a.step(Input::Event(AgentEvent::LogRecord { rank: Rank(0), record: failure }))), 1);
    // Rank 1's shim never reported: its dicts go on.
    assert_eq!(sent(a.step(Input::Event(printed(1, 1, 0.9)))), 1);
}

#[test]
fn the_shims_announcement_of_a_wrapped_trainer_is_not_sent_and_drops_even_the_first_printed_dict() {
    let mut a = Agent::running(1, false);
    let sent = |effects: Vec<Effect>| {
        effects.iter().filter(|e| matches!(e, Effect::Send(AgentEvent::LogRecord { .. }))).count()
    };
    let logged: writers::Logged =
        serde_json::from_value(serde_json::json!({"writer": "hf_trainer", "metrics": []})).expect("a Logged");
    let announcement = AgentEvent::LogRecord { rank: Rank(0), record: writers::record(1, logged) };
    assert_eq!(sent(a.step(Input::Event(announcement))), 0, "an announcement has no values to keep");
    assert_eq!(sent(a.step(Input::Event(printed(0, 1, 0.9)))), 0, "the first printed dict is a copy too");
    assert_eq!(sent(a.step(Input::Event(trainer_log(0, 1, 0.9)))), 1);
}
