//! The agent's helpers for SSH launchers: `agent start` (start the agent detached and say when
//! it is ready), `agent connect` (bridge the exec channel's stdio to the agent socket) and
//! `agent checkpoint` (choose a checkpoint on this node for a resume).
use crate::paths::RunDirPaths;
use anyhow::Context;
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub use crate::protocol::spec::NO_AGENT_EXIT;

/// The file where an agent hosting the rendezvous store writes the port it bound.
pub fn port_file(paths: &RunDirPaths) -> PathBuf {
    paths.root.join("rendezvous.port")
}

/// `flightdeck agent start --run-dir DIR`: starts the agent in its own session (so it outlives
/// this SSH session), waits for its "ready" line, prints `ready PID STORE_PORT PROGRAM_PORT`
/// and exits.
pub fn start(run_dir: PathBuf) -> anyhow::Result<i32> {
    let paths = RunDirPaths::new(run_dir);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(paths.agent_log())
        .with_context(|| format!("opening {}", paths.agent_log().display()))?;
    let mut cmd = Command::new(std::env::current_exe().context("locating the flightdeck executable")?);
    cmd.arg("agent").arg("--run-dir").arg(&paths.root).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    crate::detach::new_session(&mut cmd);
    let mut child = cmd.spawn().context("starting the agent")?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        std::io::BufReader::new(out).read_line(&mut line)?;
    }
    if line.trim() != "ready" {
        let _ = child.wait();
        let tail = std::fs::read_to_string(paths.agent_log()).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect();
        anyhow::bail!("the agent exited before it was ready; {}: {}", paths.agent_log().display(), tail.join(" | "));
    }
    // `STORE_PORT PROGRAM_PORT` from an agent hosting the store; nothing from the others.
    let ports = std::fs::read_to_string(port_file(&paths)).unwrap_or_default();
    let mut ports = ports.split_whitespace().map(|p| p.parse::<u16>().unwrap_or(0));
    let (store, program) = (ports.next().unwrap_or(0), ports.next().unwrap_or(0));
    println!("ready {} {store} {program}", child.id());
    // The agent is not waited for: it lives on, adopted by init, after this process exits.
    Ok(0)
}

/// `flightdeck agent connect --run-dir DIR`: copies stdin to the agent socket and the socket to
/// stdout, until either side ends. The frames pass through untouched.
pub fn connect(run_dir: PathBuf) -> anyhow::Result<i32> {
    let paths = RunDirPaths::new(run_dir);
    let sock = match std::os::unix::net::UnixStream::connect(paths.agent_socket()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("no agent at {}: {e} (the run's agent has exited)", paths.agent_socket().display());
            return Ok(NO_AGENT_EXIT);
        }
    };
    let mut up = sock.try_clone()?;
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if up.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        // The server hung up: so does this link; the agent keeps its frames for the next one.
        let _ = up.shutdown(std::net::Shutdown::Both);
        std::process::exit(0);
    });
    let mut down = sock;
    let mut stdout = std::io::stdout().lock();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match down.read(&mut buf) {
            Ok(0) | Err(_) => return Ok(0),
            Ok(n) => {
                // stdout is line-buffered; frames are binary, so flush every chunk.
                if stdout.write_all(&buf[..n]).and_then(|_| stdout.flush()).is_err() {
                    return Ok(0);
                }
            }
        }
    }
}

/// `flightdeck agent checkpoint --root ROOT [--step N]`: `store::checkpoints::choose` on this
/// node, printed as one JSON line, `{"Ok": Chosen}` or `{"Err": "why"}`; exits 0 either way
/// (the answer is the line).
pub fn checkpoint(root: &std::path::Path, step: Option<u64>) -> i32 {
    let chosen = crate::store::checkpoints::choose(root, step).map_err(|e| e.to_string());
    match serde_json::to_string(&chosen) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("flightdeck agent checkpoint: {e}");
            1
        }
    }
}
