//! Helpers for tests that drive the real `flightdeck` binary on a temporary database.
#![allow(dead_code)]
pub mod charts;
pub mod tmux;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_flightdeck"))
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn recipe(name: &str) -> PathBuf {
    repo().join("recipes").join(name)
}

/// A command's stdout, after asserting it succeeded (its stderr in the message if not).
pub fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The id of the run a `run`/`resume` printed (`run ID: ...`).
pub fn run_id(stdout: &str) -> String {
    let line = stdout.lines().find(|l| l.starts_with("run ") && l.contains(": ")).expect("a `run ID:` line");
    line[4..].split(':').next().expect("id").to_string()
}

/// A temporary database; its server is waited for (and its leftovers checked) on `finish`.
pub struct Db {
    pub dir: tempfile::TempDir,
}

impl Db {
    pub fn new() -> Db {
        // Short paths: Unix socket paths are limited to 108 bytes.
        let dir = tempfile::Builder::new().prefix("fd").tempdir_in("/tmp").expect("tempdir");
        Db { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.arg("--db").arg(self.path()).args(args);
        // The server exits soon after its last client, so tests can wait for it.
        c.env("FLIGHTDECK_SERVER_IDLE_MS", "300");
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("running flightdeck")
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("valid JSON")
    }

    pub fn spawn(&self, args: &[&str]) -> Child {
        self.cmd(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning flightdeck")
    }

    /// Blocks until no server owns this database (the server holds an exclusive flock on
    /// `server.lock` for its whole life, so taking the lock *is* the event "server exited").
    pub fn wait_server_exit(&self) {
        let path = self.path().join("server.lock");
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(&path) else {
            return;
        };
        // SAFETY: flock on a descriptor we own; blocks until the server releases it.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(r, 0, "flock on {}", path.display());
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
    }

    /// Processes that belong to this database: its server, agents and ranks.
    pub fn leftover_processes(&self) -> Vec<String> {
        let needle = self.path().display().to_string();
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let pid = entry.file_name().to_string_lossy().to_string();
            if pid.parse::<u32>().is_err() || pid == std::process::id().to_string() {
                continue;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmd.contains(&needle) || String::from_utf8_lossy(&environ).contains(&needle) {
                // A zombie has exited already; only its parent's wait is missing.
                let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
                if stat.rsplit(')').next().is_some_and(|s| s.trim_start().starts_with('Z')) {
                    continue;
                }
                found.push(format!("{pid}: {cmd}"));
            }
        }
        found
    }

    /// Waits for the server to exit and asserts that nothing of this database runs.
    pub fn finish(&self) {
        self.wait_server_exit();
        // The lock is released as the server's descriptors close, a moment before the process
        // is gone: wait for each candidate's exit event (a pidfd turns readable), bounded.
        for entry in self.leftover_processes() {
            if let Some(pid) = entry.split(':').next().and_then(|p| p.parse::<i32>().ok()) {
                wait_pid_exit(pid, 10_000);
            }
        }
        let left = self.leftover_processes();
        assert!(left.is_empty(), "processes left behind: {left:#?}");
    }
}

/// Reads a child's stdout line by line until `pred` matches; returns that line.
pub fn read_until(lines: &mut impl Iterator<Item = std::io::Result<String>>, pred: impl Fn(&str) -> bool) -> String {
    for line in lines.by_ref() {
        let line = line.expect("reading child output");
        if pred(&line) {
            return line;
        }
    }
    panic!("output ended before the expected line");
}

pub fn stdout_lines(child: &mut Child) -> impl Iterator<Item = std::io::Result<String>> {
    BufReader::new(child.stdout.take().expect("piped stdout")).lines()
}

/// The event texts of a `show --json` document, oldest first.
pub fn event_texts(show: &serde_json::Value) -> Vec<String> {
    show["events"].as_array().expect("events").iter().filter_map(|e| e["text"].as_str().map(String::from)).collect()
}

/// Parses `step,rank,value` CSV into (step, rank, value) rows.
pub fn csv_rows(text: &str) -> Vec<(u64, u32, f64)> {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("step,rank,value"), "CSV header");
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

/// One rank's points of a run's series, as `metrics --format csv` gives them: (step, value).
pub fn rank_series(db: &Db, run: &str, key: &str, rank: u32) -> Vec<(u64, f64)> {
    let csv = db.run(&["metrics", run, "--key", key, "--format", "csv"]);
    assert!(csv.status.success(), "metrics {key}: {}", String::from_utf8_lossy(&csv.stderr));
    let rows = csv_rows(&String::from_utf8_lossy(&csv.stdout));
    rows.iter().filter(|r| r.1 == rank).map(|r| (r.0, r.2)).collect()
}

/// The step a progress line reports (`RUN step 12/60 loss ...`).
pub fn progress_step(line: &str) -> Option<u64> {
    let rest = line.split(" step ").nth(1)?;
    // `step 42/200`, or `step 42` when no total is planned (a command's run).
    rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Waits until process `pid` has exited (or `timeout_ms` passed): poll(2) on its pidfd.
pub fn wait_pid_exit(pid: i32, timeout_ms: i32) {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return; // already gone
    }
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; the descriptor is closed right after.
    unsafe {
        libc::poll(&mut p, 1, timeout_ms);
        libc::close(fd);
    }
}

/// Says that (part of) a test cannot run here and why: on stderr, and as a line of the file
/// `FLIGHTDECK_SKIP_LOG` names (`.ci/run` sets it and counts the lines as skipped), so a skip
/// is never a silent pass.
pub fn skipped(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("FLIGHTDECK_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// The PyTorch virtual environment's python (`FD_VENV`, exported by `make test`), if set.
pub fn venv_python() -> Option<PathBuf> {
    std::env::var_os("FD_VENV").map(|v| PathBuf::from(v).join("bin/python"))
}

/// Writes a `kind = "command"` recipe running `argv` on `ranks_per_node` ranks per node.
pub fn command_recipe(path: &Path, name: &str, argv: &[&str], ranks_per_node: u32) {
    command_recipe_with(path, name, argv, ranks_per_node, "");
}

/// `command_recipe` with more `[command]` lines (`launcher = "torchrun"`).
pub fn command_recipe_with(path: &Path, name: &str, argv: &[&str], ranks_per_node: u32, command: &str) {
    let argv: Vec<String> = argv.iter().map(|a| format!("{a:?}")).collect();
    let text = format!(
        "name = {name:?}\nkind = \"command\"\n[command]\nargv = [{}]\n{command}[cluster]\nranks_per_node = {ranks_per_node}\n",
        argv.join(", ")
    );
    std::fs::write(path, text).expect("writing the recipe");
}

/// The tails of every log under the database's run directories (ranks, agents, torchrun's
/// per-rank files): for a failure message, so a rank that died says how.
pub fn run_logs(db: &Db) -> String {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "log") || p.file_name().is_some_and(|n| n == "stderr.log") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&db.path().join("runs"), &mut files);
    files.sort();
    let mut text = String::new();
    for f in files {
        let body = std::fs::read_to_string(&f).unwrap_or_default();
        let tail: Vec<&str> = body.lines().rev().take(40).collect();
        text.push_str(&format!("\n--- {} (last {} lines)\n", f.display(), tail.len()));
        for l in tail.iter().rev() {
            text.push_str(l);
            text.push('\n');
        }
    }
    text
}

/// Every path under `root` that others (group or world) may read, write or enter.
pub fn open_to_others(root: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut open = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else { continue };
            if meta.file_type().is_symlink() {
                continue;
            }
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                open.push(format!("{:03o} {}", mode, e.path().display()));
            }
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    open
}

/// A system user made for one test (useradd), removed when dropped: a process of another user
/// on the same machine. None (the test reported as skipped, with the reason) where it cannot be.
pub struct ThrowawayUser {
    pub name: String,
}

impl ThrowawayUser {
    pub fn make(test: &str) -> Option<ThrowawayUser> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            skipped(test, "making a throwaway user to connect as needs root");
            return None;
        }
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("fdpeer{}x{n}", std::process::id());
        let made = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", &name])
            .output();
        if !made.as_ref().is_ok_and(|o| o.status.success()) {
            skipped(test, &format!("useradd {name} failed: {made:?}"));
            return None;
        }
        Some(ThrowawayUser { name })
    }

    /// Connects to the Unix socket at `path` as this user; `closed` when the other end hung up
    /// at once, `answered` when it sent anything, else the error.
    pub fn probe_socket(&self, path: &Path) -> String {
        let probe = format!(
            "import socket\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(60)\ns.connect({:?})\n\
             print('closed' if s.recv(64) == b'' else 'answered')",
            path.display().to_string()
        );
        let out = Command::new("runuser")
            .args(["-u", &self.name, "--", "/usr/bin/python3", "-c", &probe])
            .output()
            .expect("runuser");
        format!("{}{}", String::from_utf8_lossy(&out.stdout).trim(), String::from_utf8_lossy(&out.stderr).trim())
    }
}

impl Drop for ThrowawayUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}
