//! One torchrun per node, which spawns the node's ranks: found among its children by the `RANK` in their environment, their output tailed, their exits read from its failure report.
//!
//! torchrun (`torch.distributed.run`, PyTorch 2.11) starts each worker with `Popen(...,
//! start_new_session=True)`, so every rank leads its own session and process group and can be
//! signalled like a rank the agent started itself. With `--redirects 3 --log-dir DIR` each
//! worker's stdout and stderr are files; the agent reads them (the paths are the worker's fds 1
//! and 2) into the rank's `Output`, exactly as it reads a pipe. torchrun's own output goes to
//! `logs/torchrun.log` and upstream as the node's first rank's lines. Only torchrun can wait
//! for its workers, so their exit statuses come from its `ChildFailedError` report (the
//! `failures` adapter): the ranks it names failed as it says; the others ended with torchrun
//! (0 when it succeeded, else stopped by it with SIGTERM). The rest of the agent sees `Started`
//! and `Exited` per rank, as for direct ranks.
use super::output::Output;
use super::ranks::{exit_status, log_choice, open_log, prepare, DRAIN};
use super::{AgentSpec, Input};
use crate::adapters::{Choice, Format, Label, LogReader, MAX_LINE_BYTES};
use crate::ids::Rank;
use crate::paths::RunDirPaths;
use crate::protocol::{ExitStatus, Stream};
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// How often torchrun's children are looked for while some rank is not found yet.
const DISCOVER: Duration = Duration::from_millis(100);
/// How often a rank's output file is read again once it has nothing new.
const TAIL_POLL: Duration = Duration::from_millis(50);
/// The pipe between a tailed file and the rank's `Output`.
const PIPE_BYTES: usize = 64 * 1024;

/// torchrun's command line for this node: its program (`argv[0]` when that is torchrun, else
/// `argv[0] -m torch.distributed.run`), the options from the spec, then the script and its
/// arguments. The recipe's check (`command_launch`) has refused options set here.
pub fn argv(spec: &AgentSpec, paths: &RunDirPaths, argv: &[String]) -> anyhow::Result<Vec<String>> {
    let nproc = spec.ranks.len() as u32;
    let first = spec.ranks.first().map(|(rank, _)| rank.0).context("this node runs no rank")?;
    // torchrun's static rendezvous numbers ranks node_rank × nproc + local_rank.
    let contiguous =
        spec.ranks.iter().enumerate().all(|(i, (rank, local))| rank.0 == first + i as u32 && *local == i as u32);
    if !contiguous || !first.is_multiple_of(nproc) || !spec.world_size.is_multiple_of(nproc) {
        anyhow::bail!(
            "torchrun numbers a node's ranks node_rank × {nproc} + local_rank, but this node runs ranks {:?} of {}",
            spec.ranks.iter().map(|(r, _)| r.0).collect::<Vec<_>>(),
            spec.world_size
        );
    }
    let (program, script) = match crate::recipe::torchrun_prefix_len(argv) {
        Some(k) => (argv[..k].to_vec(), &argv[k..]),
        None => (vec![argv[0].clone(), "-m".into(), "torch.distributed.run".into()], &argv[1..]),
    };
    let options = [
        ("--nnodes", (spec.world_size / nproc).to_string()),
        ("--nproc-per-node", nproc.to_string()),
        ("--node-rank", (first / nproc).to_string()),
        ("--master-addr", spec.master_addr.clone()),
        ("--master-port", spec.program_port.to_string()),
        ("--rdzv-id", spec.run.as_str().to_string()),
        ("--max-restarts", "0".into()),
        ("--log-dir", paths.root.join("torchrun").display().to_string()),
        ("--redirects", "3".into()),
    ];
    let mut out = program;
    for (key, value) in options {
        out.push(format!("{key}={value}"));
    }
    out.extend(script.iter().cloned());
    Ok(out)
}

/// Starts the node's torchrun and the task that finds, reads and ends its ranks; returns its pid.
pub async fn spawn(spec: &AgentSpec, paths: &RunDirPaths, tx: mpsc::Sender<Input>) -> anyhow::Result<u32> {
    let c = spec.recipe.command.as_ref().context("a torchrun launch needs a [command]")?;
    let argv = argv(spec, paths, &c.argv)?;
    let first = spec.ranks[0].0;
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    prepare(&mut cmd, spec, paths, first);
    // The shim ties each worker's life to torchrun's (PR_SET_PDEATHSIG), as `prepare` ties
    // torchrun's to the agent's.
    cmd.env("FLIGHTDECK_LAUNCHER", "torchrun");
    let mut child = cmd.spawn().with_context(|| format!("starting torchrun ({})", argv.join(" ")))?;
    let pid = child.id().unwrap_or(0);
    let choice = log_choice(spec);
    let own = Output::new(first, open_log(&paths.root.join("logs").join("torchrun.log"))?, choice, tx.clone());
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(own.clone().forward(out, Stream::Stdout)));
    }
    let failures = match child.stderr.take() {
        Some(err) => {
            let (write, read) = tokio::io::duplex(PIPE_BYTES);
            readers.push(tokio::spawn(own.clone().forward(read, Stream::Stderr)));
            tokio::spawn(failed_ranks(err, write))
        }
        None => tokio::spawn(async { Failed::default() }),
    };
    let mut ranks = BTreeMap::new();
    for &(rank, local_rank) in &spec.ranks {
        let output = Output::new(rank, open_log(&paths.rank_log(rank.0))?, choice, tx.clone());
        ranks.insert(rank, Worker { local_rank, output, pid: None });
    }
    let (ended, done) = watch::channel(false);
    let node = Node { torchrun: pid, ranks, own, readers, failures, done };
    tokio::spawn(node.supervise(child, ended, tx));
    Ok(pid)
}

