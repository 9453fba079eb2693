//! Where this node's helper programs and libraries are: found as the user's shell would, then where the project's set-up or a Python environment put them.
//!
//! A user runs `flightdeck` from a plain shell, whose PATH and LD_LIBRARY_PATH hold nothing of
//! `make`'s: py-spy sits in the cache's `bin/` or in the rank's own virtual environment, PyTorch's
//! wheel ships libnccl as `libnccl.so.2` under `site-packages/nvidia/nccl/lib`, and a container's
//! driver may put libnvidia-ml off the loader's path. Each search says where it looked.
use std::path::{Path, PathBuf};

/// A program or library found, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub path: PathBuf,
    /// `PATH`, `the rank's Python environment`, `the Flightdeck cache`, ...
    pub how: &'static str,
}

/// The cache `make` installs into: `FLIGHTDECK_CACHE`, else `$XDG_CACHE_HOME/flightdeck`, else
/// `~/.cache/flightdeck`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(c) = std::env::var_os("FLIGHTDECK_CACHE").filter(|c| !c.is_empty()) {
        return Some(PathBuf::from(c));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()) {
        return Some(PathBuf::from(x).join("flightdeck"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/flightdeck"))
}

/// The PyTorch environment this binary was built against (`make` exports `FD_VENV`), if it is
/// on this machine.
fn build_venv() -> Option<PathBuf> {
    option_env!("FD_VENV").map(PathBuf::from).filter(|p| p.is_dir())
}

/// Places a program is looked for, in order, each with how it was found.
fn program_dirs(extra: &[(PathBuf, &'static str)]) -> Vec<(PathBuf, &'static str)> {
    let mut dirs: Vec<(PathBuf, &'static str)> = Vec::new();
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path).map(|d| (d, "PATH")));
    }
    dirs.extend(extra.iter().cloned());
    if let Some(c) = cache_dir() {
        dirs.push((c.join("bin"), "the Flightdeck cache"));
    }
    // A wheel installs `flightdeck` and py-spy into one environment's bin/.
    if let Some(dir) = std::env::current_exe().ok().and_then(|e| e.parent().map(Path::to_path_buf)) {
        dirs.push((dir, "beside flightdeck"));
    }
    if let Some(v) = build_venv() {
        dirs.push((v.join("bin"), "the build's PyTorch environment"));
    }
    for d in ["/usr/local/bin", "/usr/bin", "/bin"] {
        dirs.push((PathBuf::from(d), "the system's bin"));
    }
    dirs
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `program` (`eu-stack`, `gdb`, `py-spy`), wherever this node has it.
pub fn program(program: &str) -> Option<Found> {
    find_in(program, &program_dirs(&[]))
}

/// `program` for the Python process `pid`: its own environment first (the interpreter's bin/,
/// its VIRTUAL_ENV or CONDA_PREFIX), then as `program` finds it.
pub fn program_for_python(program: &str, pid: u32) -> Option<Found> {
    find_in(program, &program_dirs(&python_env_dirs(pid)))
}

fn find_in(program: &str, dirs: &[(PathBuf, &'static str)]) -> Option<Found> {
    dirs.iter()
        .map(|(d, how)| (d.join(program), *how))
        .find(|(p, _)| executable(p))
        .map(|(path, how)| Found { path, how })
}

/// The bin/ directories of the Python environment process `pid` runs in.
fn python_env_dirs(pid: u32) -> Vec<(PathBuf, &'static str)> {
    const HOW: &str = "the rank's Python environment";
    let mut dirs = Vec::new();
    if let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) {
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let argv0 = Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(argv0));
        if argv0.is_absolute() {
            if let Some(dir) = argv0.parent() {
                dirs.push((dir.to_path_buf(), HOW));
            }
        }
    }
    if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
        for var in environ.split(|b| *b == 0) {
            for key in [&b"VIRTUAL_ENV="[..], b"CONDA_PREFIX="] {
                if let Some(v) = var.strip_prefix(key) {
                    dirs.push((PathBuf::from(String::from_utf8_lossy(v).into_owned()).join("bin"), HOW));
                }
            }
        }
    }
    if let Some(dir) =
        std::fs::read_link(format!("/proc/{pid}/exe")).ok().and_then(|e| e.parent().map(Path::to_path_buf))
    {
        dirs.push((dir, HOW));
    }
    dirs
}

/// NVIDIA's management library where drivers and container runtimes put it, for when the
/// loader's own search (`libnvidia-ml.so.1` by name) finds nothing.
pub fn nvml_candidates() -> Vec<PathBuf> {
    NVML_PLACES.iter().map(PathBuf::from).filter(|p| p.is_file()).collect()
}

/// Where `nvml_candidates` looks: Debian/Ubuntu and RHEL's library dirs, Kubernetes' device
/// plugin and GPU operator mounts, WSL's. (CUDA's `stubs/` copy is no driver: never taken.)
pub const NVML_PLACES: [&str; 7] = [
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
    "/usr/local/nvidia/lib/libnvidia-ml.so.1",
    "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib/wsl/lib/libnvidia-ml.so.1",
];

/// PyTorch's NCCL (`libnccl.so.2`, the one name its wheel ships): beside the libtorch this binary
/// was built against, in the build's environment, or in any `site-packages` of the Python
/// environments given (a rank's).
pub fn pytorch_nccl(envs: &[PathBuf]) -> Option<Found> {
    let mut places: Vec<(PathBuf, &'static str)> = Vec::new();
    if let Some(lib) = option_env!("FD_TORCH_LIB") {
        // site-packages/torch/lib → site-packages/nvidia/nccl/lib
        let site = Path::new(lib).parent().and_then(Path::parent);
        places.extend(site.map(|s| (s.join("nvidia/nccl/lib"), "beside the build's libtorch")));
    }
    let mut roots: Vec<PathBuf> = envs.to_vec();
    roots.extend(build_venv());
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root.join("lib")) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("python") {
                places
                    .push((e.path().join("site-packages/nvidia/nccl/lib"), "a Python environment's nvidia-nccl wheel"));
            }
        }
    }
    places
        .into_iter()
        .map(|(d, how)| (d.join("libnccl.so.2"), how))
        .find(|(p, _)| p.is_file())
        .map(|(path, how)| Found { path, how })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_off_the_path_is_found_in_the_cache_and_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let tool = bin.join("fd-test-tool");
        std::fs::write(&tool, "#!/bin/sh\n").expect("tool");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let dirs = vec![(PathBuf::from("/nonexistent"), "PATH"), (bin.clone(), "the Flightdeck cache")];
        let found = find_in("fd-test-tool", &dirs).expect("found");
        assert_eq!((found.path, found.how), (tool.clone(), "the Flightdeck cache"));
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(find_in("fd-test-tool", &dirs), None, "not executable: not a program");
    }

    #[test]
    fn a_python_process_is_given_its_own_environments_bin() {
        // This test's own process: its exe's directory is among them.
        let pid = std::process::id();
        let dirs = python_env_dirs(pid);
        let exe_dir = std::env::current_exe().expect("exe").parent().expect("dir").to_path_buf();
        let exe_dir = std::fs::canonicalize(&exe_dir).unwrap_or(exe_dir);
        assert!(dirs.iter().any(|(d, _)| std::fs::canonicalize(d).is_ok_and(|d| d == exe_dir)), "{dirs:?}");
    }
}
