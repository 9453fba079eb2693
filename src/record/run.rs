//! A run's records: its status, its row in the history, its ranks, events and verdicts.
use crate::ids::RunId;
use serde::{Deserialize, Serialize};

/// A run's lifecycle. `Hung`: live, with a hang verdict holding (it goes back to `Running` when
/// progress resumes). `Interrupted`: its agents could not be reached after a server restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Starting,
    Running,
    Hung,
    Succeeded,
    Failed,
    Stopped,
    Killed,
    Interrupted,
}

impl RunStatus {
    pub fn is_live(self) -> bool {
        matches!(self, RunStatus::Starting | RunStatus::Running | RunStatus::Hung)
    }

    /// A live run's status under the analysis: hung while a hang verdict holds, running again
    /// once none does; any other status stays.
    pub fn with_hang(self, hung: bool) -> RunStatus {
        match (self, hung) {
            (RunStatus::Running, true) => RunStatus::Hung,
            (RunStatus::Hung, false) => RunStatus::Running,
            (s, _) => s,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Starting => "starting",
            RunStatus::Running => "running",
            RunStatus::Hung => "hung",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Stopped => "stopped",
            RunStatus::Killed => "killed",
            RunStatus::Interrupted => "interrupted",
        }
    }
}

/// One row of the `runs` tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: RunId,
    pub name: String,
    pub recipe_name: String,
    pub recipe_path: String,
    /// The validated recipe, as JSON.
    pub recipe_json: String,
    pub status: RunStatus,
    pub reason: String,
    pub created_ms: u64,
    pub ended_ms: Option<u64>,
    pub hosts: Vec<String>,
    pub world_size: u32,
    pub steps_planned: u64,
    /// The highest step every rank has reported.
    pub step: u64,
    pub last_loss: Option<f64>,
    pub parent: Option<RunId>,
    /// Where the agent of each node listens, for reattaching.
    pub agent_sockets: Vec<String>,
    /// The last agent frame made durable, per node (same order as `hosts`).
    pub acked_seq: Vec<u64>,
    /// For a resumed run: the checkpoint of `parent` it started from.
    #[serde(default)]
    pub resumed_from: Option<ResumePoint>,
    /// For a run with `[init] from`: the checkpoint whose weights it started from (`parent` is
    /// that checkpoint's run, when it is one of the history's).
    #[serde(default)]
    pub init_from: Option<InitPoint>,
    /// For a run recovery started: which restart of its lineage, and why its parent ended.
    #[serde(default)]
    pub restart: Option<Restart>,
    /// For a run of a sweep: which point of which sweep (a recovery child keeps its parent's).
    #[serde(default)]
    pub sweep: Option<super::sweep::SweepPoint>,
}

/// A restart by recovery (`[recovery]`): the attempt's number in its lineage (1 = the first
/// restart) and the cause that ended its parent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Restart {
    pub attempt: u32,
    pub cause: Cause,
}

/// Why a run of a lineage ended early, as recovery counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// A rank exited with an error (or a signal).
    Crash,
    /// A hang verdict: no progress on some rank; the server killed the run.
    Hang,
    /// A node's agent was lost.
    NodeLost,
    /// The allocation's time limit came (Slurm's warning): the run stopped with a checkpoint
    /// and continues in a new allocation.
    TimeLimit,
    /// The averaged gradients were not finite (`recovery.on_nan`): the ranks exited with
    /// `NON_FINITE_EXIT` without applying the step.
    Nan,
    /// Checkpoint saves kept failing (a `checkpoint-failing` verdict): the server stopped the
    /// run while its last good checkpoint was recent.
    Checkpoint,
}

/// The exit code of a rank that stopped on a non-finite gradient norm (`recovery.on_nan`).
pub const NON_FINITE_EXIT: i32 = 86;

impl Cause {
    pub fn name(self) -> &'static str {
        match self {
            Cause::Crash => "crash",
            Cause::Hang => "hang",
            Cause::NodeLost => "node_lost",
            Cause::TimeLimit => "time_limit",
            Cause::Nan => "nan",
            Cause::Checkpoint => "checkpoint",
        }
    }
}