/// One of the node's ranks as torchrun's child.
struct Worker {
    local_rank: u32,
    output: Output,
    /// Its pid once found.
    pid: Option<u32>,
}

/// What the supervising task owns.
struct Node {
    torchrun: u32,
    ranks: BTreeMap<Rank, Worker>,
    /// torchrun's own output.
    own: Output,
    /// The tasks reading output (torchrun's, then each rank's files).
    readers: Vec<JoinHandle<()>>,
    /// The ranks torchrun reports failed, once its stderr ends.
    failures: JoinHandle<Failed>,
    /// Turns true when torchrun has exited: the tailed files are then read to their end.
    done: watch::Receiver<bool>,
}

impl Node {
    /// Finds the ranks as torchrun starts them, waits for torchrun, then drains every output
    /// and reports each rank's exit (the failed ones first, so the run's reason is theirs).
    async fn supervise(
        mut self,
        mut child: tokio::process::Child,
        ended: watch::Sender<bool>,
        tx: mpsc::Sender<Input>,
    ) {
        let mut tick = tokio::time::interval(DISCOVER);
        let waited = loop {
            tokio::select! {
                waited = child.wait() => break waited,
                _ = tick.tick(), if self.ranks.values().any(|w| w.pid.is_none()) => {
                    for started in self.discover().await {
                        let _ = tx.send(started).await;
                    }
                }
            }
        };
        let status = exit_status(waited, "torchrun");
        let _ = ended.send(true);
        let readers = std::mem::take(&mut self.readers);
        let _ = tokio::time::timeout(DRAIN, async {
            for task in readers {
                let _ = task.await;
            }
        })
        .await;
        let failed =
            tokio::time::timeout(DRAIN, &mut self.failures).await.ok().and_then(Result::ok).unwrap_or_default();
        // A worker torchrun left behind (it was killed before it could stop them) goes now.
        for pid in self.ranks.values().filter_map(|w| w.pid) {
            // SAFETY: kill(2) on a process group; no memory is touched.
            unsafe {
                libc::kill(-(pid as i32), libc::SIGKILL);
            }
        }
        // The first observed failure first, so the run's reason and `dead` verdict are its.
        let mut order: Vec<&Rank> = self.ranks.keys().collect();
        order.sort_by_key(|rank| (failed.root != Some(rank.0), !failed.statuses.contains_key(&rank.0)));
        for rank in order {
            let worker = &self.ranks[rank];
            let status = match failed.statuses.get(&rank.0) {
                Some(own) => own.clone(),
                None if status.success() => status.clone(),
                // torchrun stops the rest of its workers with SIGTERM when one fails.
                None if !failed.statuses.is_empty() => ExitStatus::Signal(libc::SIGTERM),
                None => status.clone(),
            };
            let last_error = match worker.pid {
                Some(_) => worker.output.last_error(),
                None => self.own.last_error(),
            };
            let pid = worker.pid.unwrap_or(self.torchrun);
            let _ = tx.send(Input::Exited { rank: *rank, pid, status, last_error }).await;
        }
    }

    /// torchrun's children that are ranks of this node and were not found before: each gets
    /// readers on its output files and is reported `Started`.
    async fn discover(&mut self) -> Vec<Input> {
        let torchrun = self.torchrun;
        let found = tokio::task::spawn_blocking(move || children_with_rank(Path::new("/proc"), torchrun))
            .await
            .unwrap_or_default();
        let mut started = Vec::new();
        for (pid, rank) in found {
            let Some(worker) = self.ranks.get_mut(&Rank(rank)).filter(|w| w.pid.is_none()) else { continue };
            worker.pid = Some(pid);
            for (fd, stream) in [(1, Stream::Stdout), (2, Stream::Stderr)] {
                match std::fs::read_link(format!("/proc/{pid}/fd/{fd}")) {
                    Ok(path) if path.is_file() => {
                        let (write, read) = tokio::io::duplex(PIPE_BYTES);
                        self.readers.push(tokio::spawn(worker.output.clone().forward(read, stream)));
                        self.readers.push(tokio::spawn(tail(path, self.done.clone(), write)));
                    }
                    Ok(path) => tracing::warn!(
                        "rank {rank}'s fd {fd} is {}, not a file: its output is not read",
                        path.display()
                    ),
                    Err(e) => tracing::warn!("rank {rank} (pid {pid}): reading its fd {fd}: {e}"),
                }
            }
            started.push(Input::Started { rank: Rank(rank), local_rank: worker.local_rank, pid });
        }
        started
    }
}

