//! A rank's last error line: what it said as it died, picked out of its output as it goes by.
//!
//! Pure: the agent's forwarders (and `import`) feed it every line, stdout and stderr alike, and
//! when the rank exits its last pick is quoted in the `RankExited` event and the run's failure reason. The
//! lines it takes: the last line of a Python traceback (`RuntimeError: ...`, with PyTorch's
//! `[rankN]:` prefix stripped), an allocation failure (Rust's `memory allocation of N bytes
//! failed`, libtorch's `not enough memory`), a CUDA out-of-memory, a C++ exception's `what():`,
//! a Rust panic with its message, and this binary's own `flightdeck: ...` error line.

use crate::adapters::value::Scan;
/// A quoted error is cut to this many characters: a reason, not a log.
pub const MAX_ERROR_CHARS: usize = 300;

#[derive(Debug, Default)]
pub struct LastError {
    last: Option<String>,
    /// The previous line opened a two-line error (a panic, `terminate called`): this one says what.
    pending: Option<String>,
    lines: u64,
    /// `lines` when `last` was set.
    at: u64,
}

impl LastError {
    /// Looks at one line of the rank's output.
    pub fn line(&mut self, line: &str) {
        self.lines += 1;
        let line = strip_rank_prefix(line.trim_end());
        if let Some(opener) = self.pending.take() {
            let said = line.trim();
            let said = said.strip_prefix("what():").map(str::trim).unwrap_or(said);
            if !said.is_empty() {
                self.set(&format!("{opener}: {said}"));
                return;
            }
        }
        if line.starts_with("thread '") && line.has("' panicked at ") {
            // Rust prints the panic's place, then its message on the next line.
            let at = line.trim_end_matches(':');
            self.set(at);
            self.pending = Some(at.to_string());
        } else if line.starts_with("terminate called after throwing") {
            self.set(line);
            self.pending = Some(line.to_string());
        } else if is_error_line(line) {
            self.set(line);
        }
    }

    fn set(&mut self, line: &str) {
        let line = line.trim();
        let cut: String = line.chars().take(MAX_ERROR_CHARS).collect();
        self.last = Some(if cut.len() < line.len() { format!("{cut}…") } else { cut });
        self.at = self.lines;
    }

