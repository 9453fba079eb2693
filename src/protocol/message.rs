//! Every message that crosses a socket: rank → agent, agent ↔ server, client ↔ server.
use crate::ids::{Rank, RunId, Step};
pub use crate::record::{signal_name, CollectiveOp, CollectiveRecord, CollectiveState, ExitStatus, Phase};
use serde::{Deserialize, Serialize};

/// Bumped on any change to these types; peers with another version are refused.
pub const PROTOCOL_VERSION: u32 = 12;

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

/// One optimizer step's telemetry from one rank. Missing fields of a JSON-lines client read
/// as zero, so a script can send just `step` and `loss`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
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
    /// Rank 0 committed a checkpoint (from its background writer, once the manifest is down).
    CheckpointSaved(CheckpointSaved),
    /// A save failed; training goes on without it.
    CheckpointFailed {
        step: Step,
        reason: String,
    },
    /// The rank's ring listener turned a connection away (no or a wrong secret).
    Refused(Refusal),
    /// Metrics a trainer kind adds to the standard step's (`mean_token_accuracy`, an eval's
    /// `eval/exact_match`, DPO's `rewards/margins`), by their stored names, at `step`.
    Metrics {
        step: Step,
        metrics: Vec<(String, f64)>,
    },
}

/// A connection to one of the run's TCP ports that failed the handshake on the run's secret
/// (`crate::collective::auth`): dropped, counted, and said as an event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// Which port: `store` or `ring listener of rank N`.
    pub listener: String,
    /// The connecting side's address, `IP:PORT`.
    pub peer: String,
    pub reason: String,
    /// Connections this listener has refused so far, this one included.
    pub count: u64,
}

/// One committed checkpoint and what saving it cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointSaved {
    pub step: Step,
    /// The step directory.
    pub path: String,
    pub bytes: u64,
    /// Mean over ranks of this step's loss.
    pub loss: f64,
    pub saved_ms: u64,
    /// How long the training thread was held: the snapshot, plus waiting for a previous save.
    pub blocking_ms: f64,
    /// The background write: files, hashes, fsyncs, manifest, LATEST.
    pub write_ms: f64,
    /// bytes / write time, in 1e9 bytes per second.
    pub write_gbps: f64,
    /// Older checkpoints deleted to keep `checkpoint.keep`.
    pub pruned: Vec<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One GPU's sample from NVML (decoded in `agent::nvml`). A field the GPU or driver does not
/// offer is `None` (never a made-up zero), so panels can tell "0 %" from "unknown".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub util_pct: f64,
    pub mem_used_bytes: u64,
    pub mem_total_bytes: u64,
    pub power_w: f64,
    pub temp_c: f64,
    pub uuid: String,
    /// NVML's memory-controller busy %.
    pub mem_util_pct: Option<f64>,
    /// SM activity from GPM (Hopper and newer): the share of SMs busy, not just "a kernel ran".
    pub sm_active_pct: Option<f64>,
    /// Tensor-core activity from GPM.
    pub tensor_active_pct: Option<f64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    /// Why clocks are held down now (NVML's "clock event reasons"); empty = running free.
    pub throttle: Vec<ThrottleReason>,
    pub pcie_rx_bytes_per_s: Option<u64>,
    pub pcie_tx_bytes_per_s: Option<u64>,
    /// Summed over links, from the counters' change since the previous sample.
    pub nvlink_rx_bytes_per_s: Option<u64>,
    pub nvlink_tx_bytes_per_s: Option<u64>,
    /// Volatile (since driver load) corrected / uncorrected ECC error counts.
    pub ecc_corrected: Option<u64>,
    pub ecc_uncorrected: Option<u64>,
    /// Compute processes on this GPU, with the rank each belongs to when it is one of ours.
    pub processes: Vec<GpuProcess>,
}

/// One compute process on a GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub rank: Option<Rank>,
    pub mem_used_bytes: Option<u64>,
}

/// NVML's clock event (throttle) reasons, one per bit of its mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThrottleReason {
    GpuIdle,
    ApplicationClocks,
    SwPowerCap,
    HwSlowdown,
    SyncBoost,
    SwThermal,
    HwThermal,
    HwPowerBrake,
    DisplayClocks,
}

