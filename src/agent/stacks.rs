//! Stack dumps of live ranks: eu-stack (or gdb) for native ranks, py-spy for Python ranks.
//!
//! eu-stack is preferred: it stops the rank only while it unwinds (tens of milliseconds for a
//! libtorch rank, measured in docs/hangs.md), where gdb first reads every shared library's
//! symbols with the rank stopped (seconds for libtorch). Each tool's output is parsed into
//! frames free of addresses and hashes, so identical code reads identically across processes
//! and `group` can put identical ranks together.
use crate::protocol::{Frame, RankStacks, StackTool, ThreadStack};
use std::time::{Duration, Instant};

/// A dump that takes longer is abandoned (the tool is killed, which detaches it).
const DUMP_TIMEOUT: Duration = Duration::from_secs(30);

/// The native tools this node has, in order of preference, with where each was found.
pub fn native_tools() -> Vec<(StackTool, crate::tools::Found)> {
    [StackTool::EuStack, StackTool::Gdb]
        .into_iter()
        .filter_map(|t| crate::tools::program(t.name()).map(|f| (t, f)))
        .collect()
}

/// A rank whose executable is a Python interpreter gets py-spy (its Python stack is what helps).
fn is_python(pid: u32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().starts_with("python")))
        .unwrap_or(false)
}

/// Which tool would dump `pid` and where it is, or why none can. py-spy is looked for on PATH,
/// in the rank's own Python environment, in the Flightdeck cache and beside this binary, so a
/// plain shell finds what `make` installed.
pub fn choose(pid: u32) -> Result<(StackTool, crate::tools::Found), String> {
    if is_python(pid) {
        if let Some(found) = crate::tools::program_for_python(StackTool::PySpy.name(), pid) {
            return Ok((StackTool::PySpy, found));
        }
    }
    native_tools().into_iter().next().ok_or_else(|| {
        "no stack tool on this node: install elfutils (eu-stack) or gdb (scripts/install-deps.sh does), \
         and py-spy for Python ranks (make installs it into the Flightdeck cache)"
            .to_string()
    })
}

/// Dumps one rank's threads; never fails, the error says why there are no stacks.
pub async fn dump(rank: u32, host: &str, pid: u32, native: bool) -> RankStacks {
    let mut out =
        RankStacks { rank, host: host.to_string(), pid, tool: None, elapsed_ms: 0, threads: Vec::new(), error: None };
    let (tool, found) = match choose(pid) {
        Ok(t) => t,
        Err(e) => {
            out.error = Some(e);
            return out;
        }
    };
    out.tool = Some(tool);
    let p = pid.to_string();
    let args: Vec<&str> = match tool {
        StackTool::EuStack => vec!["-p", &p],
        // -nx: no user .gdbinit; no auto-loaded scripts or debuginfod lookups while the rank waits.
        StackTool::Gdb => vec![
            "-nx",
            "-batch",
            "-iex",
            "set auto-load off",
            "-iex",
            "set debuginfod enabled off",
            "-p",
            &p,
            "-ex",
            "thread apply all bt",
        ],
        StackTool::PySpy if native => vec!["dump", "--native", "--pid", &p],
        StackTool::PySpy => vec!["dump", "--pid", &p],
    };
    let started = Instant::now();
    let child = tokio::process::Command::new(&found.path)
        .args(&args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let result = tokio::time::timeout(DUMP_TIMEOUT, child).await;
    out.elapsed_ms = started.elapsed().as_millis() as u64;
    match result {
        Err(_) => out.error = Some(format!("{} took longer than {DUMP_TIMEOUT:?} and was stopped", tool.name())),
        Ok(Err(e)) => out.error = Some(format!("cannot run {}: {e}", tool.name())),
        Ok(Ok(o)) => {
            let text = String::from_utf8_lossy(&o.stdout);
            out.threads = match tool {
                StackTool::EuStack => parse_eu_stack(&text),
                StackTool::Gdb => parse_gdb(&text),
                StackTool::PySpy => parse_py_spy(&text),
            };
            if out.threads.is_empty() {
                let err = String::from_utf8_lossy(&o.stderr);
                let why = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("no output");
                out.error = Some(format!("{} read no stacks from pid {pid} ({}): {why}", tool.name(), o.status));
            }
        }
    }
    out
}

/// `TID 123:` then `#0  0x00007f... function` lines.
pub fn parse_eu_stack(text: &str) -> Vec<ThreadStack> {
    let mut threads: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        if let Some(tid) = line.strip_prefix("TID ").and_then(|r| r.trim_end_matches(':').trim().parse().ok()) {
            threads.push(ThreadStack { tid, name: None, frames: Vec::new() });
        } else if let (Some(t), Some(rest)) = (threads.last_mut(), frame_line(line)) {
            // `0x00007f... function` (or just the address when there is no symbol).
            let mut parts = rest.splitn(2, char::is_whitespace);
            let _addr = parts.next();
            let function = parts.next().map(str::trim).filter(|f| !f.is_empty()).unwrap_or("??");
            t.frames.push(Frame { function: clean_function(function), location: None });
        }
    }
    threads
}

