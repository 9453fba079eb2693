//! Log adapters: each framework's printed lines read into metric records. Pure: lines in, records out, no I/O.
//!
//! One file per framework; `LogReader` is the one entry point (one per stream: a rank's stdout
//! and stderr, or a log file). It cleans each line (ANSI colours, `\r`-redrawn bars, Ray's
//! `(TaskRunner pid=...)` prefixes, trailing spaces), bounds it, and asks the adapters.
//! Names and values follow one rule (`docs/adapters.md`): labels printed with spaces or
//! punctuation become lowercase `snake_case`, identifiers are kept verbatim.
use serde::{Deserialize, Serialize};

mod areal;
pub mod clean;
mod deepspeed;
pub mod failures;
pub mod fatal;
mod hf;
pub mod json;
mod lightning;
mod llmc;
mod megatron;
mod nanogpt;
mod nemo;
mod openrlhf;
mod primerl;
mod series;
mod slime;
#[cfg(test)]
mod tests;
mod torchtitan;
mod tqdm;
pub mod value;
mod verl;
pub mod writers;
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
    /// A fact that is not a failure (NCCL's version and init lines): `failures.rs` labels only.
    Info,
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

impl Record {
    /// An empty record of `kind` at line `line`: adapters fill in the rest.
    pub fn at(line: u64, kind: RecordKind) -> Record {
        Record { line, end_line: None, step: None, kind, metrics: Vec::new(), labels: Vec::new() }
    }

    pub fn label(&self, key: &str) -> Option<&Label> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// A failure event's name (`child_failed`, `nccl_timeout`, ...) and the rank it is about:
    /// the `rank` it names (torchrun prints its children's failures), else `printer`, the rank
    /// whose output it was. `None` for a record that is not an event.
    pub fn failure(&self, printer: u32) -> Option<(&str, u32)> {
        if self.kind != RecordKind::Event {
            return None;
        }
        let name = match self.label("event") {
            Some(Label::Text(t)) => t.as_str(),
            _ => "failure",
        };
        let about = match self.label("rank") {
            Some(Label::Int(r)) => u32::try_from(*r).unwrap_or(printer),
            _ => printer,
        };
        Some((name, about))
    }
}

/// One framework's adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Megatron,
    /// NeMo 2.x's `Training epoch N, iteration ...` lines, NeMo's Lightning bars, Megatron's timers.
    Nemo,
    Deepspeed,
    Hf,
    Tqdm,
    Verl,
    Openrlhf,
    Torchtitan,
    Nanogpt,
    /// llm.c's C/CUDA trainers, its PyTorch reference and its `main.log`.
    Llmc,
    /// slime's `step N: {...}`, `rollout N: {...}`, `perf N: {...}`, `eval N: {...}` dicts.
    Slime,
    /// AReaL's realhf step line and RPC statistics, and its stats tables (realhf and areal-lite).
    Areal,
    /// PRIME-RL's trainer and orchestrator step lines, zeroband to today.
    Primerl,
    Lightning,
    /// torchrun's ChildFailedError, NCCL watchdog timeouts, CUDA OOM: any framework's failures.
    Failures,
}

