//! torchrun / torch elastic: the `ChildFailedError` report and the agent's own failure lines.
//!
//! - The report (`torch/distributed/elastic/multiprocessing/errors/__init__.py`,
//!   `ChildFailedError.format_msg`), after `…ChildFailedError:`. 1.9: a `*` border, an `=` section
//!   rule, `Root Cause:` then `Other Failures:`, fields `time: …`, `rank: 0 (local_rank: 0)`,
//!   `exitcode: 1 (pid: 123)`, `error_file: …`, `msg: "…"`. 1.10+: an `=` border, a `-` section
//!   rule, `Failures:` then `Root Cause (first observed failure):`, fields `time      : …`,
//!   `host      : …`, `rank      : …`, `exitcode  : …`, `error_file: …`, `traceback : …` (a child's
//!   traceback indented under it when it recorded one). One `child_failed` per entry (`rank`,
//!   `local_rank`, `exit_code` or `signal` (negative exit code) with `signal_name`, `pid`, `host`,
//!   `program`, the child's `error` and `reason` from its traceback), `end_line`; the root cause
//!   has `root_cause` 1 and comes last, as 1.10+ prints it.
//! - `failed (exitcode: 1) local_rank: 0 (pid: 123) of binary: /usr/bin/python3`
//!   (`multiprocessing/api.py`, 1.9+): `elastic_worker_failed`.
//! - `Sending process 123 closing signal SIGTERM` (`closing_signal`), `Received 15 death signal,
//!   shutting down workers` / `Received Signals.SIGTERM death signal, …` (`death_signal`).
//! - `SignalException: Process 123 got signal: 15` (`signal_exception`), `RendezvousTimeoutError`
//!   (`rendezvous_timeout`), `RendezvousClosedError`/`RendezvousConnectionError: …`
//!   (`rendezvous_error`): read as exception lines in `traceback.rs`.
use super::{after, event, lead_int, signal_name, signal_number, Bytes, Put};
use crate::adapters::value::Scan;
use crate::adapters::{Label, Record};

/// A report longer than this is not torchrun's: it ends there.
const MAX_BLOCK_LINES: u64 = 20_000;

/// `…ChildFailedError:` (the report follows on the next lines).
pub(super) fn opens(text: &str) -> bool {
    text.ends_with("ChildFailedError:") && text.has("ChildFailedError")
}

#[derive(Debug)]
pub(super) struct Block {
    start: u64,
    program: Option<String>,
    entry: Option<Record>,
    /// The border's character (`=`, or `*` in 1.9); the second border closes the report.
    border: Option<char>,
    /// Under `Root Cause`: the entries that follow are the first observed failure.
    in_root: bool,
    /// The root cause's entry, held until the end (1.9 prints it first).
    root: Option<Record>,
    /// Inside an entry's traceback value.
    traceback: bool,
}

pub(super) enum Step {
    /// The line was the report's; these records are complete.
    Took(Vec<Record>),
    /// The report ended before this line (which is not the report's); these records are complete.
    Ended(Vec<Record>),
}

impl Block {
    pub(super) fn new(start: u64) -> Block {
        Block { start, program: None, entry: None, border: None, in_root: false, root: None, traceback: false }
    }

    /// The report's closing border was read.
    pub(super) fn done(&self) -> bool {
        self.start == 0
    }

    pub(super) fn finish(mut self) -> Vec<Record> {
        let mut out = Vec::new();
        self.flush(&mut out);
        out.extend(self.root.take());
        out
    }

    fn flush(&mut self, out: &mut Vec<Record>) {
        self.traceback = false;
        if let Some(mut r) = self.entry.take() {
            if self.in_root {
                r.labels.push(("root_cause".into(), Label::Int(1)));
                self.root = Some(r);
            } else {
                out.push(r);
            }
        }
    }

