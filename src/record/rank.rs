//! How a rank is doing and how it ended: shared by the wire, the store and the analysis.
use serde::{Deserialize, Serialize};

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
    /// GRPO: sampling completions from the policy.
    Generate,
    /// GRPO: the rule reward and the advantages.
    Score,
    /// GRPO: the frozen reference's (and the sampling policy's) log-probabilities.
    Reference,
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
            Phase::Generate => "generate",
            Phase::Score => "score",
            Phase::Reference => "reference",
            Phase::Done => "done",
        }
    }
}