/// The processes whose parent is `parent` and whose environment has a `RANK`: `(pid, rank)`.
/// A child between fork and exec still has torchrun's environment, without `RANK`: it is
/// found at a later look.
fn children_with_rank(proc: &Path, parent: u32) -> Vec<(u32, u32)> {
    let Ok(entries) = std::fs::read_dir(proc) else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if parent_of(&stat) != Some(parent) {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if let Some(rank) = env_value(&environ, "RANK").and_then(|v| v.parse().ok()) {
            found.push((pid, rank));
        }
    }
    found
}

/// The parent pid in a `/proc/PID/stat` line: the second field after the command's `)` (the
/// command may itself hold spaces and parentheses).
fn parent_of(stat: &str) -> Option<u32> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `key`'s value in a `/proc/PID/environ` (NUL-separated `KEY=VALUE`).
fn env_value<'a>(environ: &'a [u8], key: &str) -> Option<&'a str> {
    environ.split(|b| *b == 0).find_map(|pair| {
        let value = pair.strip_prefix(key.as_bytes())?.strip_prefix(b"=")?;
        std::str::from_utf8(value).ok()
    })
}

/// Copies what is appended to `path` into `into` until `done` turns true and the file has
/// nothing more (what a worker wrote before torchrun exited is all there by then).
async fn tail(path: PathBuf, mut done: watch::Receiver<bool>, mut into: DuplexStream) {
    let mut file = match tokio::fs::File::open(&path).await {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!("opening {}: {e}", path.display());
            return;
        }
    };
    let mut buf = vec![0u8; PIPE_BYTES];
    let mut last = false;
    loop {
        match file.read(&mut buf).await {
            Ok(0) if last => return,
            Ok(0) => {
                tokio::select! {
                    _ = tokio::time::sleep(TAIL_POLL) => {}
                    changed = done.changed() => last = changed.is_err(),
                }
                last |= *done.borrow();
            }
            Ok(n) => {
                if into.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!("reading {}: {e}", path.display());
                return;
            }
        }
    }
}

/// What torchrun's `ChildFailedError` report says.
#[derive(Debug, Default, PartialEq)]
struct Failed {
    /// Rank → how it failed (`exitcode` negative is the signal).
    statuses: BTreeMap<u32, ExitStatus>,
    /// The first observed failure: torchrun prints it last, under "Root Cause". The others
    /// include the ranks it stopped with SIGTERM after it.
    root: Option<u32>,
}

/// Passes torchrun's stderr on to `into` and reads its `ChildFailedError` report. torchrun
/// never waits on this: a closed `into` only stops the copy.
async fn failed_ranks(mut from: impl AsyncRead + Unpin, mut into: DuplexStream) -> Failed {
    let mut reader = LogReader::new(Choice::One(Format::Failures));
    let mut failed = Failed::default();
    let mut note = |records: Vec<crate::adapters::Record>| {
        for record in records {
            let Some(Label::Int(rank)) = record.label("rank") else { continue };
            let status = match (record.label("exit_code"), record.label("signal")) {
                (_, Some(Label::Int(signal))) => ExitStatus::Signal(*signal as i32),
                (Some(Label::Int(code)), _) => ExitStatus::Code(*code as i32),
                _ => continue,
            };
            failed.statuses.insert(*rank as u32, status);
            failed.root = Some(*rank as u32);
        }
    };
    let (mut buf, mut line, mut n, mut copying) = (vec![0u8; PIPE_BYTES], Vec::new(), 0u64, true);
    loop {
        let got = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(got) => got,
        };
        if copying && into.write_all(&buf[..got]).await.is_err() {
            copying = false;
        }
        for piece in buf[..got].split_inclusive(|b| *b == b'\n') {
            if line.len() + piece.len() <= MAX_LINE_BYTES + 1 {
                line.extend_from_slice(piece);
            }
            if piece.ends_with(b"\n") {
                n += 1;
                note(reader.push(n, line.strip_suffix(b"\n").unwrap_or(&line)));
                line.clear();
            }
        }
    }
    if !line.is_empty() {
        note(reader.push(n + 1, &line));
    }
    note(reader.finish());
    failed
}

#[cfg(test)]
#[path = "torchrun_tests.rs"]
mod tests;
