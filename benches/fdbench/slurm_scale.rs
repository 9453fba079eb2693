//! `fdbench slurm-scale`: 1,024 light ranks through a real Slurm (issue 18). A fake cluster of
//! NODES slurmd on loopback (tests/common/slurm.rs) runs NODES × RANKS_PER_NODE copies of a perl
//! rank that stamps its start in a file and then prints a torchtitan step line STEPS_PER_S times
//! a second. Each repetition runs both sides, in alternating order:
//!
//! - `fd`: `flightdeck run --headless` with `cluster.launcher = "slurm"` (sbatch holder, agents by
//!   srun, ranks by the agents, every line read by the torchtitan adapter and sent to the server).
//!   Launch is submit to the last rank's start stamp; then, over SECS, the server's and agents'
//!   CPU and memory, the store's lag behind the agents (the server log's ingest windows), and the
//!   live cockpit (`attach` in tmux at 160×48 with `FLIGHTDECK_FRAME_STATS`); then `kill`.
//! - `srun`: `srun -N NODES --ntasks-per-node R` of the same rank, its output to /dev/null
//!   through srun. Launch is the same; then srun's CPU over the same SECS; then `scancel`.
//!
//! One JSON object per side per repetition on stdout; `benches/driver/slurm_scale.py` tabulates.
#[allow(dead_code)]
#[path = "../../tests/common/slurm.rs"]
mod slurm;

use anyhow::{bail, Context};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster's slot (tests/common/slurm.rs): apart from the test suite's clusters.
const SLOT: u16 = 9;
const LAUNCH_LIMIT: Duration = Duration::from_secs(900);
const POLL: Duration = Duration::from_millis(50);
const TMUX_SOCKET: &str = "fdbench-slurm-scale";

/// The rank: its start stamp (unix ms) into DIR/start-RANK, then one torchtitan step line per
/// 1/RATE s (on a schedule, so a late line does not slow the rest), STEPS of them.
const RANK_PL: &str = r#"use Time::HiRes qw(time sleep);
my ($dir, $rate, $steps) = @ARGV;
my $r = $ENV{RANK} // $ENV{SLURM_PROCID};
open(my $f, '>', "$dir/.start-$r") or die "$dir: $!";
printf $f "%d\n", time() * 1000;
close $f;
rename("$dir/.start-$r", "$dir/start-$r") or die "$dir: $!";
$| = 1;
my $t0 = time();
for my $s (1 .. $steps) {
    my $wait = $t0 + $s / $rate - time();
    sleep($wait) if $wait > 0;
    printf "step: %d  loss: %.4f  grad_norm: %.4f  tps: 8,192\n", $s, 3.0 * exp(-$s / 300) + 0.5, 1.0 + ($s % 7) / 10;
}
"#;

pub struct Args {
    pub fd_bin: PathBuf,
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub steps_per_s: f64,
    pub secs: u64,
    pub reps: usize,
}

pub fn main(args: &Args) -> anyhow::Result<()> {
    let cluster = slurm::Cluster::start("fdbench-slurm-scale", args.nodes, SLOT).map_err(anyhow::Error::msg)?;
    let work = tempfile::tempdir().context("temp dir")?;
    let rank_pl = work.path().join("rank.pl");
    std::fs::write(&rank_pl, RANK_PL)?;
    eprintln!("slurm-scale: {} nodes up ({})", args.nodes, cluster.dir().display());
    for rep in 0..args.reps {
        let sides = if rep % 2 == 0 { ["fd", "srun"] } else { ["srun", "fd"] };
        for side in sides {
            let dir = work.path().join(format!("{side}-{rep}"));
            let starts = dir.join("starts");
            std::fs::create_dir_all(&starts)?;
            let result = match side {
                "fd" => fd_side(&cluster, args, &rank_pl, &dir, &starts),
                _ => srun_side(&cluster, args, &rank_pl, &dir, &starts),
            };
            let mut out = result.with_context(|| format!("{side} repetition {}", rep + 1))?;
            out["side"] = json!(side);
            out["rep"] = json!(rep + 1);
            out["load"] = json!(std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim());
            wait_no_jobs(&cluster)?;
            // An overloaded side can leave nodes drained ("Kill task failed"): the next one gets
            // them back, and the output says how many there were.
            out["nodes_resumed"] = json!(resume_nodes(&cluster)?);
            println!("{out}");
            std::fs::remove_dir_all(&dir).ok();
        }
    }
    Ok(())
}

