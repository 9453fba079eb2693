//! Starting one rank: the torchrun environment, its own process group, its output (`output.rs`) and its exit.
use super::output::Output;
use super::{AgentSpec, Input};
use crate::adapters::Choice;
use crate::ids::Rank;
use crate::paths::RunDirPaths;
use crate::protocol::{ExitStatus, Stream};
use crate::recipe::Kind;
use anyhow::Context;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::Duration;
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
        .env("GROUP_RANK", spec.node_rank().to_string())
        .env("GROUP_WORLD_SIZE", spec.nodes().to_string())
        .env("ROLE_RANK", rank.0.to_string())
        .env("ROLE_WORLD_SIZE", spec.world_size.to_string())
        .env("MASTER_ADDR", &spec.master_addr)
        .env("MASTER_PORT", spec.program_port.to_string())
        .env("TORCHELASTIC_RUN_ID", spec.run.as_str());
    if std::env::var_os("SLURM_JOB_ID").is_some() {
        // Under Slurm the agent is the step's one task per node; a rank inherits that task's
        // SLURM_PROCID and SLURM_NTASKS, which Slurm-aware code (Lightning, submitit) reads
        // as its own rank and world: they are made this rank's.
        cmd.env("SLURM_PROCID", rank.0.to_string())
            .env("SLURM_LOCALID", local_rank.to_string())
            .env("SLURM_NTASKS", spec.world_size.to_string())
            .env("SLURM_NPROCS", spec.world_size.to_string())
            .env("SLURM_NODEID", spec.node_rank().to_string())
            .env("SLURM_NNODES", spec.nodes().to_string())
            .env("SLURM_NTASKS_PER_NODE", spec.recipe.cluster.ranks_per_node.to_string());
    }
    prepare(&mut cmd, spec, paths, rank);
    let mut child = cmd.spawn().with_context(|| format!("starting rank {rank} ({})", spec.exe.display()))?;
    let pid = child.id().unwrap_or(0);
    let output = Output::new(rank, open_log(&paths.rank_log(rank.0))?, log_choice(spec), tx.clone());
    let stdout = child.stdout.take().map(|out| tokio::spawn(output.clone().forward(out, Stream::Stdout)));
    let stderr = child.stderr.take().map(|err| tokio::spawn(output.clone().forward(err, Stream::Stderr)));
    tokio::spawn(async move {
        let status = exit_status(child.wait().await, &format!("rank {rank}"));
        // What the rank printed before it exited may still be in the pipes: read it first, so
        // its records come before the exit and its last error line is known. A child of the
        // rank that keeps the pipes open is not waited for longer than DRAIN.
        let drained = async {
            for task in stdout.into_iter().chain(stderr) {
                let _ = task.await;
            }
        };
        let _ = tokio::time::timeout(DRAIN, drained).await;
        let last_error = output.last_error();
        let _ = tx.send(Input::Exited { rank, pid, status, last_error }).await;
    });
    Ok(pid)
}

/// A directory holding `libnccl.so` → PyTorch's `libnccl.so.2`, for a GPU rank on a node where
/// NCCL loads by no name cudarc tries (PyTorch's wheel ships only `libnccl.so.2`): the rank gets
/// it first on its LD_LIBRARY_PATH, so a plain shell needs no link made by hand. None when NCCL
/// already loads by name, or no PyTorch NCCL is found (the rank then says what it searched).
fn nccl_link_dir(paths: &RunDirPaths) -> Option<std::path::PathBuf> {
    let loads = |name: &str| {
        let Ok(name) = std::ffi::CString::new(name) else { return false };
        // SAFETY: dlopen with a valid C string, closed at once; NCCL's initialisers only set up
        // its own state.
        unsafe {
            let h = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
            if !h.is_null() {
                libc::dlclose(h);
            }
            !h.is_null()
        }
    };
    if loads("libnccl.so") {
        return None;
    }
    let nccl = crate::tools::pytorch_nccl(&[])?;
    let dir = paths.root.join("lib");
    std::fs::create_dir_all(&dir).ok()?;
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&nccl.path, &link).ok()?;
    tracing::info!("GPU ranks load NCCL through {} -> {} ({})", link.display(), nccl.path.display(), nccl.how);
    Some(dir)
}