impl Format {
    pub const ALL: [Format; 15] = [
        Format::Megatron,
        Format::Nemo,
        Format::Deepspeed,
        Format::Hf,
        Format::Tqdm,
        Format::Verl,
        Format::Openrlhf,
        Format::Torchtitan,
        Format::Nanogpt,
        Format::Llmc,
        Format::Slime,
        Format::Areal,
        Format::Primerl,
        Format::Lightning,
        Format::Failures,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::Megatron => "megatron",
            Format::Nemo => "nemo",
            Format::Deepspeed => "deepspeed",
            Format::Hf => "hf",
            Format::Tqdm => "tqdm",
            Format::Verl => "verl",
            Format::Openrlhf => "openrlhf",
            Format::Torchtitan => "torchtitan",
            Format::Nanogpt => "nanogpt",
            Format::Llmc => "llmc",
            Format::Slime => "slime",
            Format::Areal => "areal",
            Format::Primerl => "primerl",
            Format::Lightning => "lightning",
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

/// One stream's reader: holds only what multi-line records need (torchrun's failure block,
/// DeepSpeed's comms summary table, Megatron's `--timing-log-option all` block). A stream that
/// interleaves ranks (torchrun's `[rank3]:` lines, `srun -l`) keeps a failure block per rank its
/// prefixes name.
pub struct LogReader {
    choice: Choice,
    /// Keyed by the (rank, local rank) a line's prefixes named.
    failures: Vec<(StreamRank, failures::Failures)>,
    comms: deepspeed::CommsTable,
    rank_times: megatron::RankTimes,
    /// verl's pprinted `Initial/Final validation metrics` over several lines.
    verl_validation: verl::Validation,
    /// AReaL's stats tables under their header lines.
    areal_tables: areal::Tables,
    /// Hosts whose pdsh `host: ` a line was read through: their lines are read without it first,
    /// so a multi-line table behind pdsh is not closed by its own prefixed lines.
    pdsh_hosts: Vec<String>,
    /// The previous line's candidate pdsh host (hashed: no allocation a line), and whether a
    /// bar followed it.
    last_host: Option<(u64, bool)>,
    pub skipped: Skipped,
}

/// The (rank, local rank) a line's prefixes named: whose failure block a line belongs to.
type StreamRank = (Option<u32>, Option<u32>);

/// pdsh hosts a stream remembers (a launch over more nodes reads the rest whole first).
const MAX_PDSH_HOSTS: usize = 256;

/// Ranks whose failure blocks one stream keeps apart; lines of further ranks share one.
const MAX_STREAM_RANKS: usize = 4096;

/// The metric adapters `auto` asks, most specific first (each checks a cheap prefix first).
const AUTO: [Format; 14] = [
    Format::Megatron,
    Format::Nemo,
    Format::Deepspeed,
    Format::Torchtitan,
    Format::Verl,
    // Before nanoGPT, whose `step N: ...` eval reader would take slime's `step N: {...}`.
    Format::Slime,
    Format::Areal,
    Format::Primerl,
    Format::Llmc,
    Format::Nanogpt,
    Format::Hf,
    Format::Openrlhf,
    Format::Lightning,
    Format::Tqdm,
];

/// Which part of the reader took a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taker {
    /// A failure (or a line inside a failure block).
    Failures,
    /// A row (or the header) of DeepSpeed's comms summary table.
    CommsTable,
    Adapter(Format),
}

/// What the reader did with one line (`parse-log --explain`).
#[derive(Debug)]
pub struct Explanation {
    /// The line as read: `None` when it was skipped (too long, not UTF-8), with the reason.
    pub skipped: Option<&'static str>,
    /// The message the adapters read, once every wrapper was off.
    pub message: String,
    pub origin: clean::Origin,
    /// The message after pdsh's `host: ` too, when only that reading was taken.
    pub without_host: Option<String>,
    pub taker: Option<Taker>,
    pub records: Vec<Record>,
}

impl LogReader {
    pub fn new(choice: Choice) -> LogReader {
        LogReader {
            choice,
            failures: Vec::new(),
            comms: deepspeed::CommsTable::default(),
            rank_times: megatron::RankTimes::default(),
            verl_validation: verl::Validation::default(),
            areal_tables: areal::Tables::default(),
            pdsh_hosts: Vec::new(),
            last_host: None,
            skipped: Skipped::default(),
        }
    }

    /// Reads line `line` (1-based; `raw` without its newline) and returns the records it
    /// completes. Failures are read whatever the format (any framework's job can fail); a line
    /// over `MAX_LINE_BYTES` or of invalid UTF-8 is counted and skipped.
    pub fn push(&mut self, line: u64, raw: &[u8]) -> Vec<Record> {
        self.read_line(line, raw, false).map(|e| e.records).unwrap_or_default()
    }

    /// `push`, saying how: `None` for a line that gave nothing and was no one's.
    pub fn explain(&mut self, line: u64, raw: &[u8]) -> Option<Explanation> {
        self.read_line(line, raw, true)
    }