fn world(args: &Args) -> usize {
    args.nodes * args.ranks_per_node
}

/// The rank's argv: perl, the script, its start directory, rate and a step count that outlasts
/// the measurement.
fn rank_argv(args: &Args, rank_pl: &Path, starts: &Path) -> Vec<String> {
    let steps = ((args.secs as f64 + LAUNCH_LIMIT.as_secs_f64() + 300.0) * args.steps_per_s) as u64;
    vec![
        "perl".into(),
        rank_pl.display().to_string(),
        starts.display().to_string(),
        args.steps_per_s.to_string(),
        steps.to_string(),
    ]
}

fn fd_side(
    c: &slurm::Cluster,
    args: &Args,
    rank_pl: &Path,
    dir: &Path,
    starts: &Path,
) -> anyhow::Result<serde_json::Value> {
    let db = dir.join("db");
    let argv: Vec<String> = rank_argv(args, rank_pl, starts).iter().map(|a| format!("{a:?}")).collect();
    let recipe = dir.join("scale.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"scale\"\nkind = \"command\"\n[command]\nargv = [{}]\nlog_format = \"torchtitan\"\n\
             [cluster]\nlauncher = \"slurm\"\nnodes = {}\nranks_per_node = {}\nremote_dir = {:?}\n",
            argv.join(", "),
            args.nodes,
            args.ranks_per_node,
            dir.join("nodes").display().to_string()
        ),
    )?;
    let fd = |sub: &[&str]| {
        let mut cmd = Command::new(&args.fd_bin);
        cmd.arg("--db").arg(&db).args(sub);
        for (k, v) in c.env() {
            cmd.env(k, v);
        }
        cmd
    };
    let t0 = unix_ms();
    let mut run = fd(&["run", &recipe.display().to_string(), "--headless", "--name", "scale"])
        .stdout(std::fs::File::create(dir.join("run.out"))?)
        .stderr(std::fs::File::create(dir.join("run.err"))?)
        .spawn()?;
    // Whatever happens next, the run and the cockpit do not outlive this repetition.
    let _teardown = Teardown(fd(&["kill", "scale"]));
    let launch_ms = wait_starts(starts, world(args), t0, &mut run, &dir.join("run.err"))?;
    let server = pids(|cmd| cmd.contains(&db.display().to_string()) && cmd.contains("\0server"));
    // The agents themselves, not the srun clients whose command lines end the same way.
    let agent_cmd = format!("{}\0agent\0slurm", args.fd_bin.display());
    let agents = pids(|cmd| cmd.starts_with(&agent_cmd));
    if server.len() != 1 || agents.len() != args.nodes {
        bail!("found {} server and {} agent processes (want 1 and {})", server.len(), agents.len(), args.nodes);
    }
    let stepds = pids(|cmd| cmd.starts_with("slurmstepd"));
    let frames = dir.join("frames.json");
    let attach = format!(
        "export {}={}; exec {:?} --db {:?} attach scale",
        "FLIGHTDECK_FRAME_STATS",
        frames.display(),
        args.fd_bin.display().to_string(),
        db.display().to_string()
    );
    let mut tmux = Command::new("tmux");
    tmux.args(["-L", TMUX_SOCKET, "new-session", "-d", "-x", "160", "-y", "48", "-s", "scale", "sh", "-c", &attach]);
    for (k, v) in c.env() {
        tmux.env(k, v);
    }
    check(tmux.output()?, "tmux new-session")?;
    let log = db.join("server.log");
    let windows_before = lag_windows(&log).len();
    let before = (ticks(&server), ticks(&agents), ticks(&stepds));
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(args.secs));
    let after = (ticks(&server), ticks(&agents), ticks(&stepds));
    // The ingest windows that ended inside the measured time.
    let lag: Vec<serde_json::Value> = lag_windows(&log).into_iter().skip(windows_before).collect();
    let wall = started.elapsed().as_secs_f64();
    let (server_pss, server_hwm) = (pss_kb(server[0]), status_kb(server[0], "VmHWM:"));
    let agents_pss: u64 = agents.iter().map(|p| pss_kb(*p)).sum();
    // `:q`, the cockpit's quit (q alone goes back to the home screen).
    let quit = ["-L", TMUX_SOCKET, "send-keys", "-t", "scale", ":q", "Enter"];
    check(Command::new("tmux").args(quit).output()?, "tmux send-keys")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !frames.exists() {
        if Instant::now() > deadline {
            bail!("the cockpit wrote no {} within 60 s", frames.display());
        }
        std::thread::sleep(POLL);
    }
    let _ = Command::new("tmux").args(["-L", TMUX_SOCKET, "kill-server"]).output();
    let cockpit: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&frames)?)?;
    // What was measured stands even when an overloaded run is slow to go: the teardown's
    // trouble is reported with it, and the run's processes are killed by pid.
    let killed = check(fd(&["kill", "scale"]).output()?, "flightdeck kill")
        .and_then(|()| wait_child(&mut run, Duration::from_secs(300), "the headless run after kill"));
    let teardown = match killed {
        Ok(()) => serde_json::Value::Null,
        Err(e) => {
            let _ = run.kill();
            for pid in server.iter().chain(&agents) {
                // SAFETY: signalling processes this repetition started.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            // The cluster is this benchmark's own: every job on it is the run's.
            for job in c.jobs() {
                let _ = c.cmd("scancel", &[&job]);
            }
            json!(format!("{e:#}"))
        }
    };
    let pct = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / clk_tck() / wall * 100.0;
    Ok(json!({
        "launch_ms": launch_ms,
        "secs": wall,
        "server_cpu_pct": pct(before.0, after.0),
        "server_pss_mb": server_pss as f64 / 1024.0,
        "server_hwm_mb": server_hwm as f64 / 1024.0,
        "agents_cpu_pct": pct(before.1, after.1),
        "agents_pss_mb": agents_pss as f64 / 1024.0,
        "stepds_cpu_pct": pct(before.2, after.2),
        "lag": lag,
        "cockpit": cockpit,
        "teardown_error": teardown,
    }))
}

