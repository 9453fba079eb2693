//! `flightdeck doctor`: what this machine can and cannot do, one line per check.
use crate::paths::DbPaths;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Ok,
    /// Works without it, with less (e.g. no GPU telemetry).
    Warn,
    /// Runs cannot work.
    Fail,
}

pub(super) struct Check {
    pub name: &'static str,
    pub level: Level,
    pub detail: String,
}

/// `flightdeck doctor [--hosts ...] [--json]`.
#[derive(clap::Args, Debug)]
pub struct DoctorArgs {
    /// Check these SSH nodes instead of this machine (comma-separated; like cluster.hosts).
    #[arg(long, value_delimiter = ',')]
    pub hosts: Vec<String>,
    /// Take the nodes' settings ([cluster]: remote_dir, libtorch, timeouts) from this recipe,
    /// and its hosts when --hosts is not given.
    #[arg(long)]
    pub recipe: Option<std::path::PathBuf>,
    /// Override a recipe key (repeatable), e.g. --set cluster.libtorch=/opt/libtorch/lib.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
    /// Trust SSH host keys seen for the first time and record them (like accept-new).
    #[arg(long)]
    pub accept_new_host_keys: bool,
    /// This machine's checks as JSON (what `doctor --hosts` reads from each node).
    #[arg(long)]
    pub json: bool,
    /// Check the Slurm cluster instead: its commands, controller, the partition (the recipe's
    /// or the default), enough nodes, and that a 1-node step runs Flightdeck on a node.
    #[arg(long, conflicts_with = "hosts")]
    pub slurm: bool,
}

pub fn main(db: &DbPaths, args: DoctorArgs) -> anyhow::Result<i32> {
    if args.slurm {
        return super::doctor_slurm::run(args);
    }
    if !args.hosts.is_empty() || args.recipe.is_some() {
        return super::doctor_hosts::run(args);
    }
    Ok(doctor(db, args.json))
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Ok => "ok",
        Level::Warn => "warn",
        Level::Fail => "FAIL",
    }
}

pub fn doctor(db: &DbPaths, json: bool) -> i32 {
    // libtorch's CUDA half first: loading it brings in the NCCL that PyTorch ships, which the
    // nccl check then finds.
    let gpu = super::doctor_gpu::checks();
    let mut checks = vec![libtorch()];
    checks.extend(gpu.into_iter().map(|(name, ok, detail)| Check {
        name,
        level: if ok { Level::Ok } else { Level::Warn },
        detail,
    }));
    checks.extend([gpus(), database(db), disk(db), ports(), stack_tools(), ssh()]);
    print(&checks, json)
}

/// The checks as a table (or JSON); the exit code: failure when any check failed.
pub(super) fn print(checks: &[Check], json: bool) -> i32 {
    if json {
        let list: Vec<serde_json::Value> = checks
            .iter()
            .map(|c| serde_json::json!({"name": c.name, "state": level_name(c.level), "detail": c.detail}))
            .collect();
        println!("{}", serde_json::json!({"version": 1, "checks": list}));
    } else {
        println!("{:<10} {:<5} DETAIL", "CHECK", "STATE");
        for c in checks {
            println!("{:<10} {:<5} {}", c.name, level_name(c.level), c.detail);
        }
    }
    if checks.iter().any(|c| c.level == Level::Fail) {
        super::EXIT_FAILURE
    } else {
        0
    }
}

#[cfg(feature = "torch")]
fn libtorch() -> Check {
    match std::panic::catch_unwind(crate::worker::libtorch_probe) {
        Ok(Ok(detail)) => Check { name: "libtorch", level: Level::Ok, detail },
        Ok(Err(e)) => Check { name: "libtorch", level: Level::Fail, detail: e.to_string() },
        Err(_) => Check { name: "libtorch", level: Level::Fail, detail: "libtorch panicked on a 2x2 matmul".into() },
    }
}

#[cfg(not(feature = "torch"))]
fn libtorch() -> Check {
    Check { name: "libtorch", level: Level::Fail, detail: "built without the `torch` feature".into() }
}