    /// One line; `explain` keeps the message and the pdsh reading in the answer (copies the
    /// hot path does without).
    fn read_line(&mut self, line: u64, raw: &[u8], explain: bool) -> Option<Explanation> {
        let skip = |why| Explanation {
            skipped: Some(why),
            message: String::new(),
            origin: clean::Origin::default(),
            without_host: None,
            taker: None,
            records: Vec::new(),
        };
        if self.choice == Choice::None {
            return None;
        }
        if raw.len() > MAX_LINE_BYTES {
            self.skipped.too_long += 1;
            return Some(skip("over 64 KiB"));
        }
        let Ok(text) = std::str::from_utf8(raw) else {
            self.skipped.invalid_utf8 += 1;
            return Some(skip("not UTF-8"));
        };
        let cleaned = clean::line(text);
        if cleaned.text.is_empty() {
            return None;
        }
        let mut origin = cleaned.origin;
        if origin.taken.contains(&clean::Wrapper::Pdsh) {
            // A host certainly pdsh's (another wrapper followed it): its other lines are too.
            if let Some(h) = origin.host.as_deref() {
                self.remember_pdsh(h);
            }
        }
        // The cleaner found the candidate already: `host: ` ends two bytes before the cut.
        let host = cleaned.host_cut.map(|cut| (cut, (cut, &cleaned.text[..cut - 2])));
        // The same `host: ` on consecutive lines is pdsh's (a framework's own `key: ` lines
        // learned this way cost a second reading, never a wrong one: the whole line is read after).
        // `Iteration:  50%|` on two lines is a bar's desc as likely as a host: a host is learned
        // from two lines one of which is not a bar.
        match host {
            Some((cut, (_, h))) => {
                let bar = clean::bar_start(&cleaned.text[cut..]);
                let hash = word_hash(h);
                match self.last_host {
                    Some((last, last_bar)) if last == hash && !(bar && last_bar) => self.remember_pdsh(h),
                    _ => self.last_host = Some((hash, bar)),
                }
            }
            None => self.last_host = None,
        }
        let known = host.is_some_and(|(_, (_, h))| self.pdsh_hosts.iter().any(|k| k == h));
        let mut taken = if known { None } else { self.read(line, &cleaned.text, cleaned.bytes, &origin) };
        let mut without_host = None;
        if taken.is_none() {
            // pdsh's `host: `, tried after the whole line (a framework's `step: ` must win)
            // unless this host's lines were read that way before.
            if let Some((cut, (_, host))) = host.filter(|(_, (_, h))| known || clean::host_like(h)) {
                let inner = clean::line(&cleaned.text[cut..]);
                let mut merged = inner.origin;
                merged.host = merged.host.or_else(|| Some(host.to_string()));
                merged.rank = merged.rank.or(origin.rank);
                merged.local_rank = merged.local_rank.or(origin.local_rank);
                let mut wrappers = origin.taken;
                wrappers.push(clean::Wrapper::Pdsh);
                merged.taken = wrappers.followed_by(&merged.taken);
                taken = self.read(line, &inner.text, inner.bytes, &merged);
                if taken.is_some() {
                    self.remember_pdsh(host);
                    origin = merged;
                    without_host = explain.then(|| inner.text.into_owned());
                }
            }
            if taken.is_none() && known {
                taken = self.read(line, &cleaned.text, cleaned.bytes, &origin);
            }
        }
        let (mut records, taker) = match taken {
            Some((records, taker)) => (records, Some(taker)),
            None => (Vec::new(), None),
        };
        for r in &mut records {
            label_origin(r, &origin);
        }
        let message = if explain { cleaned.text.into_owned() } else { String::new() };
        Some(Explanation { skipped: None, message, origin, without_host, taker, records })
    }

    fn remember_pdsh(&mut self, host: &str) {
        if self.pdsh_hosts.len() < MAX_PDSH_HOSTS && !self.pdsh_hosts.iter().any(|k| k == host) {
            self.pdsh_hosts.push(host.to_string());
        }
    }

    /// One cleaned message through the failure readers, the comms table and the adapters:
    /// `None` when none of them took it.
    fn read(
        &mut self,
        line: u64,
        text: &str,
        bytes: value::ByteSet,
        origin: &clean::Origin,
    ) -> Option<(Vec<Record>, Taker)> {
        value::with_message_bytes(text, bytes, || self.read_known(line, text, origin))
    }

    /// `read`, with the message's bytes known to every reader's phrase search.
    fn read_known(&mut self, line: u64, text: &str, origin: &clean::Origin) -> Option<(Vec<Record>, Taker)> {
        let failures = self.failures_of((origin.rank, origin.local_rank));
        if let Some(records) = failures.push(line, text) {
            return Some((records, Taker::Failures));
        }
        // A traceback the line ended (its exception waited for a chained one) comes before it.
        let ready = failures.take_ready();
        match self.read_adapters(line, text) {
            Some((mut records, taker)) => {
                records.splice(0..0, ready);
                Some((records, taker))
            }
            None if ready.is_empty() => None,
            None => Some((ready, Taker::Failures)),
        }
    }

