//! Starting a long-lived helper process (the server, an agent) in its own session, and waiting
//! for the one "ready" line it prints once it serves.
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Spawns `cmd` detached (new session, stdin closed, stderr to `stderr_log`) and returns whether
/// its first stdout line was `ready` (or the `error: WHY` it said instead). The child is reaped by a thread, so it never lingers as a
/// zombie while the caller lives; it outlives the caller otherwise.
pub fn spawn_until_ready(mut cmd: Command, stderr_log: &std::path::Path) -> std::io::Result<Ready> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(stderr_log)?;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    new_session(&mut cmd);
    let mut child = cmd.spawn()?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        std::io::BufReader::new(out).read_line(&mut line)?;
    }
    std::thread::spawn(move || child.wait());
    Ok(match line.trim() {
        "ready" => Ready::Yes,
        said => Ready::No(said.strip_prefix("error: ").map(str::to_string)),
    })
}

/// What a detached process said on its first line.
#[derive(Debug, PartialEq)]
pub enum Ready {
    Yes,
    /// It exited or said something else; `error: WHY` gives the why.
    No(Option<String>),
}

/// Makes `cmd` start in its own session: it survives the caller, the terminal and an SSH
/// session's hangup.
pub fn new_session(cmd: &mut Command) {
    // SAFETY: setsid is async-signal-safe and touches no parent memory.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The last `n` lines of a log file, joined for an error message.
pub fn log_tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(n)..];
    if tail.is_empty() {
        "(no output)".into()
    } else {
        tail.join(" | ")
    }
}