/// What a rank's (or a node's torchrun's) process gets besides the ranks' own torchrun
/// variables: Flightdeck's variables, the working directory, piped output, a process group of
/// its own, a death signal tied to the agent, and for a command what makes PyTorch observable,
/// the Python shim and the recipe's `[command] env`. `rank` names the TensorBoard directory.
pub(super) fn prepare(cmd: &mut tokio::process::Command, spec: &AgentSpec, paths: &RunDirPaths, rank: Rank) {
    // Flightdeck's own rendezvous store, on another port than the program's MASTER_PORT.
    cmd.env("FLIGHTDECK_STORE_ADDR", &spec.master_addr)
        .env("FLIGHTDECK_STORE_PORT", spec.master_port.to_string())
        .env("FLIGHTDECK_RUN", spec.run.as_str())
        .env("FLIGHTDECK_NODE", &spec.node)
        .env("FLIGHTDECK_RECIPE", paths.recipe())
        .env("FLIGHTDECK_TELEMETRY", paths.telemetry_socket())
        .env("FLIGHTDECK_RUN_DIR", &paths.root)
        .current_dir(working_dir(spec, paths))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    if let (Kind::Command, Some(c)) = (&spec.recipe.kind, &spec.recipe.command) {
        if c.observe {
            // The recorder writes its dumps into this directory; it does not make it.
            let _ = std::fs::create_dir_all(paths.root.join("fr"));
            for (key, value) in observe_env(paths, rank, spec.recipe.cluster.device == crate::recipe::Device::Cuda) {
                cmd.env(key, value);
            }
        }
        if c.instrument {
            match install_shim(paths) {
                Ok(dir) => {
                    let path = match std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
                        Some(old) => format!("{}:{}", dir.display(), old.to_string_lossy()),
                        None => dir.display().to_string(),
                    };
                    cmd.env("PYTHONPATH", path).env("FLIGHTDECK_SHIM_DIR", paths.fr_dir());
                }
                Err(e) => tracing::warn!("rank {rank} runs without the Python shim: {e:#}"),
            }
        }
        for (key, value) in &c.env {
            cmd.env(key, value);
        }
    }
    if !matches!(spec.recipe.kind, Kind::Command) {
        // The run's secret, for the store's and the ring's handshakes; a user's program has no
        // use for it, so it is not told where it is.
        cmd.env(crate::collective::auth::SECRET_FILE_ENV, paths.secret());
        if spec.recipe.cluster.device == crate::recipe::Device::Cuda {
            if let Some(dir) = nccl_link_dir(paths) {
                let path = match std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
                    Some(old) => format!("{}:{}", dir.display(), old.to_string_lossy()),
                    None => dir.display().to_string(),
                };
                cmd.env("LD_LIBRARY_PATH", path);
            }
        }
    }
    if let Some(dir) = &spec.resume_from {
        // A resumed run: every rank restores this checkpoint before its first step.
        cmd.env("FLIGHTDECK_RESUME_FROM", dir);
    }
    if let Some(dir) = &spec.init_from {
        // `[init] from`: every rank starts from these weights.
        cmd.env("FLIGHTDECK_INIT_FROM", dir);
    }
    // A user's program gets the user's own umask back (a worker keeps flightdeck's 077: its
    // checkpoints are the run's).
    let umask = matches!(spec.recipe.kind, Kind::Command).then(crate::private_files::user_umask);
    // SAFETY: prctl and umask are async-signal-safe; the closure touches no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(mask) = umask {
                libc::umask(mask);
            }
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
}