/// Kills the run (the command given) and the cockpit's tmux when a repetition ends, however.
struct Teardown(Command);

impl Drop for Teardown {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", TMUX_SOCKET, "kill-server"]).output();
        let _ = self.0.output();
    }
}

fn srun_side(
    c: &slurm::Cluster,
    args: &Args,
    rank_pl: &Path,
    dir: &Path,
    starts: &Path,
) -> anyhow::Result<serde_json::Value> {
    let t0 = unix_ms();
    let (nodes, per_node) = (args.nodes.to_string(), args.ranks_per_node.to_string());
    let mut srun = c
        .command("srun")
        .args(["--nodes", &nodes, "--ntasks-per-node", &per_node, "--job-name=fdbench-srun-scale"])
        .args(rank_argv(args, rank_pl, starts))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("srun.err"))?)
        .spawn()?;
    let launch_ms = wait_starts(starts, world(args), t0, &mut srun, &dir.join("srun.err"))?;
    let me = vec![srun.id() as i32];
    let stepds = pids(|cmd| cmd.starts_with("slurmstepd"));
    let before = (ticks(&me), ticks(&stepds));
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(args.secs));
    let after = (ticks(&me), ticks(&stepds));
    let wall = started.elapsed().as_secs_f64();
    let srun_pss = pss_kb(me[0]);
    check(c.command("scancel").args(["--name", "fdbench-srun-scale"]).output()?, "scancel")?;
    wait_child(&mut srun, Duration::from_secs(300), "srun")?;
    let pct = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / clk_tck() / wall * 100.0;
    Ok(json!({
        "launch_ms": launch_ms,
        "secs": wall,
        "srun_cpu_pct": pct(before.0, after.0),
        "srun_pss_mb": srun_pss as f64 / 1024.0,
        "stepds_cpu_pct": pct(before.1, after.1),
    }))
}