    /// The comms table and the metric adapters.
    fn read_adapters(&mut self, line: u64, text: &str) -> Option<(Vec<Record>, Taker)> {
        if matches!(self.choice, Choice::Auto | Choice::One(Format::Deepspeed)) {
            if let Some(records) = self.comms.push(line, text) {
                return Some((records, Taker::CommsTable));
            }
        }
        // Megatron's `--timing-log-option all` block (NeMo 2 prints it too): a row names its timer
        // only through the line above it.
        if let Choice::Auto | Choice::One(Format::Megatron | Format::Nemo) = self.choice {
            if let Some(records) = self.rank_times.push(line, text) {
                let format = if let Choice::One(f) = self.choice { f } else { Format::Megatron };
                return Some((records, Taker::Adapter(format)));
            }
        }
        // Multi-line blocks: verl's pprinted validation metrics, AReaL's stats tables.
        if let Choice::Auto | Choice::One(Format::Verl) = self.choice {
            if let Some(records) = self.verl_validation.push(line, text) {
                return Some((records, Taker::Adapter(Format::Verl)));
            }
        }
        if let Choice::Auto | Choice::One(Format::Areal) = self.choice {
            if let Some(records) = self.areal_tables.push(line, text) {
                return Some((records, Taker::Adapter(Format::Areal)));
            }
        }
        let (record, format) = match self.choice {
            Choice::One(Format::Failures) | Choice::None => None,
            Choice::One(format) => parse(format, line, text).map(|r| (r, format)),
            Choice::Auto => AUTO.iter().find_map(|f| parse(*f, line, text).map(|r| (r, *f))),
        }?;
        let nan = nan_loss(&record);
        Some((std::iter::once(record).chain(nan).collect(), Taker::Adapter(format)))
    }

    /// The failure readers' state for the rank a line's prefix named (`None`: no prefix).
    fn failures_of(&mut self, rank: StreamRank) -> &mut failures::Failures {
        let at = match self.failures.iter().position(|(r, _)| *r == rank) {
            Some(at) => at,
            None if self.failures.len() < MAX_STREAM_RANKS => {
                self.failures.push((rank, failures::Failures::default()));
                self.failures.len() - 1
            }
            None => 0,
        };
        &mut self.failures[at].1
    }