fn database(db: &DbPaths) -> Check {
    let probe = db.root.join(".doctor-probe");
    let r = std::fs::create_dir_all(&db.root).and_then(|_| std::fs::write(&probe, b"ok"));
    let _ = std::fs::remove_file(&probe);
    let shown = db.root.display();
    match (r, crate::private_files::open_to_others(&db.root)) {
        (Ok(()), Some(mode)) => Check {
            name: "database",
            level: Level::Warn,
            detail: format!(
                "{shown} is writable but open to other users (mode {mode:03o}): its runs, logs and checkpoints \
                 can be read by them; `chmod 700 {shown}`"
            ),
        },
        (Ok(()), None) => {
            Check { name: "database", level: Level::Ok, detail: format!("{shown} is writable, owner-only") }
        }
        (Err(e), _) => Check { name: "database", level: Level::Fail, detail: format!("{shown}: {e}") },
    }
}

fn disk(db: &DbPaths) -> Check {
    let c = std::ffi::CString::new(db.root.display().to_string()).unwrap_or_default();
    // SAFETY: statvfs fills the struct we pass; the path is a valid C string.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut s) };
    if r != 0 {
        return Check { name: "disk", level: Level::Warn, detail: "cannot stat the database directory".into() };
    }
    let free_gib = s.f_bavail as f64 * s.f_frsize as f64 / (1u64 << 30) as f64;
    let level = if free_gib < 1.0 { Level::Warn } else { Level::Ok };
    Check { name: "disk", level, detail: format!("{free_gib:.1} GiB free for history and checkpoints") }
}

fn ports() -> Check {
    match std::net::TcpListener::bind("127.0.0.1:0") {
        Ok(l) => Check {
            name: "ports",
            level: Level::Ok,
            detail: format!("can listen on loopback (got port {})", l.local_addr().map(|a| a.port()).unwrap_or(0)),
        },
        Err(e) => Check { name: "ports", level: Level::Fail, detail: format!("cannot listen on loopback: {e}") },
    }
}

pub(super) fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false)
}

/// The tool each kind of rank gets, found as the agent finds it (PATH, the cache, beside the
/// binary, the build's environment), and where.
fn stack_tools() -> Check {
    let say = |f: &crate::tools::Found| format!("{} ({})", f.path.display(), f.how);
    let native = crate::agent::stacks::native_tools().into_iter().next();
    let python = crate::tools::program("py-spy");
    let native_text = match &native {
        Some((tool, f)) => format!("native ranks get {} at {}", tool.name(), say(f)),
        None => "native ranks get none (install elfutils or gdb: scripts/install-deps.sh)".into(),
    };
    let python_text = match (&python, &native) {
        (Some(f), _) => format!("Python ranks get py-spy at {} (or the one in their own environment)", say(f)),
        (None, Some((tool, _))) => format!(
            "Python ranks get py-spy only from their own environment, else {} (native frames, no Python frames: `make` installs py-spy)",
            tool.name()
        ),
        (None, None) => "Python ranks get py-spy only from their own environment".into(),
    };
    let level = if native.is_none() && python.is_none() { Level::Warn } else { Level::Ok };
    Check { name: "stacks", level, detail: format!("{python_text}; {native_text}") }
}

fn ssh() -> Check {
    if on_path("ssh") {
        Check { name: "ssh", level: Level::Ok, detail: "ssh client present".into() }
    } else {
        Check { name: "ssh", level: Level::Warn, detail: "no ssh client (only needed for `ssh` debugging)".into() }
    }
}

fn gpus() -> Check {
    let Ok(n) = crate::agent::nvml::open() else {
        return Check { name: "gpus", level: Level::Warn, detail: "no NVML: no GPUs visible (CPU ranks only)".into() };
    };
    let count = n.device_count().unwrap_or(0);
    let names: Vec<String> = (0..count).filter_map(|i| n.device_by_index(i).ok().and_then(|d| d.name().ok())).collect();
    match count {
        0 => Check { name: "gpus", level: Level::Warn, detail: "0 GPUs (CPU ranks only)".into() },
        _ => Check { name: "gpus", level: Level::Ok, detail: format!("{count}: {}", names.join(", ")) },
    }
}
