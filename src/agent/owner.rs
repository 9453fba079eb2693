//! The agent's owner: when a run ends, how it ends, and which rank gets which signal — a pure step function.
//!
//! `Owner::step` takes one `Input` and the time, and returns the `Effect`s for the I/O loop in
//! `agent/mod.rs` to carry out; it never signals, sleeps or writes itself, so every rule of
//! stop, kill and run end is unit-tested (`owner_tests.rs`) without a process or a socket.
use super::AgentSpec;
use crate::adapters::writers::{self, Writer};
use crate::adapters::{Record, RecordKind};
use crate::ids::Rank;
use crate::protocol::{AgentEvent, ExitStatus, RankMsg, RunOutcome};
use crate::recipe::Kind;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use tokio::time::Instant;

/// How long an ended run's agent waits for a server to collect its last frames.
pub const LINGER: Duration = Duration::from_secs(600);

/// Everything the owner reacts to: what the agent's tasks send on its channel, and what the
/// I/O loop itself notices (a started rank, a heartbeat tick, a timer, the last ack).
#[derive(Debug)]
pub(crate) enum Input {
    /// The agent started this rank (before `ready`).
    Started {
        rank: Rank,
        local_rank: u32,
        pid: u32,
    },
    /// A launcher (torchrun) was started that will start these ranks; each is `Started` when
    /// found among its children. Until then the launcher stands in for them.
    Launched {
        pid: u32,
        ranks: Vec<Rank>,
    },
    Event(AgentEvent),
    /// Sent once the rank's output is drained, so `last_error` is its last word.
    Exited {
        rank: Rank,
        pid: u32,
        status: ExitStatus,
        last_error: Option<String>,
    },
    Stop,
    Kill,
    /// A rank's telemetry connection reached its end: everything it sent has been forwarded.
    TelemetryClosed {
        rank: Rank,
    },
    /// Read the stacks of the live ranks (or one); answered with `AgentEvent::StackDump`.
    DumpStacks {
        request: u64,
        rank: Option<Rank>,
        native: bool,
    },
    /// Time for a heartbeat frame.
    Heartbeat,
    /// A timer armed by `Effect::Arm` came due.
    Timer(Timer),
    /// The server has acknowledged every frame in the outbox.
    AllAcked,
}

/// The owner's timers; each is armed at most once per run (see `Owner::step`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// The grace period after SIGTERM ran out: SIGKILL whatever still lives.
    Escalate,
    /// A graceful stop's grace period ran out: fall back to SIGTERM.
    SaveOverdue,
    /// No server collected the ended run's last frames in time.
    Linger,
}

/// The signals the owner sends, each to a rank's whole process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGUSR1: stop at the next step boundary and save a checkpoint.
    Save,
    /// SIGTERM.
    Terminate,
    /// SIGKILL.
    Kill,
}

/// Why the agent exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The run ended and the server acknowledged every frame.
    Collected,
    /// The run ended and no server collected its last frames within `LINGER`.
    Unclaimed,
}

/// What the I/O loop does for the owner, in order.
#[derive(Debug, PartialEq)]
pub(crate) enum Effect {
    /// Sequence the event into the outbox and wake the link.
    Send(AgentEvent),
    Signal {
        rank: Rank,
        pid: u32,
        signal: Signal,
    },
    /// The same signal to the node's launcher (torchrun), which passes it on to ranks it has
    /// started and not yet been seen to start.
    SignalLauncher {
        pid: u32,
        signal: Signal,
    },
    /// Feed `Input::Timer(timer)` back at `at`.
    Arm {
        timer: Timer,
        at: Instant,
    },
    /// Dump these ranks' stacks and send the answer back as an `Input::Event(StackDump)`.
    DumpStacks {
        request: u64,
        targets: Vec<(Rank, u32)>,
        native: bool,
    },
    Exit(Exit),
}