/// `Thread 2 (Thread 0x7f... (LWP 123) "name"):` then `#0  0x... in function (args) at file:line`.
pub fn parse_gdb(text: &str) -> Vec<ThreadStack> {
    let mut threads: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        if line.starts_with("Thread ") {
            let tid = line.split("LWP ").nth(1).and_then(|r| r.split(')').next()).and_then(|n| n.trim().parse().ok());
            let name = line.split('"').nth(1).map(str::to_string);
            threads.push(ThreadStack { tid: tid.unwrap_or(0), name, frames: Vec::new() });
        } else if let (Some(t), Some(rest)) = (threads.last_mut(), frame_line(line)) {
            let rest = match rest.split_once(" in ") {
                Some((addr, f)) if addr.starts_with("0x") => f,
                _ => rest,
            };
            let (head, location) = match rest.rsplit_once(" at ") {
                Some((h, loc)) => (h, Some(loc.trim().to_string())),
                None => (rest.split(" from ").next().unwrap_or(rest), None),
            };
            let function = head.split(" (").next().unwrap_or(head).trim();
            t.frames.push(Frame { function: clean_function(function), location });
        }
    }
    threads
}

/// `Thread 0x7f... (active): "MainThread"` then indented `function (file.py:line)` lines.
pub fn parse_py_spy(text: &str) -> Vec<ThreadStack> {
    let mut threads: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Thread ") {
            let id = rest.split_whitespace().next().unwrap_or("0");
            let tid = match id.strip_prefix("0x").or_else(|| id.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16).map(|v| v as u32).unwrap_or(0),
                None => id.parse().unwrap_or(0),
            };
            let name = line.split('"').nth(1).map(str::to_string);
            threads.push(ThreadStack { tid, name, frames: Vec::new() });
        } else if let (Some(t), true) = (threads.last_mut(), line.starts_with("    ")) {
            let l = line.trim();
            let (function, location) = match l.rsplit_once(" (") {
                Some((f, loc)) => (f, Some(loc.trim_end_matches(')').to_string())),
                None => (l, None),
            };
            // With --native, a frame without a symbol is its address, which differs between
            // processes running the same code; `??` lets identical stacks group.
            let function = if is_address(function) { "??".to_string() } else { function.to_string() };
            t.frames.push(Frame { function, location });
        }
    }
    threads
}

fn is_address(function: &str) -> bool {
    function.strip_prefix("0x").is_some_and(|hex| !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The text after `#N` on a frame line, if it is one.
fn frame_line(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix('#')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    (digits > 0).then(|| rest[digits..].trim())
}

/// Demangles Rust symbols (legacy `_ZN...E` and v0 `_R...`), undoes the escapes of names a
/// tool half-demangled, and drops hashes and `.llvm.N` suffixes, which differ between builds
/// but not between identical stacks.
pub fn clean_function(raw: &str) -> String {
    let name = raw.split(".llvm.").next().unwrap_or(raw);
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        // The alternate form leaves the hash out.
        return format!("{d:#}");
    }
    let mut s = name.to_string();
    for (from, to) in [
        ("$LT$", "<"),
        ("$GT$", ">"),
        ("$RF$", "&"),
        ("$BP$", "*"),
        ("$C$", ","),
        ("$u20$", " "),
        ("$u27$", "'"),
        ("$u5b$", "["),
        ("$u5d$", "]"),
        ("$u7b$", "{"),
        ("$u7d$", "}"),
        ("$LP$", "("),
        ("$RP$", ")"),
        ("..", "::"),
    ] {
        s = s.replace(from, to);
    }
    let s = s.strip_prefix('_').filter(|r| r.starts_with('<')).map(str::to_string).unwrap_or(s);
    match s.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => head.to_string(),
        _ => s,
    }
}

#[cfg(test)]
#[path = "stacks_tests.rs"]
mod tests;
