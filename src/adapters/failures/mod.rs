//! Failures any job prints, read as events with fields: c10d, NCCL, CUDA, Xid, tracebacks, Slurm, torchrun.
//!
//! PyTorch c10d (NCCL and gloo), NCCL
//! itself, CUDA, GPU Xid lines, Python tracebacks, Slurm, torchrun/elastic. One file per family:
//!
//! - `c10d.rs`: `ProcessGroupNCCL`'s watchdog, heartbeat monitor, desync report and teardown,
//!   the store and network errors of `torch.distributed` (1.8 to 2.11).
//! - `nccl.rs`: `NCCL WARN` lines of every transport, `NCCL INFO` init lines (kind `info`),
//!   PyTorch's `NCCL error in: FILE:LINE, REASON, NCCL version V` (NCCL 2.4 to 2.28).
//! - `cuda.rs`: the caching allocator's out-of-memory (every wording since 1.0), `CUDA error: …`,
//!   cuBLAS/cuDNN status errors, device-side asserts, the kernel's `NVRM: Xid` lines.
//! - `gloo.rs`: gloo's `[enforce fail at …]` and `[FILE:LINE] …` transport errors.
//! - `slurm.rs`: srun's task exits, slurmstepd's `*** … CANCELLED … ***` and OOM kills (17.11 to 25.11).
//! - `torchrun.rs`: `ChildFailedError`'s report (1.9's and 1.10+'s layouts) and the elastic
//!   agent's own lines.
//! - `traceback.rs`: a Python traceback (chained ones too): the last exception is the reason,
//!   with the innermost frame of user code.
//!
//! `push` is called on every line of every log, so each family is behind a cheap substring
//! gate. Multi-line states (torchrun's block, a traceback) are bounded.
use super::{Label, Record, RecordKind};
use crate::adapters::value::Scan;

mod c10d;
mod cuda;
mod gloo;
mod nccl;
mod slurm;
#[cfg(test)]
mod tests;
mod torchrun;
mod traceback;

#[derive(Debug, Default)]
pub struct Failures {
    block: Option<torchrun::Block>,
    traceback: Option<traceback::Traceback>,
    /// Records a line completed without being a failure's own (a traceback's exception, held
    /// to see that no chained one follows, ends at the next other line): given with the next
    /// line that is a failure's, at `finish`, or at once through `take_ready`.
    ready: Vec<Record>,
}

impl Failures {
    /// Reads one line; `None` when it is not a failure's (so the metric adapters may read it).
    pub fn push(&mut self, line: u64, text: &str) -> Option<Vec<Record>> {
        let mut out = std::mem::take(&mut self.ready);
        if let Some(block) = &mut self.block {
            match block.push(line, text) {
                torchrun::Step::Took(records) => {
                    if block.done() {
                        self.block = None;
                    }
                    return Some(records);
                }
                torchrun::Step::Ended(records) => {
                    self.block = None;
                    out = records;
                }
            }
        }
        if let Some(tb) = &mut self.traceback {
            match tb.push(line, text) {
                traceback::Step::Took => return Some(out),
                traceback::Step::Pass => return self.single(line, text, out),
                traceback::Step::Done(record) => {
                    self.traceback = None;
                    out.push(record);
                }
                traceback::Step::Child => {
                    self.traceback = None;
                    self.block = Some(torchrun::Block::new(line));
                    return Some(out);
                }
                traceback::Step::Drop => self.traceback = None,
            }
        }
        if let Some(prefix) = traceback::opens(text) {
            self.traceback = Some(traceback::Traceback::new(line, text, prefix));
            return Some(out);
        }
        if torchrun::opens(text) {
            self.block = Some(torchrun::Block::new(line));
            return Some(out);
        }
        self.single(line, text, out)
    }

    /// The records still open when the stream ends (a block's last entry, a traceback's exception).
    pub fn finish(&mut self) -> Vec<Record> {
        let mut out = std::mem::take(&mut self.ready);
        out.extend(self.block.take().map(torchrun::Block::finish).unwrap_or_default());
        out.extend(self.traceback.take().and_then(traceback::Traceback::finish));
        out
    }

    /// Records the last `push` completed while answering `None` (the line was not a failure's,
    /// so the metric adapters read it): a reader gives them before that line's records. A reader
    /// that never asks gets them with the next failure line or at `finish`.
    pub fn take_ready(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.ready)
    }

    /// A line read alone; `out` holds what an ended multi-line record gave.
    fn single(&mut self, line: u64, text: &str, mut out: Vec<Record>) -> Option<Vec<Record>> {
        match classify(line, text) {
            Some(Read::Record(r)) => out.push(r),
            Some(Read::Consumed) => {}
            None => {
                // Not a failure's line: the metric adapters read it; what ended before it waits.
                self.ready = out;
                return None;
            }
        }
        Some(out)
    }
}

/// What one line says on its own.
pub enum Read {
    Record(Record),
    /// A line of a failure family that gives no record (`NCCL INFO` chatter): kept from the metric adapters.
    Consumed,
}