impl ThrottleReason {
    /// The reason's name in samples, events and panels.
    pub fn name(self) -> &'static str {
        match self {
            ThrottleReason::GpuIdle => "idle",
            ThrottleReason::ApplicationClocks => "app-clocks",
            ThrottleReason::SwPowerCap => "sw-power-cap",
            ThrottleReason::HwSlowdown => "hw-slowdown",
            ThrottleReason::SyncBoost => "sync-boost",
            ThrottleReason::SwThermal => "sw-thermal",
            ThrottleReason::HwThermal => "hw-thermal",
            ThrottleReason::HwPowerBrake => "hw-power-brake",
            ThrottleReason::DisplayClocks => "display-clocks",
        }
    }

    /// Reasons worth an event: the GPU is being slowed by heat or a hardware signal. Power
    /// capping under full load is normal on H100/H200 and flaps, so it shows in samples but
    /// raises no event.
    pub fn is_alarming(self) -> bool {
        matches!(
            self,
            ThrottleReason::HwSlowdown
                | ThrottleReason::SwThermal
                | ThrottleReason::HwThermal
                | ThrottleReason::HwPowerBrake
        )
    }
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
    /// Boxed: a sample is ten times the size of any other event.
    GpuSample(Box<GpuSample>),
    Log {
        rank: Rank,
        stream: Stream,
        line: String,
    },
    RankExited {
        rank: Rank,
        pid: u32,
        status: ExitStatus,
        /// The rank's own last error line (a Python exception, an allocation failure, an OOM),
        /// so the reason a rank died is in the history, not only in its log.
        last_error: Option<String>,
    },
    /// What a log adapter read from a rank's output (`crate::adapters`): a framework's metrics
    /// or a failure it printed. `rank` is the rank whose output it was.
    LogRecord {
        rank: Rank,
        record: crate::adapters::Record,
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
    /// A Python rank's flight recorder and main-thread stack as its shim last wrote them
    /// (`crate::torchfr`; sent when they change, about once a second). Boxed: it is large.
    TorchFlight {
        rank: Rank,
        snapshot: Box<crate::torchfr::Snapshot>,
    },
    /// The answer to `AgentCommand::DumpStacks`: this node's ranks (or the one asked for).
    StackDump {
        request: u64,
        stacks: Vec<crate::record::RankStacks>,
    },
    /// NVML reported a critical XID error on GPU `index` (e.g. 79: fell off the bus).
    GpuXid {
        index: u32,
        xid: u64,
    },
    /// NVML reported an ECC error on GPU `index`.
    GpuEcc {
        index: u32,
        uncorrected: bool,
    },
    /// The notable clock event reasons of GPU `index` changed (idle and application clocks are
    /// not notable); `reasons` is the new set, empty when the GPU runs free again.
    GpuThrottle {
        index: u32,
        reasons: Vec<ThrottleReason>,
    },
    /// The node's rendezvous store turned a connection away (no or a wrong secret).
    Refused(Refusal),
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
    /// Read the stacks of every rank on the node (or of `rank`); answered by `StackDump`.
    /// `native`: Python ranks' C/C++ frames too, interleaved with their Python ones.
    DumpStacks { request: u64, rank: Option<Rank>, native: bool },
}

/// Client → server.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Launch a validated recipe (serialised as JSON, so the server trusts nothing it parses).
    Launch {
        recipe_json: String,
        recipe_path: String,
        name: Option<String>,
        /// The client's environment: an SSH launch resolves hosts, keys and known_hosts in it,
        /// a Slurm launch runs Slurm's commands in it; not in the server's (an earlier login's).
        env: super::spec::ClientEnv,
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
    /// The cockpit's feed: the stored run (`Reply::Snapshot`), then its live frame batches as
    /// `Watch` streams them, then `Reply::Ended`. The server subscribes to the live frames before
    /// it reads the store, so nothing falls between the snapshot and the stream.
    Open {
        run: String,
    },
    /// A run's checkpoints, checked on disk: sizes, or every byte's sha256 when `verify`.
    Checkpoints {
        run: String,
        verify: bool,
    },
    /// Every flight-recorder record the history holds of one rank, in sequence order
    /// (`Reply::Collectives`): the report's bandwidth chart and its incident pictures.
    Collectives {
        run: String,
        rank: u32,
    },
    /// Start a child of `run` from its checkpoint at `step` (None: the newest verified one).
    /// `recipe_json`: the validated recipe with the user's overrides (None: the parent's).
    Resume {
        run: String,
        step: Option<u64>,
        recipe_json: Option<String>,
        name: Option<String>,
        env: super::spec::ClientEnv,
    },
    /// Dump the stacks of a live run's ranks (all, or `rank`), grouped (`Reply::Stacks`).
    Stacks {
        run: String,
        rank: Option<u32>,
        /// Python ranks' native frames too (py-spy `--native`); native ranks always have them.
        native: bool,
    },
    /// Read a finished run's logs or TensorBoard events (at `path`, absolute: the server reads
    /// it) into the history (`Reply::Imported`).
    Import {
        path: String,
        format: crate::adapters::Choice,
        name: Option<String>,
    },
    /// Queue a sweep (`Reply::Swept`): the client expanded and validated every point;
    /// `max_ranks` 0 asks for the server's default capacity.
    Sweep {
        sweep: crate::record::SweepRecord,
        env: super::spec::ClientEnv,
    },
    /// Sweeps with a point waiting or running, or every sweep with `all` (`Reply::Queue`).
    Queue {
        all: bool,
    },
    /// Cancel a sweep's points (`SWEEP`, or one point `SWEEP:N`, N from 1): waiting ones never
    /// start, running ones are killed (`Reply::Cancelled`).
    Cancel {
        target: String,
    },
}

