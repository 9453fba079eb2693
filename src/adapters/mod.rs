//! Log adapters: each framework's printed lines read into metric records. Pure: lines in, records out, no I/O.
//!
//! One file per framework; `LogReader` is the one entry point (one per stream: a rank's stdout
//! and stderr, or a log file). It cleans each line (ANSI colours, `\r`-redrawn bars, Ray's
//! `(TaskRunner pid=...)` prefixes, trailing spaces), bounds it, and asks the adapters.
//! Names and values follow one rule (`docs/adapters.md`): labels printed with spaces or
//! punctuation become lowercase `snake_case`, identifiers are kept verbatim.
use serde::{Deserialize, Serialize};

pub mod fatal;
pub mod json;
mod series;
pub use series::series;

/// A line longer than this is counted and skipped, never parsed or kept.
pub const MAX_LINE_BYTES: usize = 64 * 1024;

/// What a record is; `Step` (a training step's line) is the one without a `kind` in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    Step,
    Validation,
    Eval,
    Memory,
    Timers,
    CommOp,
    CommsSummary,
    Progress,
    TrainSummary,
    Event,
}

/// String or integer context of a record (tqdm's desc/n/total, an event's name and rank).
/// Tagged on the wire (bincode cannot read untagged enums); `json.rs` writes the plain value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Label {
    Int(i64),
    Text(String),
}

/// What one line (or one multi-line block) said.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// 1-based number of the record's first line.
    pub line: u64,
    /// The last line of a multi-line record.
    pub end_line: Option<u64>,
    /// The step the line printed, if it printed one.
    pub step: Option<u64>,
    pub kind: RecordKind,
    /// In the order printed; NaN and infinities kept.
    pub metrics: Vec<(String, f64)>,
    pub labels: Vec<(String, Label)>,
}

/// One framework's adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Megatron,
    Deepspeed,
    Hf,
    Tqdm,
    Verl,
    Openrlhf,
    Torchtitan,
    Nanogpt,
    /// torchrun's ChildFailedError, NCCL watchdog timeouts, CUDA OOM: any framework's failures.
    Failures,
}

impl Format {
    pub const ALL: [Format; 9] = [
        Format::Megatron,
        Format::Deepspeed,
        Format::Hf,
        Format::Tqdm,
        Format::Verl,
        Format::Openrlhf,
        Format::Torchtitan,
        Format::Nanogpt,
        Format::Failures,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::Megatron => "megatron",
            Format::Deepspeed => "deepspeed",
            Format::Hf => "hf",
            Format::Tqdm => "tqdm",
            Format::Verl => "verl",
            Format::Openrlhf => "openrlhf",
            Format::Torchtitan => "torchtitan",
            Format::Nanogpt => "nanogpt",
            Format::Failures => "failures",
        }
    }
}

/// Which adapters a reader asks: every one (`auto`, per line), one, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    Auto,
    One(Format),
    None,
}

#[derive(Debug, thiserror::Error)]
#[error("unknown log format {given:?}; valid: auto, none, {valid}")]
pub struct UnknownFormat {
    pub given: String,
    pub valid: String,
}

impl Choice {
    /// As a recipe writes it: `auto`, `none` or a format's name.
    pub fn name(self) -> &'static str {
        match self {
            Choice::Auto => "auto",
            Choice::None => "none",
            Choice::One(f) => f.name(),
        }
    }
}

/// Every framework's output is read unless a recipe says otherwise.
impl Default for Choice {
    fn default() -> Choice {
        Choice::Auto
    }
}

/// By name, as recipes and stored recipes write it.
impl Serialize for Choice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Choice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Choice, D::Error> {
        let name = String::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for Choice {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Choice, UnknownFormat> {
        match s {
            "auto" => Ok(Choice::Auto),
            "none" => Ok(Choice::None),
            _ => Format::ALL
                .into_iter()
                .find(|f| f.name() == s)
                .map(Choice::One)
                .ok_or_else(|| UnknownFormat { given: s.to_string(), valid: Format::ALL.map(Format::name).join(", ") }),
        }
    }
}

/// Lines a reader could not parse, by cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub too_long: u64,
    pub invalid_utf8: u64,
}

/// One stream's reader: holds only what multi-line records need.
pub struct LogReader {
    choice: Choice,
    pub skipped: Skipped,
}

impl LogReader {
    pub fn new(choice: Choice) -> LogReader {
        LogReader { choice, skipped: Skipped::default() }
    }

    /// Reads line `line` (1-based; `raw` without its newline) and returns the records it completes.
    pub fn push(&mut self, line: u64, raw: &[u8]) -> Vec<Record> {
        let _ = (line, raw, self.choice);
        Vec::new()
    }

    /// The end of the stream: records still open (a failure block at the very end).
    pub fn finish(&mut self) -> Vec<Record> {
        Vec::new()
    }
}

/// The cockpit's standard series a record also writes, where the framework's metric means the
/// same: `loss`, `step_time_ms`, `tokens_per_s`, `lr`, `grad_norm`.
pub fn standard(record: &Record) -> Vec<(&'static str, f64)> {
    let _ = record;
    Vec::new()
}
