//! What the hang and straggler analysis concludes, and stack dumps: data that crosses sockets.
use super::{CollectiveOp, Phase};
use crate::ids::Step;
use serde::{Deserialize, Serialize};

/// The classes of verdict (DESIGN §9). All but the straggler are hangs; a straggler is slow, not
/// stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictKind {
    /// A rank is behind in sequence number: it never entered the collective its peers wait in.
    NeverEntered,
    /// Every rank entered the collective and none completed it.
    StuckInCollective,
    /// A rank exited while its peers still needed it.
    Dead,
    /// A node's agent is gone (its port refuses the reconnect) or silent past the heartbeat
    /// limit: its ranks are unreachable, named with the node.
    NodeLost,
    /// Ranks disagree on the op or size of one sequence number.
    Mismatch,
    /// A rank is consistently slower than the median, by the recipe's margin.
    Straggler,
    /// Checkpoint saves keep failing (a full disk, a lost mount): training on would be
    /// unprotected, so the run is stopped while its last good checkpoint is recent.
    CheckpointFailing,
    /// A rank's log reported a failure (a watchdog timeout, a NCCL transport error, a CUDA
    /// error): the ranks whose logs did, the root cause first.
    Failure,
}

impl VerdictKind {
    pub fn name(self) -> &'static str {
        match self {
            VerdictKind::NeverEntered => "never-entered",
            VerdictKind::StuckInCollective => "stuck-in-collective",
            VerdictKind::Dead => "dead",
            VerdictKind::NodeLost => "node-lost",
            VerdictKind::Mismatch => "mismatch",
            VerdictKind::Straggler => "straggler",
            VerdictKind::CheckpointFailing => "checkpoint-failing",
            VerdictKind::Failure => "failure",
        }
    }

    /// Hangs get an incident report and an automatic stack dump; stragglers and failing
    /// checkpoints do not (the ranks are not stuck).
    pub fn is_hang(self) -> bool {
        !matches!(self, VerdictKind::Straggler | VerdictKind::CheckpointFailing)
    }
}

/// A rank a verdict names, with where it was when last heard from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Culprit {
    pub rank: u32,
    pub host: String,
    pub pid: Option<u32>,
    /// Its last reported phase.
    pub phase: Option<Phase>,
    pub step: u64,
    /// The highest sequence number it entered (0: none yet).
    pub last_seq: u64,
    /// One line on what is wrong with this rank.
    pub detail: String,
}

/// The collective a verdict is about.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveRef {
    pub seq: u64,
    pub op: CollectiveOp,
    pub elements: u64,
    pub bytes: u64,
    pub step: Step,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub kind: VerdictKind,
    pub culprits: Vec<Culprit>,
    pub collective: Option<CollectiveRef>,
    /// Ranks held up by the culprits (inside the collective, or idle).
    pub waiting: Vec<u32>,
    /// When the condition began (last progress, the exit, the first mismatched record), unix ms.
    pub since_ms: u64,
    /// When the analysis concluded, unix ms.
    pub detected_ms: u64,
    /// The one line a person reads first.
    pub summary: String,
}

impl Verdict {
    /// How long the condition had lasted when it was detected.
    pub fn duration_ms(&self) -> u64 {
        self.detected_ms.saturating_sub(self.since_ms)
    }

    /// The incident report's file name in the run directory: unique per verdict, sorting by time.
    pub fn report_file_name(&self) -> String {
        format!("incident-{}-{}.md", self.detected_ms, self.kind.name())
    }

    /// The stem of the incident report's picture beside it: `STEM.svg` and `STEM.png`.
    pub fn chart_stem(&self) -> String {
        format!("incident-{}-{}-progress", self.detected_ms, self.kind.name())
    }
}

/// The program that read a rank's stacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StackTool {
    EuStack,
    Gdb,
    PySpy,
}

impl StackTool {
    pub fn name(self) -> &'static str {
        match self {
            StackTool::EuStack => "eu-stack",
            StackTool::Gdb => "gdb",
            StackTool::PySpy => "py-spy",
        }
    }
}

/// One frame, innermost first in its thread; `function` is demangled and free of addresses and
/// hashes, so the same code in two processes reads the same.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub function: String,
    /// `file:line` where the tool knows it.
    pub location: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadStack {
    pub tid: u32,
    pub name: Option<String>,
    pub frames: Vec<Frame>,
}

/// One rank's dump: its threads, or why there are none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankStacks {
    pub rank: u32,
    pub host: String,
    pub pid: u32,
    pub tool: Option<StackTool>,
    /// How long the tool held the rank (attach to detach, as seen from outside).
    pub elapsed_ms: u64,
    pub threads: Vec<ThreadStack>,
    pub error: Option<String>,
}

/// Ranks whose main threads' stacks are identical frame by frame, with the first one's threads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackGroup {
    pub ranks: Vec<u32>,
    pub threads: Vec<ThreadStack>,
}

/// The answer to `flightdeck stacks`: groups (largest first) and the ranks that could not be read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StackReport {
    pub run: crate::ids::RunId,
    pub groups: Vec<StackGroup>,
    /// (rank, why) for each rank without stacks.
    pub failures: Vec<(u32, String)>,
    /// Per rank: (rank, pid, tool, elapsed ms), so the cost of the dump is visible.
    pub timings: Vec<(u32, u32, Option<StackTool>, u64)>,
}