/// Reads one line alone: the families, each behind a cheap gate, then exception types.
pub fn classify(line: u64, t: &str) -> Option<Read> {
    if t.len() < 6 {
        return None;
    }
    let mut r = classify_families(line, t)?;
    if let Read::Record(rec) = &mut r {
        if rec.label("error").is_none() {
            if let Some(ty) = exception_type_in(t) {
                rec.labels.push(("error".into(), Label::Text(ty.to_string())));
            }
        }
    }
    Some(r)
}

/// Which of a few rare bytes a line holds (the capitals and marks the failure phrases are made
/// of), as a 32-bit set made in one table-driven pass: each family's gate asks for the bytes its
/// phrases need before any substring search, so an ordinary line costs one pass.
#[derive(Clone, Copy)]
pub(crate) struct Bytes(u32);

const RARE: &[u8; 32] = b"NCLRWTEIUXADSJGBKOFPHM*`#([\'xvw:";

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < RARE.len() {
        table[RARE[i] as usize] = 1 << i;
        i += 1;
    }
    table
};

impl Bytes {
    pub(crate) fn of(t: &str) -> Bytes {
        let mut mask = 0u32;
        for &b in t.as_bytes() {
            mask |= TABLE[b as usize];
        }
        Bytes(mask)
    }

    /// `b` must be one of `RARE`.
    pub(crate) fn has(&self, b: u8) -> bool {
        self.0 & TABLE[b as usize] != 0
    }

    pub(crate) fn all(&self, bytes: &[u8]) -> bool {
        bytes.iter().all(|b| self.has(*b))
    }

    /// A capital letter among `RARE`'s.
    pub(crate) fn upper(&self) -> bool {
        self.0 & ((1 << 22) - 1) != 0
    }
}

/// The exception type a line names before its message (`RuntimeError: …`, also behind a
/// prefix no wrapper took off: `node-7: torch.OutOfMemoryError: …`).
fn exception_type_in(t: &str) -> Option<&str> {
    for (i, _) in t.match_indices(": ").take(4) {
        let head = &t[..i];
        let word = head.rsplit(|c: char| c.is_whitespace()).next().unwrap_or(head);
        if let Some((ty, _)) = traceback::exception_line(word, false) {
            return Some(ty);
        }
    }
    None
}

pub(crate) fn classify_families(line: u64, t: &str) -> Option<Read> {
    let b = Bytes::of(t);
    let nccl = b.all(b"NCL") && t.contains("NCCL");
    if nccl {
        if let Some(r) = nccl::parse(line, t) {
            return Some(r);
        }
    }
    if nccl || b.has(b'R') || b.has(b'T') {
        if let Some(r) = c10d::parse(line, t, &b, nccl) {
            return Some(Read::Record(r));
        }
    }
    if nccl {
        if let Some(r) = nccl::error(line, t) {
            return Some(Read::Record(r));
        }
    }
    if b.has(b'v') && (b.has(b'[') || b.has(b'D')) && t.contains("ollective") {
        if let Some(r) = c10d::desync(line, t) {
            return Some(Read::Record(r));
        }
    }
    if let Some(r) = cuda::parse(line, t, &b) {
        return Some(Read::Record(r));
    }
    if let Some(r) = slurm::parse(line, t, &b) {
        return Some(Read::Record(r));
    }
    if b.all(b"x(") || b.all(b"SG") || b.has(b'R') {
        if let Some(r) = torchrun::parse(line, t, &b) {
            return Some(Read::Record(r));
        }
    }
    if b.all(b"[:") && t.contains("loo") {
        if let Some(r) = gloo::parse(line, t) {
            return Some(Read::Record(r));
        }
    }
    if b.has(b'T') || b.all(b"DSE") {
        if let Some(r) = c10d::store_or_network(line, t) {
            return Some(Read::Record(r));
        }
    }
    if b.has(b'(') || b.has(b'\'') {
        if let Some(r) = cpp_exception(line, t, &b) {
            return Some(r);
        }
    }
    if !(b.has(b'E') || b.has(b'I')) {
        return None;
    }
    let (ty, msg) = traceback::exception_line(t, false)?;
    traceback::by_type(line, ty, msg, false).map(Read::Record)
}

/// `terminate called after throwing an instance of 'c10::DistBackendError'`, and the `what():`
/// line after it, read by what it says.
fn cpp_exception(line: u64, t: &str, b: &Bytes) -> Option<Read> {
    let body = t.trim_start();
    if let Some(what) = body.strip_prefix("what():") {
        let what = what.trim();
        return match classify_families(line, what)? {
            Read::Record(r) => Some(Read::Record(r)),
            Read::Consumed => None,
        };
    }
    if !(b.has(b'\'') && t.contains("terminate called ")) {
        return None;
    }
    let rest = after(t, "terminate called ")?;
    let mut r = event(line, "cpp_exception");
    if let Some(ty) = rest.strip_prefix("after throwing an instance of '") {
        r.text("error", ty.split('\'').next().unwrap_or(ty));
    } else {
        r.text("reason", &format!("terminate called {}", rest.trim()));
    }
    Some(Read::Record(r))
}