    pub(super) fn push(&mut self, line: u64, text: &str) -> Step {
        let mut out = Vec::new();
        if line.saturating_sub(self.start) > MAX_BLOCK_LINES {
            self.flush(&mut out);
            out.extend(self.root.take());
            return Step::Ended(out);
        }
        let t = text.trim();
        if let Some(c) = rule(t) {
            match self.border {
                None => self.border = Some(c),
                Some(b) if b == c => {
                    self.flush(&mut out);
                    out.extend(self.root.take());
                    // Done: the caller drops the block on the next line.
                    self.start = 0;
                    return Step::Took(out);
                }
                Some(_) => self.flush(&mut out),
            }
            return Step::Took(out);
        }
        if t.is_empty() || t == "<NO_OTHER_FAILURES>" || t == "Failures:" || t == "Other Failures:" {
            if t.ends_with(':') {
                self.flush(&mut out);
                self.in_root = false;
            }
            return Step::Took(out);
        }
        if t.starts_with("Root Cause") && t.ends_with(':') {
            self.flush(&mut out);
            self.in_root = true;
            return Step::Took(out);
        }
        if self.entry.is_none() && self.program.is_none() {
            if let Some(program) = t.strip_suffix(" FAILED") {
                self.program = Some(program.to_string());
                return Step::Took(out);
            }
        }
        if t.starts_with('[') && t.ends_with("]:") && super::whole(&t[1..t.len() - 2]).is_some() {
            self.flush(&mut out);
            let mut r = Record::at(line, crate::adapters::RecordKind::Event);
            r.end_line = Some(line);
            r.labels.push(("event".into(), Label::Text("child_failed".into())));
            if let Some(p) = &self.program {
                r.labels.push(("program".into(), Label::Text(p.clone())));
            }
            self.entry = Some(r);
            return Step::Took(out);
        }
        let indented = text.starts_with(' ') || text.starts_with('\t');
        let Some(entry) = &mut self.entry else {
            // Before any entry only the title may come (centered, so indented).
            return if indented { Step::Took(out) } else { self.end(out) };
        };
        let depth = text.len() - text.trim_start().len();
        if self.traceback && (indented || super::traceback::exception_line(t, true).is_some()) {
            // The child's traceback, indented two more: frames, code, its exception line.
            if let Some((file, src, func)) = t.strip_prefix("File \"").and_then(super::traceback::user_frame) {
                for key in ["file", "src_line", "func"] {
                    entry.labels.retain(|(k, _)| k != key);
                }
                entry.text("file", &file);
                entry.int("src_line", src);
                entry.text("func", &func);
            } else if let Some((ty, msg)) = super::traceback::exception_line(t, true) {
                // Printed two in (frames four, code six); a wrapper may have taken a space off.
                if depth < 4 {
                    entry.labels.retain(|(k, _)| k != "error" && k != "reason");
                    entry.text("error", ty);
                    entry.text("reason", msg.trim());
                }
            }
            entry.end_line = Some(line);
            return Step::Took(out);
        }
        if let Some((key, value)) = t.split_once(':') {
            if field(entry, key.trim(), value.trim()) {
                entry.end_line = Some(line);
                self.traceback = key.trim() == "traceback" && value.trim().starts_with("Traceback");
                return Step::Took(out);
            }
        }
        if indented {
            // 1.9's `msg:` JSON, a long value's continuation.
            return Step::Took(out);
        }
        self.end(out)
    }

    /// A line that is not the report's: the report ends before it.
    fn end(&mut self, mut out: Vec<Record>) -> Step {
        self.flush(&mut out);
        out.extend(self.root.take());
        Step::Ended(out)
    }
}

/// A rule line (`=====`, `-----`, `*****`): its character.
fn rule(t: &str) -> Option<char> {
    let c = t.chars().next()?;
    (matches!(c, '=' | '-' | '*') && t.len() >= 10 && t.chars().all(|x| x == c)).then_some(c)
}

