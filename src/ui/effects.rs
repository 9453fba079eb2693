//! Every outside effect of the cockpit passes through `Effects`: the clock it reads and the
//! requests it makes of the server. Live, a server task carries the requests out; in tests they
//! are only recorded, and the clock stands still, so every frame can be snapshot.
use crate::ids::RunId;
use crate::protocol::{AgentFrame, RunSnapshot, StackReport, Verdict};
use crate::store::{RunRecord, RunStatus};
use std::path::PathBuf;

#[derive(Clone, Copy, Debug)]
pub enum Clock {
    System,
    /// A fixed instant (Unix ms), for tests and benchmarks that drive time themselves.
    Fixed(u64),
}

/// What the cockpit asks of the outside world.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    ListRuns,
    /// Stream a run: its snapshot, then live frames (replaces any open stream).
    Open {
        run: String,
    },
    /// Stop streaming the open run (the run itself goes on).
    Close,
    Launch {
        recipe: PathBuf,
        overrides: Vec<String>,
    },
    Kill {
        run: RunId,
    },
    ListRecipes,
    /// Mean loss per step of each run, for the compare screen.
    LoadCompare {
        runs: Vec<RunId>,
    },
    /// A sweep and its points' states, for the compare screen opened on a sweep.
    LoadSweep {
        id: String,
    },
    /// A run's checkpoints, checked on disk (sizes; every byte's sha256 when `verify`).
    LoadCheckpoints {
        run: RunId,
        verify: bool,
    },
    /// A child of `run` from its checkpoint at `step` (None: the newest that verifies);
    /// `kill_first`: the run is live, kill it and wait for its end before resuming.
    Resume {
        run: RunId,
        step: Option<u64>,
        kill_first: bool,
    },
    /// Graceful stop: every rank checkpoints, then exits.
    Stop {
        run: RunId,
    },
    /// The parent's mean loss up to `step`, drawn before a resumed run's own.
    LoadParentLoss {
        child: RunId,
        parent: RunId,
        step: u64,
    },
    /// The run's newest incident report (path and markdown), from its stored verdicts.
    LoadIncident {
        run: RunId,
    },
    /// Export `run` into `out` (relative: the cockpit's working directory).
    Export {
        run: RunId,
        format: crate::export::Format,
        out: PathBuf,
    },
    /// Write `run`'s report with its charts into `out`.
    Report {
        run: RunId,
        out: PathBuf,
    },
    /// Dump the live ranks' stacks (one rank, or all), grouped; takes seconds.
    Stacks {
        run: RunId,
        rank: Option<u32>,
        native: bool,
    },
}

/// A recipe the picker offers: its path, and whether it wants CUDA on a machine without it.
#[derive(Clone, Debug, PartialEq)]
pub struct RecipeChoice {
    pub path: String,
    pub no_gpu_here: bool,
}

/// The recipe the picker starts on when it is listed (the README's and `make demo`'s).
pub const DEFAULT_RECIPE: &str = "recipes/tiny-gpt.toml";

/// What comes back, as events for the UI task.
#[derive(Clone, Debug)]
pub enum DataEvent {
    Runs(Vec<RunRecord>),
    Snapshot(Box<RunSnapshot>),
    /// Live frames of one node of the run (each node numbers its own frames).
    Frames {
        run: RunId,
        node: u32,
        frames: Vec<AgentFrame>,
    },
    /// The stream fell behind the run and dropped batches: the app reopens it.
    Lagged {
        run: RunId,
        skipped: u64,
    },
    Ended {
        run: RunId,
        status: RunStatus,
        reason: String,
    },
    /// Recovery started `child` in `run`'s place (from `run`'s progress stream): the cockpit
    /// goes on with the child, as `run --headless` does.
    Restarted {
        run: RunId,
        child: RunId,
        restart: crate::record::Restart,
    },
    Launched(RunId),
    Recipes(Vec<RecipeChoice>),
    CompareSeries {
        run: RunId,
        points: Vec<(u64, f64)>,
    },
    Sweep(Box<crate::record::SweepStatus>),
    /// A compared run's lineage goodput (productive ÷ wall), once it has ended.
    CompareGoodput {
        run: RunId,
        ratio: Option<f64>,
    },
    Checkpoints(Box<crate::ui::panels::ckpts::CkptList>),
    CheckpointsFailed {
        run: RunId,
        message: String,
    },
    Resumed(Box<crate::ui::panels::ckpts::Resumed>),
    /// The server refused a resume: its message.
    ResumeFailed(String),
    ParentLoss {
        child: RunId,
        loss: crate::ui::panels::chart::ParentLoss,
    },
    /// The verdicts that hold now for the open run, and the incident reports written so far
    /// (from its progress stream).
    Verdicts {
        run: RunId,
        verdicts: Vec<Verdict>,
        incidents: Vec<String>,
    },
    /// The newest incident report of `run` (its path, None if kept only in the history, and
    /// its markdown), or why there is none.
    Incident {
        run: RunId,
        result: Result<(Option<String>, String), String>,
    },
    /// A stack dump's answer, or why there is none (run not live, agent gone).
    Stacks {
        run: RunId,
        rank: Option<u32>,
        result: Result<Box<StackReport>, String>,
    },
    /// The server refused to open `run` (no such run, an ambiguous prefix): nothing to show.
    OpenFailed {
        run: String,
        message: String,
    },
    /// Something done, to say in the status line.
    Done(String),
    Error(String),
}

#[derive(Debug)]
pub struct Effects {
    pub clock: Clock,
    outbox: Vec<Command>,
}

impl Effects {
    pub fn live() -> Effects {
        Effects { clock: Clock::System, outbox: Vec::new() }
    }

    pub fn fixed(now_ms: u64) -> Effects {
        Effects { clock: Clock::Fixed(now_ms), outbox: Vec::new() }
    }

    pub fn now_ms(&self) -> u64 {
        match self.clock {
            Clock::System => crate::ids::unix_ms(),
            Clock::Fixed(t) => t,
        }
    }

    pub fn send(&mut self, c: Command) {
        self.outbox.push(c);
    }

    /// The commands issued since the last call (the runtime hands them to the server task).
    pub fn take(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.outbox)
    }

    pub fn pending(&self) -> &[Command] {
        &self.outbox
    }
}