    /// The end of the stream: records still open (a failure block at the very end).
    pub fn finish(&mut self) -> Vec<Record> {
        let mut out = Vec::new();
        for ((rank, local_rank), f) in &mut self.failures {
            let origin = clean::Origin { rank: *rank, local_rank: *local_rank, ..clean::Origin::default() };
            for mut r in f.finish() {
                label_origin(&mut r, &origin);
                out.push(r);
            }
        }
        out
    }
}

/// FNV-1a of a short word: the previous line's pdsh candidate, compared without keeping it.
fn word_hash(word: &str) -> u64 {
    word.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The rank, local rank and host a line's wrappers named, on each record it gave, unless the
/// record names its own (torchrun's report names the failed child).
fn label_origin(r: &mut Record, origin: &clean::Origin) {
    let ints = [("rank", origin.rank), ("local_rank", origin.local_rank)];
    for (key, value) in ints {
        if let Some(v) = value {
            if r.label(key).is_none() {
                r.labels.push((key.to_string(), Label::Int(i64::from(v))));
            }
        }
    }
    if let Some(host) = &origin.host {
        if r.label("host").is_none() {
            r.labels.push(("host".to_string(), Label::Text(host.clone())));
        }
    }
}

fn parse(format: Format, line: u64, text: &str) -> Option<Record> {
    match format {
        Format::Megatron => megatron::parse(line, text),
        Format::Nemo => nemo::parse(line, text),
        Format::Deepspeed => deepspeed::parse(line, text),
        Format::Hf => hf::parse(line, text),
        Format::Tqdm => tqdm::parse(line, text),
        Format::Verl => verl::parse(line, text),
        Format::Openrlhf => openrlhf::parse(line, text),
        Format::Torchtitan => torchtitan::parse(line, text),
        Format::Nanogpt => nanogpt::parse(line, text),
        Format::Llmc => llmc::parse(line, text),
        Format::Slime => slime::parse(line, text),
        Format::Areal => areal::parse(line, text),
        Format::Primerl => primerl::parse(line, text),
        Format::Lightning => lightning::parse(line, text),
        Format::Failures => None,
    }
}

/// A training step whose loss is NaN or infinite is also a failure event.
fn nan_loss(record: &Record) -> Option<Record> {
    let (_, loss) = standard(record).into_iter().find(|(n, _)| *n == "loss")?;
    if loss.is_finite() {
        return None;
    }
    let mut r = Record::at(record.line, RecordKind::Event);
    r.step = record.step;
    r.labels.push(("event".into(), Label::Text("nan_loss".into())));
    r.metrics.push(("loss".into(), loss));
    Some(r)
}

/// The cockpit's standard series a training step also writes, where the framework's metric
/// means the same: the first of each list that the record has.
const STANDARD: [(&str, &[(&str, f64)]); 5] = [
    (
        "loss",
        &[
            ("loss", 1.0),
            ("lm_loss", 1.0),
            ("train_loss", 1.0),
            ("train/loss", 1.0),
            ("reduced_train_loss", 1.0),
            ("trl", 1.0),
            ("loss/mean", 1.0),
            // RL frameworks: the policy's loss (verl, OpenRLHF, AReaL realhf and lite/1.x),
            // OpenRLHF's SFT loss, PRIME-RL's printed `Loss`.
            ("actor/loss", 1.0),
            ("actor/pg_loss", 1.0),
            ("policy_loss", 1.0),
            ("gpt_loss", 1.0),
            ("Loss", 1.0),
            ("actor_loss", 1.0),
            ("update/actor_loss/avg", 1.0),
            ("grpo_actor/actor_loss/avg", 1.0),
        ],
    ),
    (
        "step_time_ms",
        &[
            ("step_time_ms", 1.0),
            ("elapsed_time_per_iteration_ms", 1.0),
            ("elapsed_time_per_iteration_s", 1000.0),
            ("train_step_timing_in_s", 1000.0),
            ("time_ms", 1.0),
            ("iter_time_s", 1000.0),
            ("timing_s/step", 1000.0),
            ("perf/time_per_step", 1000.0),
            ("step_avg_ms", 1.0),
            ("step_time", 1000.0),
            // slime's `perf/step_time` (older: train wait + train), PRIME-RL's `Time`, AReaL
            // realhf's end-to-end time, OpenRLHF's `timing/step_total`. (verl SFT's
            // `train/time(s)` reads `train_time_s`, which modded-nanogpt's cumulative
            // `train_time:45.1s` also gives: not a step time, so not here.)
            ("perf/step_time", 1000.0),
            ("perf/total_train_time", 1000.0),
            ("time_s", 1000.0),
            ("end_to_end_execution_time_s", 1000.0),
            ("timing/step_total", 1000.0),
        ],
    ),
    (
        "tokens_per_s",
        &[
            ("tps", 1.0),
            ("perf/throughput", 1.0),
            ("tokens_per_second", 1.0),
            ("train_tokens_per_second", 1.0),
            ("wps", 1.0),
            ("tok/s", 1.0),
            ("toks/s", 1.0),
            ("perf/trainer/tokens_per_second_full_step", 1.0),
            ("throughput_tokens_s", 1.0),
            ("perf/actor_train_tok_per_s", 1.0),
        ],
    ),
    (
        "lr",
        &[
            ("lr", 1.0),
            ("learning_rate", 1.0),
            ("actor_lr", 1.0),
            ("actor/lr", 1.0),
            ("trainer/lr", 1.0),
            // verl SFT (`train/lr(1e-3)` prints lr x 1000), slime's first param group,
            // PRIME-RL's `LR`, AReaL's `update/lr` (lite: `grpo_actor/lr`).
            ("train/lr", 1.0),
            ("train_lr_1e_3", 0.001),
            ("train/lr-pg_0", 1.0),
            ("LR", 1.0),
            ("update/lr", 1.0),
            ("grpo_actor/lr", 1.0),
        ],
    ),
    (
        "grad_norm",
        &[
            ("grad_norm", 1.0),
            ("actor/grad_norm", 1.0),
            ("norm", 1.0),
            ("trainer/grad_norm/mean", 1.0),
            ("train/grad_norm", 1.0),
            ("update/grad_norm", 1.0),
            ("grpo_actor/grad_norm", 1.0),
        ],
    ),
];

/// The cockpit's standard series a record also writes, where the framework's metric means the
/// same: `loss`, `step_time_ms`, `tokens_per_s`, `lr`, `grad_norm` (training steps only).
pub fn standard(record: &Record) -> Vec<(&'static str, f64)> {
    if record.kind != RecordKind::Step {
        return Vec::new();
    }
    let get = |name: &str| record.metrics.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    STANDARD
        .iter()
        .filter_map(|(standard, sources)| {
            sources.iter().find_map(|(source, scale)| get(source).map(|v| (*standard, v * scale)))
        })
        .collect()
}