/// The checkpoint a run's starting weights came from (`[init] from`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InitPoint {
    pub run: Option<RunId>,
    pub step: u64,
    pub path: String,
}

/// What a launch knows of a run before anything starts.
#[derive(Clone, Debug, PartialEq)]
pub struct RunMeta {
    pub name: String,
    pub recipe_name: String,
    pub recipe_path: String,
    /// The validated recipe, as JSON.
    pub recipe_json: String,
    pub world_size: u32,
    pub steps_planned: u64,
}

/// A resumed run's parent and the checkpoint of it that the run starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct Lineage {
    pub parent: RunId,
    pub from: ResumePoint,
    /// Set when recovery, not a person, resumed the parent.
    pub restart: Option<Restart>,
}

impl RunRecord {
    /// A local one-rank run record for unit tests: `id`, `name`, `status`, created at `created_ms`.
    #[cfg(test)]
    pub fn for_test(id: &str, name: &str, status: RunStatus, created_ms: u64) -> RunRecord {
        let meta = RunMeta {
            name: name.into(),
            recipe_name: "r".into(),
            recipe_path: "r.toml".into(),
            recipe_json: "{}".into(),
            world_size: 1,
            steps_planned: 1,
        };
        let mut r = RunRecord::starting(RunId(id.into()), meta, vec!["local".into()], vec![], None);
        r.status = status;
        r.created_ms = created_ms;
        r
    }

    /// The record of a run that is starting: the one constructor (launches, resumes, benches
    /// and tests all build a run here). `hosts` and `agent_sockets` have one entry per node.
    pub fn starting(
        id: RunId,
        meta: RunMeta,
        hosts: Vec<String>,
        agent_sockets: Vec<String>,
        lineage: Option<Lineage>,
    ) -> RunRecord {
        let (parent, resumed_from, restart) =
            lineage.map_or((None, None, None), |l| (Some(l.parent), Some(l.from), l.restart));
        RunRecord {
            id,
            name: meta.name,
            recipe_name: meta.recipe_name,
            recipe_path: meta.recipe_path,
            recipe_json: meta.recipe_json,
            status: RunStatus::Starting,
            reason: String::new(),
            created_ms: crate::ids::unix_ms(),
            ended_ms: None,
            acked_seq: vec![0; hosts.len()],
            hosts,
            world_size: meta.world_size,
            steps_planned: meta.steps_planned,
            step: 0,
            last_loss: None,
            parent,
            agent_sockets,
            resumed_from,
            init_from: None,
            restart,
            sweep: None,
        }
    }
}

/// Where a resumed run took over from its parent: it trains `step + 1` onwards.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResumePoint {
    pub step: u64,
    /// The parent's checkpoint directory for that step.
    pub path: String,
}

/// One series point.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub step: u64,
    pub rank: u32,
    pub value: f64,
}

/// What is known about one rank of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: u32,
    pub host: String,
    pub pid: Option<u32>,
    pub exit: Option<super::ExitStatus>,
    pub step: u64,
    pub phase: Option<super::Phase>,
    pub last_loss: Option<f64>,
    pub cpu_pct: Option<f64>,
    pub rss_bytes: Option<u64>,
    /// Its rank on its node, as its agent numbered it (torchrun's LOCAL_RANK).
    #[serde(default)]
    pub local_rank: Option<u32>,
    /// Its latest step's time.
    #[serde(default)]
    pub step_time_ms: Option<f64>,
    /// When it was last heard from (agent clock).
    #[serde(default)]
    pub last_seen_ms: Option<u64>,
}

impl RankInfo {
    /// A rank nothing is known of yet.
    pub fn new(rank: u32) -> RankInfo {
        RankInfo {
            rank,
            host: String::new(),
            pid: None,
            exit: None,
            step: 0,
            phase: None,
            last_loss: None,
            cpu_pct: None,
            rss_bytes: None,
            local_rank: None,
            step_time_ms: None,
            last_seen_ms: None,
        }
    }

