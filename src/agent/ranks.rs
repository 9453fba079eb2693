//! Starting one rank: the torchrun environment, its own process group, logs captured line by line.
use super::{AgentSpec, Input};
use crate::ids::Rank;
use crate::paths::RunDirPaths;
use crate::protocol::{AgentEvent, ExitStatus, Stream};
use crate::recipe::Kind;
use anyhow::Context;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Starts `rank` and the tasks that forward its output and its exit; returns its pid.
pub async fn spawn(
    spec: &AgentSpec,
    paths: &RunDirPaths,
    rank: Rank,
    local_rank: u32,
    tx: mpsc::Sender<Input>,
) -> anyhow::Result<u32> {
    let mut cmd = match (&spec.recipe.kind, &spec.recipe.command) {
        (Kind::Command, Some(c)) => {
            let mut cmd = tokio::process::Command::new(&c.argv[0]);
            cmd.args(&c.argv[1..]);
            cmd
        }
        _ => {
            let mut cmd = tokio::process::Command::new(&spec.exe);
            cmd.arg("worker");
            cmd
        }
    };
    let local_world = spec.ranks.len();
    cmd.env("RANK", rank.0.to_string())
        .env("LOCAL_RANK", local_rank.to_string())
        .env("WORLD_SIZE", spec.world_size.to_string())
        .env("LOCAL_WORLD_SIZE", local_world.to_string())
        .env("GROUP_RANK", "0")
        .env("MASTER_ADDR", &spec.master_addr)
        .env("MASTER_PORT", spec.program_port.to_string())
        // Flightdeck's own rendezvous store, on another port than the program's MASTER_PORT.
        .env("FLIGHTDECK_STORE_ADDR", &spec.master_addr)
        .env("FLIGHTDECK_STORE_PORT", spec.master_port.to_string())
        .env("TORCHELASTIC_RUN_ID", spec.run.as_str())
        .env("FLIGHTDECK_RUN", spec.run.as_str())
        .env("FLIGHTDECK_NODE", &spec.node)
        .env("FLIGHTDECK_RECIPE", paths.recipe())
        .env("FLIGHTDECK_TELEMETRY", paths.telemetry_socket())
        .env("FLIGHTDECK_RUN_DIR", &paths.root)
        .current_dir(&paths.root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    if let Some(dir) = &spec.resume_from {
        // A resumed run: every rank restores this checkpoint before its first step.
        cmd.env("FLIGHTDECK_RESUME_FROM", dir);
    }
    // SAFETY: prctl is async-signal-safe; the closure touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            // A rank never outlives its agent: nothing of a run is orphaned if the agent dies.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Under Yama's ptrace_scope = 1 only ancestors may attach; this lets the agent's
            // stack tools (its children) attach too. Fails harmlessly where Yama is absent.
            libc::prctl(libc::PR_SET_PTRACER, libc::getppid() as libc::c_ulong, 0, 0, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().with_context(|| format!("starting rank {rank} ({})", spec.exe.display()))?;
    let pid = child.id().unwrap_or(0);
    let log_path = paths.rank_log(rank.0);
    let log = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .await
        .with_context(|| format!("opening {}", log_path.display()))?;
    let log = std::sync::Arc::new(tokio::sync::Mutex::new(log));
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward_lines(out, rank, Stream::Stdout, log.clone(), tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward_lines(err, rank, Stream::Stderr, log, tx.clone()));
    }
    tokio::spawn(async move {
        let status = match child.wait().await {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(c), _) => ExitStatus::Code(c),
                (None, Some(sig)) => ExitStatus::Signal(sig),
                (None, None) => ExitStatus::Code(-1),
            },
            Err(e) => {
                tracing::warn!("waiting for rank {rank}: {e}");
                ExitStatus::Code(-1)
            }
        };
        let _ = tx.send(Input::Exited { rank, pid, status }).await;
    });
    Ok(pid)
}

/// Appends each line to the rank's log file and forwards it upstream.
async fn forward_lines<R: tokio::io::AsyncRead + Unpin>(
    pipe: R,
    rank: Rank,
    stream: Stream,
    log: std::sync::Arc<tokio::sync::Mutex<tokio::fs::File>>,
    tx: mpsc::Sender<Input>,
) {
    let mut lines = BufReader::new(pipe).lines();
    loop {
        match lines.next_line().await {
            Ok(Some(line)) => {
                {
                    let mut f = log.lock().await;
                    let _ = f.write_all(line.as_bytes()).await;
                    let _ = f.write_all(b"\n").await;
                }
                if tx.send(Input::Event(AgentEvent::Log { rank, stream, line })).await.is_err() {
                    return;
                }
            }
            Ok(None) => return,
            Err(e) => {
                // Not UTF-8 or a read error: say so once and stop following this pipe.
                tracing::warn!("rank {rank} {stream:?}: {e}");
                return;
            }
        }
    }
}