/// Waits until `world` ranks stamped their start in `dir`; the last stamp minus `t0`, in ms.
fn wait_starts(dir: &Path, world: usize, t0: u64, child: &mut Child, err: &Path) -> anyhow::Result<u64> {
    let deadline = Instant::now() + LAUNCH_LIMIT;
    loop {
        let names: Vec<_> = std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with("start-"))
            .map(|e| e.path())
            .collect();
        if names.len() >= world {
            let mut last = 0;
            for p in names {
                let text = std::fs::read_to_string(&p)?;
                last = last.max(text.trim().parse::<u64>().with_context(|| format!("{}: {text:?}", p.display()))?);
            }
            return Ok(last.saturating_sub(t0));
        }
        if let Some(status) = child.try_wait()? {
            bail!("exited ({status}) with {} of {world} ranks started: {}", names.len(), tail(err));
        }
        if Instant::now() > deadline {
            bail!("{} of {world} ranks started within {} s: {}", names.len(), LAUNCH_LIMIT.as_secs(), tail(err));
        }
        std::thread::sleep(POLL);
    }
}

fn wait_child(child: &mut Child, limit: Duration, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("{what} did not exit within {} s", limit.as_secs());
        }
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// Returns drained or down nodes to service; how many there were.
fn resume_nodes(c: &slurm::Cluster) -> anyhow::Result<usize> {
    let out = c.cmd("sinfo", &["-h", "-N", "-t", "drain,down", "-o", "%N"]);
    let nodes: std::collections::BTreeSet<String> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect();
    if !nodes.is_empty() {
        let list = nodes.iter().cloned().collect::<Vec<_>>().join(",");
        check(c.cmd("scontrol", &["update", &format!("nodename={list}"), "state=resume"]), "scontrol update")?;
    }
    Ok(nodes.len())
}

fn wait_no_jobs(c: &slurm::Cluster) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while !c.jobs().is_empty() {
        if Instant::now() > deadline {
            bail!("jobs left after 300 s: {:?}", c.jobs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The server log's ingest windows so far, oldest first: (frames/s, p50, p99, max ms).
fn lag_windows(log: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split_once(": ingest over ").map(|(_, rest)| rest))
        .filter_map(|rest| {
            let num = |key: &str| -> Option<f64> {
                let at = rest.find(key)? + key.len();
                rest[at..].split(|c: char| !(c.is_ascii_digit() || c == '.')).next()?.parse().ok()
            };
            Some(json!({
                "secs": num("")?,
                "frames_per_s": num("frames (")?,
                "p50_ms": num("p50 ")?,
                "p99_ms": num("p99 ")?,
                "max_ms": num("max ")?,
            }))
        })
        .collect()
}

fn check(out: std::process::Output, what: &str) -> anyhow::Result<()> {
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// Processes whose NUL-separated command line satisfies `pred`.
fn pids(pred: impl Fn(&str) -> bool) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            !cmd.is_empty() && pred(&String::from_utf8_lossy(&cmd))
        })
        .collect()
}

/// utime + stime of `pids` together, in clock ticks (gone processes count 0).
fn ticks(pids: &[i32]) -> u64 {
    pids.iter()
        .map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // Fields after the command's closing parenthesis: state is the 3rd field, utime the 14th.
            let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
            let f: Vec<&str> = rest.split_whitespace().collect();
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            n(11) + n(12)
        })
        .sum()
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).max(1) as f64
}

fn status_kb(pid: i32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// A process's proportional share of memory (shared pages divided among their users): the
/// agents map the same libtorch, which VmRSS would count once per agent.
fn pss_kb(pid: i32) -> u64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    rollup.lines().find(|l| l.starts_with("Pss:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