/// Server → client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Launched {
        run: RunId,
    },
    Runs {
        runs: Vec<crate::record::RunRecord>,
    },
    Run {
        detail: Box<crate::record::RunDetail>,
    },
    Metrics {
        points: Vec<crate::record::Point>,
    },
    /// One line of progress for a followed run.
    Progress(Progress),
    /// The followed run ended.
    Ended {
        run: RunId,
        status: crate::record::RunStatus,
        reason: String,
    },
    /// The followed run ended and recovery started `child` in its place; the stream goes on
    /// with the child's progress.
    Restarted {
        run: RunId,
        status: crate::record::RunStatus,
        reason: String,
        child: RunId,
        restart: crate::record::Restart,
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
    Imported {
        run: RunId,
        ranks: u32,
        records: u64,
        status: crate::record::RunStatus,
    },
    Ok,
    Error {
        message: String,
    },
    /// The first reply to `Open`: what the store holds of the run.
    Snapshot(Box<RunSnapshot>),
    Checkpoints {
        run: RunId,
        /// The run's checkpoint directory.
        dir: String,
        /// The step `LATEST` names.
        latest: Option<u64>,
        checkpoints: Vec<crate::record::CheckpointRecord>,
    },
    /// A child run started from `parent`'s checkpoint at `step`.
    Resumed {
        run: RunId,
        parent: RunId,
        step: u64,
        path: String,
        /// Newer checkpoints passed over because they failed verification.
        skipped: Vec<crate::record::Skipped>,
    },
    Stacks(Box<crate::record::StackReport>),
    Collectives {
        records: Vec<CollectiveRecord>,
    },
    /// One host's step in an SSH launch, sent before `Launched` (or `Error`).
    LaunchProgress {
        host: String,
        text: String,
    },
    /// A sweep queued, as stored (its capacity filled in).
    Swept {
        sweep: crate::record::SweepRecord,
    },
    Queue {
        sweeps: Vec<crate::record::SweepStatus>,
    },
    /// Points (numbered from 1) that will not start, and runs killed.
    Cancelled {
        sweep: String,
        points: Vec<u32>,
        killed: Vec<RunId>,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub run: RunId,
    pub status: crate::record::RunStatus,
    pub step: u64,
    pub steps: u64,
    pub loss_mean: Option<f64>,
    pub step_time_ms_mean: Option<f64>,
    pub ranks_alive: u32,
    pub world_size: u32,
    /// The analysis' verdicts that hold now (a hang until progress resumes, a straggler until
    /// it keeps up), so a follower (the cockpit's banner and heatmap, `run --headless`) sees
    /// them live. Every verdict is also stored as an event when first given.
    pub verdicts: Vec<crate::record::Verdict>,
    /// The incident reports written so far (their paths), so a follower can say so live.
    #[serde(default)]
    pub incidents: Vec<String>,
}

/// What the store holds of one run, for a cockpit that opens it (`Request::Open`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSnapshot {
    pub detail: crate::record::RunDetail,
    /// One entry per (metric, rank), in step order: raw points (buckets of one) for short runs,
    /// rollup buckets for long ones, so the snapshot stays small at any run length.
    pub series: Vec<SeriesSnapshot>,
    /// The most recent flight-recorder records of each rank.
    pub collectives: Vec<(u32, Vec<CollectiveRecord>)>,
    /// The tail of each rank's log.
    pub logs: Vec<(u32, Vec<String>)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeriesSnapshot {
    pub metric: String,
    pub rank: u32,
    pub buckets: Vec<crate::record::Bucket>,
}