    /// Started and not yet exited.
    pub fn is_alive(&self) -> bool {
        self.pid.is_some() && self.exit.is_none()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    RunStarted,
    RankStarted,
    RankExited,
    RunEnded,
    Notice,
    BadFrame,
    NanLoss,
    CheckpointSaved,
    CheckpointFailed,
    /// The analysis gave a verdict (hang or straggler); the `verdicts` tree has it in full.
    Verdict,
    /// An incident report was written; the text names its file.
    Incident,
    /// A rank's output showed a failure (torchrun's ChildFailedError, an NCCL timeout, an OOM).
    Failure,
    /// A connection to one of the run's TCP ports failed the handshake on the run's secret.
    Refused,
}

impl EventKind {
    /// The kind as `--json` and exports write it (serde's snake_case).
    pub fn name(self) -> &'static str {
        match self {
            EventKind::RunStarted => "run_started",
            EventKind::RankStarted => "rank_started",
            EventKind::RankExited => "rank_exited",
            EventKind::RunEnded => "run_ended",
            EventKind::Notice => "notice",
            EventKind::BadFrame => "bad_frame",
            EventKind::NanLoss => "nan_loss",
            EventKind::CheckpointSaved => "checkpoint_saved",
            EventKind::CheckpointFailed => "checkpoint_failed",
            EventKind::Verdict => "verdict",
            EventKind::Incident => "incident",
            EventKind::Failure => "failure",
            EventKind::Refused => "refused",
        }
    }
}

/// One row of the `events` tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub t_ms: u64,
    pub kind: EventKind,
    pub rank: Option<u32>,
    pub text: String,
}

/// Everything `show` prints about one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunDetail {
    pub run: RunRecord,
    pub ranks: Vec<RankInfo>,
    pub events: Vec<EventRecord>,
    /// Metric names with at least one point.
    pub metrics: Vec<String>,
    pub summary: Summary,
    /// Every verdict the analysis gave, oldest first, with its incident report if it has one.
    #[serde(default)]
    pub verdicts: Vec<VerdictRecord>,
    /// The lineage through recovery's restarts that ends at this run, oldest first (empty when
    /// recovery never restarted it).
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    /// Where the lineage's wall time went (`crate::goodput`), once it has ended.
    #[serde(default)]
    pub goodput: Option<Goodput>,
}

/// One run of a lineage recovery restarted, as `show` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub run: RunId,
    pub status: RunStatus,
    pub reason: String,
    /// The highest step every rank reached.
    pub step: u64,
    /// The checkpoint step it started from (None for the first).
    pub resumed_from: Option<u64>,
    /// Why it was started (None for the first).
    pub restart: Option<Restart>,
}

/// A lineage's wall time split; the parts add up to `wall_ms`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Goodput {
    pub wall_ms: f64,
    pub productive_ms: f64,
    pub failed_ms: f64,
    pub checkpoint_ms: f64,
    pub stalled_ms: f64,
    pub restart_wait_ms: f64,
    pub other_ms: f64,
    /// productive ÷ wall.
    pub ratio: f64,
}

/// One row of the `verdicts` tree (key: run, detected ms, index): a verdict as given, or as
/// sharpened later (stacks single out a culprit), and its incident report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VerdictRecord {
    pub verdict: super::Verdict,
    /// The markdown report's file (in the run's directory), for hangs.
    pub report_path: Option<String>,
    /// The report itself, so the history keeps it if the run directory is removed.
    pub report_md: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub steps_done: u64,
    /// Mean over ranks and the first (last) ten steps.
    pub loss_first10_mean: Option<f64>,
    pub loss_last10_mean: Option<f64>,
    pub step_time_ms_median: Option<f64>,
    pub tokens_per_s: Option<f64>,
}

/// One rollup bucket of a series: min, max, sum and count of its points, and the last one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub min: f64,
    pub max: f64,
    pub sum: f64,
    pub count: u64,
    pub last_step: u64,
    pub last: f64,
}