    pub fn get(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// How many lines came after the last error line (0: it was the last line).
    pub fn lines_since(&self) -> Option<u64> {
        self.last.as_ref().map(|_| self.lines - self.at)
    }
}

/// `[rank1]: RuntimeError: ...` → `RuntimeError: ...` (PyTorch prefixes a rank's traceback).
fn strip_rank_prefix(line: &str) -> &str {
    let Some(rest) = line.strip_prefix("[rank") else { return line };
    match rest.at("]:") {
        Some(end) if rest[..end].trim().bytes().all(|b| b.is_ascii_digit()) => rest[end + 2..].trim_start(),
        _ => line,
    }
}

fn is_error_line(line: &str) -> bool {
    is_alloc_or_exception(line) || is_failure(line)
}

/// A line the failure readers take for a failure (an `NCCL WARN`, srun's task exit, an Xid, a
/// device assert, a watchdog timeout…), not one of the lines that follow it as the process is
/// taken down (`closing signal`, `To avoid data inconsistency…`).
fn is_failure(line: &str) -> bool {
    const AFTERMATH: [&str; 7] = [
        "closing_signal",
        "death_signal",
        "process_teardown",
        "nccl_ops_failed",
        "dump_signal",
        "slurm_step_aborted",
        "cpp_exception",
    ];
    match super::failures::classify(0, line) {
        Some(super::failures::Read::Record(r)) if r.kind == super::RecordKind::Event => {
            !matches!(r.label("event"), Some(super::Label::Text(e)) if AFTERMATH.contains(&e.as_str()))
        }
        _ => false,
    }
}

fn is_alloc_or_exception(line: &str) -> bool {
    line.has("memory allocation of ") && line.ends_with(" failed")
        || line.has("CUDA out of memory")
        || line.has("not enough memory: you tried to allocate")
        || line.starts_with("flightdeck: ")
        || line.starts_with("Error: ")
        || is_python_exception(line)
}

/// The last line of a traceback: a dotted identifier ending in Error, Exception or Interrupt,
/// alone or followed by `: message`, at the start of the line.
fn is_python_exception(line: &str) -> bool {
    let name = line.split_once(':').map_or(line, |(name, _)| name);
    let plain = !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
    let starts = name.bytes().next().is_some_and(|b| b.is_ascii_alphabetic());
    let exceptional = ["Error", "Exception", "Interrupt"].iter().any(|s| name.ends_with(s));
    plain && starts && exceptional && (name.len() == line.len() || line[name.len()..].starts_with(':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(lines: &[&str]) -> Option<String> {
        let mut e = LastError::default();
        lines.iter().for_each(|l| e.line(l));
        e.get().map(str::to_string)
    }

    #[test]
    fn a_python_traceback_gives_its_last_line_without_the_rank_prefix() {
        let tb = [
            "[rank1]: Traceback (most recent call last):",
            "[rank1]:   File \"/job/train.py\", line 12, in <module>",
            "[rank1]:     x = torch.empty(30_000_000_000)",
            "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 111.76 GiB.",
            "step 3 loss 2.1",
        ];
        assert_eq!(
            last(&tb).as_deref(),
            Some("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 111.76 GiB.")
        );
        assert_eq!(last(&["KeyboardInterrupt"]).as_deref(), Some("KeyboardInterrupt"));
    }

    #[test]
    fn allocation_failures_panics_and_cpp_exceptions_are_taken() {
        let rust = ["memory allocation of 120000000000 bytes failed"];
        assert_eq!(last(&rust).as_deref(), Some("memory allocation of 120000000000 bytes failed"));
        let panic = ["thread 'main' panicked at src/worker/train.rs:10:5:", "index out of bounds"];
        assert_eq!(
            last(&panic).as_deref(),
            Some("thread 'main' panicked at src/worker/train.rs:10:5: index out of bounds")
        );
        let cpp = ["terminate called after throwing an instance of 'c10::Error'", "  what():  bad alloc"];
        assert_eq!(
            last(&cpp).as_deref(),
            Some("terminate called after throwing an instance of 'c10::Error': bad alloc")
        );
        let ours = ["flightdeck: worker: DefaultCPUAllocator: not enough memory: you tried to allocate 1 bytes."];
        assert_eq!(last(&ours).as_deref(), Some(ours[0]));
    }

    #[test]
    fn lines_that_only_mention_errors_are_not_taken() {
        let noise = [
            "UserWarning: this is deprecated",
            "error rate: 0.5",
            "{'loss': 0.5, 'grad_norm': 1.0}",
            "Errors: 0",
            "  File \"x.py\", line 3, in f",
            "[rankx]: ValueErrorish thing",
        ];
        assert_eq!(last(&noise), None);
    }

    #[test]
    fn failure_lines_of_nccl_slurm_and_the_gpu_are_taken_and_their_aftermath_is_not() {
        let warn = "node1:2840:2901 [0] misc/ibvwrap.cc:252 NCCL WARN Call to ibv_create_qp failed";
        assert_eq!(last(&[warn, "node1:2840:2901 [0] NCCL INFO Channel 00/02 :    0   1"]).as_deref(), Some(warn));
        let srun = "srun: error: node01: task 3: Exited with exit code 1";
        assert_eq!(last(&[srun, "Sending process 4244 closing signal SIGTERM"]).as_deref(), Some(srun));
        let timeout = "[E ProcessGroupNCCL.cpp:464] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, Timeout(ms)=10000) ran for 10917 milliseconds before timing out.";
        let after = [
            "[E ProcessGroupNCCL.cpp:478] Some NCCL operations have failed or timed out.",
            "To avoid data inconsistency, we are taking the entire process down.",
        ];
        assert_eq!(last(&[timeout, after[0], after[1]]).as_deref(), Some(timeout));
        assert_eq!(last(&["NCCL version 2.18.1+cuda12.1", "export NCCL_DEBUG=INFO"]), None);
    }

    #[test]
    fn a_long_error_is_cut_and_the_last_one_wins() {
        let long = format!("RuntimeError: {}", "x".repeat(2000));
        let got = last(&[&long]).unwrap_or_default();
        assert_eq!(got.chars().count(), MAX_ERROR_CHARS + 1);
        assert_eq!(last(&["ValueError: first", "OSError: second"]).as_deref(), Some("OSError: second"));
        let mut e = LastError::default();
        ["OSError: early", "step 1", "step 2"].iter().for_each(|l| e.line(l));
        assert_eq!(e.lines_since(), Some(2));
    }
}
