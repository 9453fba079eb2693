//! Python tracebacks (CPython 3.6 to 3.14): the exception's type and message and the innermost frame of user code.
//!
//! `traceback.py`'s format: `Traceback (most recent call
//! last):`, frames `  File "PATH", line N, in FUNC` with their code (and 3.11+'s `^^^^` marks),
//! then the exception line `TYPE: MESSAGE`. Chained exceptions (`During handling of the above
//! exception, another exception occurred:`, `The above exception was the direct cause of the
//! following exception:`) and `torch.multiprocessing.spawn`'s `-- Process N terminated with the
//! following error:` continue the same record: the last exception is the reason.
//!
//! One record per traceback, from its first line to its exception line (`end_line`): the
//! exception read by what it says (an NCCL error, a CUDA error, a store timeout, … see the other
//! families) or by its type (`DistBackendError`, `SignalException`, …), else `python_exception`;
//! with `error` (the type as printed), `reason` (the message), and the innermost frame of user
//! code (`file`, `src_line`, `func`: frames under `site-packages`, `dist-packages`,
//! `lib/pythonX.Y/`, `torch/` or `<frozen …>` are not the user's). The state is bounded: a
//! traceback that does not end within `MAX_LINES` is dropped.
use super::{event, lead_int, Put};
use crate::adapters::value::Scan;
use crate::adapters::{Label, Record};

const OPENER: &str = "Traceback (most recent call last):";
/// Lines a traceback may run before it is dropped (deep recursion prints `[Previous line repeated N more times]`).
const MAX_LINES: u64 = 5_000;
/// Lines of a multi-line message after the exception line (NCCL's `ncclSystemError: …`, `Last error:`, …).
const MAX_CONTINUATION: u32 = 8;

/// `Traceback (most recent call last):`, alone or after a logger's prefix (which the
/// traceback's other lines may repeat): the prefix's length.
pub(super) fn opens(text: &str) -> Option<usize> {
    let t = text.trim_end();
    let head = t.strip_suffix(OPENER)?;
    (head.trim().is_empty() || head.ends_with(' ')).then_some(if head.trim().is_empty() { 0 } else { head.len() })
}

#[derive(Debug)]
pub(super) struct Traceback {
    start: u64,
    /// The last line that was the traceback's.
    last: u64,
    /// A logger's prefix before `Traceback`, stripped from the lines that repeat it.
    prefix: String,
    frame: Option<(String, i64, String)>,
    /// Code lines since the last `File` line (a frame prints its code and 3.11's marks under it).
    code: u8,
    phase: Phase,
    /// A chain's earlier exception, the record if the next traceback never ends.
    previous: Option<Record>,
    process: Option<i64>,
}

#[derive(Debug)]
enum Phase {
    Frames,
    /// The exception line was read: held until it is certain no chained exception follows.
    Held {
        record: Record,
        blanks: u32,
        continuation: u32,
        last_error: bool,
    },
    /// Between a chain's separator and the next `Traceback`.
    Chain,
}

pub(super) enum Step {
    /// The line was the traceback's.
    Took,
    /// A line of another stream between the frames: read it alone, the traceback goes on.
    Pass,
    /// The traceback ended before this line: its record; read the line anew.
    Done(Record),
    /// The exception is torchrun's `ChildFailedError`: its report follows.
    Child,
    /// Not a traceback after all (or too long): read the line anew.
    Drop,
}

/// Lines without one of the traceback's before it is given up.
const MAX_GAP: u64 = 200;

impl Traceback {
    pub(super) fn new(start: u64, text: &str, prefix: usize) -> Traceback {
        Traceback {
            start,
            last: start,
            prefix: text.get(..prefix).unwrap_or("").to_string(),
            frame: None,
            code: 0,
            phase: Phase::Frames,
            previous: None,
            process: None,
        }
    }

    pub(super) fn finish(self) -> Option<Record> {
        match self.phase {
            Phase::Held { record, .. } => Some(record),
            _ => self.previous,
        }
    }

    /// The traceback ends here without its exception: the chain's earlier one, if any.
    fn give_up(&mut self) -> Step {
        match std::mem::replace(&mut self.phase, Phase::Frames) {
            Phase::Held { record, .. } => Step::Done(record),
            _ => self.previous.take().map_or(Step::Drop, Step::Done),
        }
    }