/// What the owner needs from the spec.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub node: String,
    /// How many ranks this node runs (for "all N ranks finished").
    pub ranks: usize,
    /// The worker's ranks stop at a step boundary and save on SIGUSR1; other kinds get SIGTERM.
    pub graceful_stop: bool,
    /// SIGTERM, then SIGKILL after this long.
    pub stop_grace: Duration,
    /// A graceful stop may take this long before the ranks get SIGTERM.
    pub save_grace: Duration,
}

impl Config {
    pub fn from_spec(spec: &AgentSpec) -> Config {
        Config {
            node: spec.node.clone(),
            ranks: spec.ranks.len(),
            graceful_stop: spec.recipe.kind == Kind::Pretrain,
            stop_grace: Duration::from_millis(spec.stop_grace_ms),
            save_grace: Duration::from_millis(spec.save_grace_ms),
        }
    }
}

/// Where the run is on its way to `RunEnded`.
#[derive(Debug)]
enum Phase {
    Running,
    /// A graceful stop: the ranks were asked to save, and may exit 0 with steps to spare.
    Saving,
    /// The run will end this way once every rank is gone (failed, stopped by SIGTERM, killed).
    Ending(RunOutcome, String),
    /// `RunEnded` is in the outbox; the agent waits for its acknowledgement.
    Ended,
}

pub(crate) struct Owner {
    config: Config,
    phase: Phase,
    alive: BTreeMap<Rank, u32>,
    /// Ranks a launcher is starting, not yet found: the run waits for them as for live ones.
    pending: BTreeSet<Rank>,
    /// The node's torchrun while any of its ranks is pending or alive.
    launcher: Option<u32>,
    /// Ranks that said hello on the telemetry socket: their SIGUSR1 handler is installed.
    registered: BTreeSet<Rank>,
    /// Ranks whose telemetry connection is still open: the run ends only once these drain too,
    /// so the last step of every rank is in the history.
    telemetry_open: BTreeSet<Rank>,
    /// The most steps any rank reported finishing: where a graceful stop ended.
    finished_steps: Option<u64>,
    /// Ranks whose shim reported a `Trainer.log` call: the dicts they print are copies of those
    /// calls (rounded, without the step), so only the writer's records go upstream.
    trainer_logs: BTreeSet<Rank>,
}

impl Owner {
    pub fn new(config: Config) -> Owner {
        Owner {
            config,
            phase: Phase::Running,
            alive: BTreeMap::new(),
            pending: BTreeSet::new(),
            launcher: None,
            registered: BTreeSet::new(),
            telemetry_open: BTreeSet::new(),
            finished_steps: None,
            trainer_logs: BTreeSet::new(),
        }
    }

    /// `RunEnded` has been sent: no more heartbeats, and the last ack ends the agent.
    pub fn ended(&self) -> bool {
        matches!(self.phase, Phase::Ended)
    }

    /// The live ranks and their pids, in rank order (what the sampler watches).
    pub fn alive(&self) -> Vec<(Rank, u32)> {
        self.alive.iter().map(|(r, p)| (*r, *p)).collect()
    }