/// One `key : value` line of an entry; false for a line that is not one of its fields.
fn field(r: &mut Record, key: &str, value: &str) -> bool {
    match key {
        "host" => r.text("host", value),
        "rank" => {
            // `1 (local_rank: 1)`
            let (rank, rest) = value.split_once(' ').unwrap_or((value, ""));
            r.int_of("rank", rank);
            if let Some(local) = after(rest, "local_rank:") {
                r.int_of("local_rank", local.trim().trim_end_matches(')'));
            }
        }
        "exitcode" => {
            // `1 (pid: 4243)`, or `-9 (pid: 4243)` for a signal.
            exit(r, value);
            if let Some(pid) = after(value, "pid:") {
                r.int_of("pid", pid.trim().trim_end_matches(')'));
            }
        }
        "traceback" | "msg" => {
            // `Signal 9 (SIGKILL) received by PID 4243`, 1.9's `"Signal 9 (SIGKILL) received by PID 4243"`
            let value = value.trim_matches('"');
            if value.starts_with("Signal ") {
                if let Some(name) = super::between(value, "(", ")") {
                    r.text("signal_name", name);
                }
            }
        }
        "time" | "error_file" => {}
        _ => return false,
    }
    true
}

/// An exit code: negative is the signal (`-9` → `signal` 9).
fn exit(r: &mut Record, value: &str) {
    if let Some((code, _)) = lead_int(value.trim()) {
        if code < 0 {
            r.int("signal", -code);
        } else {
            r.int("exit_code", code);
        }
    }
}

/// The elastic agent's one-line failures.
pub(super) fn parse(line: u64, t: &str, b: &Bytes) -> Option<Record> {
    if let Some(rest) = if b.all(b"x(") { after(t, "failed (exitcode: ") } else { None } {
        // `failed (exitcode: 1) local_rank: 0 (pid: 4243) of binary: /usr/bin/python3`
        let mut r = event(line, "elastic_worker_failed");
        exit(&mut r, rest);
        if let Some(Label::Int(n)) = r.label("signal").cloned() {
            if let Some(name) = signal_name(n) {
                r.text("signal_name", name);
            }
        }
        let (local, _) = after(rest, "local_rank: ").and_then(lead_int)?;
        r.int("local_rank", local);
        if let Some((pid, _)) = after(rest, "(pid: ").and_then(lead_int) {
            r.int("pid", pid);
        }
        if let Some(binary) = after(rest, " of binary: ") {
            r.text("program", binary.trim());
        }
        return Some(r);
    }
    if (b.all(b"SG") || b.has(b'R')) && t.has(" signal") {
        if let Some(rest) = after(t, "Sending process ") {
            // `Sending process 4244 closing signal SIGTERM`
            let (pid, rest) = lead_int(rest)?;
            let name = rest.strip_prefix(" closing signal ")?.trim();
            let mut r = event(line, "closing_signal");
            r.int("pid", pid);
            signal(&mut r, name);
            return Some(r);
        }
        if let Some(rest) = after(t, "Closing process ") {
            // 2.6+: `Closing process 293866 via signal SIGTERM`
            let (pid, rest) = lead_int(rest)?;
            let name = rest.strip_prefix(" via signal ")?.trim();
            let mut r = event(line, "closing_signal");
            r.int("pid", pid);
            signal(&mut r, name);
            return Some(r);
        }
        if let Some(rest) = after(t, "Received ") {
            // `Received 15 death signal, shutting down workers`, `Received Signals.SIGTERM death signal, …`
            let (sig, _) = rest.cut(" death signal, shutting down workers")?;
            let mut r = event(line, "death_signal");
            signal(&mut r, sig.trim_start_matches("Signals."));
            return Some(r);
        }
    }
    None
}

/// `SIGTERM`, `15` → `signal` and `signal_name`.
pub(super) fn signal(r: &mut Record, sig: &str) {
    if let Some(n) = super::whole(sig) {
        r.int("signal", n);
        if let Some(name) = signal_name(n) {
            r.text("signal_name", name);
        }
    } else if let Some(n) = signal_number(sig) {
        r.int("signal", n);
        r.text("signal_name", sig);
    } else if !sig.is_empty() {
        r.text("signal_name", sig);
    }
}
