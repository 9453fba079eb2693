//! Every message that crosses a socket: rank → agent, agent ↔ server, client ↔ server.
use crate::ids::{Rank, RunId, Step};
use serde::{Deserialize, Serialize};

/// Bumped on any change to these types; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// The first frame on every connection, in both directions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    /// The sender's host name (`local` for the embedded runtime's agent).
    pub node: String,
    /// The sender's `flightdeck` version.
    pub agent_version: String,
    pub role: Role,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Rank,
    Agent,
    Server,
    Client,
}

impl Hello {
    pub fn new(role: Role, node: &str) -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            node: node.to_string(),
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            role,
        }
    }
}

/// What a rank is doing right now. Reported on every change, so a hung rank's last phase is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Init,
    Data,
    Fwd,
    Bwd,
    Comm,
    Opt,
    Ckpt,
    Eval,
    Done,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Init => "init",
            Phase::Data => "data",
            Phase::Fwd => "fwd",
            Phase::Bwd => "bwd",
            Phase::Comm => "comm",
            Phase::Opt => "opt",
            Phase::Ckpt => "ckpt",
            Phase::Eval => "eval",
            Phase::Done => "done",
        }
    }
}

/// One optimizer step's telemetry from one rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    pub step: Step,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens: u64,
    pub step_time_ms: f64,
    pub data_ms: f64,
    pub fwd_ms: f64,
    pub bwd_ms: f64,
    pub comm_ms: f64,
    pub opt_ms: f64,
    pub mem_rss_bytes: u64,
}

impl StepMetrics {
    /// The metric series this step writes, by their stored names (units in the names).
    pub fn series(&self) -> [(&'static str, f64); 11] {
        [
            ("loss", self.loss),
            ("lr", self.lr),
            ("grad_norm", self.grad_norm),
            ("tokens", self.tokens as f64),
            ("step_time_ms", self.step_time_ms),
            ("data_ms", self.data_ms),
            ("fwd_ms", self.fwd_ms),
            ("bwd_ms", self.bwd_ms),
            ("comm_ms", self.comm_ms),
            ("opt_ms", self.opt_ms),
            ("mem_rss_bytes", self.mem_rss_bytes as f64),
        ]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Barrier,
}

impl CollectiveOp {
    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::ReduceScatter => "reduce_scatter",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::Barrier => "barrier",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CollectiveState {
    Scheduled,
    Started,
    Completed,
}

/// The flight recorder's record of one collective on one rank.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveRecord {
    /// Per-rank sequence number, from 1; equal across ranks for the same collective.
    pub seq: u64,
    pub op: CollectiveOp,
    pub dtype: String,
    pub elements: u64,
    pub bytes: u64,
    pub enqueue_us: u64,
    pub start_us: Option<u64>,
    pub end_us: Option<u64>,
    pub state: CollectiveState,
    /// The training step the collective belongs to (0 outside training).
    pub step: Step,
}

/// Rank → agent, over the agent's telemetry socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum RankMsg {
    /// First message after `Hello`: who is talking.
    Register {
        rank: Rank,
        pid: u32,
    },
    Phase {
        step: Step,
        phase: Phase,
        t_ms: u64,
    },
    Step(StepMetrics),
    Collective(CollectiveRecord),
    /// The rank's training finished normally after this many steps.
    Finished {
        steps: u64,
        final_loss: f64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a rank process ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    Code(i32),
    Signal(i32),
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        *self == ExitStatus::Code(0)
    }

    pub fn describe(&self) -> String {
        match self {
            ExitStatus::Code(c) => format!("exit code {c}"),
            ExitStatus::Signal(s) => format!("signal {s} ({})", signal_name(*s)),
        }
    }
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => "unknown signal",
    }
}

/// One GPU's sample from NVML.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub util_pct: f64,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    pub power_w: f64,
    pub temp_c: f64,
}

/// How a run ended, as the agent saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunOutcome {
    Succeeded,
    Failed,
    Stopped,
    Killed,
}

/// What happened on a node. The agent stamps each with a sequence number (`AgentFrame`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AgentEvent {
    RankStarted {
        rank: Rank,
        local_rank: u32,
        pid: u32,
        host: String,
    },
    Rank {
        rank: Rank,
        msg: RankMsg,
    },
    ProcSample {
        rank: Rank,
        cpu_pct: f64,
        rss_bytes: u64,
    },
    GpuSample(GpuSample),
    Log {
        rank: Rank,
        stream: Stream,
        line: String,
    },
    RankExited {
        rank: Rank,
        pid: u32,
        status: ExitStatus,
    },
    /// Something the node wants said once (e.g. "no NVML: CPU-only sampling").
    Notice {
        text: String,
    },
    /// Bad frames from ranks, counted and dropped.
    BadFrame {
        rank: Option<Rank>,
        reason: String,
    },
    Heartbeat,
    /// Every rank has exited; the agent lingers until this is acknowledged.
    RunEnded {
        outcome: RunOutcome,
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentFrame {
    /// Monotonic per agent and run, from 1.
    pub seq: u64,
    pub t_ms: u64,
    pub event: AgentEvent,
}

/// Server → agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AgentCommand {
    /// Send frames after this sequence number (0 = from the start). First after `Hello`.
    Attach { run: RunId, after_seq: u64 },
    /// Everything up to and including `seq` is durable: the agent may forget it.
    Ack { seq: u64 },
    /// Graceful: SIGTERM to every rank, SIGKILL after the grace period.
    Stop,
    /// Immediate SIGKILL of every rank.
    Kill,
}

/// Client → server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Launch a validated recipe (serialised as JSON, so the server trusts nothing it parses).
    Launch {
        recipe_json: String,
        recipe_path: String,
        name: Option<String>,
    },
    ListRuns,
    ShowRun {
        run: String,
    },
    /// Series points of one run; `key` None = every metric, `rank` None = every rank.
    Metrics {
        run: String,
        key: Option<String>,
        rank: Option<u32>,
    },
    /// Stream this run's progress until it ends.
    Follow {
        run: String,
    },
    Stop {
        run: String,
    },
    Kill {
        run: String,
    },
    /// Stream a live run's agent frames as they are ingested (`Reply::Frames`), until it ends
    /// (`Reply::Ended`). Frames already stored are read with the other requests.
    Watch {
        run: String,
    },
}

/// Server → client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Launched {
        run: RunId,
    },
    Runs {
        runs: Vec<crate::store::RunRecord>,
    },
    Run {
        detail: Box<crate::store::RunDetail>,
    },
    Metrics {
        points: Vec<crate::store::Point>,
    },
    /// One line of progress for a followed run.
    Progress(Progress),
    /// The followed run ended.
    Ended {
        run: RunId,
        status: crate::store::RunStatus,
        reason: String,
    },
    /// A batch of a watched run's frames, from node `node`, just made durable.
    Frames {
        run: RunId,
        node: u32,
        frames: Vec<AgentFrame>,
    },
    /// The watcher fell behind and `skipped` batches were dropped: reload from the store.
    Lagged {
        run: RunId,
        skipped: u64,
    },
    Ok,
    Error {
        message: String,
    },
    /// One host's step in an SSH launch, sent before `Launched` (or `Error`).
    LaunchProgress {
        host: String,
        text: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub run: RunId,
    pub status: crate::store::RunStatus,
    pub step: u64,
    pub steps: u64,
    pub loss_mean: Option<f64>,
    pub step_time_ms_mean: Option<f64>,
    pub ranks_alive: u32,
    pub world_size: u32,
}