// ---- helpers shared by the families ----

pub(crate) fn event(line: u64, name: &str) -> Record {
    let mut r = Record::at(line, RecordKind::Event);
    r.labels.push(("event".into(), Label::Text(name.into())));
    r
}

pub(crate) fn info(line: u64, name: &str) -> Record {
    let mut r = Record::at(line, RecordKind::Info);
    r.labels.push(("event".into(), Label::Text(name.into())));
    r
}

pub(crate) trait Put {
    fn text(&mut self, key: &str, value: &str);
    fn int(&mut self, key: &str, value: i64);
    fn metric(&mut self, key: &str, value: f64);
    /// `value` as an integer label when it is one.
    fn int_of(&mut self, key: &str, value: &str) {
        if let Some(v) = whole(value) {
            self.int(key, v);
        }
    }
}

impl Put for Record {
    fn text(&mut self, key: &str, value: &str) {
        if !value.is_empty() && self.label(key).is_none() {
            self.labels.push((key.into(), Label::Text(value.into())));
        }
    }
    fn int(&mut self, key: &str, value: i64) {
        if self.label(key).is_none() {
            self.labels.push((key.into(), Label::Int(value)));
        }
    }
    fn metric(&mut self, key: &str, value: f64) {
        if !self.metrics.iter().any(|(k, _)| k == key) {
            self.metrics.push((key.into(), value));
        }
    }
}

/// What follows the first `pat` in `s`.
pub(crate) fn after<'a>(s: &'a str, pat: &str) -> Option<&'a str> {
    s.at(pat).map(|i| &s[i + pat.len()..])
}

/// What lies between the first `a` and the next `b` after it.
pub(crate) fn between<'a>(s: &'a str, a: &str, b: &str) -> Option<&'a str> {
    let rest = after(s, a)?;
    rest.at(b).map(|i| &rest[..i])
}

/// A whole integer (optionally negative) and nothing else.
pub(crate) fn whole(s: &str) -> Option<i64> {
    let s = s.trim();
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || digits.len() > 18 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// The integer (optionally negative) at the start of `s`, and the rest.
pub(crate) fn lead_int(s: &str) -> Option<(i64, &str)> {
    let neg = s.starts_with('-');
    let digits = if neg { &s[1..] } else { s };
    let end = digits.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    if end == 0 || end > 18 {
        return None;
    }
    let v: i64 = digits[..end].parse().ok()?;
    Some((if neg { -v } else { v }, &digits[end..]))
}

/// The number at the start of `s` (`600012`, `1.5`), and the rest.
pub(crate) fn lead_num(s: &str) -> Option<(f64, &str)> {
    let end = s.bytes().position(|b| !(b.is_ascii_digit() || b == b'.')).unwrap_or(s.len());
    if end == 0 {
        return None;
    }
    Some((s[..end].parse().ok()?, &s[end..]))
}

/// A signal's number from its name (`SIGKILL` → 9), Linux numbering.
pub(crate) fn signal_number(name: &str) -> Option<i64> {
    SIGNALS.iter().find(|(n, _, _)| *n == name).map(|(_, v, _)| *v)
}

/// A signal's name from its number (9 → `SIGKILL`).
pub(crate) fn signal_name(number: i64) -> Option<&'static str> {
    SIGNALS.iter().find(|(_, v, _)| *v == number).map(|(n, _, _)| *n)
}

/// A signal from `strsignal`'s words (`Killed` → `SIGKILL`), as srun prints them.
pub(crate) fn signal_from_words(words: &str) -> Option<(&'static str, i64)> {
    SIGNALS.iter().find(|(_, _, w)| *w == words).map(|(n, v, _)| (*n, *v))
}

const SIGNALS: [(&str, i64, &str); 20] = [
    ("SIGHUP", 1, "Hangup"),
    ("SIGINT", 2, "Interrupt"),
    ("SIGQUIT", 3, "Quit"),
    ("SIGILL", 4, "Illegal instruction"),
    ("SIGTRAP", 5, "Trace/breakpoint trap"),
    ("SIGABRT", 6, "Aborted"),
    ("SIGBUS", 7, "Bus error"),
    ("SIGFPE", 8, "Floating point exception"),
    ("SIGKILL", 9, "Killed"),
    ("SIGUSR1", 10, "User defined signal 1"),
    ("SIGSEGV", 11, "Segmentation fault"),
    ("SIGUSR2", 12, "User defined signal 2"),
    ("SIGPIPE", 13, "Broken pipe"),
    ("SIGALRM", 14, "Alarm clock"),
    ("SIGTERM", 15, "Terminated"),
    ("SIGSTKFLT", 16, "Stack fault"),
    ("SIGCHLD", 17, "Child exited"),
    ("SIGCONT", 18, "Continued"),
    ("SIGSTOP", 19, "Stopped (signal)"),
    ("SIGXCPU", 24, "CPU time limit exceeded"),
];