    pub(super) fn push(&mut self, line: u64, text: &str) -> Step {
        if line.saturating_sub(self.start) > MAX_LINES || line.saturating_sub(self.last) > MAX_GAP {
            return self.give_up();
        }
        let mut t = text.trim_end();
        if !self.prefix.is_empty() {
            if let Some(rest) = t.strip_prefix(self.prefix.as_str()) {
                t = rest;
            }
        }
        let step = match &mut self.phase {
            Phase::Frames => self.frames(line, t),
            Phase::Held { blanks, continuation, last_error, .. } => {
                if t.is_empty() {
                    *blanks += 1;
                    if *blanks > 2 {
                        return self.give_up();
                    }
                    Step::Took
                } else if t == "During handling of the above exception, another exception occurred:"
                    || t == "The above exception was the direct cause of the following exception:"
                {
                    self.chain()
                } else if let Some(n) =
                    t.strip_prefix("-- Process ").and_then(|s| s.strip_suffix(" terminated with the following error:"))
                {
                    self.process = super::whole(n);
                    self.chain()
                } else if *blanks == 0
                    && *continuation < MAX_CONTINUATION
                    && (t.starts_with("nccl") && t.has("Error: ") || t == "Last error:" || *last_error)
                {
                    // NCCL's message goes on: `ncclSystemError: …`, `Last error:`, and the error it names.
                    *last_error = t == "Last error:";
                    *continuation += 1;
                    Step::Took
                } else {
                    return self.give_up();
                }
            }
            Phase::Chain => {
                if t.is_empty() {
                    Step::Took
                } else if t.trim() == OPENER {
                    self.phase = Phase::Frames;
                    self.frame = None;
                    self.code = 0;
                    Step::Took
                } else {
                    return self.give_up();
                }
            }
        };
        if matches!(step, Step::Took) {
            self.last = line;
        }
        step
    }

    fn chain(&mut self) -> Step {
        if let Phase::Held { record, .. } = std::mem::replace(&mut self.phase, Phase::Chain) {
            self.previous = Some(record);
        }
        Step::Took
    }

    fn frames(&mut self, line: u64, t: &str) -> Step {
        if t.is_empty() {
            return Step::Took;
        }
        if t.trim() == OPENER {
            // Another traceback before this one's exception: this one starts again.
            self.start = line;
            self.frame = None;
            self.code = 0;
            return Step::Took;
        }
        if let Some(frame) = t.trim_start().strip_prefix("File \"") {
            // A frame line (indented by two; a wrapper may have taken its indentation off).
            self.code = 0;
            if let Some(frame) = parse_frame(frame) {
                if is_user(&frame.0) {
                    self.frame = Some(frame);
                }
            }
            return Step::Took;
        }
        if t.starts_with(' ') || t.starts_with('\t') {
            if let Some(frame) = t.trim_start().strip_prefix("File \"") {
                self.code = 0;
                if let Some(frame) = parse_frame(frame) {
                    if is_user(&frame.0) {
                        self.frame = Some(frame);
                    }
                }
                return Step::Took;
            }
            // A frame's code and marks follow its `File` line; other indented lines are not the traceback's.
            if self.code < 4 && self.last + 1 == line {
                self.code += 1;
                return Step::Took;
            }
            return Step::Pass;
        }
        if t.starts_with("[Previous line repeated ") {
            return Step::Took;
        }
        let Some((ty, msg)) = exception_line(t, true) else { return Step::Pass };
        if ty.ends_with("ChildFailedError") && msg.trim().is_empty() {
            return Step::Child;
        }
        let mut r = match super::classify_families(line, t) {
            Some(super::Read::Record(r)) if r.kind == crate::adapters::RecordKind::Event => r,
            _ => by_type(line, ty, msg, true).unwrap_or_else(|| event(line, "python_exception")),
        };
        r.line = self.start;
        r.end_line = Some(line);
        r.text("error", ty);
        if matches!(r.label("event"), Some(Label::Text(e)) if e == "python_exception") {
            r.text("reason", msg.trim());
        }
        if let Some((file, src, func)) = &self.frame {
            // The user's frame says more than a C++ source location the message printed.
            r.labels.retain(|(k, _)| !matches!(k.as_str(), "file" | "src_line" | "func"));
            r.text("file", file);
            r.int("src_line", *src);
            r.text("func", func);
        }
        if let Some(p) = self.process {
            r.int("process", p);
        }
        self.previous = None;
        self.phase = Phase::Held { record: r, blanks: 0, continuation: 0, last_error: false };
        Step::Took
    }
}

