//! A tmux server on its own socket for driving the cockpit through a real terminal: keys in,
//! capture-pane out (with `-e`, the escape codes too, to check colours).
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The shell line a tmux session runs: the cockpit on `db` with its own config directory, then
/// its exit code on screen (`COCKPIT-EXIT=N`), and the pane kept open to read it.
pub fn cockpit_shell(config: &std::path::Path, db: &std::path::Path) -> String {
    format!(
        "env FLIGHTDECK_CONFIG={} FLIGHTDECK_SERVER_IDLE_MS=300 {} --db {}; echo COCKPIT-EXIT=$?; sleep 600",
        config.display(),
        super::bin().display(),
        db.display()
    )
}

pub fn installed() -> bool {
    Command::new("tmux").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// Killed with its sessions when dropped (also when the test fails).
pub struct Tmux {
    pub socket: String,
    /// How long `wait_for` waits before failing with the screen.
    pub deadline: Duration,
}

impl Tmux {
    /// Starts session `cockpit` of `size` running `shell` in `dir`.
    pub fn start(tag: &str, size: (u16, u16), dir: &std::path::Path, shell: &str, deadline: Duration) -> Tmux {
        let tmux = Tmux { socket: format!("fd-{tag}-{}", std::process::id()), deadline };
        let (w, h) = (size.0.to_string(), size.1.to_string());
        let dir = dir.to_str().expect("utf-8 path");
        let started = tmux.cmd(&["new-session", "-d", "-s", "cockpit", "-x", &w, "-y", &h, "-c", dir, shell]);
        assert!(started.status.success(), "tmux: {}", String::from_utf8_lossy(&started.stderr));
        tmux
    }

    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("running tmux")
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "cockpit"]).stdout).into_owned()
    }

    /// The screen with its SGR escape codes.
    pub fn screen_escaped(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-e", "-t", "cockpit"]).stdout).into_owned()
    }

    pub fn type_text(&self, text: &str) {
        assert!(self.cmd(&["send-keys", "-t", "cockpit", "-l", text]).status.success());
    }

    pub fn key(&self, key: &str) {
        assert!(self.cmd(&["send-keys", "-t", "cockpit", key]).status.success());
    }

    /// Reads the screen until `pred` holds (the screen changing is the event waited for).
    pub fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            assert!(!s.contains("COCKPIT-EXIT="), "the cockpit exited while waiting for {what}:\n{s}");
            assert!(start.elapsed() < self.deadline, "timed out waiting for {what}; the screen:\n{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

/// Each rank's step from the ranks table (rows under the `RANK STEP` header).
pub fn rank_steps(screen: &str) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    let mut in_table = false;
    for line in screen.lines() {
        let cells: Vec<&str> = line.trim_matches(|c| "│┃ ".contains(c)).split_whitespace().collect();
        if cells.first() == Some(&"RANK") && cells.get(1) == Some(&"STEP") {
            in_table = true;
            continue;
        }
        match (in_table, cells.first().and_then(|c| c.parse().ok()), cells.get(1).and_then(|c| c.parse().ok())) {
            (true, Some(rank), Some(step)) => out.push((rank, step)),
            _ => in_table = false,
        }
    }
    out
}

/// The SGR parameters in force where `needle` starts on the first line holding it (tmux writes
/// one escape per change; a reset `0` clears what came before).
pub fn sgr_at(escaped: &str, needle: &str) -> Option<Vec<String>> {
    let line = escaped.lines().find(|l| strip(l).contains(needle))?;
    let mut params: Vec<String> = Vec::new();
    let mut rest = line;
    loop {
        let esc = rest.find('\u{1b}');
        let text_end = esc.unwrap_or(rest.len());
        if rest[..text_end].contains(needle) {
            return Some(params);
        }
        let e = esc?;
        let after = &rest[e + 1..];
        let Some(body) = after.strip_prefix('[') else {
            rest = after;
            continue;
        };
        let end = body.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(body.len());
        if body[end..].starts_with('m') {
            for p in body[..end].split(';') {
                if p.is_empty() || p == "0" {
                    params.clear();
                } else {
                    params.push(p.to_string());
                }
            }
        }
        rest = &body[(end + 1).min(body.len())..];
    }
}

/// A line without its escape codes.
pub fn strip(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}