/// A rank's log file (appended to: a resumed run's ranks add to their parent's).
pub(super) fn open_log(path: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// A process's end as the protocol says it; `what` names it in the warning if waiting failed.
pub(super) fn exit_status(waited: std::io::Result<std::process::ExitStatus>, what: &str) -> ExitStatus {
    match waited {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(c), _) => ExitStatus::Code(c),
            (None, Some(sig)) => ExitStatus::Signal(sig),
            (None, None) => ExitStatus::Code(-1),
        },
        Err(e) => {
            tracing::warn!("waiting for {what}: {e}");
            ExitStatus::Code(-1)
        }
    }
}

/// What makes a PyTorch program observable, for every command rank unless `[command] observe =
/// false` (each is documented in docs/real-jobs.md; `[command] env` overrides any one): the
/// flight recorder's buffer and dump files in the run directory (old and new names), dumps on
/// timeout with the error handling that lets them finish, Python's faulthandler, TensorBoard
/// directories for HF/TRL and verl, and on GPU nodes NCCL's RAS socket on a port of its own.
pub fn observe_env(paths: &RunDirPaths, rank: Rank, gpu: bool) -> Vec<(&'static str, String)> {
    let fr = paths.root.join("fr").join("rank_").display().to_string();
    let tb = paths.root.join("tb").join(format!("rank{}", rank.0)).display().to_string();
    let mut env = vec![
        ("TORCH_FR_BUFFER_SIZE", "2000".to_string()),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000".to_string()),
        ("TORCH_FR_DUMP_TEMP_FILE", fr.clone()),
        ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", fr),
        ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1".to_string()),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3".to_string()),
        ("PYTHONFAULTHANDLER", "1".to_string()),
        // Python block-buffers a pipe or a file: without this its lines arrive kilobytes late.
        ("PYTHONUNBUFFERED", "1".to_string()),
        ("TENSORBOARD_LOGGING_DIR", tb.clone()),
        ("TENSORBOARD_DIR", tb),
    ];
    if gpu {
        // NCCL's RAS listens on 127.0.0.1:28028 by default: two runs on a node would collide.
        if let Ok(port) = super::free_port("127.0.0.1") {
            env.push(("NCCL_RAS_ADDR", format!("127.0.0.1:{port}")));
        }
    }
    env
}

/// The Python shim, built into the binary so that every node has the one of its version.
const SHIM: &str = include_str!("../../assets/shim/sitecustomize.py");

/// Writes the shim into the run directory (once per node and run); returns its folder.
fn install_shim(paths: &RunDirPaths) -> anyhow::Result<std::path::PathBuf> {
    let dir = paths.shim_dir();
    let file = dir.join("sitecustomize.py");
    if std::fs::read_to_string(&file).is_ok_and(|s| s == SHIM) {
        return Ok(dir);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::create_dir_all(paths.fr_dir()).with_context(|| format!("creating {}", paths.fr_dir().display()))?;
    let tmp = dir.join("sitecustomize.py.tmp");
    std::fs::write(&tmp, SHIM).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &file).with_context(|| format!("installing {}", file.display()))?;
    Ok(dir)
}

/// A command's `cwd` (by default the recipe's directory) where this node has it, else the run
/// directory (the worker's, and an SSH node's, which lacks the launching machine's paths).
fn working_dir(spec: &AgentSpec, paths: &RunDirPaths) -> std::path::PathBuf {
    match spec.recipe.command.as_ref().and_then(|c| c.cwd.as_ref()) {
        Some(dir) if spec.recipe.kind == Kind::Command && dir.is_dir() => dir.clone(),
        _ => paths.root.clone(),
    }
}

/// How long a rank's output is still read after it exited.
pub(super) const DRAIN: Duration = Duration::from_secs(2);

/// The adapters a rank's output goes through: a command's `[command] log_format`; none for the
/// worker, which reports its steps itself.
pub(super) fn log_choice(spec: &AgentSpec) -> Choice {
    match (&spec.recipe.kind, &spec.recipe.command) {
        (Kind::Command, Some(c)) => c.log_format,
        _ => Choice::None,
    }
}