/// `/job/train.py", line 12, in main` → (path, 12, main).
fn parse_frame(s: &str) -> Option<(String, i64, String)> {
    let (path, rest) = s.cut("\", line ")?;
    let (num, rest) = lead_int(rest)?;
    let func = rest.strip_prefix(", in ").unwrap_or("").trim();
    Some((path.to_string(), num, func.to_string()))
}

/// A frame's `PATH", line N, in FUNC` when it is the user's code.
pub(super) fn user_frame(s: &str) -> Option<(String, i64, String)> {
    parse_frame(s).filter(|f| is_user(&f.0))
}

/// A frame of the user's code: not a library's, the standard library's, PyTorch's or frozen.
fn is_user(path: &str) -> bool {
    let p = path.replace('\\', "/");
    !(p.starts_with('<')
        || p.has("site-packages/")
        || p.has("dist-packages/")
        || p.has("/lib/python")
        || p.starts_with("torch/")
        || p.has("/torch/"))
}

/// The exception line `TYPE: MESSAGE` (or a bare `TYPE`): a dotted identifier whose last part
/// names an exception. Inside a traceback (`lenient`) any CamelCase class counts; alone, only
/// names ending in `Error`, `Exception`, `Interrupt` or `Exit`.
pub(crate) fn exception_line(t: &str, lenient: bool) -> Option<(&str, &str)> {
    let (ty, msg) = match t.find(':') {
        Some(i) => (&t[..i], &t[i + 1..]),
        None => (t, ""),
    };
    if ty.is_empty() || ty.len() > 200 || !msg.is_empty() && !msg.starts_with(' ') {
        return None;
    }
    let plain = ty.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    let first = ty.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if !plain || !first || ty.ends_with('.') || ty.has("..") {
        return None;
    }
    let last = ty.rsplit('.').next().unwrap_or(ty);
    let named = ["Error", "Exception", "Interrupt", "Exit"].iter().any(|s| last.ends_with(s));
    let camel = last.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
        && last.bytes().any(|b| b.is_ascii_lowercase())
        && (ty.contains('.')
            || ["StopIteration", "StopAsyncIteration", "GeneratorExit", "Warning"].iter().any(|s| last.ends_with(s)));
    if named || lenient && camel {
        Some((ty, msg))
    } else {
        None
    }
}

/// An exception read by its type when its message names no family.
pub(super) fn by_type(line: u64, ty: &str, msg: &str, lenient: bool) -> Option<Record> {
    let last = ty.rsplit('.').next().unwrap_or(ty);
    let msg = msg.trim();
    let name = match last {
        "DistBackendError" => "dist_backend_error",
        "DistNetworkError" => "dist_network_error",
        "DistStoreError" => {
            if msg.has("imeout") || msg.has("imed out") {
                "store_timeout"
            } else {
                "store_error"
            }
        }
        "SignalException" => "signal_exception",
        "RendezvousTimeoutError" => "rendezvous_timeout",
        "RendezvousClosedError" | "RendezvousConnectionError" | "RendezvousError" | "RendezvousStateError" => {
            "rendezvous_error"
        }
        "ProcessExitedException" => "process_exited",
        "OutOfMemoryError" => "cuda_oom",
        _ if lenient => "python_exception",
        _ => return None,
    };
    let mut r = event(line, name);
    r.text("error", ty);
    match name {
        "signal_exception" => {
            // `Process 4243 got signal: 15`
            if let Some((pid, _)) = super::after(msg, "Process ").and_then(lead_int) {
                r.int("pid", pid);
            }
            if let Some(sig) = super::after(msg, "got signal: ") {
                super::torchrun::signal(&mut r, sig.trim());
            }
        }
        "process_exited" => {
            // `process 1 terminated with signal SIGABRT`, `process 0 terminated with exit code 1`
            if let Some((p, _)) = super::after(msg, "process ").and_then(lead_int) {
                r.int("process", p);
            }
            if let Some(sig) = super::after(msg, "terminated with signal ") {
                super::torchrun::signal(&mut r, sig.trim());
            }
            if let Some((code, _)) = super::after(msg, "terminated with exit code ").and_then(lead_int) {
                r.int("exit_code", code);
            }
        }
        _ => r.text("reason", msg),
    }
    Some(r)
}