    pub fn step(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::Launched { pid, ranks } => {
                self.launcher = Some(pid);
                self.pending.extend(ranks);
            }
            Input::Started { rank, local_rank, pid } => {
                self.pending.remove(&rank);
                self.alive.insert(rank, pid);
                out.push(Effect::Send(AgentEvent::RankStarted {
                    rank,
                    local_rank,
                    pid,
                    host: self.config.node.clone(),
                }));
                // Found after the run began to end: it gets what the others got.
                let late = match self.phase {
                    Phase::Ending(RunOutcome::Killed, _) => Some(Signal::Kill),
                    Phase::Ending(..) => Some(Signal::Terminate),
                    Phase::Running | Phase::Saving | Phase::Ended => None,
                };
                out.extend(late.map(|signal| Effect::Signal { rank, pid, signal }));
            }
            // After `RunEnded` the run's history is closed: the server acknowledges nothing past
            // it, so a late frame (a sample taken just before the last exit) would keep the
            // agent waiting for an ack that never comes.
            Input::Event(_) if self.ended() => {}
            Input::Event(event) => {
                let mut keep = true;
                match &event {
                    AgentEvent::Rank { rank, msg: RankMsg::Register { .. } } => {
                        self.telemetry_open.insert(*rank);
                        self.registered.insert(*rank);
                        // A stop that came before this rank could catch SIGUSR1: deliver it now.
                        if let (Phase::Saving, Some(&pid)) = (&self.phase, self.alive.get(rank)) {
                            out.push(Effect::Signal { rank: *rank, pid, signal: Signal::Save });
                        }
                    }
                    AgentEvent::Rank { msg: RankMsg::Finished { steps, .. }, .. } => {
                        self.finished_steps = self.finished_steps.max(Some(*steps));
                    }
                    AgentEvent::LogRecord { rank, record } => match writers::writer_of(record) {
                        Some(Writer::HfTrainer) => {
                            // An empty one is the shim's announcement that the Trainer is wrapped.
                            self.trainer_logs.insert(*rank);
                            keep = !record.metrics.is_empty();
                        }
                        Some(Writer::Tensorboard | Writer::Wandb) => {}
                        None => keep = !(self.trainer_logs.contains(rank) && printed_trainer_dict(record)),
                    },
                    _ => {}
                }
                if keep {
                    out.push(Effect::Send(event));
                }
            }
            Input::TelemetryClosed { rank } => {
                self.telemetry_open.remove(&rank);
            }
            Input::Exited { rank, pid, status, last_error } => {
                self.alive.remove(&rank);
                self.pending.remove(&rank);
                if self.alive.is_empty() && self.pending.is_empty() {
                    // Its ranks are reported gone only once it has exited: its pid may be reused.
                    self.launcher = None;
                }
                // The first failure decides the outcome, even over a graceful stop (a rank that
                // fails while saving has no checkpoint to show for it).
                let during = match self.phase {
                    Phase::Running => Some(""),
                    Phase::Saving => Some(" while stopping gracefully"),
                    Phase::Ending(..) | Phase::Ended => None,
                };
                if let (false, Some(during)) = (status.success(), during) {
                    let said = last_error.as_ref().map(|e| format!(": {e}")).unwrap_or_default();
                    let reason = format!(
                        "rank {rank} ({}, pid {pid}) ended with {}{during}{said}",
                        self.config.node,
                        status.describe()
                    );
                    self.terminate(RunOutcome::Failed, reason, now, &mut out);
                }
                out.push(Effect::Send(AgentEvent::RankExited { rank, pid, status, last_error }));
            }
            Input::Stop => match self.phase {
                Phase::Running if self.config.graceful_stop => {
                    // The worker's ranks agree on a step boundary, save a checkpoint and exit 0.
                    self.phase = Phase::Saving;
                    // Only to ranks past start-up: SIGUSR1 would kill one still loading (its
                    // default action); the others get it when they register.
                    let registered = &self.registered;
                    self.signal_all(Signal::Save, |rank| registered.contains(&rank), &mut out);
                    out.push(Effect::Arm { timer: Timer::SaveOverdue, at: now + self.config.save_grace });
                }
                Phase::Running => self.terminate(RunOutcome::Stopped, "stopped on request".into(), now, &mut out),
                // Already on its way out: a second stop changes nothing.
                Phase::Saving | Phase::Ending(..) | Phase::Ended => {}
            },
            Input::Timer(Timer::SaveOverdue) => {
                if matches!(self.phase, Phase::Saving) && !self.alive.is_empty() {
                    let reason = format!(
                        "stopped on request; the ranks did not reach a step boundary and save within {} s, so they \
                         were terminated (no checkpoint from the stop)",
                        self.config.save_grace.as_secs()
                    );
                    self.terminate(RunOutcome::Stopped, reason, now, &mut out);
                }
            }
            Input::Kill => {
                // A kill overrides a stop, never a failure (the failure is what the run ended of).
                match self.phase {
                    Phase::Running | Phase::Saving | Phase::Ending(RunOutcome::Stopped, _) => {
                        self.phase = Phase::Ending(RunOutcome::Killed, "killed on request".into());
                    }
                    Phase::Ending(..) | Phase::Ended => {}
                }
                self.signal_all(Signal::Kill, |_| true, &mut out);
            }
            Input::Timer(Timer::Escalate) => self.signal_all(Signal::Kill, |_| true, &mut out),
            Input::DumpStacks { request, rank, native } => {
                let targets = self.alive.iter().filter(|(r, _)| rank.is_none_or(|want| want == **r));
                out.push(Effect::DumpStacks { request, targets: targets.map(|(r, p)| (*r, *p)).collect(), native });
            }
            Input::Heartbeat if !self.ended() => out.push(Effect::Send(AgentEvent::Heartbeat)),
            Input::Heartbeat => {}
            Input::Timer(Timer::Linger) => out.push(Effect::Exit(Exit::Unclaimed)),
            Input::AllAcked if self.ended() => out.push(Effect::Exit(Exit::Collected)),
            Input::AllAcked => {}
        }
        if self.alive.is_empty() && self.pending.is_empty() && self.telemetry_open.is_empty() && !self.ended() {
            let (outcome, reason) = self.outcome();
            out.push(Effect::Send(AgentEvent::RunEnded { outcome, reason }));
            self.phase = Phase::Ended;
            out.push(Effect::Arm { timer: Timer::Linger, at: now + LINGER });
        }
        out
    }

    /// Decides the outcome, SIGTERMs every live rank and arms the SIGKILL that follows.
    fn terminate(&mut self, outcome: RunOutcome, reason: String, now: Instant, out: &mut Vec<Effect>) {
        self.phase = Phase::Ending(outcome, reason);
        self.signal_all(Signal::Terminate, |_| true, out);
        out.push(Effect::Arm { timer: Timer::Escalate, at: now + self.config.stop_grace });
    }

    fn signal_all(&self, signal: Signal, to: impl Fn(Rank) -> bool, out: &mut Vec<Effect>) {
        for (&rank, &pid) in self.alive.iter().filter(|(r, _)| to(**r)) {
            out.push(Effect::Signal { rank, pid, signal });
        }
        // torchrun stops the ranks it started on SIGTERM itself; SIGUSR1 is for the worker.
        if let (Some(pid), false) = (self.launcher, signal == Signal::Save) {
            out.push(Effect::SignalLauncher { pid, signal });
        }
    }

    /// How the run ended, once every rank is gone.
    fn outcome(&self) -> (RunOutcome, String) {
        match &self.phase {
            Phase::Running | Phase::Ended => {
                (RunOutcome::Succeeded, format!("all {} ranks finished", self.config.ranks))
            }
            Phase::Saving => match self.finished_steps {
                Some(step) => (RunOutcome::Stopped, format!("stopped on request after step {step}, checkpoint saved")),
                None => (RunOutcome::Stopped, "stopped on request at a step boundary, checkpoint saved".into()),
            },
            Phase::Ending(outcome, reason) => (*outcome, reason.clone()),
        }
    }
}

/// A printed line that is what `Trainer.log` prints: a dict without a step (HF's printed dicts
/// never carry one), as a step, an eval or the final summary.
fn printed_trainer_dict(record: &Record) -> bool {
    record.step.is_none() && matches!(record.kind, RecordKind::Step | RecordKind::Eval | RecordKind::TrainSummary)
}

#[cfg(test)]
#[path = "owner_tests.rs"]
mod tests;
